"""Multi-node cases: host sets, role layouts, ports and the cluster spec of a case that spans hosts, and how
the outcomes of its containers become one result (README "Multi-node cases").

A benchmark with `nodes: [2]` plans one case per set of 2 hosts (its hosts in config order, taken in
consecutive disjoint sets); the case's `host` is the set's first host, where the chief runs (worker 0 of a
ps_worker case, node 0 of a launcher case) and whose case folder keeps every role's log. Two layouts:
`ps_worker` (tf_cnn_benchmarks' parameter servers and workers, a port each) and `launcher` (torch_synthetic
under torchrun: one launcher per host, `--node_rank` its place in the set, rendezvous at the first host's
port). Pure functions over plain data, except `port_free`, which asks
the network.
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass
from typing import Sequence

PS, WORKER, NODE = "ps", "worker", "node"
PS_WORKER, LAUNCHER = "ps_worker", "launcher"
# The chief has joined the cluster and its session runs (tf_cnn_benchmarks prints it before the first step).
JOINED_MARKER = "Running warm up"
# Rank 0 of a torchrun job has joined its process group (torch_synthetic.py prints it once every rank is in).
LAUNCHER_JOINED_MARKER = "joined process group: rank 0 of"
# The harnesses a layout runs, and the process group backend of a launcher case per device.
LAYOUT_HARNESS = {PS_WORKER: "tf_cnn_benchmarks", LAUNCHER: "torch_synthetic"}
DEFAULT_BACKEND = {"cpu": "gloo", "gpu": "nccl"}
PORT_TRIES = 64  # ports tried per role past base_port before the case fails port_unavailable


def host_sets(hosts: Sequence[str], nodes: int) -> list[list[str]]:
    """Consecutive disjoint sets of `nodes` hosts, in the order given; hosts left over make no set."""
    return [list(hosts[i:i + nodes]) for i in range(0, len(hosts) - nodes + 1, nodes)]


MAX_CASE_KEY = 250  # benchmark_results.case_key (String(250)): PostgreSQL refuses a longer one, and the night's store


def set_case_key(point_key: str, host_set: Sequence[str]) -> str:
    """`<point key>.n<N>.<host>+<host>...`: the matrix point, the number of hosts and the set, by name. A set too
    long to spell within MAX_CASE_KEY (e.g. 32 hosts) is named by its first host, how many more, and a digest of
    the whole set, `<point>.n32.gpu-01+31more.<digest>` (the row's host_set keeps every name)."""
    key = f"{point_key}.n{len(host_set)}.{'+'.join(host_set)}"
    if len(key) <= MAX_CASE_KEY:
        return key
    import hashlib

    digest = hashlib.sha256("+".join(host_set).encode()).hexdigest()[:12]
    short = f"{point_key}.n{len(host_set)}.{host_set[0]}+{len(host_set) - 1}more.{digest}"
    return short if len(short) <= MAX_CASE_KEY else f"{point_key}.n{len(host_set)}.{digest}"


def layout(host_set: Sequence[str], ps_per_node: int, workers_per_node: int, ps_nodes: str = "all") -> list[dict]:
    """The roles of a ps_worker case: workers (worker 0 on the first host: the chief), then parameter servers.

    Task indexes count per job in host order, as tf_cnn_benchmarks' `--ps_hosts`/`--worker_hosts` list them."""
    workers = [{"host": h, "job": WORKER} for h in host_set for _ in range(workers_per_node)]
    ps_hosts = host_set if ps_nodes == "all" else host_set[:1]
    servers = [{"host": h, "job": PS} for h in ps_hosts for _ in range(ps_per_node)]
    return ([{**r, "task_index": i} for i, r in enumerate(workers)]
            + [{**r, "task_index": i} for i, r in enumerate(servers)])


def launcher_layout(host_set: Sequence[str], procs_per_node: int) -> list[dict]:
    """The roles of a launcher case: one launcher (torchrun) per host, `node0` (node rank 0, the chief, whose
    host serves the rendezvous) on the first, each starting `procs` ranks."""
    return [{"host": h, "job": NODE, "task_index": i, "procs": procs_per_node} for i, h in enumerate(host_set)]


def joined_marker(layout_name: str | None) -> str:
    """The chief's log line that says its cluster is complete."""
    return LAUNCHER_JOINED_MARKER if layout_name == LAUNCHER else JOINED_MARKER


def role_name(role: dict) -> str:
    """`worker0`, `ps1`, `node1`: how logs, containers and details name a role."""
    return f"{role['job']}{role['task_index']}"


def is_chief(role: dict) -> bool:
    return role["job"] in (WORKER, NODE) and role["task_index"] == 0


def runs_to_the_end(role: dict) -> bool:
    """Whether the case is done only when this role has exited (everyone but a parameter server)."""
    return role["job"] != PS


class PortUnavailable(RuntimeError):
    """No free port for a role within PORT_TRIES of the case's base port."""


def port_free(address: str, port: int, local: bool) -> bool:
    """Nobody listens on address:port. On this machine (a local engine) the port must also be bindable on every
    address, as the container's server binds it (tf_cnn_benchmarks' gRPC server `0.0.0.0:<port>`, torchrun's store
    too: a port taken on another address of the machine, e.g. 127.0.0.1 for a role on 127.0.0.2, made the role fail);
    on another host, a connection that is not accepted means free (its other addresses cannot be asked from here)."""
    if local:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's: a TIME_WAIT port is free
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((address, port)) != 0


def allocate_ports(roles: Sequence[dict], addresses: dict[str, str], local: dict[str, bool], base_port: int,
                   is_free=port_free) -> list[int]:
    """One port per role, all different (hosts of a set may be one machine), each checked free on its host:
    a taken port is skipped for the next one. Raises PortUnavailable naming the role when none is left."""
    ports: list[int] = []
    candidate = base_port
    for role in roles:
        tried = 0
        while True:
            if tried >= PORT_TRIES or candidate > 65535:
                raise PortUnavailable(f"no free port for {role_name(role)} on {role['host']} "
                                      f"({addresses[role['host']]}) in {base_port}..{candidate - 1}")
            port, candidate, tried = candidate, candidate + 1, tried + 1
            if is_free(addresses[role["host"]], port, local[role["host"]]):
                ports.append(port)
                break
    return ports


def cluster_args(roles: Sequence[dict], ports: Sequence[int], addresses: dict[str, str], role: dict) -> list[str]:
    """tf_cnn_benchmarks' cluster flags for one role: its job and task index, and every ps and worker address."""
    def listing(job: str) -> str:
        return ",".join(f"{addresses[r['host']]}:{p}" for r, p in zip(roles, ports) if r["job"] == job)

    return [f"--job_name={role['job']}", f"--ps_hosts={listing(PS)}", f"--worker_hosts={listing(WORKER)}",
            f"--task_index={role['task_index']}"]


_PYTHON = re.compile(r"^(?:.*/)?python[0-9.]*$")


def launcher_command(command: Sequence[str], roles: Sequence[dict], master_port: int, addresses: dict[str, str],
                     role: dict, backend: str) -> list[str]:
    """torchrun for one host of a launcher case: static rendezvous at the first host's address and port, this
    host's node rank and processes, then the case's script and flags (plus the process group's backend).

    A command that starts with a Python interpreter runs torchrun as that interpreter's module
    (`python3 -m torch.distributed.run`), so the image's own Python is the one; any other command is
    started by `torchrun --no-python`."""
    flags = [f"--nnodes={len(roles)}", f"--node_rank={role['task_index']}", f"--nproc_per_node={role['procs']}",
             f"--master_addr={addresses[roles[0]['host']]}", f"--master_port={master_port}"]
    argv = [*command, f"--dist_backend={backend}"]
    if argv and _PYTHON.match(argv[0]):
        return [argv[0], "-m", "torch.distributed.run", *flags, *argv[1:]]
    return ["torchrun", *flags, "--no-python", *argv]


def port_roles(roles: Sequence[dict], layout_name: str | None) -> list[dict]:
    """The roles that listen on a port of their own: every ps and worker; of a launcher case only node 0,
    whose launcher serves the rendezvous (its ranks' own connections take ports the kernel picks)."""
    return list(roles[:1]) if layout_name == LAUNCHER else list(roles)


def role_command(command: Sequence[str], roles: Sequence[dict], ports: Sequence[int], addresses: dict[str, str],
                 role: dict, cluster: dict | None = None) -> list[str]:
    """One role's argv: a launcher case's torchrun, else the command plus tf_cnn_benchmarks' cluster flags."""
    cluster = cluster or {}
    if cluster.get("layout") == LAUNCHER:
        return launcher_command(command, roles, ports[0], addresses, role, cluster.get("backend") or "gloo")
    return [*command, *cluster_args(roles, ports, addresses, role)]


@dataclass(frozen=True)
class RoleEnd:
    """How one role's container ended (its own classification, `fleetbench.measure.classify`)."""

    name: str
    host: str
    job: str
    status: str
    failure_class: str | None
    detail: str | None
    exit_code: int | None
    stopped: bool = False  # stopped by fleetbench (a ps after the workers, or a peer after a failure)
    started_at: str | None = None  # the container's own start and end
    finished_at: str | None = None


def classify_role(role: dict, outcome: dict, harness: str = "tf_cnn_benchmarks") -> RoleEnd:
    """One role's end, classified on its own (`fleetbench.measure.classify` of its container and log, read by
    the case's harness): a role fleetbench stopped is not judged, and only the chief has to print a result."""
    from fleetbench.harnesses import get as get_harness
    from fleetbench.harnesses.tf_cnn import from_parsed
    from fleetbench.measure import OK, classify, read_tail
    from fleetbench.parsing import parse_log_file

    name = role_name(role)
    if outcome.get("stopped"):
        return RoleEnd(name, role["host"], role["job"], OK, None, "stopped by fleetbench", outcome.get("exit_code"),
                       stopped=True, started_at=outcome.get("started_at"), finished_at=outcome.get("finished_at"))
    try:
        if harness == "tf_cnn_benchmarks":
            measured = from_parsed(parse_log_file(outcome["log_path"], "tf_cnn_benchmarks"))
        else:
            measured = get_harness(harness).measure(outcome["log_path"], {})
    except (ValueError, OSError):
        measured = None
    status, failure_class, detail = classify(outcome, measured, read_tail(outcome.get("log_path")))
    if failure_class == "no_result" and not is_chief(role):
        status, failure_class, detail = OK, None, None
    return RoleEnd(name, role["host"], role["job"], status, failure_class, detail, outcome.get("exit_code"),
                   started_at=outcome.get("started_at"), finished_at=outcome.get("finished_at"))


def peer_failure(dead: RoleEnd) -> tuple[str, str]:
    """(failure_class, detail) of a case a non-chief role broke: `peer_failed`, naming the role and its class."""
    why = f"{dead.failure_class}" + (f": {dead.detail}" if dead.detail else "")
    return "peer_failed", f"{dead.name} on {dead.host} failed ({why}); every other container of the case was stopped"


def set_problem(case, verdicts: dict, images: dict) -> tuple[str, str | None, str] | None:
    """Why a multi-node case cannot run, as (status, failure_class, detail) — a host of its set not validated,
    unfit, without the image or with another one than the others pinned (digest and bake), or (unless
    `mixed_gpu_models`) with another GPU model — else None."""
    from fleetbench.hosts.devices import assign
    from fleetbench.measure import FAILED, SKIPPED

    for host in case.hosts:
        v = verdicts.get(host)
        if v is None:
            return FAILED, "host_check_failed", f"validation of host {host} of the set did not finish"
        if v.unfit:
            return SKIPPED, "host_unfit", f"host {host} of the set is unfit: {v.reasons}"
    models = {h: verdicts[h].host_facts.gpu_model for h in case.hosts}
    if case.num_gpus and not case.cluster.get("mixed_gpu_models") and len(set(models.values())) > 1:
        shown = ", ".join(f"{h}: {m}" for h, m in models.items())
        return SKIPPED, "mixed_gpu_models", f"the hosts of the set have different GPU models ({shown})"
    for host in case.hosts:  # every node needs its GPUs (a host with MIG on has fewer whole GPUs to give)
        devices = assign(case, verdicts[host].host_facts)
        if devices.skipped:  # before the image: a host that cannot run the case does not pull its image
            return SKIPPED, devices.skip_class, f"host {host} of the set: {devices.skip_detail}"
    for host in case.hosts:
        host_images = images.get(host)
        image = host_images.images.get(case.image) if host_images else None
        if image is None:
            return FAILED, "task_failed", f"the image of host {host} of the set was not prepared"
        if image.get("failure_class"):
            return FAILED, image["failure_class"], f"host {host} of the set: {image.get('error') or 'no image'}"
    pinned = {h: images[h].images[case.image] for h in case.hosts}
    what = {h: (i.get("digest") or i.get("image_id"), i.get("bake_inputs")) for h, i in pinned.items()}
    if len(set(what.values())) > 1:  # the tag moved between the lanes' pulls, or a host kept an older copy
        shown = ", ".join(f"{h}: {(d or 'unknown').removeprefix('sha256:')[:12]}" + (f" (bake {b[:12]})" if b else "")
                          for h, (d, b) in what.items())
        return FAILED, "image_mismatch", f"the hosts of the set pinned different images of {case.image}: {shown}"
    return None
