"""The typed data one fleet_benchmark run passes between its tasks.

Built once where it is made (the plan by `plan`, a verdict by a lane's host check, ...), turned into JSON
only at the XCom edge (`to_xcom`) and read back there (`load`, which also takes the model itself).
Nothing downstream re-defaults or re-checks a field: a planned host's `min_free_gb` or `connection`
is the config's value, its images are `ImageSpec`s, the run's fleet settings a `FleetSettings`.

    RunPlan      run (RunInfo) + hosts (PlannedHost: the config's HostSpec, what its cases need,
                 its images) + cases (fleetbench.plan.Case)
    HostVerdict  a lane's host check for one host: verdict, reasons, checks, facts
    HostImages   a lane's image step for one host: PreparedImage per image name
    CaseOutcome  how one case's container ended (BenchmarkCaseOperator), with its Measurement
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fleetbench.config import FleetSettings, HostSpec, ImageSpec
from fleetbench.plan import Case


class _XcomEdge:
    """Read from and written to XCom as JSON."""

    @classmethod
    def load(cls, value):
        """The model from its XCom JSON (a dict), or the model itself; None stays None."""
        if value is None or isinstance(value, cls):
            return value
        return cls.model_validate(value)

    def to_xcom(self) -> dict:
        return self.model_dump(mode="json")


class _Xcom(_XcomEdge, BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunInfo(_Xcom):
    dag_id: str
    run_id: str
    logical_date: str | None = None
    run_type: str | None = None
    fleet: str | None = None
    config_digest: str | None = None
    config_path: str | None = None
    started_at: str | None = None
    fleetbench_version: str | None = None
    dry_run: bool = False
    params: dict[str, Any] = {}
    # The run uses the fleet settings it was planned with, not whatever the file says later.
    fleet_settings: FleetSettings = FleetSettings()


class CaseNeeds(_Xcom):
    """What the host's cases of this run need from it (the lane's host check judges the host against it)."""

    gpus: int = 0  # the most devices a case asks for (whole GPUs or MIG instances)
    image_cuda: str | None = None  # the oldest CUDA of the GPU cases' images (each case is judged by its own)
    whole_gpus: int | None = None  # the most whole GPUs a case asks for; None: `gpus` (a plan without MIG cases)
    fewest_whole_gpus: int | None = None  # the fewest whole GPUs a GPU case asks for; None: as many as `whole_gpus`
    mig: dict[str, int] = {}  # MIG profile -> the most instances of it a case asks for


class PlannedHost(_XcomEdge, HostSpec):
    """A host of the config as this run plans it: its settings, its cases' needs, the images they run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    needs: CaseNeeds = CaseNeeds()
    images: list[ImageSpec] = []

    @property
    def local(self) -> bool:
        """Probed on the worker itself (else over the host's SSH connection)."""
        return self.connection == "local"


class MissingPlan(RuntimeError):
    """A task that runs whatever happened upstream (collect, store, report) got no plan: `plan` failed."""


# The XCom key of a host's slice of a plan's cases (`RunPlan.split`): its single-node cases and the multi-node cases
# it is in. Host names are config names ([A-Za-z0-9_.-]), safe in a key.
def slice_key(host: str) -> str:
    return f"plan.cases.host.{host}"


class RunPlan(_Xcom):
    run: RunInfo
    hosts: list[PlannedHost]
    cases: list[Case]
    # Where the cases travel apart from the plan (`split`): slice key -> its number of cases; `cases` is then
    # empty until `with_cases` reads the slices a task needs. None: the cases are in `cases`.
    slices: dict[str, int] | None = None
    # The hosts with multi-node cases (their slices hold them), for `multinode.cases`; with `slices` only.
    multinode_hosts: list[str] = []
    case_total: int | None = None  # with `slices`: the number of cases in them (a set's case counted once)

    @classmethod
    def load(cls, value):
        """As `_XcomEdge.load`, but a missing plan is an error that says so: every later step needs it."""
        if value is None:
            raise MissingPlan("this run has no plan: the `plan` task failed or did not run (see its log), so there "
                              "is nothing to run, collect or store")
        return super().load(value)

    @property
    def case_count(self) -> int:
        """The run's number of planned cases, whether or not they were read."""
        return len(self.cases) if self.slices is None else self.case_total or 0

    def split(self) -> tuple[dict, dict[str, list]]:
        """(the plan without its cases, {slice key: [[index, case], ...]}) as XCom JSON: one slice per host, with
        its single-node cases and the multi-node cases it is in (a set's case is in each of its hosts' slices).
        One XCom of every case of a night grew with the fleet (~1,400 bytes a case: PostgreSQL's 256 MiB JSONB cap
        failed the plan task at ~190,000 cases) and every lane read all of it (52 MB at 1,000 hosts x 52 cases); a
        lane now reads its host's slice, `multinode.cases` those of the hosts in sets, `store` every slice. The
        index keeps the plan's order of the cases (and tells a set's case read twice)."""
        whole = self.to_xcom()
        slices: dict[str, list] = {}
        in_sets: dict[str, None] = {}
        for index, (case, data) in enumerate(zip(self.cases, whole["cases"])):
            for host in case.hosts:
                slices.setdefault(slice_key(host), []).append([index, data])
                if case.nodes > 1:
                    in_sets[host] = None
        whole["cases"] = []
        whole["slices"] = {key: len(value) for key, value in slices.items()}
        whole["multinode_hosts"] = list(in_sets)
        whole["case_total"] = len(self.cases)
        return whole, slices

    def with_cases(self, pull, hosts: list[str] | None = None) -> RunPlan:
        """The plan with the cases of `hosts` (their single-node cases and the multi-node ones they are in; None:
        every case) read through `pull(key)` (the plan task's XCom of that key). A plan that was not split is
        returned as it is."""
        if self.slices is None:
            return self
        keys = list(self.slices) if hosts is None else [k for k in map(slice_key, hosts) if k in self.slices]
        by_index = {}
        for key in keys:
            part = pull(key)
            if part is None or len(part) != self.slices[key]:
                raise MissingPlan(f"this run's plan has {self.slices[key]} case(s) under XCom {key!r} of the `plan` "
                                  f"task, and {'none' if part is None else len(part)} could be read")
            by_index.update((index, case) for index, case in part)
        cases = _CASES.validate_python([by_index[i] for i in sorted(by_index)])
        return self.model_copy(update={"cases": cases, "slices": None if hosts is None else self.slices})

    def host(self, name: str) -> PlannedHost | None:
        """The host as planned for this run; None when the run has no case on it (e.g. a `hosts` parameter)."""
        return self._hosts.get(name)

    @cached_property
    def _hosts(self) -> dict[str, PlannedHost]:
        return {h.name: h for h in self.hosts}


class HostVerdict(_Xcom):
    """A lane's host check: `facts` is `HostFacts.to_dict()` (read once per host with `host_facts`)."""

    host: str
    verdict: str
    reasons: str = ""
    checks: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    facts_dir: str | None = None
    collected_at: str | None = None

    @cached_property
    def host_facts(self):
        from fleetbench.hosts import HostFacts

        return HostFacts.from_dict(self.facts)

    @property
    def unfit(self) -> bool:
        return self.verdict == "unfit"


class HostImages(_Xcom):
    """A lane's image step: one `fleetbench.images.PreparedImage` (as a dict) per image name, and the Docker API
    version the host's engine speaks (its `GET /version`, asked once by the lane's client): the lane's cases
    use it rather than each asking the engine again (`BenchmarkCaseOperator`)."""

    host: str
    images: dict[str, dict[str, Any]] = {}
    skipped: bool = False
    api_version: str | None = None

    def ready(self, image: str) -> dict | None:
        """The prepared image when it can run cases, else None."""
        prepared = self.images.get(image)
        return prepared if prepared and not prepared.get("failure_class") else None


class Measurement(_Xcom):
    """What a case measured: its result fields (status, failure class, metrics) and its step samples."""

    fields: dict[str, Any]
    steps: list[dict[str, Any]] = []


class CaseOutcome(_Xcom):
    """How one case's container ended, as BenchmarkCaseOperator saw it (also written next to the log)."""

    model_config = ConfigDict(extra="forbid")  # BenchmarkCaseOperator is its one producer
    host: str
    case_key: str
    image: str | None = None
    container_name: str | None = None
    command: list[str] = []
    gpu_device_ids: list[str] | None = None
    exit_code: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    killed_by_airflow: bool = False
    engine_unreachable: bool = False
    start_error_class: str | None = None
    error: str | None = None
    log_path: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    # A CPU case's package energy from the host's RAPL counters ({"energy_j", "zones", "wraps"}), or why
    # there is none ({"reason"}); None for GPU cases (`fleetbench.telemetry.rapl`).
    rapl: dict[str, Any] | None = None
    peak_mem_mib: float | None = None  # the container's peak memory (fleetbench.telemetry.container_memory)
    peak_mem_source: str | None = None
    # The execution of the run it belongs to (the plan's `started_at`): collect takes no outcome file that an
    # earlier execution of the same run (cleared, backfilled again) left in the run's folder.
    run_started_at: str | None = None
    measurement: Measurement | None = Field(default=None)


_CASES = TypeAdapter(list[Case])


def by_host(items) -> dict[str, Any]:
    """Per-host answers (HostVerdict, HostImages, or their dicts) keyed by host; None items (skipped lanes) dropped."""
    return {i.host if hasattr(i, "host") else i["host"]: i for i in items if i}
