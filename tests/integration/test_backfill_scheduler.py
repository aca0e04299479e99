"""Backfill after a driver upgrade, for real: `airflow backfill create` executed by a running scheduler
(LocalExecutor). Three past nights give exactly 3 x cases rows; reprocessing one night replaces its
current rows and adds none to the nights' results (the earlier attempts are kept aside: see
test_backfill_attempts_scheduler.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_cluster import LocalAirflow
from fleet_configs import smoke_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.scheduler]


def rows_by_night(engine):
    """Rows of the backfilled nights (a scheduled run of tonight may also happen: the DAG is unpaused)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "select logical_date, count(*), min(stored_at), max(driver_version) is null, min(status) "
            "from benchmark_results where logical_date < '2026-11-04' "
            "group by logical_date order by logical_date")).all()


def test_backfill_three_nights_then_rerun_one(tmp_path, pg_url, smoke_image, docker_api):
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8, 16), num_batches=5)
    config = write_config(tmp_path / "fleet.yaml", cfg)
    warehouse = f"sqlite:///{tmp_path}/warehouse.db"
    env = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse,
           "FLEETBENCH_DATA_DIR": str(tmp_path / "data")}
    from fleetbench.warehouse import get_engine

    engine = get_engine(warehouse)
    with LocalAirflow(tmp_path / "airflow", pg_url, env=env) as airflow:
        airflow.import_pools(config)
        airflow.wait_for_dag("fleet_benchmark")
        airflow.cli("backfill", "create", "--dag-id", "fleet_benchmark", "--from-date", "2026-11-01T00:00:00",
                    "--to-date", "2026-11-03T12:00:00", "--reprocess-behavior", "failed")
        runs = airflow.wait_for_runs("fleet_benchmark", 3, timeout=400, run_type="backfill")
        assert [r["state"] for r in runs] == ["success"] * 3, airflow.logs()
        assert {r["run_type"] for r in runs} == {"backfill"}
        nights = rows_by_night(engine)
        assert len(nights) == 3 and [n[1] for n in nights] == [2, 2, 2]  # exactly 3 nights x 2 cases
        assert all(n[4] == "ok" for n in nights)
        first_store = {n[0]: n[2] for n in nights}
        airflow.wait_for_backfills()

        # The operator reruns one night (e.g. after a driver upgrade): its current rows are replaced, not added.
        airflow.cli("backfill", "create", "--dag-id", "fleet_benchmark", "--from-date", "2026-11-02T00:00:00",
                    "--to-date", "2026-11-02T12:00:00", "--reprocess-behavior", "completed")
        import time

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            nights = rows_by_night(engine)
            backfills = [r for r in airflow.runs("fleet_benchmark") if r["run_type"] == "backfill"]
            if (any(n[2] != first_store[n[0]] for n in nights)
                    and all(r["state"] in ("success", "failed") for r in backfills)):
                break
            time.sleep(2)
        runs = [r for r in airflow.runs("fleet_benchmark") if r["run_type"] == "backfill"]
        assert len(runs) == 3 and all(r["state"] == "success" for r in runs), runs
    nights = rows_by_night(engine)
    assert [n[1] for n in nights] == [2, 2, 2]
    changed = [n[0] for n in nights if n[2] != first_store[n[0]]]
    assert len(changed) == 1 and "2026-11-02" in str(changed[0])
    with engine.connect() as conn:
        assert conn.execute(text("select count(*) from runs where logical_date < '2026-11-04'")).scalar() == 3
    assert docker_api.containers(all=True, filters={"label": "org.fleetbench.dag_id=fleet_benchmark",
                                                    "status": "running"}) == []
