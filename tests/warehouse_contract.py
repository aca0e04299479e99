"""The warehouse's contract, run against SQLite (unit) and PostgreSQL (integration): writes, schema, migrations."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import pytest
from sqlalchemy import MetaData, Table, bindparam, func, inspect, select, text
from sqlalchemy.exc import IntegrityError

from fleetbench.timestamps import utc as _dt
from fleetbench.warehouse import (
    current_revision,
    downgrade,
    fetch_capacity_features,
    fetch_results,
    get_engine,
    latest_run_id,
    store_run,
    upgrade,
)
from fleetbench.warehouse.schema import benchmark_results, host_facts, regressions, result_metrics, runs, steps
from warehouse_rows import DERIVED, result_row, run_row, step_rows

# 0024: 0016's OOM indexes repaired; 0023: bake_inputs, harness_revision; 0022: whole-GPU scaled_gpus masks; 0021:
# run_case_rollup.mig_profile, nodes; 0020: host_month_rollup.model_runs; 0019: regressions.mailed_at; 0018:
HEAD = "0024"  # torch_synthetic precision from --precision; 0017: CPU cases out of the GPU rollups; 0016: partial
# indexes; 0015: superseded_host_facts; 0014: multi-node cases; 0013: regression units; 0012: MIG
NEW_RESULT_COLUMNS = set(DERIVED)  # the derived-metric columns revision 0003 adds
REGRESSION_COLUMNS = {  # name: nullable, as the regression detector expects them
    "id": False, "dag_id": False, "run_id": False, "host": False, "case_key": False, "metric": False,
    "direction": False, "baseline_value": False, "value": False, "delta_pct": False, "z_score": True,
    "p_value": True, "baseline_n": False, "baseline_window": False, "changes": True, "severity": False,
    "detected_at": False, "kind": False, "status": False, "basis": True, "since_run_id": True, "since_date": True,
    "segment": True, "baseline_segment": True, "detectable_pct": True, "same_change_as": True, "unit": True,
    "mailed_at": True,
}
CAPACITY_COLUMNS = ["dag_id", "run_id", "logical_date", "host", "case_key", "model", "batch_size_per_device",
                    "num_gpus", "precision", "gpu_model", "peak_gpu_mem_mib", "mean_power_w", "energy_source",
                    "mean_gpu_util_pct", "images_per_sec", "status", "failure_class", "gpu_oom",
                    # revision 0009
                    "benchmark", "image_name", "device", "batch_size_global", "command", "peak_mem_mib",
                    "peak_mem_source", "capacity_mib", "predicted_mem_mib", "capacity_note", "oom"]


def count(engine, table, **where) -> int:
    query = select(func.count()).select_from(table)
    for k, v in where.items():
        query = query.where(table.c[k] == v)
    with engine.connect() as conn:
        return conn.execute(query).scalar()


# -- writes ---------------------------------------------------------------------------------------
def check_store_and_rerun_replaces(engine):
    upgrade(engine)
    upgrade(engine)  # idempotent
    store_run(engine, run_row(), [], [result_row("a", **DERIVED), result_row("b")],
              step_rows("a", 3) + step_rows("b", 3))
    assert count(engine, benchmark_results) == 2 and count(engine, steps) == 6
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    for column, value in DERIVED.items():  # the derived metrics round-trip
        assert rows["a"][column] == (pytest.approx(value) if isinstance(value, float) else value), column
    assert all(rows["b"][c] is None for c in NEW_RESULT_COLUMNS)
    # A retry of the same run writes new numbers and fewer steps: replaced, not duplicated.
    store_run(engine, run_row(), [],
              [result_row("a", ips=200.0, **{**DERIVED, "speedup_efficiency": 0.8, "cost_usd": 0.5}), result_row("b")],
              step_rows("a", 2) + step_rows("b", 3))
    assert count(engine, benchmark_results) == 2 and count(engine, runs) == 1
    assert count(engine, steps, case_key="a") == 2
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert rows["a"]["images_per_sec"] == 200.0
    assert (rows["a"]["speedup_efficiency"], rows["a"]["cost_usd"]) == (0.8, 0.5)
    assert rows["a"]["started_at"] == "2026-12-01T02:00:05+00:00"
    assert rows["a"]["command"] == '["python", "x.py"]'
    # Another run adds rows; the latest run is found.
    store_run(engine, {**run_row("r2"), "finished_at": "2026-12-02T02:10:00+00:00"}, [], [result_row("a", run_id="r2")])
    assert count(engine, benchmark_results) == 3
    assert latest_run_id(engine) == "r2"


def check_rerun_with_fewer_cases_leaves_no_stale_rows(engine):
    """Run r1 stored with cases a, b on hosts h1, h2, then again with only a on h1: b's result, steps,
    rollups and h2's host facts go in the same transaction; another run's rows stay. A write with
    complete=False (one host's rows of a run) adds without deleting."""
    from fleetbench.warehouse.schema import host_facts, run_case_rollup, run_host_rollup

    upgrade(engine)
    hosts = [{"dag_id": "fleet_benchmark", "run_id": "r1", "host": h, "verdict": "ready"} for h in ("h1", "h2")]
    both = [result_row("a"), result_row("b", host="h2")]
    store_run(engine, run_row(), hosts, both, step_rows("a", 3) + step_rows("b", 3, host="h2"))
    store_run(engine, run_row("r2"), [], [result_row("b", run_id="r2", host="h2")],
              step_rows("b", 2, run_id="r2", host="h2"))
    assert count(engine, benchmark_results, run_id="r1") == 2 and count(engine, host_facts, run_id="r1") == 2
    store_run(engine, {**run_row(), "cases_total": 1}, hosts[:1], [result_row("a", ips=150.0)], step_rows("a", 3))
    assert [r["case_key"] for r in fetch_results(engine, run_id="r1")] == ["a"]
    assert count(engine, steps, run_id="r1") == 3 and count(engine, steps, run_id="r1", case_key="b") == 0
    assert count(engine, host_facts, run_id="r1") == 1 and count(engine, host_facts, run_id="r1", host="h2") == 0
    assert count(engine, run_host_rollup, run_id="r1", host="h2") == 0
    assert count(engine, run_case_rollup, run_id="r1", case_key="b") == 0
    assert count(engine, benchmark_results, run_id="r2") == 1 and count(engine, steps, run_id="r2") == 2
    store_run(engine, run_row(), [], [result_row("b", host="h2")], step_rows("b", 1, host="h2"), complete=False)
    assert sorted(r["case_key"] for r in fetch_results(engine, run_id="r1")) == ["a", "b"]


def check_delete_keys_removes_exactly_those_keys(engine, chunk: int):
    """`bulk.delete_keys` with `chunk` keys per statement (where the backend chunks): the steps of exactly the
    named cases go, whichever chunk they fall in; another case's, and another run's of the same case, stay."""
    from fleetbench.warehouse import bulk
    from fleetbench.warehouse.schema import RESULT_KEY

    upgrade(engine)
    cases = [f"c{i}" for i in range(7)]
    store_run(engine, run_row(), [], [result_row(c) for c in cases], [s for c in cases for s in step_rows(c, 3)])
    store_run(engine, run_row("r2"), [], [result_row("c0", run_id="r2")], step_rows("c0", 2, run_id="r2"))
    gone = ["c0", "c2", "c3", "c6"]
    before = bulk.DELETE_CHUNK
    bulk.DELETE_CHUNK = chunk
    with engine.begin() as conn:
        try:
            bulk.delete_keys(conn, steps, RESULT_KEY, [("fleet_benchmark", "r1", "h1", c) for c in gone])
            bulk.delete_keys(conn, steps, RESULT_KEY, [])  # nothing to delete: no statement
        finally:
            bulk.DELETE_CHUNK = before
    with engine.connect() as conn:
        left = conn.execute(select(steps.c.run_id, steps.c.case_key, func.count()).group_by(
            steps.c.run_id, steps.c.case_key).order_by(steps.c.run_id, steps.c.case_key)).all()
    assert [tuple(r) for r in left] == [("r1", c, 3) for c in cases if c not in gone] + [("r2", "c0", 2)]


def check_failed_write_leaves_nothing(engine):
    upgrade(engine)
    bad = result_row("b")
    bad["status"] = None  # NOT NULL: the second row fails inside the transaction
    with pytest.raises(Exception):
        store_run(engine, run_row("r9"), [], [result_row("a", run_id="r9"), {**bad, "run_id": "r9"}],
                  step_rows("a", 3, run_id="r9"))
    assert count(engine, benchmark_results, run_id="r9") == 0
    assert count(engine, steps, run_id="r9") == 0
    assert count(engine, runs, run_id="r9") == 0


def check_run_counts_are_what_was_stored(engine):
    """`runs.cases_*` (and what `store_run` returns) count the results as stored: a row that cannot be stored as
    measured (an exit code beyond INTEGER) is failed / store_error there, so the run counts it failed, not ok;
    rows given twice under one key count once. A partial write counts the whole run."""
    from fleetbench.report.openmetrics import collect

    upgrade(engine)
    given = run_row()  # says 2 ok, as the rows did before fitting
    stored = store_run(engine, given, [], [result_row("a"), result_row("b", exit_code=2**40), result_row("c"),
                                           result_row("c", status="skipped", ips=None)])
    assert stored == {"written": 3, "total": 3, "ok": 1, "failed": 1, "skipped": 1}
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.cases_total, runs.c.cases_ok, runs.c.cases_failed, runs.c.cases_skipped)
                            ).all() == [(3, 1, 1, 1)]
    assert {r["case_key"]: (r["status"], r["failure_class"]) for r in fetch_results(engine)} == {
        "a": ("ok", None), "b": ("failed", "store_error"), "c": ("skipped", "gpu_oom")}
    cases = [f for f in collect(engine) if f.name == "fleetbench_last_run_cases"][0]
    assert {labels["status"]: value for labels, value in cases.samples} == {"ok": 1, "failed": 1, "skipped": 1}
    hosts = [{"dag_id": "fleet_benchmark", "run_id": "r1", "host": "h1", "verdict": "ready"}]
    assert store_run(engine, given, hosts, [], complete=False) == {**stored, "written": 0}
    assert store_run(engine, given, [], [result_row("d", host="h2")], complete=False) == {
        "written": 1, "total": 4, "ok": 2, "failed": 1, "skipped": 1}


def check_timestamps_read_back_in_utc(engine):
    """Timestamps read back are ISO text in UTC and a pivot's `date` is the logical date's UTC day, whatever zone
    the database gives its sessions (PostgreSQL's default is the server's: initdb takes the machine's). The
    engine's sessions are in UTC; rows read through a session in another zone are converted all the same."""
    from sqlalchemy import create_engine

    from fleetbench.warehouse.attempts import fetch_attempts
    from fleetbench.warehouse.frames import pivot, results_frame

    upgrade(engine)
    engines = [engine]
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE \"{engine.url.database}\" SET timezone TO 'America/Los_Angeles'")
            conn.commit()
        engine.dispose()  # new sessions, which take the database's zone unless told otherwise
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "UTC"
        engines.append(create_engine(engine.url))  # a session in the database's zone
        with engines[1].connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "America/Los_Angeles"
    night = {**run_row(), "logical_date": "2026-12-01T02:00:00+00:00"}
    store_run(engine, night, [], [result_row("a", metric="images_per_sec", value=100.0, unit="images/s",
                                             better="higher")])
    try:
        for e in engines:
            for rows in (fetch_results(e), fetch_attempts(e)):
                assert (rows[0]["logical_date"], rows[0]["started_at"], rows[0]["stored_at"][-6:]) == (
                    "2026-12-01T02:00:00+00:00", "2026-12-01T02:00:05+00:00", "+00:00")
                table = pivot(results_frame(rows), "date:host")
                assert (list(table.index), table.loc["2026-12-01", "h1"]) == (["2026-12-01"], 100.0)
            with e.connect() as conn:
                assert _dt(conn.execute(select(runs.c.logical_date)).scalar()) == datetime(2026, 12, 1, 2,
                                                                                            tzinfo=timezone.utc)
    finally:
        for e in engines[1:]:
            e.dispose()


def check_capacity_features(engine):
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("cnn.resnet50.bs64.g1.replicated", precision="fp32", peak_gpu_mem_mib=30210.0, mean_power_w=310.5,
                   energy_source="measured", mean_gpu_util_pct=97.5),
        result_row("cnn.resnet50.bs512.g1.replicated", status="failed", ips=None, batch_size_per_device=512,
                   precision="fp32", peak_gpu_mem_mib=40536.0),
        result_row("cnn.resnet50.bs64.g2.replicated", host="ghost", status="skipped", ips=None,
                   failure_class="host_unfit"),
    ])
    rows = fetch_capacity_features(engine)
    assert [list(r) for r in rows[:1]] == [CAPACITY_COLUMNS]
    by_batch = {r["batch_size_per_device"]: r for r in rows}
    assert set(by_batch) == {64, 512}  # the skipped case never ran: not a capacity sample
    ok, oom = by_batch[64], by_batch[512]
    assert ((ok["model"], ok["num_gpus"], ok["precision"], ok["gpu_model"])
            == ("resnet50", 1, "fp32", "NVIDIA A100-SXM4-40GB"))
    assert ((ok["peak_gpu_mem_mib"], ok["mean_power_w"], ok["mean_gpu_util_pct"], ok["images_per_sec"])
            == (30210.0, 310.5, 97.5, 100.0))
    assert (ok["status"], ok["failure_class"], ok["gpu_oom"], ok["energy_source"]) == ("ok", None, 0, "measured")
    # the same types on every backend, as fetch_results gives them: ISO text in UTC, the command as JSON text
    assert (ok["logical_date"], ok["command"]) == ("2026-12-01T02:00:00+00:00", '["python", "x.py"]')
    assert ok["logical_date"] == fetch_results(engine)[0]["logical_date"]
    assert ((oom["status"], oom["failure_class"], oom["gpu_oom"], oom["peak_gpu_mem_mib"])
            == ("failed", "gpu_oom", 1, 40536.0))
    assert [r["batch_size_per_device"] for r in fetch_capacity_features(engine, model="resnet50")] == [512, 64]
    assert fetch_capacity_features(engine, model="vgg16") == []


def check_capacity_reads_profiles_bounds_and_misses(engine):
    """`capacity.read_rows`: ok readings newest first, each profile per harness (a torch_synthetic resnet50 is not
    a tf_cnn_benchmarks one) and torch_synthetic's per compile and channels_last (its OOMs' bounds grouped by
    command, which says them), one bound row per OOM memory size and batch with its newest night, every miss as
    stored, and only the DAGs asked for; the profile fitted from them is the one the rows make."""
    from fleetbench.capacity import Settings, fit_profiles, read_rows

    upgrade(engine)
    rows = [result_row(f"cnn.resnet50.bs{b}.g1.replicated", batch_size_per_device=b, harness="tf_cnn_benchmarks",
                       peak_gpu_mem_mib=1000.0 + 60 * b) for b in (32, 64, 128)]
    rows += [result_row(f"torch.resnet50.bs{b}", batch_size_per_device=b, harness="torch_synthetic",
                        peak_gpu_mem_mib=500.0 + 10 * b) for b in (32, 64, 128)]
    rows += [result_row(f"cnn.resnet50.bs{b}.g1.replicated", batch_size_per_device=b, harness="tf_cnn_benchmarks",
                        status="failed", ips=None, capacity_mib=40960.0, precision="fp32") for b in (512, 1024)]
    rows += [result_row(f"torch.resnet50.bs{b}.{mode}", host=host, batch_size_per_device=b, harness="torch_synthetic",
                        status="failed", ips=None, capacity_mib=40960.0, precision="fp32",
                        command=["python", "torch_synthetic.py", f"--compile={int(mode == 'compiled')}"])
             for b, mode, host in ((256, "eager", "h1"), (256, "eager", "h2"), (512, "compiled", "h1"))]
    rows.append(result_row("cnn.resnet50.bs768.g1.replicated", batch_size_per_device=768, harness="tf_cnn_benchmarks",
                           status="failed", ips=None, capacity_mib=81920.0, predicted_mem_mib=47080.0,
                           capacity_note="fits: 47080 +- 50 MiB"))
    rows.append(result_row("cnn.resnet50.bs256.g1.replicated", batch_size_per_device=256, status="failed", ips=None,
                           failure_class="nonzero_exit", peak_gpu_mem_mib=99999.0))  # no reading, no bound
    store_run(engine, run_row("r1"), [], rows, [])
    store_run(engine, {**run_row("r2"), "dag_id": "other"}, [],
              [dict(result_row("x", run_id="r2", model="vgg16", peak_gpu_mem_mib=9000.0), dag_id="other")], [])

    got = read_rows(engine, ["resnet50"])
    # 6 readings, 5 bound rows (tf_cnn_benchmarks, 40960 MiB: batches 512 and 1024; 81920 MiB: the miss, stored
    # without a precision: by its command; torch_synthetic: eager 256 (two hosts, one command), compiled 512), 1 miss
    assert {r["model"] for r in got} == {"resnet50"} and len(got) == 6 + 5 + 1
    assert {r["logical_date"] is not None for r in got} == {True}
    profiles = fit_profiles(got, Settings())
    tf = profiles[("tf_cnn_benchmarks", "resnet50", "fp32", "gpu", "", "cnn")]  # result_row's benchmark
    torch = profiles[("torch_synthetic", "resnet50", "fp32", "gpu", "channels_last=0,compile=0", "cnn")]
    assert (tf.slope, tf.intercept, tf.n) == (60.0, 1000.0, 3) and (torch.slope, torch.intercept) == (10.0, 500.0)
    assert tf.ooms == {40960.0: 512, 81920.0: 768} and torch.ooms == {40960.0: 256}
    compiled = profiles[("torch_synthetic", "resnet50", "fp32", "gpu", "channels_last=0,compile=1", "cnn")]
    assert compiled.ooms == {40960.0: 512}
    assert [m["case_key"] for m in tf.misses] == ["cnn.resnet50.bs768.g1.replicated"]
    assert {r["model"] for r in read_rows(engine)} == {"resnet50", "vgg16"}
    assert {r["model"] for r in read_rows(engine, dag_ids={"other"})} == {"vgg16"}
    assert read_rows(engine, dag_ids=set()) == []


def check_report_reads_through_partial_indexes(engine):
    """The report's multi-node table and the capacity reads name their partial index's condition word for word
    (revision 0016), so the database reads only those rows: each query's plan uses its index."""
    from sqlalchemy import event

    from fleetbench.capacity import read_rows
    from fleetbench.report import build_report
    from fleetbench.warehouse.schema import MEMORY_READING_ROWS, MISSED_OOM_ROWS, MULTINODE_OK_ROWS, OOM_ROWS

    upgrade(engine)
    rows = [result_row(f"c{i}", host=f"h{i % 7}") for i in range(300)]
    rows += [result_row("m", nodes=2, host_set="h1,h2"), result_row("r", peak_gpu_mem_mib=900.0),
             result_row("o", status="failed", ips=None, capacity_mib=40960.0, precision="fp32"),
             result_row("t", status="failed", ips=None, capacity_mib=40960.0, precision="fp32",
                        harness="torch_synthetic"),  # its bound grouped by command, as its compile says
             result_row("f", status="failed", ips=None, capacity_mib=40960.0, capacity_note="fits: 900 +- 9 MiB")]
    store_run(engine, run_row("r1"), [], rows, [])
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    indexes = {MULTINODE_OK_ROWS: "ix_benchmark_results_multinode", MEMORY_READING_ROWS:
               "ix_benchmark_results_memory_readings", MISSED_OOM_ROWS: "ix_benchmark_results_missed_ooms",
               OOM_ROWS: "ix_benchmark_results_ooms"}  # the longer condition first: it contains OOM_ROWS
    seen: list[tuple[str, str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        sql = statement.replace("%%", "%")  # psycopg's paramstyle doubles a literal %
        for cond, name in indexes.items():
            if cond in sql and not statement.startswith("EXPLAIN"):
                seen.append((name, statement, parameters))
                break

    event.listen(engine, "before_cursor_execute", capture)
    try:
        report = build_report(engine)
        read_rows(engine, ["resnet50"])
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert report["node_scaling"] and report["capacity"]
    assert {name for name, _, _ in seen} == set(indexes.values())
    pg = engine.dialect.name == "postgresql"
    with engine.connect() as conn:
        if pg:
            conn.exec_driver_sql("SET enable_seqscan = off")
        for name, statement, parameters in seen:
            plan = conn.exec_driver_sql(("EXPLAIN " if pg else "EXPLAIN QUERY PLAN ") + statement, parameters).all()
            assert name in str(plan), (statement, plan)


def regression(**over) -> dict:
    row = {"dag_id": "fleet_benchmark", "run_id": "r2", "host": "h1", "case_key": "a", "metric": "images_per_sec",
           "direction": "higher", "baseline_value": 100.0, "value": 90.0, "delta_pct": -10.0, "z_score": -4.2,
           "p_value": 0.001, "baseline_n": 5, "baseline_window": json.dumps(["r1", "r0"]),
           "changes": json.dumps({"driver_version": ["535.104.05", "550.54.15"]}), "severity": "major",
           "detected_at": datetime(2026, 12, 2, 3, 0, tzinfo=timezone.utc)}
    row.update(over)
    return row


def check_regressions_table(engine):
    upgrade(engine)
    cols = {c["name"]: c["nullable"] for c in inspect(engine).get_columns("regressions")}
    assert cols == REGRESSION_COLUMNS
    uniques = [u["column_names"] for u in inspect(engine).get_unique_constraints("regressions")]
    assert ["dag_id", "run_id", "host", "case_key", "metric"] in uniques
    with engine.begin() as conn:
        conn.execute(regressions.insert(), [regression(), regression(metric="step_cv", direction="lower", z_score=None,
                                                                     p_value=None, changes=None)])
    for bad in (regression(),  # the same (run, host, case, metric) twice
                regression(metric="cost_usd", direction="sideways"),
                regression(metric="energy_kwh", baseline_value=None)):
        with pytest.raises(IntegrityError):
            with engine.begin() as conn:
                conn.execute(regressions.insert(), [bad])
    with engine.connect() as conn:
        stored = conn.execute(select(regressions).order_by(regressions.c.metric)).mappings().all()
    assert [(r["metric"], r["direction"], r["z_score"]) for r in stored] == [("images_per_sec", "higher", -4.2),
                                                                            ("step_cv", "lower", None)]
    assert json.loads(stored[0]["baseline_window"]) == ["r1", "r0"]


# -- migrations -----------------------------------------------------------------------------------
def check_migrate_empty_database(engine):
    assert current_revision(engine) is None
    upgrade(engine)
    assert current_revision(engine) == HEAD
    insp = inspect(engine)
    assert ({"runs", "host_facts", "benchmark_results", "steps", "regressions", "alembic_version"}
            <= set(insp.get_table_names()))
    assert "capacity_features" in insp.get_view_names()
    assert NEW_RESULT_COLUMNS <= {c["name"] for c in insp.get_columns("benchmark_results")}
    assert {"ix_benchmark_results_host_case_time", "ix_benchmark_results_logical_date",
            "ix_benchmark_results_case_time"} <= {i["name"] for i in insp.get_indexes("benchmark_results")}
    assert "ix_regressions_host_case_time" in {i["name"] for i in insp.get_indexes("regressions")}
    partial = {"ix_benchmark_results_memory_readings", "ix_benchmark_results_ooms", "ix_benchmark_results_multinode"}
    reflected = {i["name"]: i for i in insp.get_indexes("benchmark_results")}
    assert partial <= {i.name for i in benchmark_results.indexes} and partial <= set(reflected)
    for index in benchmark_results.indexes:  # the migration's conditions are the schema module's
        if index.name in partial and engine.dialect.name == "sqlite":
            assert str(reflected[index.name]["dialect_options"]["sqlite_where"]) == str(
                index.dialect_options["sqlite"]["where"]), index.name
    downgrade(engine, "0015")  # revision 0016 adds the partial indexes only
    assert not partial & {i["name"] for i in inspect(engine).get_indexes("benchmark_results")}
    upgrade(engine)
    # The schema module and the migrations agree on every table's columns.
    for table in (runs, steps, benchmark_results, regressions, host_facts, result_metrics):
        assert {c["name"] for c in insp.get_columns(table.name)} == {c.name for c in table.columns}, table.name


def _insert(engine, table_name: str, rows: list[dict]) -> None:
    """Insert through the table as the database has it now (an older revision than the schema module's)."""
    with engine.begin() as conn:
        table = Table(table_name, MetaData(), autoload_with=conn)
        for r in rows:  # one by one: the rows have different columns
            conn.execute(table.insert(), {k: (_dt(v) if k.endswith(("_at", "_date"))
                                              else json.dumps(v) if isinstance(v, list) else v)
                                          for k, v in r.items() if k in table.c})


def check_migrate_from_previous_revision(engine):
    upgrade(engine, "0002")
    assert current_revision(engine) == "0002"
    _insert(engine, "runs", [run_row("r1")])
    _insert(engine, "benchmark_results", [
        result_row("a", energy_source="measured", energy_j=7200.0, mean_power_w=120.0, peak_gpu_mem_mib=1000.0),
        result_row("b", status="failed", ips=None)])
    _insert(engine, "steps", step_rows("a", 3))

    upgrade(engine)
    assert current_revision(engine) == HEAD
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert set(rows) == {"a", "b"} and count(engine, steps) == 3
    a, b = rows["a"], rows["b"]
    assert ((a["images_per_sec"], a["energy_j"], a["mean_power_w"], a["command"])
            == (100.0, 7200.0, 120.0, '["python", "x.py"]'))
    # Backfilled from what the row had: 7200 J / 3.6e6 = 0.002 kWh; 100 batches x 64 images / 100 images/s = 64 s.
    assert a["energy_kwh"] == pytest.approx(0.002) and a["time_for_batches_s"] == pytest.approx(64.0)
    assert b["energy_kwh"] is None and b["time_for_batches_s"] is None  # nothing to backfill from
    assert all(a[c] is None for c in NEW_RESULT_COLUMNS - {"energy_kwh", "time_for_batches_s"})
    assert len(fetch_capacity_features(engine)) == 2
    # The migrated table takes new writes: a rerun of the old run replaces its row.
    store_run(engine, run_row("r1"), [], [result_row("a", ips=110.0, **DERIVED)], step_rows("a", 2), complete=False)
    assert count(engine, benchmark_results) == 2 and count(engine, steps, case_key="a") == 2
    assert fetch_results(engine, run_id="r1")[0]["speedup_efficiency"] == 1.0

    downgrade(engine, "0002")
    insp = inspect(engine)
    assert current_revision(engine) == "0002"
    assert "regressions" not in insp.get_table_names() and "capacity_features" not in insp.get_view_names()
    assert not NEW_RESULT_COLUMNS & {c["name"] for c in insp.get_columns("benchmark_results")}
    assert count(engine, benchmark_results) == 2 and count(engine, steps) == 2  # rows survive the downgrade
    upgrade(engine)
    assert current_revision(engine) == HEAD
    downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"} and current_revision(engine) is None


CPU_ENERGY_COLUMNS = {"price_per_hour", "cpu_tdp_w", "mean_cpu_util_pct"}  # revision 0007


def check_migrate_cpu_energy_columns(engine):
    """0004 -> 0007 adds the CPU cost and energy columns, keeps the stored rows (NULL there), takes CPU rows
    with them, and goes down again without losing a row."""
    upgrade(engine, "0004")
    _insert(engine, "runs", [run_row("r1")])
    _insert(engine, "benchmark_results", [result_row("a", **DERIVED)])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert CPU_ENERGY_COLUMNS <= {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    old = fetch_results(engine, run_id="r1")[0]
    assert old["cost_usd"] == pytest.approx(DERIVED["cost_usd"]) and all(old[c] is None for c in CPU_ENERGY_COLUMNS)
    cpu = result_row("cpu", num_gpus=0, device="cpu", energy_source="estimated", energy_j=120.0, price_per_hour=0.1,
                     cost_usd=0.1 * 60 / 3600, cpu_tdp_w=8.0, mean_cpu_util_pct=25.0)
    store_run(engine, run_row("r1"), [], [result_row("a", **DERIVED), cpu], complete=False)
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert [rows["cpu"][c] for c in ("price_per_hour", "cpu_tdp_w", "mean_cpu_util_pct")] == [0.1, 8.0, 25.0]
    assert len(fetch_capacity_features(engine)) == 2
    downgrade(engine, "0004")
    assert not CPU_ENERGY_COLUMNS & {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    assert count(engine, benchmark_results) == 2
    upgrade(engine)
    assert current_revision(engine) == HEAD


CAPACITY_RESULT_COLUMNS = {"peak_mem_mib", "peak_mem_source", "capacity_mib", "predicted_mem_mib", "capacity_note"}


def check_migrate_to_capacity(engine):
    """0004 -> 0009 keeps the rows (new columns NULL), the view gains the capacity columns; and back down."""
    upgrade(engine, "0004")
    _insert(engine, "runs", [run_row("r1")])
    _insert(engine, "benchmark_results", [
        result_row("a", peak_gpu_mem_mib=1000.0),
        result_row("b", status="failed", ips=None, failure_class="oom_killed"),
        result_row("c", status="skipped", ips=None, failure_class="host_unfit")])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    rows = {r["case_key"]: r for r in fetch_capacity_features(engine)}
    assert set(rows) == {"a", "b"}  # skipped cases never ran: still not capacity samples
    assert all(rows[k][c] is None for k in rows for c in CAPACITY_RESULT_COLUMNS)
    a, b = rows["a"], rows["b"]
    assert (a["peak_gpu_mem_mib"], a["oom"], b["oom"], b["gpu_oom"]) == (1000.0, 0, 1, 0)
    store_run(engine, run_row("r1"), [], [result_row("a", peak_mem_mib=512.5, peak_mem_source="cgroup_v1",
                                                     capacity_mib=1024.0, predicted_mem_mib=500.0,
                                                     capacity_note="fits: 500 +- 5 MiB")], [], complete=False)
    a = {r["case_key"]: r for r in fetch_capacity_features(engine)}["a"]
    assert (a["peak_mem_mib"], a["peak_mem_source"], a["capacity_mib"], a["predicted_mem_mib"]) == (
        512.5, "cgroup_v1", 1024.0, 500.0)
    downgrade(engine, "0004")
    insp = inspect(engine)
    assert not CAPACITY_RESULT_COLUMNS & {c["name"] for c in insp.get_columns("benchmark_results")}
    assert count(engine, benchmark_results) == 3
    assert "oom" not in fetch_capacity_features(engine)[0]  # 0003's view again
    upgrade(engine)
    assert current_revision(engine) == HEAD


MIG_COLUMNS = {"mig_profile", "mig_instances"}  # revision 0012


def check_migrate_mig_columns(engine):
    """0011 -> 0012: stored rows (whole GPUs) keep NULL MIG columns; a MIG row round-trips, and when a rerun
    supersedes it, superseded_results keeps its MIG profile and instance count; down to 0011 keeps every row."""
    from attempts_contract import superseded

    upgrade(engine, "0011")
    _insert(engine, "runs", [run_row("r1")])
    _insert(engine, "benchmark_results", [result_row("a", attempt_id="A-a")])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    for table in ("benchmark_results", "superseded_results"):
        assert MIG_COLUMNS <= {c["name"] for c in inspect(engine).get_columns(table)}, table
    old = fetch_results(engine, run_id="r1")[0]
    assert (old["mig_profile"], old["mig_instances"], old["images_per_sec"]) == (None, None, 100.0)
    mig = result_row("cnn.g1.mig-1g.10gb", mig_profile="1g.10gb", mig_instances=1, attempt_id="A-m")
    store_run(engine, run_row("r1"), [], [result_row("a", attempt_id="A-a"), mig], complete=False)
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert (rows["cnn.g1.mig-1g.10gb"]["mig_profile"], rows["cnn.g1.mig-1g.10gb"]["mig_instances"]) == ("1g.10gb", 1)
    # a rerun of the MIG case (a new container outcome) supersedes it: the old attempt keeps its MIG columns
    store_run(engine, run_row("r1"), [], [{**mig, "attempt_id": "B-m", "images_per_sec": 90.0}], complete=False)
    assert [(r["case_key"], r["mig_profile"], r["mig_instances"]) for r in superseded(engine)] == [
        ("cnn.g1.mig-1g.10gb", "1g.10gb", 1)]
    downgrade(engine, "0011")
    for table in ("benchmark_results", "superseded_results"):
        assert not MIG_COLUMNS & {c["name"] for c in inspect(engine).get_columns(table)}, table
    assert count(engine, benchmark_results) == 2


MULTINODE_COLUMNS = {"nodes", "host_set", "roles_json", "node_efficiency", "node_baseline_images_per_sec"}


def check_migrate_to_multinode(engine):
    """0011 -> 0014: stored rows (current and superseded) ran on one host (nodes 1, no host set); a multi-node
    row round-trips its hosts, roles and efficiency; the downgrade drops the columns from both tables."""
    from fleetbench.warehouse.schema import superseded_results

    upgrade(engine, "0011")
    _insert(engine, "runs", [run_row("r1")])
    _insert(engine, "benchmark_results", [result_row("a"), result_row("b", status="failed", ips=None,
                                                                      failure_class="nonzero_exit")])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO superseded_results (dag_id, run_id, host, case_key, status, attempt, "
                          "superseded_at) VALUES ('d', 'r1', 'h1', 'a', 'ok', 1, '2026-12-01 00:00:00')"))
    upgrade(engine)
    assert current_revision(engine) == HEAD
    rows = {r["case_key"]: r for r in fetch_results(engine)}
    assert {(k, r["nodes"], r["host_set"], r["roles_json"], r["node_efficiency"]) for k, r in rows.items()} == {
        ("a", 1, None, None, None), ("b", 1, None, None, None)}
    with engine.connect() as conn:
        assert conn.execute(select(superseded_results.c.nodes, superseded_results.c.host_set)).all() == [(1, None)]
    roles = json.dumps([{"role": "worker0", "host": "h1"}, {"role": "ps0", "host": "h2"}])
    store_run(engine, run_row("r1"), [], [result_row("m", nodes=2, host_set="h1,h2", roles_json=roles,
                                                     node_efficiency=0.75, node_baseline_images_per_sec=100.0)],
              [], complete=False)
    m = {r["case_key"]: r for r in fetch_results(engine)}["m"]
    assert (m["nodes"], m["host_set"], json.loads(m["roles_json"])[1]["host"], m["node_efficiency"],
            m["node_baseline_images_per_sec"]) == (2, "h1,h2", "h2", 0.75, 100.0)
    downgrade(engine, "0013")
    insp = inspect(engine)
    for table in ("benchmark_results", "superseded_results"):
        assert not MULTINODE_COLUMNS & {c["name"] for c in insp.get_columns(table)}, table
    assert count(engine, benchmark_results) == 3
    upgrade(engine)
    assert current_revision(engine) == HEAD


def check_failed_migration_rolls_back(engine):
    """A migration that fails half-way leaves the previous revision as it was (transactional DDL)."""
    upgrade(engine, "0002")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE regressions (x INTEGER)")  # 0003 creates it after altering benchmark_results
    with pytest.raises(Exception, match="regressions"):
        upgrade(engine)
    assert current_revision(engine) == "0002"
    assert not NEW_RESULT_COLUMNS & {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE regressions")
    upgrade(engine)
    assert current_revision(engine) == HEAD


# -- concurrent writers ---------------------------------------------------------------------------
KEYS = [f"cnn.m{i:02d}.bs64.g1.replicated" for i in range(60)]
WRITER_KEYS = (KEYS[:45], KEYS[15:])  # 30 keys overlap
WRITER_STEPS = (3, 5)  # each writer writes its own number of steps per case, valued 1000 x writer + step


def concurrent_writer(url: str, writer: int, rounds: int, barrier) -> None:
    """One writer process: migrate, then per round wait for the other writer and upsert its keys of run `r<round>`."""
    engine = get_engine(url)
    try:
        barrier.wait(timeout=60)
        upgrade(engine)  # both at once on a fresh database
        rng = random.Random(writer)
        for rnd in range(rounds):
            keys = list(WRITER_KEYS[writer])
            rng.shuffle(keys)
            results = [result_row(k, run_id=f"r{rnd}", ips=float(1000 * writer + rnd)) for k in keys]
            step = [s for k in keys for s in step_rows(k, WRITER_STEPS[writer], run_id=f"r{rnd}", base=1000.0 * writer)]
            barrier.wait(timeout=60)
            store_run(engine, run_row(f"r{rnd}"), [], results, step, complete=False)
    finally:
        engine.dispose()


def check_concurrent_writers(url: str, rounds: int = 6) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=concurrent_writer, args=(url, w, rounds, barrier)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0], "a writer failed (its traceback is in the captured stderr)"

    engine = get_engine(url)
    try:
        with engine.connect() as conn:
            per_key = conn.execute(select(benchmark_results.c.run_id, benchmark_results.c.case_key, func.count())
                                   .group_by(benchmark_results.c.run_id, benchmark_results.c.case_key)).all()
            written = conn.execute(select(benchmark_results.c.run_id, benchmark_results.c.case_key,
                                          benchmark_results.c.images_per_sec)).all()
            step_sets = conn.execute(select(steps.c.run_id, steps.c.case_key, func.count(),
                                            func.min(steps.c.images_per_sec), func.max(steps.c.images_per_sec))
                                     .group_by(steps.c.run_id, steps.c.case_key)).all()
        # Exactly one row per key, for every key either writer wrote, in every round.
        assert len(per_key) == rounds * len(KEYS) and {n for *_, n in per_key} == {1}
        assert count(engine, runs) == rounds
        with engine.connect() as conn:  # the run row counts both writers' results: the second counts after the first
            assert conn.execute(select(runs.c.cases_total, runs.c.cases_ok).distinct()).all() == [(len(KEYS),) * 2]
        # Each case's result row and its steps come from one writer (the one that wrote it last):
        # steps valued 1000 x writer + step, 3 of them from writer 0, 5 from writer 1.
        writer_of = {(run, key): int(ips // 1000) for run, key, ips in written}
        assert len(step_sets) == len(writer_of)
        for run, key, n, low, high in step_sets:
            w = writer_of[(run, key)]
            assert (n, low, high) == (WRITER_STEPS[w], 1000.0 * w + 1, 1000.0 * w + WRITER_STEPS[w]), (run, key)
        # Keys only one writer has are that writer's; the overlap went to one or the other.
        assert {writer_of[(f"r{r}", k)] for r in range(rounds) for k in KEYS[:15]} == {0}
        assert {writer_of[(f"r{r}", k)] for r in range(rounds) for k in KEYS[45:]} == {1}
    finally:
        engine.dispose()


# -- metric samples (revision 0010) ---------------------------------------------------------------
def metric(case_key: str, name: str, value: float, run_id: str = "r1", host: str = "h1", unit: str = "GB/s",
           better: str = "higher", labels: str = "{}") -> dict:
    return {"dag_id": "fleet_benchmark", "run_id": run_id, "host": host, "case_key": case_key, "metric": name,
            "labels": labels, "value": value, "unit": unit, "better": better}


def metrics_of(engine, **where) -> dict:
    from fleetbench.warehouse.schema import result_metrics

    query = select(result_metrics)
    for k, v in where.items():
        query = query.where(result_metrics.c[k] == v)
    with engine.connect() as conn:
        return {(r.case_key, r.metric, r.labels): (r.value, r.unit, r.better) for r in conn.execute(query)}


def check_metric_samples_stored_with_results(engine):
    """A result's samples are written with it, replaced whole by a rerun, deleted with it; a failed write
    leaves none; `better` is higher or lower."""
    upgrade(engine)
    primary = {"harness": "nccl_tests", "metric": "avg_busbw", "value": 42.5578, "unit": "GB/s", "better": "higher"}
    oop = '{"placement": "out_of_place", "size_bytes": 8589934592}'
    store_run(engine, run_row(), [], [result_row("a", ips=None, **primary), result_row("b")], [], metric_rows=[
        metric("a", "avg_busbw", 42.5578), metric("a", "busbw", 123.56, labels=oop),
        metric("a", "time", 127453.0, unit="us", better="lower", labels=oop),
        metric("b", "images_per_sec", 100.0, unit="images/s")])
    row = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}["a"]
    assert (row["harness"], row["metric"], row["value"], row["unit"], row["better"]) == tuple(primary.values())
    assert metrics_of(engine, case_key="a") == {
        ("a", "avg_busbw", "{}"): (42.5578, "GB/s", "higher"), ("a", "busbw", oop): (123.56, "GB/s", "higher"),
        ("a", "time", oop): (127453.0, "us", "lower")}
    # A rerun of the run with fewer samples for a, and without b: a's samples are replaced, b's go with b.
    store_run(engine, run_row(), [], [result_row("a", ips=None, **{**primary, "value": 40.0})], [],
              metric_rows=[metric("a", "avg_busbw", 40.0)])
    assert metrics_of(engine) == {("a", "avg_busbw", "{}"): (40.0, "GB/s", "higher")}
    # A failed write (a NOT NULL result column) leaves neither the results nor their samples.
    with pytest.raises(Exception):
        store_run(engine, run_row("r9"), [], [result_row("a", run_id="r9"), {**result_row("b", run_id="r9"),
                                                                          "status": None}],
                  metric_rows=[metric("a", "avg_busbw", 1.0, run_id="r9")])
    assert metrics_of(engine, run_id="r9") == {}
    with pytest.raises(IntegrityError):  # direction is higher or lower, nothing else
        store_run(engine, run_row("r8"), [], [result_row("a", run_id="r8")],
                  metric_rows=[metric("a", "x", 1.0, run_id="r8", better="sideways")])
    assert metrics_of(engine, run_id="r8") == {}


def check_migrate_filled_warehouse_to_metrics(engine):
    """Revision 0010 on a warehouse filled at 0004: every row gets its primary metric (images_per_sec, NULL
    where the case failed), result_metrics its images/sec and accuracy samples; rows survive a downgrade."""
    from fleetbench.warehouse.schema import result_metrics

    upgrade(engine, "0004")
    runs_ = [f"r{n}" for n in range(1, 6)]
    _insert(engine, "runs", [run_row(r) for r in runs_])
    results = []
    for r in runs_:
        for i in range(20):
            status = "ok" if i % 5 else "failed"
            results.append(result_row(f"c{i}", run_id=r, host=f"h{i % 3}", ips=100.0 + i if status == "ok" else None,
                                      status=status, accuracy_top1=0.75 if i == 1 else None))
    _insert(engine, "benchmark_results", results)
    _insert(engine, "steps", step_rows("c1", 3))
    upgrade(engine)
    assert current_revision(engine) == HEAD
    rows = fetch_results(engine)
    assert len(rows) == 100 and count(engine, steps) == 3
    for row in rows:
        assert (row["harness"], row["metric"], row["unit"], row["better"]) == (
            "tf_cnn_benchmarks", "images_per_sec", "images/s", "higher")
        assert row["value"] == row["images_per_sec"]
    assert sum(1 for r in rows if r["value"] is None) == 20  # the failed ones
    assert count(engine, result_metrics) == 80 + 5  # 80 ok images/sec, 5 accuracies (c1 of each run)
    samples = metrics_of(engine, run_id="r2")
    assert len(samples) == 16 + 1 and ("c5", "images_per_sec", "{}") not in samples  # c5 failed
    assert samples[("c2", "images_per_sec", "{}")] == (102.0, "images/s", "higher")
    assert samples[("c1", "accuracy_top1", "{}")] == (0.75, "1", "higher")
    # New writes on the migrated warehouse carry their samples.
    store_run(engine, run_row("r1"), [], [result_row("c1", ips=110.0, harness="tf_cnn_benchmarks",
                                                     metric="images_per_sec", value=110.0, unit="images/s",
                                                     better="higher")],
              step_rows("c1", 2), complete=False, metric_rows=[metric("c1", "images_per_sec", 110.0, unit="images/s")])
    assert metrics_of(engine, run_id="r1", case_key="c1") == {("c1", "images_per_sec", "{}"): (110.0, "images/s",
                                                                                               "higher")}
    downgrade(engine, "0004")
    insp = inspect(engine)
    assert result_metrics.name not in insp.get_table_names()
    assert not {"harness", "metric", "value", "unit", "better"} & {c["name"] for c in insp.get_columns(
        "benchmark_results")}
    assert count(engine, benchmark_results) == 100
    upgrade(engine)
    assert count(engine, result_metrics) == 85 - 1  # refilled from the rows (c1 of r1 now 110 images/s, no accuracy)
    assert metrics_of(engine, run_id="r1", case_key="c1") == {("c1", "images_per_sec", "{}"): (110.0, "images/s",
                                                                                               "higher")}


def check_migrate_regression_units(engine):
    """Revision 0013 on findings stored at 0011: each gets its metric's unit; a metric name of 100 characters (a
    `command` metric) fits; a downgrade keeps the findings whose name fits the old column."""
    upgrade(engine, "0011")
    _insert(engine, "regressions", [regression(), regression(metric="duration_s", direction="lower"),
                                    regression(metric="step_cv", direction="lower")])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    with engine.connect() as conn:
        units = dict(conn.execute(select(regressions.c.metric, regressions.c.unit)).all())
    assert units == {"images_per_sec": "images/s", "duration_s": "s", "step_cv": None}
    long_name = "team." + "x" * 95
    with engine.begin() as conn:
        conn.execute(regressions.insert(), [regression(metric=long_name, direction="lower", unit="ms",
                                                       same_change_as=long_name)])
    assert count(engine, regressions) == 4
    downgrade(engine, "0012")
    assert "unit" not in {c["name"] for c in inspect(engine).get_columns("regressions")}
    # PostgreSQL drops what no longer fits VARCHAR(50); SQLite never enforced the width and keeps it
    assert count(engine, regressions) == (4 if engine.dialect.name == "sqlite" else 3)
    upgrade(engine)
    assert count(engine, regressions, unit="images/s") == 1


def check_samples_of_results_written_earlier_are_upserted(engine):
    """Samples of results this write has (their old samples deleted first) go in as new rows; samples of a result
    written earlier (a partial write that adds samples) are upserted onto what is stored; a bad sample rolls the
    whole write back, results included."""
    upgrade(engine)
    store_run(engine, run_row(), [], [result_row("a"), result_row("b")], [],
              metric_rows=[metric("a", "m", 1.0), metric("b", "m", 2.0), metric("b", "n", 3.0)])
    # b is not in this write: its samples are upserted (m replaced, n kept); a's are replaced whole.
    store_run(engine, run_row(), [], [result_row("a")], [], complete=False,
              metric_rows=[metric("a", "k", 5.0), metric("b", "m", 20.0)])
    assert metrics_of(engine) == {("a", "k", "{}"): (5.0, "GB/s", "higher"), ("b", "m", "{}"): (20.0, "GB/s", "higher"),
                                  ("b", "n", "{}"): (3.0, "GB/s", "higher")}
    many = [metric(f"c{i}", f"m{j}", float(i * j), run_id="r2", labels='{"tab": "a\\tb", "nl": "x\\ny"}')
            for i in range(50) for j in range(5)]
    store_run(engine, run_row("r2"), [], [result_row(f"c{i}", run_id="r2") for i in range(50)], [], metric_rows=many)
    stored = metrics_of(engine, run_id="r2")
    assert len(stored) == 250 and stored[("c7", "m3", '{"tab": "a\\tb", "nl": "x\\ny"}')] == (21.0, "GB/s", "higher")
    with pytest.raises(IntegrityError):
        store_run(engine, run_row("r3"), [], [result_row(f"c{i}", run_id="r3") for i in range(50)], [],
                  metric_rows=[*many[:-1], metric("c1", "x", 1.0, run_id="r3", better="sideways")])
    assert count(engine, benchmark_results, run_id="r3") == 0 and metrics_of(engine, run_id="r3") == {}


def _revision(number: str):
    """A revision's module (its frozen SQL), loaded from its file."""
    import importlib.util

    from fleetbench.warehouse import MIGRATIONS

    [path] = (MIGRATIONS / "versions").glob(f"{number}_*.py")
    spec = importlib.util.spec_from_file_location(f"revision_{number}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rollups(engine) -> dict[str, list[tuple]]:
    """Every rollup row, without ids, sorted: to compare two computations of the same rollups."""
    out = {}
    with engine.connect() as conn:
        for table in ("run_host_rollup", "run_case_rollup", "host_month_rollup"):
            t = Table(table, MetaData(), autoload_with=conn)
            cols = [c for c in t.c if c.name != "id"]
            out[table] = sorted((tuple(r) for r in conn.execute(select(*cols))), key=repr)
    return out


def _gpus(engine, table: str) -> set:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(text(f"SELECT gpu FROM {table}"))}


def check_migrate_cpu_cases_out_of_gpu_rollups(engine):
    """0016 -> 0017: a CPU case on a GPU host (its row records the host's GPU) leaves that GPU's rollups: its
    rollup rows, its run's and its month's, are recomputed; down to 0016 puts them back. Both ways equal a
    rebuild of every rollup from the stored results with the expression of that revision."""
    from fleetbench.warehouse import rollup

    upgrade(engine)
    gpu = {"gpu_model": "NVIDIA A100-SXM4-40GB"}
    rows = [result_row("tf.resnet50.g1", gpu_catalog_name="A100 SXM4 40GB", **gpu),
            result_row("smoke.trivial.g0", num_gpus=0, device="cpu", gpu_catalog_name=None, **gpu)]
    store_run(engine, run_row("r1"), [], rows)
    store_run(engine, run_row("r2"), [], [result_row("tf.resnet50.g1", run_id="r2", gpu_catalog_name="A100 SXM4 40GB",
                                                     **gpu)])  # a run without a CPU case: not touched
    new = _rollups(engine)
    for table in ("run_host_rollup", "run_case_rollup", "host_month_rollup"):
        assert _gpus(engine, table) == {"A100 SXM4 40GB", None}, table

    downgrade(engine, "0016")
    old = _rollups(engine)
    for table in ("run_host_rollup", "run_case_rollup", "host_month_rollup"):
        assert _gpus(engine, table) == {"A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB"}, table  # as 0016 counted it
    with engine.begin() as conn:  # 0016's code: the old expression over everything, 0016's month rows (no model_runs)
        old_gpu, rollup.GPU = rollup.GPU, "COALESCE(gpu_catalog_name, gpu_model)"
        old_month, rollup._MONTH_SQL = rollup._MONTH_SQL, text(_revision("0017").MONTH_SQL).bindparams(
            bindparam("m0", type_=rollup._TS), bindparam("m1", type_=rollup._TS))
        old_case = rollup.case_rollup_sql  # and case rows without 0021's mig_profile and nodes
        rollup.case_rollup_sql = lambda where: old_case(where).replace(", mig_profile, nodes)", ")").replace(
            ", MAX(mig_profile), MAX(nodes)", "")
        try:
            rollup.rebuild(conn)
        finally:
            rollup.GPU, rollup._MONTH_SQL, rollup.case_rollup_sql = old_gpu, old_month, old_case
    assert _rollups(engine) == old

    upgrade(engine)
    assert current_revision(engine) == HEAD and _rollups(engine) == new
    with engine.begin() as conn:
        rollup.rebuild(conn)
    assert _rollups(engine) == new


def check_migrate_torch_precision(engine):
    """0017 -> 0018: torch_synthetic results stored as fp32 whatever their `--precision=` (current and superseded
    attempts) get the command's precision; rows already right, tf_cnn_benchmarks' and commands without the flag
    keep theirs; down to 0017 changes nothing."""
    from fleetbench.warehouse.schema import superseded_results

    upgrade(engine)  # written with today's store (its rollups are today's), as 0017 stored them, then down to 0017

    def torch(case: str, flag: str | None, stored: str, attempt: str, **extra) -> dict:
        command = ["python3", "/opt/fleetbench/torch_synthetic.py", "--model=resnet50", *([flag] if flag else [])]
        return result_row(case, harness="torch_synthetic", precision=stored, command=command,
                          attempt_id=f"{attempt}-{case}", **extra)

    first = [torch("bf16", "--precision=bf16", "fp32", "A"), torch("fp16", "--precision=fp16", "fp32", "A")]
    store_run(engine, run_row("r1"), [], first)
    store_run(engine, run_row("r1"), [], [  # the run again: A's attempts are superseded
        torch("bf16", "--precision=bf16", "fp32", "B"), torch("fp16", "--precision=fp16", "fp16", "B"),
        torch("plain", None, "fp32", "B"),
        result_row("tf", precision="fp16", command=["python", "tf_cnn_benchmarks.py", "--use_fp16"])])

    def precisions(table) -> dict:
        with engine.connect() as conn:
            return {(r.case_key, r.attempt): r.precision
                    for r in conn.execute(select(table.c.case_key, table.c.attempt, table.c.precision))}

    downgrade(engine, "0017")
    before = (precisions(benchmark_results), precisions(superseded_results))
    assert before[1] == {("bf16", 1): "fp32", ("fp16", 1): "fp32"}
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert precisions(benchmark_results) == {("bf16", 2): "bf16", ("fp16", 2): "fp16", ("plain", 1): "fp32",
                                             ("tf", 1): "fp16"}
    assert precisions(superseded_results) == {("bf16", 1): "bf16", ("fp16", 1): "fp16"}
    downgrade(engine, "0017")
    assert precisions(benchmark_results)[("bf16", 2)] == "bf16" and current_revision(engine) == "0017"
    upgrade(engine)



def check_migrate_regression_mailed_at(engine):
    """0018 -> 0019 adds regressions.mailed_at: confirmed major regressions stored before it count as mailed (at
    their detected_at), so the upgrade mails no open change again; minor, suspected and improvement rows stay
    unmarked. Detecting a night again keeps its record; down to 0018 drops the column and keeps the rows."""
    from fleetbench.regression import store_findings
    from fleetbench.regression.store import to_mail

    upgrade(engine, "0018")
    detected = datetime(2026, 12, 2, 3, 0, tzinfo=timezone.utc)
    old = [regression(metric="images_per_sec", kind="regression", status="confirmed", severity="major"),
           regression(metric="duration_s", direction="lower", kind="regression", status="confirmed", severity="minor"),
           regression(metric="energy_j", direction="lower", kind="regression", status="suspected", severity="major"),
           regression(metric="cost_usd", direction="lower", kind="improvement", status="confirmed", severity="major")]
    _insert(engine, "regressions", old)
    upgrade(engine)
    assert current_revision(engine) == HEAD
    with engine.connect() as conn:
        marked = {r.metric: _dt(r.mailed_at) for r in conn.execute(select(regressions.c.metric,
                                                                           regressions.c.mailed_at))}
    assert marked == {"images_per_sec": detected, "duration_s": None, "energy_j": None, "cost_usd": None}
    tonight = {**regression(metric="images_per_sec", kind="regression", status="confirmed", severity="major"),
               "changes": {}, "baseline_window": ["r1"]}
    assert to_mail(engine, "fleet_benchmark", [tonight], "major") == []  # on record: not mailed again
    store_findings(engine, "fleet_benchmark", "r2", [tonight])  # the night detected again: its record stays
    with engine.connect() as conn:
        assert _dt(conn.execute(select(regressions.c.mailed_at)).scalar()) == detected
    downgrade(engine, "0018")
    assert current_revision(engine) == "0018"
    assert "mailed_at" not in {c["name"] for c in inspect(engine).get_columns("regressions")}
    assert count(engine, regressions) == 1
    upgrade(engine)
    assert current_revision(engine) == HEAD


def check_migrate_month_model_runs(engine):
    """0019 -> 0020 adds host_month_rollup.model_runs and computes it for the month rows stored before: a host's
    runs with a result of the row's model, its GPU and CPU cases (rows of their own) counted once. The result
    equals what today's writes and a rebuild give; down to 0019 drops the column and keeps the rows."""
    from fleetbench.warehouse import rollup

    upgrade(engine)
    gpu = {"gpu_model": "NVIDIA A100-SXM4-40GB", "gpu_catalog_name": "A100 SXM4 40GB"}
    for n, when in enumerate(("2026-11-29T02:00:00+00:00", "2026-11-30T02:00:00+00:00", "2026-12-01T02:00:00+00:00")):
        run_id = f"r{n}"
        cpu = [result_row("cpu.resnet50", run_id=run_id, logical_date=when, num_gpus=0, device="cpu",
                          **{**gpu, "gpu_catalog_name": None})] if n != 1 else []  # not on the second night
        store_run(engine, {**run_row(run_id), "logical_date": when}, [], [
            result_row("tf.resnet50.g1", run_id=run_id, logical_date=when, **gpu), *cpu,
            result_row("tf.vgg16.g1", run_id=run_id, logical_date=when, model="vgg16", **gpu)])
    new = _rollups(engine)

    downgrade(engine, "0019")
    assert current_revision(engine) == "0019"
    assert "model_runs" not in {c["name"] for c in inspect(engine).get_columns("host_month_rollup")}
    assert count(engine, benchmark_results) == 8
    upgrade(engine)
    assert current_revision(engine) == HEAD and _rollups(engine) == new
    with engine.connect() as conn:
        got = {(r.model, r.gpu, _dt(r.month).month): (r.runs, r.model_runs) for r in conn.execute(text(
            "SELECT model, gpu, month, runs, model_runs FROM host_month_rollup"))}
    assert got == {("resnet50", "A100 SXM4 40GB", 11): (2, 2), ("resnet50", None, 11): (1, 2),
                   ("vgg16", "A100 SXM4 40GB", 11): (2, 2), ("resnet50", "A100 SXM4 40GB", 12): (1, 1),
                   ("resnet50", None, 12): (1, 1), ("vgg16", "A100 SXM4 40GB", 12): (1, 1)}
    with engine.begin() as conn:
        rollup.rebuild(conn)
    assert _rollups(engine) == new


def check_migrate_case_rollup_variant(engine):
    """0020 -> 0021 adds run_case_rollup.mig_profile and nodes and fills them for the rows stored before, from
    their cases' results: whole GPUs on one node, MIG instances, a case across hosts. The result equals what
    today's writes and a rebuild give; down to 0020 drops the columns and keeps the rows."""
    from fleetbench.warehouse import rollup

    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("tf.resnet50.g2", num_gpus=2, speedup_efficiency=0.95),
        result_row("tf.resnet50.g2.mig1g.10gb", num_gpus=2, mig_profile="1g.10gb", speedup_efficiency=0.5),
        result_row("tf.resnet50.g2.n2.h1+h2", num_gpus=2, nodes=2, host_set="h1+h2")])
    new = _rollups(engine)
    downgrade(engine, "0020")
    assert current_revision(engine) == "0020"
    assert not {"mig_profile", "nodes"} & {c["name"] for c in inspect(engine).get_columns("run_case_rollup")}
    assert count(engine, benchmark_results) == 3
    upgrade(engine)
    assert current_revision(engine) == HEAD and _rollups(engine) == new
    with engine.connect() as conn:
        got = {r.case_key: (r.mig_profile, r.nodes) for r in conn.execute(text(
            "SELECT case_key, mig_profile, nodes FROM run_case_rollup"))}
    assert got == {"tf.resnet50.g2": (None, 1), "tf.resnet50.g2.mig1g.10gb": ("1g.10gb", 1),
                   "tf.resnet50.g2.n2.h1+h2": (None, 2)}
    with engine.begin() as conn:
        rollup.rebuild(conn)
    assert _rollups(engine) == new


def _masks(engine) -> dict[str, set[tuple]]:
    with engine.connect() as conn:
        return {"run": {tuple(r) for r in conn.execute(text("SELECT run_id, host, scaled_gpus FROM run_host_rollup"))},
                "month": {tuple(r) for r in conn.execute(text("SELECT host, scaled_gpus FROM host_month_rollup"))}}


def check_migrate_whole_gpu_scaled_mask(engine):
    """0021 -> 0022: the rollups' scaled_gpus masks count whole GPUs only: a host's bit for n MIG instances is
    cleared in its run's row and its month's; down to 0021 sets it again. Both ways equal a rebuild of every rollup
    with the mask of that revision; runs without a MIG efficiency are not touched."""
    from fleetbench.warehouse import rollup

    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("tf.resnet50.g2", num_gpus=2, speedup_efficiency=0.95),  # h1: two whole GPUs
        result_row("tf.resnet50.g4.mig1g.10gb", host="h2", num_gpus=4, mig_profile="1g.10gb", speedup_efficiency=0.9),
        result_row("tf.resnet50.g2.mig1g.10gb", host="h1", num_gpus=2, mig_profile="1g.10gb", speedup_efficiency=0.5)])
    store_run(engine, run_row("r2"), [], [result_row("tf.resnet50.g8", run_id="r2", host="h3", num_gpus=8,
                                                     speedup_efficiency=0.9)])
    new = _rollups(engine)
    assert _masks(engine) == {"run": {("r1", "h1", 1 << 2), ("r1", "h2", 0), ("r2", "h3", 1 << 8)},
                              "month": {("h1", 1 << 2), ("h2", 0), ("h3", 1 << 8)}}

    downgrade(engine, "0021")
    assert _masks(engine) == {"run": {("r1", "h1", 1 << 2), ("r1", "h2", 1 << 4), ("r2", "h3", 1 << 8)},
                              "month": {("h1", 1 << 2), ("h2", 1 << 4), ("h3", 1 << 8)}}
    old = _rollups(engine)
    with engine.begin() as conn:  # 0021's code: MIG instances in the mask
        mask = rollup.SCALED_GPUS
        rollup.SCALED_GPUS = mask.replace(" AND mig_profile IS NULL", "")
        try:
            rollup.rebuild(conn)
        finally:
            rollup.SCALED_GPUS = mask
    assert _rollups(engine) == old

    upgrade(engine)
    assert current_revision(engine) == HEAD and _rollups(engine) == new
    with engine.begin() as conn:
        rollup.rebuild(conn)
    assert _rollups(engine) == new


def check_migrate_bake_provenance(engine):
    """0022 -> 0023 adds bake_inputs and harness_revision to the current and superseded results (NULL for the rows
    stored before); down to 0022 drops them and keeps every row."""
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [result_row("a", bake_inputs="b" * 64, harness_revision="c" * 40)])
    store_run(engine, {**run_row("r1"), "finished_at": "2026-12-01T03:00:00+00:00"}, [],
              [result_row("a", started_at="2026-12-01T02:30:00+00:00", bake_inputs="d" * 64,
                          harness_revision="e" * 40)])  # a second attempt: the first is superseded
    with engine.connect() as conn:
        got = {t: [tuple(r) for r in conn.execute(text(f"SELECT bake_inputs, harness_revision FROM {t}"))]
               for t in ("benchmark_results", "superseded_results")}
    assert got == {"benchmark_results": [("d" * 64, "e" * 40)], "superseded_results": [("b" * 64, "c" * 40)]}
    downgrade(engine, "0022")
    for table in ("benchmark_results", "superseded_results"):
        assert not {"bake_inputs", "harness_revision"} & {c["name"] for c in inspect(engine).get_columns(table)}
    assert count(engine, benchmark_results) == 1
    upgrade(engine)
    assert current_revision(engine) == HEAD
    with engine.connect() as conn:
        assert conn.execute(text("SELECT bake_inputs, harness_revision FROM benchmark_results")).all() == [(None, None)]


def check_repair_oom_indexes(engine):
    """A warehouse migrated by 0016's first version (the OOM index on logical_date, no missed-OOM index) gets both
    as 0016 makes them now at 0024, its rows kept; down past 0016 then works (it failed on the missing index)."""
    from fleetbench.warehouse.schema import OOM_BOUND_COLUMNS

    def indexes() -> dict:
        return {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("benchmark_results")
                if "oom" in i["name"]}

    upgrade(engine, "0023")
    store_run(engine, run_row("r1"), [], [result_row("a", status="failed", failure_class="gpu_oom", ips=None)])
    with engine.begin() as conn:  # the first version's shape
        conn.execute(text("DROP INDEX ix_benchmark_results_ooms"))
        conn.execute(text("DROP INDEX ix_benchmark_results_missed_ooms"))
        conn.execute(text("CREATE INDEX ix_benchmark_results_ooms ON benchmark_results (logical_date) "
                          "WHERE failure_class IN ('gpu_oom', 'oom_killed')"))
    assert indexes() == {"ix_benchmark_results_ooms": ["logical_date"]}
    upgrade(engine)
    assert current_revision(engine) == HEAD and count(engine, benchmark_results) == 1
    assert indexes() == {"ix_benchmark_results_ooms": list(OOM_BOUND_COLUMNS),
                         "ix_benchmark_results_missed_ooms": ["logical_date"]}
    downgrade(engine, "0015")
    assert indexes() == {} and count(engine, benchmark_results) == 1
    upgrade(engine)
    assert set(indexes()) == {"ix_benchmark_results_ooms", "ix_benchmark_results_missed_ooms"}
