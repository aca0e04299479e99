"""`make bench` part 3: the warehouse. Storing nights of results on SQLite and PostgreSQL, and the
latency of the report's queries over a year of history. Run through `bench/run.py --only warehouse`.

Per backend, on a fresh database:

1. `store_run` of a few nights on an empty table (`night_store_s_empty`).
2. The rest of the history up to `nights` filled in bulk, straight in SQL (one INSERT ... SELECT per
   night from small host and case tables, with the secondary indexes dropped during the load and
   built again after it), then the rollups rebuilt from it as migration 0004 builds them. Storing a
   year through `store_run` would take too long to bench; `history_fill` says how it was filled.
   Both backends are filled at the same time (the databases do the work, on a core each).
3. `store_run` of a few more nights on top of the full history (`night_store_s_on_year`, the cost a
   night really has), a rerun of the last one (upsert over existing keys), and the year through
   `store_run` extrapolated from those nights (`year_via_store_run_s_extrapolated`, not measured).
4. The report (`build_report`: the CLI, the Airflow view and the DAG's report task) over the default
   window (the last 30 days), the whole year, and one host over the whole year; each section of the
   whole-year report on its own; the latest run's results (`fetch_results`); the Airflow view's page
   (report, charts and HTML through its app) over the default window and the whole year.

Steps 1, 3 and 4 run one backend at a time.

The data: `hosts` hosts x 20 cases (resnet50, 5 batch sizes x 1/2/4/8 GPUs) a night, derived metrics
filled in as the DAG's `derive` fills them (energy and cost included), each result's primary metric named
(images_per_sec) and five metric samples per ok result in result_metrics (SAMPLES: 36 million rows over a year
of 1,000 hosts; every night stored through `store_run` stores its samples with it), about 1 % of the cases
failed, half of the hosts on a new driver from night 180, and a handful of regression findings a night. Every
night stored through `store_run` also stores each ok result's 11 step lines (`step_rows`: about 218,000 `steps` rows a
night at 1,000 hosts, as the DAG's store writes them); the bulk-filled history has none (a year of them would be
~80 million rows), which `history_fill` says.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from common import PG_URL, median

DAG = "fleet_benchmark"
START = datetime(2026, 1, 1, 2, tzinfo=timezone.utc)
OLD_DRIVER, NEW_DRIVER, UPGRADE_NIGHT = "535.104.05", "550.54.15", 180
# The catalog's entry (include/config/gpu_catalog.yaml): an estimated row's power is its TDP, as `derive` takes it.
GPU_MODEL, GPU_CATALOG, PRICE, WATTS = "NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", 1.99, 400.0
BATCHES, GPUS = (32, 64, 128, 256, 512), (1, 2, 4, 8)
# (case_key, batch/GPU, GPUs, images/sec, efficiency)
CASES = [(f"cnn.resnet50.bs{bs}.g{g}.replicated", bs, g, 300.0 * g * (0.96 if g > 1 else 1.0) + bs / 8,
          0.96 if g > 1 else None) for bs in BATCHES for g in GPUS]
HARNESS = "tf_cnn_benchmarks"
# Five metric samples per ok result (result_metrics), the last two labelled as nccl-tests' are: 36 million rows over
# a year of 1,000 hosts. The nights stored on top of the year store theirs with them (issue: < 5 s on PostgreSQL).
SAMPLES = (("images_per_sec", "images/s", "higher", "{}"), ("step_time_median", "ms", "lower", "{}"),
           ("final_loss", "1", "lower", "{}"),
           ("busbw", "GB/s", "higher", '{"placement": "out_of_place", "size_bytes": 8589934592}'),
           ("time", "us", "lower", '{"placement": "out_of_place", "size_bytes": 8589934592}'))
# The step lines tf_cnn_benchmarks prints for --num_batches 100 (step 1, then every 10th: the 11 of each result's
# step_count), as fractions of the result's images/sec: (step, images/sec, +/-, jitter, loss), taken from a real
# run (tests/fixtures/real-logs/tfcnn_resnet50_8gpu_lambda-v100-fp16.log, total 4676.54 images/sec).
STEP_LINES = ((1, 0.963, 0.0, 0.0, 7.79), (10, 1.004, 0.0201, 0.0544, 7.653), (20, 1.019, 0.0128, 0.0592, 7.577),
              (30, 1.012, 0.0116, 0.0591, 7.502), (40, 1.021, 0.01, 0.0587, 7.481), (50, 1.021, 0.0095, 0.0587, 7.472),
              (60, 1.02, 0.0084, 0.0592, 7.473), (70, 1.012, 0.0085, 0.0656, 7.475), (80, 1.005, 0.009, 0.0692, 7.475),
              (90, 1.001, 0.009, 0.0688, 7.477), (100, 1.0, 0.0083, 0.0688, 7.47))
DURATION_S = 120.0  # each case's wall time
STORED_NIGHTS = 3  # store_run nights timed on the empty table and on top of the history
QUERY_REPEATS = 3


def night(n: int) -> datetime:
    return START + timedelta(days=n)


def run_id(n: int) -> str:
    return f"scheduled__{night(n).isoformat()}"


def host_name(j: int) -> str:
    return f"gpu-{j:04d}"


def driver(j: int, n: int) -> str:
    return NEW_DRIVER if j % 2 == 0 and n >= UPGRADE_NIGHT else OLD_DRIVER


def failed(j: int, k: int, n: int) -> bool:
    return (j * len(CASES) + k + n) % 97 == 0


@functools.cache
def _step_stats():
    """What `derive` makes of STEP_LINES' images/sec (`fleetbench.metrics.step_stats`), as fractions of the result's
    images/sec (median, spread; the coefficient of variation is the same at any scale)."""
    from fleetbench.metrics import step_stats

    return step_stats([line[1] for line in STEP_LINES])


def derived(row: dict) -> dict:
    """Fill in the derived metrics the DAG's `derive` makes of a row's images/sec, power, price per GPU-hour, GPUs
    and wall time, and of the step lines `step_rows` gives it: energy (estimated, for every case that ran, failed
    ones too), cost, cost per million images, images per joule and the step statistics. Returns the row."""
    from fleetbench.metrics import cost_per_million_images_usd, cost_usd, energy_j, images_per_joule, kwh

    ips, power, price, gpus, duration = (row["images_per_sec"], row["mean_power_w"], row["price_per_gpu_hour"],
                                         row["num_gpus"], row["duration_s"])
    row["energy_j"] = energy_j(power, duration)
    row["energy_kwh"] = kwh(row["energy_j"])
    row["images_per_joule"] = images_per_joule(ips, power)
    row["cost_usd"] = cost_usd(price, gpus, duration)
    row["cost_per_million_images_usd"] = cost_per_million_images_usd(price, gpus, ips)
    steps = _step_stats() if ips is not None else None
    row["step_median_images_per_sec"] = ips * steps.median if steps else None
    row["step_spread_images_per_sec"] = ips * steps.spread if steps else None
    row["step_cv"] = steps.cv if steps else None
    return row


def night_rows(n: int, hosts: int) -> tuple[dict, list[dict]]:
    """One night as the DAG stores it: the run row and one result row per host and case, its derived metrics
    filled in (`derived`)."""
    when = night(n)
    rows = []
    for j in range(hosts):
        for k, (case_key, bs, gpus, ips, eff) in enumerate(CASES):
            bad = failed(j, k, n)
            value = None if bad else ips + (j * len(CASES) + k) % 17
            rows.append({
                "dag_id": DAG, "run_id": run_id(n), "logical_date": when, "host": host_name(j), "case_key": case_key,
                "benchmark": "cnn", "model": "resnet50", "batch_size_per_device": bs, "batch_size_global": bs * gpus,
                "num_gpus": gpus, "variable_update": "replicated", "device": "gpu", "num_batches": 100,
                "image_name": "tf1", "image_ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3",
                "image_digest": "sha256:" + "a" * 64, "status": "failed" if bad else "ok",
                "failure_class": "gpu_oom" if bad else None, "images_per_sec": value, "step_count": 11,
                "exit_code": 1 if bad else 0, "started_at": when, "finished_at": when + timedelta(minutes=2),
                "duration_s": DURATION_S, "driver_version": driver(j, n), "cuda_driver_version": "12.2",
                "gpu_model": GPU_MODEL, "command": '["python"]', "energy_source": "estimated",
                "precision": "fp32", "gpu_catalog_name": GPU_CATALOG,
                "speedup_efficiency": None if bad else eff, "price_per_gpu_hour": PRICE, "mean_power_w": WATTS * gpus,
                "harness": HARNESS, "metric": "images_per_sec", "value": value, "unit": "images/s",
                "better": "higher"})
            derived(rows[-1])
    run = {"dag_id": DAG, "run_id": run_id(n), "logical_date": when, "run_type": "scheduled", "fleet": "bench",
           "config_digest": "x", "started_at": when, "finished_at": when + timedelta(hours=1),
           "cases_total": len(rows), "cases_ok": sum(r["status"] == "ok" for r in rows),
           "cases_failed": sum(r["status"] == "failed" for r in rows), "cases_skipped": 0}
    return run, rows


def step_rows(rows: list[dict]):
    """The step lines of each ok result (STEP_LINES scaled to its images/sec), as the DAG stores them with it."""
    for r in rows:
        if r["status"] != "ok":
            continue
        key = {k: r[k] for k in ("dag_id", "run_id", "host", "case_key")}
        value = r["images_per_sec"]
        for step, ips, plusminus, jitter, loss in STEP_LINES:
            yield {**key, "step": step, "images_per_sec": value * ips, "plusminus": value * plusminus,
                   "jitter": value * jitter, "loss": loss}


def metric_rows(rows: list[dict]) -> list[dict]:
    """The SAMPLES of each ok result, as the DAG stores them with it."""
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        key = {k: r[k] for k in ("dag_id", "run_id", "host", "case_key")}
        for i, (metric, unit, better, labels) in enumerate(SAMPLES):
            out.append({**key, "metric": metric, "labels": labels, "value": r["value"] if i == 0 else 100.0 + i,
                        "unit": unit, "better": better})
    return out


# -- the bulk history ------------------------------------------------------------------------------
FILL_RESULT = """
INSERT INTO benchmark_results (dag_id, run_id, logical_date, host, case_key, benchmark, model, batch_size_per_device,
    batch_size_global, num_gpus, variable_update, device, num_batches, image_name, image_ref, image_digest, status,
    failure_class, images_per_sec, step_count, exit_code, started_at, finished_at, duration_s, driver_version,
    cuda_driver_version, gpu_model, command, energy_source, energy_j, energy_kwh, stored_at, precision,
    gpu_catalog_name, speedup_efficiency, price_per_gpu_hour, cost_usd, cost_per_million_images_usd, mean_power_w,
    images_per_joule, harness, metric, value, unit, better)
SELECT :dag, :run, :when, h.host, c.case_key, 'cnn', 'resnet50', c.bs, c.bs * c.gpus, c.gpus, 'replicated', 'gpu', 100,
    'tf1', 'nvcr.io/nvidia/tensorflow:23.03-tf1-py3', :digest,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN 'failed' ELSE 'ok' END,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN 'gpu_oom' END,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN NULL ELSE c.ips + (h.j * :ncases + c.k) % 17 END,
    11, CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN 1 ELSE 0 END, :when, :finished, :duration,
    CASE WHEN h.j % 2 = 0 AND :n >= :upgrade THEN :new_driver ELSE :old_driver END,
    '12.2', :gpu_model, '["python"]', 'estimated', :watts * c.gpus * :duration,
    :watts * c.gpus * :duration / 3600000.0, :when, 'fp32', :catalog,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN NULL ELSE c.eff END, :price, :price * c.gpus * :duration / 3600.0,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN NULL
         ELSE :price * c.gpus / (3600 * (c.ips + (h.j * :ncases + c.k) % 17)) * 1e6 END,
    :watts * c.gpus,
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN NULL ELSE (c.ips + (h.j * :ncases + c.k) % 17) / (:watts * c.gpus) END,
    :harness, 'images_per_sec',
    CASE WHEN (h.j * :ncases + c.k + :n) % 97 = 0 THEN NULL ELSE c.ips + (h.j * :ncases + c.k) % 17 END, 'images/s', 'higher'
FROM bench_hosts h CROSS JOIN bench_cases c
ORDER BY h.host, c.case_key
"""  # noqa: E501
FILL_METRICS = """
INSERT INTO result_metrics (dag_id, run_id, host, case_key, metric, labels, value, unit, better)
SELECT r.dag_id, r.run_id, r.host, r.case_key, s.metric, s.labels, CASE WHEN s.i = 0 THEN r.value ELSE 100.0 + s.i END,
    s.unit, s.better
FROM benchmark_results r CROSS JOIN bench_samples s
WHERE r.dag_id = :dag AND r.run_id = :run AND r.status = 'ok'
ORDER BY r.host, r.case_key, s.metric, s.labels
"""
FILL_RUN = """
INSERT INTO runs (dag_id, run_id, logical_date, run_type, fleet, config_digest, started_at, finished_at, cases_total,
    cases_ok, cases_failed, cases_skipped)
SELECT :dag, :run, :when, 'scheduled', 'bench', 'x', :when, :finished, COUNT(*),
    SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0
FROM benchmark_results WHERE dag_id = :dag AND run_id = :run
"""
# A few findings a night: a tenth of a percent of the hosts, on their 1-GPU bs64 case.
FILL_REGRESSIONS = """
INSERT INTO regressions (dag_id, run_id, host, case_key, metric, direction, baseline_value, value, delta_pct, z_score,
    p_value, baseline_n, baseline_window, changes, severity, detected_at)
SELECT dag_id, run_id, host, case_key, 'images_per_sec', 'higher', images_per_sec * 1.2, images_per_sec, -16.7, -6.0,
    0.001, 5, '[]', NULL, 'major', :when
FROM benchmark_results
WHERE dag_id = :dag AND run_id = :run AND case_key = :case AND status = 'ok' AND host IN (
    SELECT host FROM bench_hosts WHERE (j + :n) % 1000 = 0)
"""


def fill_history(engine, nights: range, hosts: int) -> dict:
    """Nights of results straight in SQL (see the module doc), then the rollups rebuilt from all rows."""
    from sqlalchemy import DateTime, bindparam, inspect, text

    from fleetbench.warehouse import rollup
    from fleetbench.warehouse.schema import benchmark_results, result_metrics

    dialect = engine.dialect.name
    existing = {i["name"] for t in ("benchmark_results", "result_metrics") for i in inspect(engine).get_indexes(t)}
    indexes = [i for t in (benchmark_results, result_metrics) for i in t.indexes
               if i.name in existing and not i.unique]  # partial ones too
    typed = [bindparam("when", type_=DateTime(timezone=True)), bindparam("finished", type_=DateTime(timezone=True))]
    fill, fill_run, fill_regressions = (text(sql).bindparams(*typed[:2 if sql != FILL_REGRESSIONS else 1])
                                        for sql in (FILL_RESULT, FILL_RUN, FILL_REGRESSIONS))
    fill_metrics = text(FILL_METRICS)
    out = {"history_fill": "bulk SQL (INSERT ... SELECT per night from host, case and sample tables, secondary indexes "
                           "rebuilt after the load; both backends at once), not store_run; results and metric samples "
                           "only, no step lines (the nights stored through store_run store theirs)",
           "history_nights_filled": len(nights)}
    start = time.monotonic()
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_hosts (j INTEGER PRIMARY KEY, host VARCHAR(100))"))
        conn.execute(text("CREATE TABLE bench_cases (k INTEGER PRIMARY KEY, case_key VARCHAR(250), bs INTEGER, "
                          "gpus INTEGER, ips FLOAT, eff FLOAT)"))
        conn.execute(text("INSERT INTO bench_hosts VALUES (:j, :host)"),
                     [{"j": j, "host": host_name(j)} for j in range(hosts)])
        conn.execute(text("INSERT INTO bench_cases VALUES (:k, :case_key, :bs, :gpus, :ips, :eff)"),
                     [{"k": k, "case_key": c[0], "bs": c[1], "gpus": c[2], "ips": c[3], "eff": c[4]}
                      for k, c in enumerate(CASES)])
        conn.execute(text("CREATE TABLE bench_samples (i INTEGER PRIMARY KEY, metric VARCHAR(100), unit VARCHAR(20), "
                          "better VARCHAR(10), labels VARCHAR(2000))"))
        conn.execute(text("INSERT INTO bench_samples VALUES (:i, :metric, :unit, :better, :labels)"),
                     [{"i": i, "metric": m, "unit": u, "better": b, "labels": lb}
                      for i, (m, u, b, lb) in enumerate(SAMPLES)])
        for i in indexes:
            i.drop(conn)
    for n in nights:
        when = night(n)
        params = {"dag": DAG, "run": run_id(n), "when": when, "finished": when + timedelta(minutes=2), "n": n,
                  "ncases": len(CASES), "digest": "sha256:" + "a" * 64, "upgrade": UPGRADE_NIGHT,
                  "new_driver": NEW_DRIVER, "old_driver": OLD_DRIVER, "gpu_model": GPU_MODEL, "catalog": GPU_CATALOG,
                  "price": PRICE, "watts": WATTS, "harness": HARNESS, "duration": DURATION_S}
        with engine.begin() as conn:
            conn.execute(fill, params)
            conn.execute(fill_run, {k: params[k] for k in ("dag", "run", "when", "finished")})
            conn.execute(fill_metrics, {"dag": DAG, "run": run_id(n)})
            conn.execute(fill_regressions, {"dag": DAG, "run": run_id(n), "when": when, "n": n, "case": CASES[4][0]})
    with engine.begin() as conn:
        for i in indexes:  # as the schema module (and its migrations) made them, WHERE clauses included
            i.create(conn)
        conn.execute(text("DROP TABLE bench_hosts"))
        conn.execute(text("DROP TABLE bench_cases"))
        conn.execute(text("DROP TABLE bench_samples"))
    out["history_fill_s"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    with engine.begin() as conn:
        rollup.rebuild(conn)
    out["rollup_rebuild_s"] = round(time.monotonic() - start, 1)
    with engine.connect() as conn:  # fresh statistics, as autovacuum / `ANALYZE` would leave them
        if dialect == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        else:
            conn.exec_driver_sql("PRAGMA analysis_limit = 1000")  # sampled, as `PRAGMA optimize` does
            conn.execute(text("ANALYZE"))
            conn.commit()
    return out


# -- the bench -------------------------------------------------------------------------------------
def bench_warehouse(quick: bool) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import func, select

    from fleetbench.warehouse import get_engine, schema, upgrade
    from pg_databases import fresh_database

    hosts = 100 if quick else 1000
    nights = 10 if quick else 365
    out = {"hosts": hosts, "cases_per_host": len(CASES), "rows_per_night": hosts * len(CASES), "history_nights": nights,
           "stored_nights_timed": STORED_NIGHTS}
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-wh-"))
    try:
        with fresh_database(PG_URL, prefix="fb_bench") as pg:
            engines = {"sqlite": get_engine(f"sqlite:///{workdir}/w.db"), "postgresql": get_engine(pg)}
            try:
                for label, engine in engines.items():
                    upgrade(engine)
                    empty = timed_nights(engine, range(STORED_NIGHTS), hosts)
                    out[label] = {"night_store_s_empty": {"median": median(empty), "each": empty}}
                with ThreadPoolExecutor(len(engines)) as pool:
                    fills = {label: pool.submit(fill_history, engine, range(STORED_NIGHTS, nights), hosts)
                             for label, engine in engines.items()}
                    for label, fill in fills.items():
                        out[label].update(fill.result())
                for label, engine in engines.items():
                    res = out[label]
                    on_year = timed_nights(engine, range(nights, nights + STORED_NIGHTS), hosts)
                    res["night_store_s_on_year"] = {"median": median(on_year), "each": on_year}
                    res["rerun_night_s"] = timed_nights(engine, [nights + STORED_NIGHTS - 1], hosts)[0]
                    res["year_via_store_run_s_extrapolated"] = {
                        "value": round(median(on_year) * 365, 1),
                        "how": "extrapolation: night_store_s_on_year median x 365, not measured"}
                    with engine.connect() as conn:
                        res["rows"] = {t.name: conn.execute(select(func.count()).select_from(t)).scalar()
                                       for t in (schema.benchmark_results, schema.result_metrics,
                                                 schema.run_host_rollup, schema.host_month_rollup,
                                                 schema.run_case_rollup)}
                    res["queries_s"] = time_report_queries(engine, nights + STORED_NIGHTS)
            finally:
                for engine in engines.values():
                    engine.dispose()
            out["sqlite"]["database_mib"] = round(sum(p.stat().st_size for p in workdir.glob("w.db*")) / 2**20)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def timed_nights(engine, nights, hosts: int) -> list[float]:
    from fleetbench.warehouse import store_run

    times = []
    for n in nights:
        run, rows = night_rows(n, hosts)
        samples, steps = metric_rows(rows), list(step_rows(rows))
        start = time.monotonic()
        store_run(engine, run, [], rows, steps, metric_rows=samples)
        times.append(round(time.monotonic() - start, 3))
    return times


def time_report_queries(engine, nights: int) -> dict:
    """Median latency of the report (`build_report`) over the default window, the whole history, and
    one host's whole history; of each section of the whole-history report; of the latest run's results."""
    from fleetbench.report import queries
    from fleetbench.report.queries import build_report, parse_filters
    from fleetbench.warehouse import fetch_results, latest_run_id

    year = parse_filters(since=night(0).date().isoformat(), until=night(nights).date().isoformat())
    reports = {
        "report_default_window": lambda: build_report(engine),
        "report_whole_year": lambda: build_report(engine, year),
        "report_one_host_whole_year": lambda: build_report(engine, parse_filters(
            since=year.since.date().isoformat(), until=night(nights).date().isoformat(), host=host_name(7))),
        "latest_run_results": lambda: fetch_results(engine, run_id=latest_run_id(engine)),
    }
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    view = TestClient(create_app(engine_factory=lambda: engine))

    def page(**params) -> None:  # the Airflow view's page: the report, its charts and the HTML
        resp = view.get("/", params=params)
        assert resp.status_code == 200, resp.text[:300]

    reports["view_default_window"] = page
    reports["view_whole_year"] = lambda: page(since=year.since.date().isoformat(),
                                              until=night(nights).date().isoformat())
    out: dict = {}
    for name, fn in reports.items():
        out[name] = round(_median_time(fn), 3)
    report = build_report(engine, year)
    out["whole_year_throughput_mode"] = report["throughput_mode"]
    out["whole_year_throughput_series"] = len(report["throughput"])
    sections = {}
    with engine.connect() as conn:
        for name, fn in queries.SECTIONS.items():
            sections[name] = round(_median_time(lambda: fn(conn, year)), 3)
    out["whole_year_sections"] = sections
    return out


def _median_time(fn) -> float:
    samples = []
    for _ in range(QUERY_REPEATS):
        start = time.monotonic()
        fn()
        samples.append(time.monotonic() - start)
    return median(samples)


# -- attempts (`bench/run.py --only attempts`) -------------------------------------------------------
ATTEMPT_NIGHTS = 3


def bench_attempts(quick: bool) -> dict:
    """A night of `hosts` x 20 results stored, stored again by a retried task (the same attempts: replaced),
    then measured again on a new driver (`--reprocess-behavior completed`: every result gets a second
    attempt and the first moves to superseded_results); per backend, on a fresh database, medians of
    ATTEMPT_NIGHTS nights, each stored with its step lines. Then the report over those nights and its re-measured
    section."""
    from sqlalchemy import func, select

    from fleetbench.report import queries
    from fleetbench.report.queries import build_report, parse_filters
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from fleetbench.warehouse.schema import benchmark_results, superseded_results
    from fleetbench.warehouse.schema import steps as steps_table
    from pg_databases import fresh_database

    hosts = 100 if quick else 1000
    out: dict = {"hosts": hosts, "rows_per_night": hosts * len(CASES), "nights": ATTEMPT_NIGHTS}
    workdir = Path(tempfile.mkdtemp(prefix="fleetbench-attempts-"))
    try:
        with fresh_database(PG_URL, prefix="fb_bench") as pg:
            for label, url in (("sqlite", f"sqlite:///{workdir}/w.db"), ("postgresql", pg)):
                engine = get_engine(url)
                try:
                    upgrade(engine)
                    times: dict[str, list[float]] = {"first_store_s": [], "retry_same_attempt_s": [],
                                                     "rerun_new_driver_s": []}
                    for n in range(ATTEMPT_NIGHTS):
                        run, rows = night_rows(n, hosts)
                        again = [{**r, "driver_version": NEW_DRIVER, "attempt_id": f"b{n}-{i}",
                                  "started_at": r["started_at"] + timedelta(days=30)} for i, r in enumerate(rows)]
                        for name, write in (("first_store_s", rows), ("retry_same_attempt_s", rows),
                                            ("rerun_new_driver_s", again)):
                            steps = list(step_rows(write))  # with its step lines, as the DAG stores a night
                            start = time.monotonic()
                            store_run(engine, run, [], write, steps)
                            times[name].append(round(time.monotonic() - start, 3))
                    res = {name: {"median": median(each), "each": each} for name, each in times.items()}
                    with engine.connect() as conn:
                        res["superseded_rows"] = conn.execute(
                            select(func.count()).select_from(superseded_results)).scalar()
                        # the step lines of the current attempts only: one set per ok result, none left twice
                        res["step_rows"] = conn.execute(select(func.count()).select_from(steps_table)).scalar()
                        ok = conn.execute(select(func.count()).select_from(benchmark_results)
                                          .where(benchmark_results.c.status == "ok")).scalar()
                    if res["step_rows"] != ok * len(STEP_LINES):
                        raise RuntimeError(f"{label}: {res['step_rows']} step lines for {ok} ok results, not "
                                           f"{len(STEP_LINES)} each")
                    window = parse_filters(since=night(0).date().isoformat(),
                                           until=night(ATTEMPT_NIGHTS).date().isoformat())
                    res["report_s"] = round(_median_time(lambda: build_report(engine, window)), 3)
                    with engine.connect() as conn:
                        res["remeasured_section_s"] = round(_median_time(
                            lambda: queries.remeasured(conn, window)), 3)
                    out[label] = res
                finally:
                    engine.dispose()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out
