"""The run's own rows: `runs` (one per DAG run, with its counts) and `host_facts` (one per validated host)."""

from __future__ import annotations

import json
from datetime import datetime, timezone


def run_row(run, counts: dict[str, int], total: int) -> dict:
    """The `runs` row of a RunInfo, finished now; `counts` by status (ok, failed, skipped)."""
    return {
        "dag_id": run.dag_id, "run_id": run.run_id, "logical_date": run.logical_date, "run_type": run.run_type,
        "fleet": run.fleet, "config_digest": run.config_digest, "started_at": run.started_at,
        "finished_at": datetime.now(timezone.utc).isoformat(), "cases_total": total,
        "cases_ok": counts.get("ok", 0), "cases_failed": counts.get("failed", 0),
        "cases_skipped": counts.get("skipped", 0),
    }


def host_row(run, verdict) -> dict:
    """The `host_facts` row of a host's HostVerdict: key facts as columns, all of them as JSON."""
    from fleetbench.hosts.health import health_issues, health_state

    facts = verdict.host_facts
    state = health_state(verdict.checks)
    return {
        "dag_id": run.dag_id, "run_id": run.run_id, "host": verdict.host, "verdict": verdict.verdict,
        "reasons": verdict.reasons, "kernel": facts.kernel, "docker_version": facts.docker_version,
        "driver_version": facts.driver_version, "cuda_driver_version": facts.cuda_driver_version,
        "gpu_count": len(facts.gpus) if facts.gpus is not None else None, "gpu_model": facts.gpu_model,
        "nvidia_runtime": facts.nvidia_runtime, "facts_json": json.dumps(verdict.facts),
        "checks_json": json.dumps(verdict.checks), "collected_at": verdict.collected_at,
        "gpu_health": state, "gpu_health_issues": health_issues(verdict.checks) or None,
        "gpu_health_json": json.dumps(facts.health()) if state else None,
    }


def metric_sample_rows(key: dict, samples: list[dict]) -> list[dict]:
    """`result_metrics` rows of one case's metric samples (fleetbench.harnesses.base.MetricSample dicts);
    `key` is the case's dag_id, run_id, host and case_key. Labels are stored as sorted JSON (part of the key)."""
    return [{**key, "metric": s["metric"], "labels": json.dumps(s.get("labels") or {}, sort_keys=True),
             "value": s["value"], "unit": s["unit"], "better": s["better"]} for s in samples]
