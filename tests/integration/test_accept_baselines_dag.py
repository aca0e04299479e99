"""fleet_benchmark's `accept_baselines` parameter, through dag.test(): the named hosts' and cases' current level
becomes their baseline the way `fleetbench regressions accept` makes it (one shared function), and an item that
matches nothing fails the run naming it.

The warehouse first holds fourteen nights of a case on localhost: ten on the old driver, then four on a new
one 20 % slower, the last night's confirmed regression stored as the DAG stores it. The run itself measures
one real smoke case on localhost.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from fleet_configs import run_fleet_dag, smoke_config, write_config
from regression_rows import fetch_regressions
from warehouse_rows import result_row, run_row

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

SEEDED = "seeded.resnet50.g1"
OLD, NEW = "535.104.05", "550.54.14"
NOISE = [0.0, 0.4, -0.3, 0.2, -0.1, 0.1, -0.2, 0.3, -0.4, 0.2, 0.1, -0.1, 0.3, -0.2]
CHANGE = 10
ONE_CASE = {"models": ["lenet"], "batch_sizes": [4], "num_batches": 3}


def seed_history(engine) -> tuple[list[str], datetime]:
    """Fourteen nights before today of SEEDED on localhost; returns their run ids and the new driver's first night."""
    from fleetbench.regression import assess_run, store_findings
    from fleetbench.warehouse import store_run

    today = datetime.now(timezone.utc).replace(hour=2, minute=0, second=0, microsecond=0)
    nights = [today - timedelta(days=len(NOISE) - n) for n in range(len(NOISE))]
    run_ids = []
    for n, when in enumerate(nights):
        run_id = f"scheduled__{when.isoformat()}"
        ips = 1000.0 * (1 + NOISE[n] / 100) * (0.8 if n >= CHANGE else 1.0)
        row = result_row(SEEDED, run_id=run_id, host="localhost", ips=ips, logical_date=when.isoformat(),
                         duration_s=100_000 / ips, driver_version=NEW if n >= CHANGE else OLD)
        store_run(engine, {**run_row(run_id), "logical_date": when.isoformat()}, [], [row])
        run_ids.append(run_id)
    store_findings(engine, "fleet_benchmark", run_ids[-1], assess_run(engine, "fleet_benchmark", run_ids[-1]).findings)
    return run_ids, nights[CHANGE]


def open_regressions(engine, run_id: str) -> list[tuple]:
    return [(r["host"], r["case_key"], r["metric"]) for r in fetch_regressions(engine, run_id=run_id)
            if r["kind"] == "regression" and r["status"] == "confirmed"]


def test_accept_baselines_accepts_like_the_cli(airflow_db, data_dir, smoke_image, tmp_path, monkeypatch, capfd,
                                               caplog):
    caplog.set_level(logging.INFO, logger="fleetbench")
    from fleetbench.warehouse import fetch_results, get_engine, upgrade
    from fleetbench.warehouse.schema import regression_acceptances as ra

    engine = get_engine()
    upgrade(engine)
    run_ids, new_driver_night = seed_history(engine)
    assert ("localhost", SEEDED, "images_per_sec") in open_regressions(engine, run_ids[-1])

    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    dag_run = run_fleet_dag(monkeypatch, config, run_conf={**ONE_CASE, "accept_baselines": ["localhost"]})
    assert dag_run.state == "success"
    with engine.connect() as conn:
        rows = {r.case_key: r for r in conn.execute(select(ra).where(ra.c.host == "localhost"))}
    tonight = next(k for k in rows if k != SEEDED)  # the smoke case measured by this run
    assert set(rows) == {SEEDED, tonight}
    # The seeded case: from the open regression's first night (the new driver's), as the CLI accepts it.
    seeded = rows[SEEDED]
    assert seeded.dag_id == "fleet_benchmark" and seeded.since.replace(tzinfo=timezone.utc) == new_driver_night
    assert seeded.accepted_by == "dag_test"  # dag.test()'s triggering user
    assert seeded.note == f"accept_baselines of run {dag_run.run_id}"
    # Its newest night was assessed again: the regression is closed, the list of open ones no longer has it.
    assert open_regressions(engine, run_ids[-1]) == []
    # The run's own case: from its newest segment's first night, i.e. tonight.
    [measured] = fetch_results(engine, run_id=dag_run.run_id)
    assert measured["case_key"] == tonight and measured["status"] == "ok"
    assert rows[tonight].since.replace(tzinfo=timezone.utc) == datetime.fromisoformat(measured["logical_date"])
    assert f"accepted localhost {SEEDED} from {new_driver_night.isoformat()} on as the new baseline (the open " \
           "regression's level)" in caplog.text + capfd.readouterr().out  # the report task's log, wherever it went

    # The same acceptance again through the CLI's function adds nothing (one row per DAG, host, case and since).
    from fleetbench.regression import accept

    again = accept(engine, "localhost", SEEDED, "fleet_benchmark")
    assert [(a["since"], a["had_open_regression"]) for a in again] == [(new_driver_night, False)]
    with engine.connect() as conn:
        assert len(conn.execute(select(ra).where(ra.c.case_key == SEEDED)).all()) == 1


def test_an_item_that_matches_nothing_fails_the_run_naming_it(airflow_db, data_dir, smoke_image, tmp_path,
                                                             monkeypatch, capfd, caplog):
    caplog.set_level(logging.INFO, logger="fleetbench")
    from fleetbench.warehouse import get_engine, upgrade
    from fleetbench.warehouse.schema import regression_acceptances as ra

    engine = get_engine()
    upgrade(engine)
    run_ids, _ = seed_history(engine)
    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    dag_run = run_fleet_dag(monkeypatch, config, run_conf={
        **ONE_CASE, "accept_baselines": [f"localhost/{SEEDED}", "localhost/no.such.case"]})
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    # the comparison fails the report task (a leaf: the run fails), after the report of what is stored is written
    assert states["store"] == "success" and states["report"] == "failed"
    out = caplog.text + capfd.readouterr().out
    assert "accept_baselines: 'localhost/no.such.case' matched no ok result of fleet_benchmark" in out
    assert "the report was written; the comparison's error follows" in out
    assert (data_dir / "reports" / "report.html").is_file()
    # The item that matched was accepted, and the night's findings are stored.
    with engine.connect() as conn:
        assert [r.case_key for r in conn.execute(select(ra))] == [SEEDED]
    assert open_regressions(engine, run_ids[-1]) == []


@pytest.mark.parametrize("conf, needle", [
    ({"accept_baselines": ["gpu-99"]}, "gpu-99"),  # not a host of the config: refused at trigger time
    ({"accept_baselines": ["localhost/bad case; rm"]}, "bad case; rm"),
    ({"accept_baselines": "localhost"}, "localhost"),  # not a list
])
def test_a_bad_accept_baselines_is_refused_at_trigger_time(airflow_db, data_dir, smoke_image, tmp_path, monkeypatch,
                                                           conf, needle):
    from airflow.sdk.exceptions import ParamValidationError

    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    with pytest.raises(ParamValidationError) as info:
        run_fleet_dag(monkeypatch, config, run_conf=conf)
    assert needle in str(info.value)
