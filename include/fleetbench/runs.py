"""Where a run's files are and what its containers are called: run folders, tokens, labels, outcome paths.

One run of a DAG keeps its artifacts under `<artifacts>/<dag_id>/<run_id>/`: per host, the probe
outputs (`hosts/<host>/facts/`) and each case's log and outcome (`hosts/<host>/cases/<case_key>.log`,
`.outcome.json`). Containers are named from a short token of the run and labelled under one prefix,
`org.fleetbench`, which maintenance and the cleanup rules read.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fleetbench.paths import artifacts_dir

LABEL_PREFIX = "org.fleetbench"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def label(name: str) -> str:
    """`org.fleetbench.<name>`: every label fleetbench sets."""
    return f"{LABEL_PREFIX}.{name}"


def safe_name(text: str) -> str:
    """`text` as a file or container name: letters, digits and `_.-`, at most 120 characters. A longer one keeps
    its first 111 and a digest of the whole, so two names that differ only past the cut stay apart (two long case
    keys of one host shared a container name, and each case's 409 removed the other's container)."""
    name = _UNSAFE.sub("_", text).strip("_.-") or "x"
    if len(name) <= 120:
        return name
    return f"{name[:111]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def run_dir(dag_id: str, run_id: str) -> Path:
    return artifacts_dir() / safe_name(dag_id) / safe_name(run_id)


def run_token(dag_id: str, run_id: str) -> str:
    """Short stable id of a DAG run, used in container names."""
    return hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:10]


def facts_dir(dag_id: str, run_id: str, host: str) -> Path:
    """Where a host's probe outputs of the run are saved."""
    return run_dir(dag_id, run_id) / "hosts" / safe_name(host) / "facts"


def case_log_dir(dag_id: str, run_id: str, host: str) -> Path:
    """Where a host's case logs and outcome files of the run are saved."""
    return run_dir(dag_id, run_id) / "hosts" / safe_name(host) / "cases"


MAX_FILE_STEM = 200  # a file name is at most 255 bytes (ext4, xfs): room for `.worker31.log.tmp` and the like


def file_stem(case_key: str) -> str:
    """A case's files' name before their suffix: its key, or for a key longer than MAX_FILE_STEM (a multi-node set of
    long host names: case keys go to 250) its start and a digest of the whole; such a case ran, then lost its
    result to ENAMETOOLONG writing its logs."""
    if len(case_key.encode()) <= MAX_FILE_STEM:
        return case_key
    head = case_key.encode()[:MAX_FILE_STEM - 13].decode(errors="ignore")
    return f"{head}-{hashlib.sha256(case_key.encode()).hexdigest()[:12]}"


def outcome_path(log_dir: str | Path, case_key: str) -> Path:
    """The outcome file a case's task writes next to its log (read back when the task died before returning)."""
    return Path(log_dir) / f"{file_stem(case_key)}.outcome.json"


def log_path(log_dir: str | Path, case_key: str) -> Path:
    return Path(log_dir) / f"{file_stem(case_key)}.log"


def push_killed_outcome(ti, outcome: dict | None, log) -> None:
    """A case killed from Airflow fails its task, so nothing returns its outcome: push it as the task's return
    value, so `store` on another machine records it `killed` with its detail without a shared folder (the
    outcome file stays too). Called from the task's main thread only: after Airflow's SIGTERM handler (on_kill)
    returned, or from on_kill where the task runner calls it after an execution_timeout, never from a signal
    handler, which may have interrupted a request to the supervisor. Best effort: a push that fails is logged."""
    if ti is None or outcome is None:
        return
    try:
        ti.xcom_push(key="return_value", value=outcome)
    except Exception as exc:  # the outcome file remains
        log.warning("case %s: the killed case's outcome could not be pushed to XCom (%s); store reads its outcome "
                    "file where it shares the folder", outcome.get("case_key"), exc)


def container_name(dag_id: str, run_id: str, host: str, case_key: str) -> str:
    return safe_name(f"fb-{run_token(dag_id, run_id)}-{host}-{case_key}")


def case_labels(dag_id: str, run_id: str, host: str, case_key: str, timeout_s: int) -> dict[str, str]:
    """A case container's labels: what maintenance recognises it by, and its own timeout (an orphan past it is
    reaped)."""
    return {
        label("managed"): "true",
        label("dag_id"): dag_id,
        label("run_id"): run_id,
        label("host"): host,
        label("case_key"): case_key,
        label("timeout_s"): str(timeout_s),
    }


def lane_id(host: str) -> str:
    """The task group (id prefix) of a host's lane: `host_<name>`, a `.` of the name (an FQDN such as gpu01.lab)
    as `_`, since Airflow's group ids take letters, digits, `_` and `-` only. The config check refuses two hosts
    whose names give one id (fleetbench.config)."""
    return "host_" + host.replace(".", "_")


def pool_name(host: str) -> str:
    """The Airflow pool of a host's lane: one slot, so one benchmark at a time on the host's GPUs."""
    return f"fleetbench_{safe_name(host)}"


def pools(cfg) -> dict:
    """`airflow pools import` JSON for every host of a fleet config: one single-slot pool each."""
    return {pool_name(h.name): {"slots": 1, "description": f"fleetbench: one benchmark at a time on {h.name}",
                                "include_deferred": False} for h in cfg.hosts}
