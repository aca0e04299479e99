"""Multi-node cases: host sets, role layouts, ports and the cluster spec of a case that spans hosts, and how
the outcomes of its containers become one result (README "Multi-node cases").

A benchmark with `nodes: [2]` plans one case per set of 2 hosts (its hosts in config order, taken in
consecutive disjoint sets); the case's `host` is the set's first host, where the chief (worker 0) runs and
whose case folder keeps every role's log. Pure functions over plain data, except `port_free`, which asks
the network.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Sequence

PS, WORKER = "ps", "worker"
# The chief has joined the cluster and its session runs (tf_cnn_benchmarks prints it before the first step).
JOINED_MARKER = "Running warm up"
PORT_TRIES = 64  # ports tried per role past base_port before the case fails port_unavailable


def host_sets(hosts: Sequence[str], nodes: int) -> list[list[str]]:
    """Consecutive disjoint sets of `nodes` hosts, in the order given; hosts left over make no set."""
    return [list(hosts[i:i + nodes]) for i in range(0, len(hosts) - nodes + 1, nodes)]


def set_case_key(point_key: str, host_set: Sequence[str]) -> str:
    """`<point key>.n<N>.<host>+<host>...`: the matrix point, the number of hosts and the set, by name."""
    return f"{point_key}.n{len(host_set)}.{'+'.join(host_set)}"


def layout(host_set: Sequence[str], ps_per_node: int, workers_per_node: int, ps_nodes: str = "all") -> list[dict]:
    """The roles of a ps_worker case: workers (worker 0 on the first host: the chief), then parameter servers.

    Task indexes count per job in host order, as tf_cnn_benchmarks' `--ps_hosts`/`--worker_hosts` list them."""
    workers = [{"host": h, "job": WORKER} for h in host_set for _ in range(workers_per_node)]
    ps_hosts = host_set if ps_nodes == "all" else host_set[:1]
    servers = [{"host": h, "job": PS} for h in ps_hosts for _ in range(ps_per_node)]
    return ([{**r, "task_index": i} for i, r in enumerate(workers)]
            + [{**r, "task_index": i} for i, r in enumerate(servers)])


def role_name(role: dict) -> str:
    """`worker0`, `ps1`: how logs, containers and details name a role."""
    return f"{role['job']}{role['task_index']}"


def is_chief(role: dict) -> bool:
    return role["job"] == WORKER and role["task_index"] == 0


class PortUnavailable(RuntimeError):
    """No free port for a role within PORT_TRIES of the case's base port."""


def port_free(address: str, port: int, local: bool) -> bool:
    """Nobody listens on address:port. On this machine (a local engine) the port must also be bindable (it is
    what the container's server will do); on another host, a connection that is not accepted means free."""
    if local:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                # not an address of this machine (EADDRNOTAVAIL): the connect below is all we can ask
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


def role_command(command: Sequence[str], roles: Sequence[dict], ports: Sequence[int], addresses: dict[str, str],
                 role: dict) -> list[str]:
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


def classify_role(role: dict, outcome: dict) -> RoleEnd:
    """One role's end, classified on its own (`fleetbench.measure.classify` of its container and log): a role
    fleetbench stopped is not judged, and only the chief has to print a result."""
    from fleetbench.harnesses.tf_cnn import from_parsed
    from fleetbench.measure import OK, classify, read_tail
    from fleetbench.parsing import parse_log_file

    name = role_name(role)
    if outcome.get("stopped"):
        return RoleEnd(name, role["host"], role["job"], OK, None, "stopped by fleetbench", outcome.get("exit_code"),
                       stopped=True, started_at=outcome.get("started_at"), finished_at=outcome.get("finished_at"))
    try:
        measured = from_parsed(parse_log_file(outcome["log_path"], "tf_cnn_benchmarks"))
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
