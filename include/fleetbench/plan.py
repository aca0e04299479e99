"""Plan expansion: hosts x benchmark matrix -> a deterministic list of cases, each with a stable case_key.

A case is plain data (JSON-able) so it can travel through XCom; its command line is built here,
from validated names only, as an argument list (never a shell string).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterable

from fleetbench.config import FleetConfig

if TYPE_CHECKING:
    from fleetbench.run_model import RunPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    host: str
    case_key: str
    benchmark: str
    image: str
    model: str | None  # the model (tf_cnn_benchmarks), the collective (nccl_tests), None (command)
    batch_size_per_device: int | None
    num_gpus: int
    variable_update: str | None
    device: str
    num_batches: int
    num_warmup_batches: int
    timeout_s: int
    command: list[str] = field(hash=False)
    container: dict = field(default_factory=dict, hash=False)  # ContainerSpec as plain data
    telemetry_period_s: float = 0.5
    # The plan's capacity verdict (fleetbench.capacity.assess): action, capacity, prediction, note.
    capacity: dict = field(default_factory=dict, hash=False)
    harness: str = "tf_cnn_benchmarks"  # fleetbench.harnesses
    harness_settings: dict = field(default_factory=dict, hash=False)  # what the harness's measure reads
    axes: dict = field(default_factory=dict, hash=False)  # the case's point in its benchmark's matrix
    # The MIG profile whose instances the case runs on (num_gpus of them); None: whole GPUs (fleetbench.hosts.devices).
    mig_profile: str | None = None
    # The CUDA version of the case's image (`images[].cuda`): a GPU case is judged against it on its host
    # (fleetbench.hosts.devices), not against the newest CUDA of the host's images.
    cuda: str | None = None

    @property
    def mig_instances(self) -> int | None:
        return self.num_gpus if self.mig_profile else None

    # A multi-node case (fleetbench.multinode): its hosts (`host` is the first, the chief's), its roles
    # ({host, job, task_index}) and its cluster settings (base_port, rendezvous_timeout_s, mixed_gpu_models).
    nodes: int = 1
    host_set: list = field(default_factory=list, hash=False)
    roles: list = field(default_factory=list, hash=False)
    cluster: dict = field(default_factory=dict, hash=False)

    @property
    def hosts(self) -> list[str]:
        """Every host the case runs on."""
        return list(self.host_set) if self.host_set else [self.host]

    @property
    def batch_size_global(self) -> int | None:
        """One step's batch across the case: per device x devices. Every worker of a multi-node case (on its
        num_gpus devices) or rank of a launcher case trains its own batch, and the chief's images/sec is the
        cluster's: tf_cnn_benchmarks' own log says `Batch size: 16 global` for 2 workers at batch 8."""
        if self.batch_size_per_device is None:
            return None
        if self.nodes > 1 and self.roles:
            return self.batch_size_per_device * sum(r.get("procs", max(self.num_gpus, 1)) for r in self.roles
                                                    if r["job"] in ("worker", "node"))
        return self.batch_size_per_device * max(self.num_gpus, 1)

    def to_dict(self) -> dict:
        return asdict(self)


def case_key(bench: str, model: str, batch_size: int, num_gpus: int, variable_update: str) -> str:
    """A tf_cnn_benchmarks case's key (fleetbench.harnesses.tf_cnn.case_key)."""
    from fleetbench.harnesses.tf_cnn import case_key as tf_cnn_case_key

    return tf_cnn_case_key(bench, model, batch_size, num_gpus, variable_update)


def mig_case_key(case_key: str, profile: str | None) -> str:
    """A MIG case's key: its point's key and the profile (`...g1.mig-1g.10gb`); whole-GPU keys stay as they are."""
    return f"{case_key}.mig-{profile.replace('+', '_')}" if profile else case_key


def batches_case_key(case_key: str, num_batches: int | None) -> str:
    """A case run with another number of batches than its benchmark's (a manual run's `num_batches` parameter):
    `<point key>.nb<N>`, a case of its own. Its duration, cost and share of warm-up are not the nightly case's,
    whose regression history and baselines it must not join."""
    return f"{case_key}.nb{num_batches}" if num_batches is not None else case_key


def expand_cases(cfg: FleetConfig, hosts: Iterable[str] | None = None,
                 models: Iterable[str] | None = None, num_batches: int | None = None) -> list[Case]:
    """Every host x every point of each benchmark's matrix (its harness's axes, and its `mig_profiles`), in config
    order. `hosts` keeps only the cases on those hosts: a multi-node case when every host of its set (as the
    config forms them) is among them. `models` keeps only the cases of those models (harnesses without models are
    kept). `num_batches` runs the benchmarks whose harness passes it with that many batches; where it is not the
    configured number, their keys say so (`batches_case_key`)."""
    from fleetbench.harnesses import get as get_harness

    only_hosts = set(hosts) if hosts is not None else None
    only_models = set(models) if models is not None else None
    overridden: dict[str, int] = {}  # benchmark -> the run's num_batches, where it is not the configured one
    if num_batches is not None:
        benchmarks = []
        for bench in cfg.benchmarks:
            if num_batches != bench.num_batches and get_harness(bench.harness).passes_num_batches:
                bench = bench.model_copy(update={"num_batches": num_batches})
                overridden[bench.name] = num_batches
            benchmarks.append(bench)
        cfg = cfg.model_copy(update={"benchmarks": benchmarks})
    points = {bench.name: get_harness(bench.harness).points(bench) for bench in cfg.benchmarks}
    cases: list[Case] = []
    for host in cfg.hosts:
        if only_hosts is not None and host.name not in only_hosts:
            continue
        for bench in cfg.benchmarks:
            if bench.hosts is not None and host.name not in bench.hosts:
                continue
            if 1 not in bench.nodes:
                continue
            image = cfg.image(bench.image)
            harness = get_harness(bench.harness)
            container = bench.container_settings().model_dump(mode="json")
            settings = harness.settings(bench)
            for point, profile in ((p, m) for p in points[bench.name] for m in bench.mig_profiles or [None]):
                if only_models is not None and "models" in harness.axes and point.model not in only_models:
                    continue
                env = harness.env(bench, point)
                cases.append(
                    Case(
                        host=host.name,
                        case_key=mig_case_key(batches_case_key(point.case_key, overridden.get(bench.name)), profile),
                        benchmark=bench.name,
                        image=image.name,
                        model=point.model,
                        batch_size_per_device=point.batch_size,
                        num_gpus=point.num_gpus,
                        variable_update=point.variable_update,
                        device=bench.device,
                        num_batches=bench.num_batches,
                        num_warmup_batches=bench.num_warmup_batches,
                        timeout_s=bench.timeout_s,
                        command=harness.command(image.command, bench, point),
                        container={**container, "environment": {**container.get("environment", {}), **env}}
                        if env else container,
                        # the wrapper also counts a CPU case's CPU time (its energy estimate)
                        telemetry_period_s=bench.telemetry_period_s,
                        harness=harness.name,
                        harness_settings=settings,
                        axes={**point.axes, "mig_profile": profile} if profile else point.axes,
                        mig_profile=profile,
                        cuda=image.cuda,
                    )
                )
    cases += _multinode_cases(cfg, points, only_hosts, only_models, overridden)
    keys = [(c.host, c.case_key) for c in cases]
    if len(keys) != len(set(keys)):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"duplicate cases in plan: {dupes[:5]}")
    return cases


def _multinode_cases(cfg: FleetConfig, points: dict, only_hosts: set | None, only_models: set | None,
                     overridden: dict[str, int]) -> list[Case]:
    """The cases of N > 1 hosts: per benchmark and N, its hosts in config order in consecutive disjoint sets
    (`fleetbench.multinode.host_sets`), each set one case per matrix point, on host networking.

    `only_hosts` (the run's `hosts` parameter) keeps the sets all of whose hosts it names: the sets are the
    configured ones, so a rerun runs the nightly's sets and none the nightly never runs (with no history). A set
    it names only some hosts of is left out, and logged."""
    from fleetbench.harnesses import get as get_harness
    from fleetbench.multinode import DEFAULT_BACKEND, LAUNCHER, host_sets, launcher_layout, layout, set_case_key

    cases = []
    for bench in cfg.benchmarks:
        sizes = [n for n in bench.nodes if n > 1]
        if not sizes:
            continue
        names = [h.name for h in cfg.hosts if bench.hosts is None or h.name in bench.hosts]
        image = cfg.image(bench.image)
        harness = get_harness(bench.harness)
        container = {**bench.container_settings().model_dump(mode="json"), "network_mode": "host"}
        cluster = {"base_port": bench.base_port, "rendezvous_timeout_s": bench.rendezvous_timeout_s,
                   "mixed_gpu_models": bench.mixed_gpu_models, "layout": bench.layout}
        if bench.layout == LAUNCHER:
            cluster["backend"] = DEFAULT_BACKEND[bench.device] if bench.backend == "auto" else bench.backend
        for n in sizes:
            for hosts in host_sets(names, n):
                if only_hosts is not None and not only_hosts.issuperset(hosts):
                    if only_hosts.intersection(hosts):
                        log.warning("hosts parameter: benchmark %s's set %s is left out: %s not asked for",
                                    bench.name, "+".join(hosts), ", ".join(h for h in hosts if h not in only_hosts))
                    continue
                for point in points[bench.name]:
                    if only_models is not None and point.model not in only_models:
                        continue
                    cases.append(Case(
                        host=hosts[0], benchmark=bench.name,
                        case_key=set_case_key(batches_case_key(point.case_key, overridden.get(bench.name)), hosts),
                        image=image.name, model=point.model, batch_size_per_device=point.batch_size,
                        num_gpus=point.num_gpus, variable_update=point.variable_update, device=bench.device,
                        num_batches=bench.num_batches, num_warmup_batches=bench.num_warmup_batches,
                        timeout_s=bench.timeout_s, command=harness.command(image.command, bench, point),
                        container=container, telemetry_period_s=0.0, harness=harness.name,
                        harness_settings=harness.settings(bench), axes={**point.axes, "nodes": n},
                        nodes=n, host_set=hosts,
                        roles=launcher_layout(hosts, (bench.procs_per_node or 1) if bench.device == "cpu"
                                              else point.num_gpus) if bench.layout == LAUNCHER
                        else layout(hosts, bench.ps_per_node, bench.workers_per_node, bench.ps_nodes),
                        cluster=cluster, cuda=image.cuda))
    return cases


def build_plan(cfg: FleetConfig, run: dict, params: dict | None = None) -> "RunPlan":
    """The run's plan: its cases, and per host with cases the host's settings, what its cases need (most
    GPUs; the oldest CUDA of its GPU cases' images, below which none of them runs: each GPU case is judged
    against its own image's CUDA, fleetbench.hosts.devices) and the images they run. `cfg` has the run's
    parameters applied (`fleetbench.params.apply_params`) but for `hosts` and `num_batches`, which the plan
    applies; `run` holds dag_id, run_id, logical_date, run_type."""
    from fleetbench import __version__
    from fleetbench.run_model import CaseNeeds, PlannedHost, RunInfo, RunPlan

    params = params or {}
    cases = expand_cases(cfg, hosts=params.get("hosts") or None, num_batches=params.get("num_batches"))
    by_host: dict[str, list[Case]] = {}  # in one pass: a scan of every case per host took 26 s at 1,000 hosts
    for c in cases:
        for name in c.hosts:
            by_host.setdefault(name, []).append(c)
    hosts = []
    for host in cfg.hosts:
        host_cases = by_host.get(host.name, [])
        if not host_cases:
            continue
        images = [cfg.image(n) for n in sorted({c.image for c in host_cases})]
        cudas = {c.cuda for c in host_cases if c.cuda and c.num_gpus}
        mig: dict[str, int] = {}
        for c in host_cases:
            if c.mig_profile:
                mig[c.mig_profile] = max(mig.get(c.mig_profile, 0), c.num_gpus)
        needs = CaseNeeds(gpus=max(c.num_gpus for c in host_cases), image_cuda=min(cudas, key=_vkey) if cudas else None,
                          whole_gpus=max((c.num_gpus for c in host_cases if not c.mig_profile), default=0),
                          fewest_whole_gpus=min((c.num_gpus for c in host_cases if c.num_gpus and not c.mig_profile),
                                                default=None), mig=mig)
        hosts.append(PlannedHost(**dict(host), needs=needs, images=images))
    info = RunInfo(**run, fleet=cfg.fleet.name, config_digest=cfg.digest(),
                   started_at=datetime.now(timezone.utc).isoformat(),
                   fleetbench_version=__version__, dry_run=bool(params.get("dry_run")), params=params,
                   fleet_settings=cfg.fleet)
    return RunPlan(run=info, hosts=hosts, cases=cases)


def plan_table(cases: Iterable[Case]) -> str:
    """The plan as people read it: host, case_key, image, command (what a dry run logs)."""
    head = ("host", "case_key", "image", "command")
    rows = [head] + [(",".join(c.hosts), c.case_key, c.image, " ".join(c.command)) for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3] for r in rows)


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
