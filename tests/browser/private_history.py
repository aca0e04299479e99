"""Results of a second DAG, `private_benchmark`, next to `fleet_history`'s `fleet_benchmark`, for the tests of
who sees what in the view: a reader who may read only `fleet_benchmark` must see none of them.

One night, after fleet_benchmark's last (so it would be the newest run and move the default window if it
leaked): a host and a model only this DAG has (gpu-secret, secretnet), an ok result on gpu-a (a host both
DAGs run) with an images/sec no fleet result has, a failed case, and an open regression on gpu-a.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from warehouse_rows import result_row
from warehouse_rows import run_row as plain_run_row

DAG = "private_benchmark"
HOST, MODEL = "gpu-secret", "secretnet"
NIGHT = datetime(2026, 11, 6, 3, 0, tzinfo=timezone.utc)
RUN_ID = f"scheduled__{NIGHT.isoformat()}"
SECRET_IPS = (12345.0, 54321.0)  # images/sec of its ok results; no fleet_benchmark result has these


def private_rows() -> list[dict]:
    when = {"dag_id": DAG, "run_id": RUN_ID, "logical_date": NIGHT.isoformat(),
            "started_at": (NIGHT + timedelta(minutes=1)).isoformat(),
            "finished_at": (NIGHT + timedelta(minutes=2)).isoformat()}
    return [
        result_row(f"tf.{MODEL}.bs64.g1.replicated", host=HOST, ips=SECRET_IPS[0], model=MODEL,
                   driver_version="999.99", **when),
        result_row("tf.resnet50.bs64.g1.replicated", host="gpu-a", ips=SECRET_IPS[1], driver_version="999.99", **when),
        result_row("tf.resnet50.bs256.g1.replicated", host=HOST, ips=None, status="failed", batch_size_per_device=256,
                   failure_class="gpu_oom", **when),
    ]


def store_private_history(engine) -> None:
    """Store the night (the warehouse must be migrated, e.g. by `fleet_history.store_history`)."""
    from fleetbench.regression import store_findings
    from fleetbench.warehouse import store_run

    rows = private_rows()
    run = {**plain_run_row(RUN_ID, dag_id=DAG), "logical_date": NIGHT.isoformat(), "started_at": NIGHT.isoformat(),
           "finished_at": (NIGHT + timedelta(minutes=30)).isoformat(), "cases_total": 3, "cases_ok": 2,
           "cases_failed": 1}
    store_run(engine, run, [], rows)
    store_findings(engine, DAG, RUN_ID, [{
        "dag_id": DAG, "run_id": RUN_ID, "host": "gpu-a", "case_key": "tf.resnet50.bs64.g1.replicated",
        "metric": "images_per_sec", "direction": "higher", "baseline_value": 60000.0, "value": SECRET_IPS[1],
        "delta_pct": (SECRET_IPS[1] - 60000.0) / 60000.0 * 100, "z_score": -9.0, "p_value": 0.001, "baseline_n": 3,
        "baseline_window": [], "changes": {}, "severity": "major",
        "detected_at": (NIGHT + timedelta(hours=1)).isoformat()}])


def secrets_in(text: str) -> list[str]:
    """The private DAG's names and numbers that appear in `text` (a page, JSON or CSV): none, for a reader of
    fleet_benchmark only."""
    marks = [DAG, HOST, MODEL, RUN_ID, "999.99"] + [f"{v:,.2f}" for v in SECRET_IPS] + [repr(v) for v in SECRET_IPS]
    return [m for m in marks if m in text]
