"""Measure: a case's container outcome + its raw log -> one classified measurement, and the case's result row.

The case's task measures once, where its log is (`measure`); the run's collect step only reads
those measurements (or a killed task's outcome file) and turns each planned case into a result row
(`result_row`, `not_run`). Pure functions over plain data; the only I/O is reading saved files.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from fleetbench.files import open_regular
from fleetbench.harnesses.base import Measured
from fleetbench.telemetry import parse_report
from fleetbench.telemetry.report import clean_report

if TYPE_CHECKING:  # the parsers load when a log is measured, not with the DAG file that names the statuses
    from fleetbench.parsing import ParsedLog

# Row statuses.
OK, FAILED, SKIPPED = "ok", "failed", "skipped"
_CORE_DUMP_MARKERS = ("core dumped", "吐核", "Aborted (core dumped)")


LOG_TAIL_BYTES = 64 * 1024  # the end of a log: its last words and the telemetry report line


def read_tail(path: str | None) -> str:
    """The end of a saved log (what classification and the telemetry report need), without reading it whole;
    "" when there is none or it is not a regular file."""
    if not path:
        return ""
    try:
        with open_regular(path) as f:
            f.seek(max(0, f.seek(0, 2) - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# Log classes that name the fault a process then aborts on (NCCL's or CUDA's, CUDA that could not start): they outrank
# a crash exit (134/139), as a fatal GPU OOM does; the exit status goes into the detail.
FAULT_CLASSES = ("nccl", "cuda_error", "cuda_driver")


def classify(outcome: dict, measured: Measured | ParsedLog | None, log_text: str,
             primary: str = "total images/sec") -> tuple[str, str | None, str | None]:
    """(status, failure_class, detail) from Docker's view of the container and what the harness read from the log.

    `measured` is the harness's reading (a tf_cnn_benchmarks ParsedLog is read as one); `primary` names the
    primary metric in the no_result detail. A fatal GPU OOM in the log outranks the exit status (the process
    died of it), but TF's INFO ``CUDA_ERROR_OUT_OF_MEMORY`` retry line alone does not: a crash (134/139) or a
    SIGKILL (137) after it is that, not gpu_oom, which capacity would take as an OOM on record. An NCCL or CUDA
    fault the log names (`FAULT_CLASSES`) outranks a crash exit (134/139) too: the process aborted on it."""
    from fleetbench.parsing.detect import oom_is_fatal

    if measured is not None and not isinstance(measured, Measured):
        from fleetbench.harnesses.tf_cnn import from_parsed

        measured = from_parsed(measured)
    if outcome.get("start_error_class"):
        return FAILED, outcome["start_error_class"], (outcome.get("error") or "")[:500]
    exit_code = outcome.get("exit_code")
    if outcome.get("killed_by_airflow"):
        return FAILED, "killed", outcome.get("error") or "the task was killed from Airflow"
    if outcome.get("timed_out"):
        return FAILED, "timeout", f"stopped after its timeout (exit {exit_code})"
    if outcome.get("engine_unreachable"):
        return FAILED, "engine_unreachable", (outcome.get("error") or "the Docker engine stopped answering")[:500]
    if outcome.get("oom_killed"):
        return FAILED, "oom_killed", f"the kernel OOM-killed the container (exit {exit_code})"
    log_class = measured.failure_class if measured is not None else None
    log_detail = measured.failure_detail if measured is not None else None
    if log_class == "gpu_oom" and oom_is_fatal(log_detail):
        return FAILED, "gpu_oom", log_detail
    tail = log_text[-4000:]
    if log_class in FAULT_CLASSES and exit_code in (134, 139):  # it aborted because of the fault its log names
        return FAILED, log_class, f"{log_detail} (then exit {exit_code}: crashed)"
    if exit_code in (134, 139) or any(m in tail for m in _CORE_DUMP_MARKERS):
        return FAILED, "core_dump", f"exit {exit_code}: " + (_last_line(tail) or "crashed")
    if exit_code == 137:
        return FAILED, "killed", "killed by SIGKILL (exit 137) without an OOM kill"
    if log_class:
        return FAILED, log_class, log_detail
    if exit_code not in (0, None):
        # the line the parser found (the exception), not its account of a missing result, which the exit explains
        found = log_detail if log_detail and log_detail in log_text else None
        return FAILED, "nonzero_exit", f"exit {exit_code}: " + _with_last_line(found, _last_line(tail))
    if measured is None or measured.primary_sample() is None:
        ended = "exited 0" if exit_code == 0 else "exit status unknown"
        why = f": {log_detail}" if log_detail else f" but printed no {primary}"
        return FAILED, "no_result", ended + why + _dropped(measured)
    return OK, None, _dropped(measured).removeprefix("; ") or None


def _with_last_line(log_detail: str | None, last: str) -> str:
    """The error line the parser found, then the harness's last words where they say something else."""
    if not log_detail:
        return last or "no output"
    if not last or last in log_detail or log_detail in last:
        return log_detail
    return f"{log_detail}; last line: {last}"


def _dropped(measured: Measured | None) -> str:
    detail = measured.dropped_detail() if measured is not None else None
    return f"; {detail}" if detail else ""


def _last_line(text: str) -> str:
    """The harness's last words (the telemetry wrapper's report line is not the harness's)."""
    lines = [ln.strip() for ln in text.strip().splitlines()
             if ln.strip() and not ln.startswith("FLEETBENCH_TELEMETRY ")]
    return lines[-1][:300] if lines else ""


def measure(case: dict, outcome: dict) -> tuple[dict, list[dict]]:
    """One case's measurement fields and its step samples.

    The case's task measures right after its container ends, on the worker that holds the log, and
    ships the result in its outcome (`measurement`): collect then needs no shared artifact folder.
    An outcome without it (e.g. read back from an outcome file) is measured here from the log.
    `case` names its harness and the harness's settings (default: tf_cnn_benchmarks); the fields carry
    the primary metric (metric, value, unit, better) and every sample under `metric_samples`.
    """
    if outcome.get("measurement"):
        return outcome["measurement"]["fields"], outcome["measurement"]["steps"]
    from fleetbench.harnesses import get as get_harness

    harness = get_harness(case.get("harness"))
    text = read_tail(outcome.get("log_path"))
    measured = None
    if text.strip():
        try:  # the whole log, streamed line by line
            measured = harness.measure(outcome["log_path"], case.get("harness_settings") or {})
        except (ValueError, OSError):
            measured = None
    planned = harness.primary_metric(case.get("harness_settings") or {})
    primary = (measured.primary if measured is not None else None) or planned[0]
    status, failure_class, detail = classify(
        outcome, measured, text,
        "total images/sec" if harness.name == "tf_cnn_benchmarks" else f"metric {primary or '(any)'}")
    ok = measured is not None and status == OK
    sample = measured.primary_sample() if ok else None
    if sample:
        unit, better = sample.unit, sample.better
    else:  # none measured: what the config says of the primary metric (nothing for one it does not name)
        unit, better = planned[1:] if primary == planned[0] else (None, None)
    fields = {
        "status": status,
        "failure_class": failure_class,
        "failure_detail": detail,
        "images_per_sec": measured.images_per_sec if ok else None,
        "accuracy_top1": measured.accuracy_top1 if ok else None,
        "metric": primary, "value": sample.value if sample else None, "unit": unit or None,
        "better": better or None,
        "step_count": measured.step_count if measured else 0,
        "exit_code": outcome.get("exit_code"),
        "started_at": outcome.get("started_at"),
        "finished_at": outcome.get("finished_at"),
        "duration_s": outcome.get("duration_s"),
        "log_path": outcome.get("log_path"),
        "command": outcome.get("command") or case.get("command"),
        # The container's peak memory, as the case's operator read it (fleetbench.telemetry.container_memory).
        "peak_mem_mib": outcome.get("peak_mem_mib"),
        "peak_mem_source": outcome.get("peak_mem_source"),
        # Every sample the log gave (also of a failed case: e.g. busbw of a run with wrong results).
        "metric_samples": [s.to_dict() for s in measured.samples] if measured else [],
    }
    fields.update(telemetry_fields(clean_report(parse_report(text)), outcome.get("rapl"), outcome.get("duration_s")))
    return fields, list(measured.steps) if measured else []


def cpu_util_pct(cpu: dict | None) -> float | None:
    """The container's share of the host's CPUs over the command: 100 x CPU seconds / (wall seconds x logical CPUs)."""
    cpu = cpu or {}
    usage, wall, count = cpu.get("usage_s"), cpu.get("wall_s"), cpu.get("count")
    if usage is None or not wall or not count:
        return None
    return round(min(100.0, 100.0 * usage / (wall * count)), 3)


def telemetry_fields(report: dict | None, rapl: dict | None = None, duration_s: float | None = None) -> dict:
    """Energy, power, GPU memory and CPU use from the telemetry wrapper's report and, for a CPU case, the
    host's RAPL reading (`CaseOutcome.rapl`): measured, or nothing (none; `fleetbench.metrics` estimates).

    `report` is a checked one (`fleetbench.telemetry.report.clean_report`): numbers are numbers."""
    cpu = (report or {}).get("cpu")
    telemetry = {**(report or {}), **({"rapl": rapl} if rapl else {})}
    fields = {"mean_cpu_util_pct": cpu_util_pct(cpu), "cpu_threads": (cpu or {}).get("count"),
              "cpu_model": (cpu or {}).get("model"), "cpu_sockets": (cpu or {}).get("sockets"),
              "telemetry_json": json.dumps(telemetry) if telemetry else None,
              "energy_source": "none", "energy_j": None, "mean_power_w": None, "peak_gpu_mem_mib": None,
              "mean_gpu_util_pct": None}
    rapl_j = (rapl or {}).get("energy_j")
    if report and report.get("nvml"):
        gpus = report.get("gpus") or []
        utils = [g["mean_util_pct"] for g in gpus if g.get("mean_util_pct") is not None]
        fields.update({
            "energy_source": report.get("energy_source") or "none",
            "energy_j": report.get("energy_j"),
            "mean_power_w": report.get("mean_power_w"),
            "peak_gpu_mem_mib": report.get("peak_mem_used_mib"),
            "mean_gpu_util_pct": round(sum(utils) / len(utils), 3) if utils else None,
        })
    elif isinstance(rapl_j, (int, float)) and rapl_j > 0:  # the CPU packages' counters, from start to end
        fields.update({"energy_source": "measured", "energy_j": float(rapl_j),
                       "mean_power_w": round(rapl_j / duration_s, 3) if duration_s else None})
    return fields


def not_run(status: str, failure_class: str | None, detail: str) -> dict:
    """Fields for a case that never ran (host unfit, image missing, task failed)."""
    now = datetime.now(timezone.utc).isoformat()
    return {"status": status, "failure_class": failure_class, "failure_detail": detail[:500], "images_per_sec": None,
            "accuracy_top1": None, "step_count": 0, "exit_code": None, "started_at": None, "finished_at": now,
            "duration_s": None, "log_path": None, "command": None, "peak_mem_mib": None, "peak_mem_source": None,
            **telemetry_fields(None)}


def outcome_from_file(log_dir: str, case_key: str) -> dict | None:
    """The outcome a case's task wrote next to its log (e.g. when it was killed before returning)."""
    from fleetbench.runs import outcome_path

    try:
        return json.loads(outcome_path(log_dir, case_key).read_text())
    except (OSError, ValueError):
        return None


def case_fields(case, verdict, image: dict | None, outcome: dict | None) -> tuple[dict, list[dict]]:
    """One planned case's measurement fields and steps, or why it has none: host not validated or unfit,
    image not prepared, task failed before reporting. `verdict` is the host's HostVerdict (or None)."""
    if verdict is None:
        fields = not_run(FAILED, "host_check_failed", "host validation did not finish")
    elif verdict.unfit:
        fields = not_run(SKIPPED, "host_unfit", f"host {case.host} is unfit: {verdict.reasons}")
    elif (devices := _devices(case, verdict)).skipped:
        fields = not_run(SKIPPED, devices.skip_class, devices.skip_detail)
    elif (getattr(case, "capacity", None) or {}).get("action") == "skip":
        fields = not_run(SKIPPED, "predicted_oom", case.capacity.get("note") or "predicted to run out of memory")
    elif (image or {}).get("failure_class"):
        fields = not_run(FAILED, image["failure_class"], image.get("error") or "image not prepared")
    elif outcome is None and image is None:  # the lane gave its verdict, then failed before its images were ready
        from fleetbench.runs import lane_id

        fields = not_run(FAILED, "task_failed", f"the host's task {lane_id(case.host)}.cases failed after the host "
                                                "check, before the case's image was prepared (see its task log)")
    elif outcome is None:
        fields = not_run(FAILED, "task_failed", "the case's task failed before reporting (see its task log)")
    else:
        return measure(case_of(case), outcome)
    return {**fields, **planned_metric(case)}, []


def _devices(case, verdict):
    """The case's devices on its host (fleetbench.hosts.devices): whole GPUs, MIG instances, or why neither."""
    from fleetbench.hosts.devices import assign

    return assign(case, verdict.host_facts)


def case_of(case) -> dict:
    """What `measure` needs of a planned case (fleetbench.plan.Case): its command and harness."""
    return {"command": case.command, "harness": case.harness, "harness_settings": case.harness_settings}


def planned_metric(case) -> dict:
    """The primary metric a case of its harness reports (for the rows of cases that never measured)."""
    from fleetbench.harnesses import get as get_harness

    metric, unit, better = get_harness(case.harness).primary_metric(case.harness_settings or {})
    return {"metric": metric, "unit": unit, "better": better}


def _gpu_health(verdict) -> str | None:
    """healthy | degraded | unfit: the host's GPUs when the case ran (None: not checked)."""
    from fleetbench.hosts.health import health_state

    return health_state(verdict.checks) if verdict is not None else None


def result_row(run, case, verdict, image: dict | None, fields: dict) -> dict:
    """A `benchmark_results` row: the case's identity and provenance (run, host facts, image) and its fields."""
    facts = verdict.host_facts if verdict is not None else None
    image = image or {}
    return {
        "dag_id": run.dag_id, "run_id": run.run_id, "logical_date": run.logical_date,
        "host": case.host, "case_key": case.case_key, "benchmark": case.benchmark, "harness": case.harness,
        "model": case.model,
        "batch_size_per_device": case.batch_size_per_device, "batch_size_global": case.batch_size_global,
        "num_gpus": case.num_gpus, "variable_update": case.variable_update, "device": case.device,
        "mig_profile": getattr(case, "mig_profile", None), "mig_instances": getattr(case, "mig_instances", None),
        "num_batches": case.num_batches, "image_name": case.image,
        # The registry digest; an image that only exists locally (no RepoDigest) is known by its image id.
        "image_ref": image.get("ref"), "image_digest": image.get("digest") or image.get("image_id"),
        # a baked image's own identity: what ran under the base digest (fleetbench.bake)
        "bake_inputs": image.get("bake_inputs"), "harness_revision": image.get("harness_revision"),
        "driver_version": facts.driver_version if facts else None,
        "cuda_driver_version": facts.cuda_driver_version if facts else None,
        "gpu_model": facts.gpu_model if facts else None,
        "host_gpu_health": _gpu_health(verdict),
        **capacity_fields(case, facts),
        **multinode_fields(case),
        **fields,
    }


def multinode_fields(case) -> dict:
    """A case's hosts and roles (fleetbench.multinode): the planned roles, which a measured case's fields
    replace with how each ended."""
    nodes = getattr(case, "nodes", 1) or 1
    if nodes <= 1:
        return {"nodes": 1, "host_set": None, "roles_json": None}
    return {"nodes": nodes, "host_set": ",".join(case.hosts), "roles_json": json.dumps(case.roles)}


HEALTH_ORDER = (None, "healthy", "degraded", "unfit")
PROVENANCE_WIDTH = {"driver_version": 50, "cuda_driver_version": 20, "gpu_model": 200}  # their columns' widths


def set_provenance(case, verdicts: dict) -> dict:
    """A multi-node case's driver, CUDA driver, GPU model and GPU health are its whole set's, not its first host's:
    one value where every host of the set has it, else each host's value in set order (`a+b`), so a driver
    upgraded on any host of the set starts a new regression segment and `compare --driver` matches neither side
    while the set is mixed; the health is the worst of the set. An empty dict for a single-host case or a set
    not validated whole (its first host's values stay, as for a case that did not run)."""
    hosts = getattr(case, "hosts", None) or []
    if (getattr(case, "nodes", 1) or 1) <= 1 or len(hosts) < 2 or any(verdicts.get(h) is None for h in hosts):
        return {}
    facts = [verdicts[h].host_facts for h in hosts]
    out = {name: _set_value([getattr(f, name) for f in facts], width) for name, width in PROVENANCE_WIDTH.items()}
    health = [_gpu_health(verdicts[h]) for h in hosts]
    out["host_gpu_health"] = max(health, key=lambda v: HEALTH_ORDER.index(v) if v in HEALTH_ORDER else 2)
    return out


def _set_value(values: list, width: int) -> str | None:
    """One value, or the distinct values in set order joined by `+` (cut to the column's width, with a digest of
    the whole so two different sets never read the same)."""
    distinct = list(dict.fromkeys(str(v) if v is not None else "?" for v in values))
    if len(distinct) == 1:
        return values[0]
    joined = "+".join(distinct)
    if len(joined) <= width:
        return joined
    import hashlib

    return f"{joined[:width - 9]}~{hashlib.sha256(joined.encode()).hexdigest()[:8]}"


def capacity_fields(case, facts=None) -> dict:
    """The plan's capacity verdict for the case (fleetbench.capacity): capacity, prediction, note. A whole-GPU case's
    capacity is its host's GPU memory as this run's check read it, where it read one: the plan knew none on a host's
    first night (no facts stored yet: its reading could not be told from a framework's reservation of the whole card,
    `capacity.fit`), and the stored facts are the night before's (a GPU swapped since: an OOM on the new, smaller card
    was recorded with the old card's memory, a bound that skipped the batch on every host with that much)."""
    from fleetbench.capacity import gpu_memory_of, row_fields

    out = row_fields(case)
    if (case.device == "gpu" and not getattr(case, "mig_profile", None) and (getattr(case, "nodes", 1) or 1) <= 1
            and facts is not None and facts.gpus):
        tonight = gpu_memory_of({"gpus": [{"memory_total_mib": g.memory_total_mib} for g in facts.gpus]})
        if tonight is not None:
            out["capacity_mib"] = tonight
    return out


def collect_rows(plan, verdicts: dict, images: dict, outcomes: list[dict]) -> dict:
    """The run's rows: one classified result row per planned case of `plan` (`fleetbench.run_model.RunPlan`), its
    step rows and metric samples. `verdicts` and `images` are by host (HostVerdict, HostImages); `outcomes` are the
    case tasks' own. A case whose task returned nothing is read from its outcome file (`fleetbench.runs`); a
    multi-node case a host of its set could not run is recorded with why (`fleetbench.multinode.set_problem`)."""
    from fleetbench import runs
    from fleetbench.multinode import set_problem
    from fleetbench.warehouse.rows import metric_sample_rows

    run = plan.run
    done = {}
    for o in outcomes:
        # Another execution's (a cleared or re-backfilled run whose host now has fewer cases: Airflow marks the
        # map indexes past the new count removed but keeps their XComs, and the lane's outcomes read them after
        # this execution's own) is not this night's, never in place of this execution's outcome of the case.
        if run.started_at and o.get("run_started_at") not in (None, run.started_at):
            continue
        done[(o["host"], o["case_key"])] = o
    rows, step_rows, metric_rows = [], [], []
    for case in plan.cases:
        verdict, host_images = verdicts.get(case.host), images.get(case.host)
        image = host_images.images.get(case.image) if host_images else None
        outcome = done.get((case.host, case.case_key))
        problem = set_problem(case, verdicts, images) if case.nodes > 1 else None
        if outcome is None and problem is None and verdict is not None and not verdict.unfit:
            outcome = outcome_from_file(str(runs.case_log_dir(run.dag_id, run.run_id, case.host)), case.case_key)
            if outcome is not None and run.started_at and outcome.get("run_started_at") not in (None, run.started_at):
                outcome = None  # an earlier execution's: this one's task never got to run the case
        if problem is not None and outcome is None:  # a host of the set could not run it
            fields, steps = {**not_run(*problem), **planned_metric(case)}, []
        else:
            fields, steps = case_fields(case, verdict, image, outcome)
        fields = dict(fields)
        samples = fields.pop("metric_samples", None) or []
        rows.append({**result_row(run, case, verdict, image, fields), **set_provenance(case, verdicts),
                     "attempt_id": _attempt_id(run, case, verdict, image, outcome, fields)})
        key = {"dag_id": run.dag_id, "run_id": run.run_id, "host": case.host, "case_key": case.case_key}
        step_rows += [{**key, **s} for s in steps]
        metric_rows += metric_sample_rows(key, samples)
    return {"rows": rows, "steps": step_rows, "metrics": metric_rows}


def _attempt_id(run, case, verdict, image: dict | None, outcome: dict | None, fields: dict) -> str:
    """The attempt's identity (`fleetbench.warehouse.attempts`): its container outcome when the case ran;
    else the run's start and the host check's time, which a cleared and rerun run renews."""
    from fleetbench.warehouse.attempts import attempt_id

    ran = verdict is not None and not verdict.unfit and not (image or {}).get("failure_class")
    return attempt_id(case.host, case.case_key, outcome if ran else None,
                      (run.started_at, verdict.collected_at if verdict else None, fields["status"],
                       fields["failure_class"]))
