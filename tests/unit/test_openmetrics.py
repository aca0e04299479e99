"""The view's /metrics: OpenMetrics of the warehouse's current state, checked with prometheus_client's parser."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from browser.fleet_history import DAG, NIGHTS, run_id, store_history
from fleetbench.report import openmetrics
from fleetbench.report.queries import Filters
from fleetbench.warehouse import fetch_results, get_engine, store_run

NOW = NIGHTS[4] + timedelta(hours=7)
# Host checks: night 4 (index 3) and night 5 (index 4); gpu-a degraded on the newest one.
VERDICTS = {3: {"gpu-a": "ready", "gpu-b": "ready", "gpu-c": "unfit"},
            4: {"gpu-a": "degraded", "gpu-b": "ready", "gpu-c": "unfit"}}


@pytest.fixture()
def history(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    store_history(engine)
    for night, verdicts in VERDICTS.items():
        run = {"dag_id": DAG, "run_id": run_id(night), "logical_date": NIGHTS[night].isoformat(), "cases_total": 0}
        hosts = [{"dag_id": DAG, "run_id": run_id(night), "host": h, "verdict": v,
                  "collected_at": NIGHTS[night] + timedelta(seconds=30)} for h, v in verdicts.items()]
        store_run(engine, {**run, **_stored_run(engine, night)}, hosts, [], complete=False)
    yield engine
    engine.dispose()


def _stored_run(engine, night: int) -> dict:
    from sqlalchemy import select

    from fleetbench.warehouse.schema import runs

    with engine.connect() as conn:
        return dict(conn.execute(select(runs).where(runs.c.run_id == run_id(night))).mappings().one())


def parse(text: str) -> dict[str, dict[tuple, float]]:
    """{family: {sorted label items: value}} through prometheus_client's OpenMetrics parser (raises on bad text)."""
    return {fam.name: {tuple(sorted(s.labels.items())): s.value for s in fam.samples}
            for fam in text_string_to_metric_families(text)}


def expected_newest_ok(engine) -> dict[tuple[str, str], dict]:
    out = {}
    for r in sorted(fetch_results(engine), key=lambda r: r["logical_date"]):
        if r["status"] == "ok":
            out[(r["host"], r["case_key"])] = r
    return out


def test_metrics_of_the_fleet_history(history):
    text = openmetrics.render(openmetrics.collect(history, now=NOW))
    assert text.endswith("# EOF\n")
    got = parse(text)
    newest = expected_newest_ok(history)
    ips = {(dict(k)["host"], dict(k)["case_key"]): v for k, v in got["fleetbench_images_per_second"].items()}
    assert ips == {k: pytest.approx(r["images_per_sec"]) for k, r in newest.items()}
    labels = dict(next(k for k in got["fleetbench_images_per_second"] if dict(k)["host"] == "gpu-b"))
    assert labels == {"dag_id": DAG, "host": "gpu-b", "case_key": "tf.resnet50.bs64.g1.replicated",
                      "model": "resnet50", "num_gpus": "1", "gpu": "H100 SXM5 80GB", "mig_profile": "", "nodes": "1",
                      "host_set": ""}
    energy = {(dict(k)["host"], dict(k)["case_key"]): v for k, v in got["fleetbench_case_energy_joules"].items()}
    assert energy == {k: pytest.approx(r["energy_j"]) for k, r in newest.items()}
    assert got["fleetbench_case_cost_usd"] == {}  # the history has prices but no cost_usd: no sample, not a 0
    nights = set(got["fleetbench_case_logical_date_seconds"].values())
    assert nights == {NIGHTS[4].timestamp()}
    # the one open regression (gpu-a's 1-GPU resnet50 since the driver change); the 2-GPU one recovered
    regs = {(dict(k)["host"], dict(k)["severity"]): v for k, v in got["fleetbench_open_regressions"].items()}
    assert regs == {("gpu-a", "major"): 1, ("gpu-a", "minor"): 0, ("gpu-b", "major"): 0, ("gpu-b", "minor"): 0,
                    ("gpu-c", "major"): 0, ("gpu-c", "minor"): 0}
    verdicts = {(dict(k)["host"], dict(k)["verdict"]): v for k, v in got["fleetbench_host_verdict"].items()}
    assert {k for k, v in verdicts.items() if v == 1} == {("gpu-a", "degraded"), ("gpu-b", "ready"),
                                                         ("gpu-c", "unfit")}
    assert len(verdicts) == 9
    finished = NIGHTS[4] + timedelta(minutes=30)
    assert got["fleetbench_last_run_age_seconds"] == {(("dag_id", DAG),): (NOW - finished).total_seconds()}
    assert got["fleetbench_last_run_timestamp_seconds"] == {(("dag_id", DAG),): finished.timestamp()}
    cases = {dict(k)["status"]: v for k, v in got["fleetbench_last_run_cases"].items()}
    assert cases == {"ok": 5, "failed": 3, "skipped": 0}


def test_metrics_show_only_the_readable_dags(history):
    got = parse(openmetrics.render(openmetrics.collect(history, Filters(dag_ids=frozenset({"other_dag"})), NOW)))
    assert all(not samples for samples in got.values())
    got = parse(openmetrics.render(openmetrics.collect(history, Filters(dag_ids=frozenset({DAG})), NOW)))
    assert len(got["fleetbench_images_per_second"]) == len(expected_newest_ok(history))


def test_an_empty_warehouse_has_metadata_only(tmp_path):
    from fleetbench.warehouse import upgrade

    engine = get_engine(f"sqlite:///{tmp_path}/empty.db")
    upgrade(engine)
    text = openmetrics.render(openmetrics.collect(engine))
    assert "# TYPE fleetbench_images_per_second gauge" in text and all(not s for s in parse(text).values())


def test_label_values_are_escaped():
    fam = openmetrics.Family("fleetbench_x", 'a "help" line\\ with\nnewline')
    fam.add({"host": 'we"ird\\host\nname', "n": None}, 2.5)
    fam.add({"host": "skipped"}, float("nan"))  # not a number: left out
    got = parse(openmetrics.render([fam]))
    assert got == {"fleetbench_x": {(("host", 'we"ird\\host\nname'), ("n", "")): 2.5}}


def test_the_view_serves_metrics(history):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    with TestClient(create_app(engine_factory=lambda: history, readable_dags=lambda: frozenset({DAG}))) as c:
        resp = c.get("/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == openmetrics.CONTENT_TYPE
        assert parse(resp.text)["fleetbench_host_verdict"]
        resp = c.get("/metrics?host=gpu-a")
        assert resp.status_code == 400 and resp.json()["field"] == "host"
    with TestClient(create_app(engine_factory=lambda: history, readable_dags=lambda: frozenset())) as c:
        assert all(not s for s in parse(c.get("/metrics").text).values())


def test_age_is_never_negative(history):
    early = datetime(2026, 11, 5, 2, 10, tzinfo=timezone.utc)  # before the run finished (clock skew)
    got = parse(openmetrics.render(openmetrics.collect(history, now=early)))
    assert got["fleetbench_last_run_age_seconds"] == {(("dag_id", DAG),): 0.0}


def test_each_cases_primary_metric_with_its_unit_and_direction(tmp_path):
    from fleetbench.warehouse import upgrade
    from warehouse_rows import result_row, run_row

    engine = get_engine(f"sqlite:///{tmp_path}/m.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("nccl", ips=None, harness="nccl_tests", metric="avg_busbw", value=180.5, unit="GB/s",
                   better="higher"),
        result_row("lat", ips=None, harness="command", metric="p99_latency", value=12.5, unit="ms", better="lower"),
        result_row("old", ips=99.0),  # no primary metric recorded: images/sec only
        result_row("cpu", ips=50.0, num_gpus=0, device="cpu")])  # on a GPU host: the row keeps its GPU as provenance
    got = parse(openmetrics.render(openmetrics.collect(engine, Filters(dag_ids=frozenset({"fleet_benchmark"})))))
    values = {(dict(k)["case_key"], dict(k)["metric"], dict(k)["unit"], dict(k)["better"]): v
              for k, v in got["fleetbench_case_value"].items()}
    assert values == {("nccl", "avg_busbw", "GB/s", "higher"): 180.5, ("lat", "p99_latency", "ms", "lower"): 12.5}
    assert {dict(k)["case_key"]: dict(k)["gpu"] for k in got["fleetbench_images_per_second"]} == {
        "old": "NVIDIA A100-SXM4-40GB", "cpu": ""}  # a CPU case is not counted under the host's GPU
    engine.dispose()


def test_a_host_measured_without_a_check_has_zero_open_regressions(tmp_path):
    """A host with results but no stored check still gets its 0 series, so a dashboard can tell "nothing open"
    from "no data"."""
    from fleetbench.warehouse import upgrade
    from warehouse_rows import result_row
    from warehouse_rows import run_row as plain_run_row

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, plain_run_row("r1"), [], [result_row("c", host="lonely")])
    got = parse(openmetrics.render(openmetrics.collect(engine, now=NOW)))
    regs = {(dict(k)["host"], dict(k)["severity"]): v for k, v in got["fleetbench_open_regressions"].items()}
    assert regs == {("lonely", "major"): 0, ("lonely", "minor"): 0}
    assert got["fleetbench_host_verdict"] == {}


def test_a_retired_hosts_open_regression_drops_out_with_its_results(history):
    """gpu-a has an open regression; 60 days later only gpu-b is measured. gpu-a's results leave the window, and so
    do its findings (its major regression was reported for ever, firing the README's example alert)."""
    from warehouse_rows import result_row
    from warehouse_rows import run_row as plain_run_row

    later = NIGHTS[4] + timedelta(days=60)
    when = later.isoformat()
    store_run(history, {**plain_run_row("later", DAG), "logical_date": when},
              [], [result_row("tf.resnet50.bs64.g1.replicated", run_id="later", host="gpu-b", logical_date=when,
                              dag_id=DAG)])
    got = parse(openmetrics.render(openmetrics.collect(history, now=later + timedelta(hours=1))))
    regs = {(dict(k)["host"], dict(k)["severity"]): v for k, v in got["fleetbench_open_regressions"].items()}
    assert regs == {("gpu-b", "major"): 0, ("gpu-b", "minor"): 0}
    assert {dict(k)["host"] for k in got["fleetbench_images_per_second"]} == {"gpu-b"}


def test_a_warehouse_without_tables_is_an_answer_not_an_outage(tmp_path):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    engine = get_engine(f"sqlite:///{tmp_path}/new.db")  # nothing stored yet: no tables
    assert openmetrics.collect(engine) == []
    with TestClient(create_app(engine_factory=lambda: engine)) as c:
        resp = c.get("/metrics")
    assert resp.status_code == 200 and resp.text == "# EOF\n"  # was 503 "not reachable"


@pytest.mark.parametrize("url, logged", [
    ("notaurl", "not a database URL"),
    ("postgresql+pyscopg2://fb:s3cret@127.0.0.1:1/w", "unknown driver 'postgresql+pyscopg2'"),  # was a 500
])
def test_a_warehouse_url_that_is_no_url_is_a_503_naming_the_setting(monkeypatch, caplog, url, logged):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import MISCONFIGURED, create_app

    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_READ_URL", raising=False)
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    with TestClient(create_app(), raise_server_exceptions=False) as c, caplog.at_level("WARNING"):
        page, metrics = c.get("/"), c.get("/metrics")
    assert (page.status_code, metrics.status_code) == (503, 503)  # were 500
    assert metrics.json()["detail"] == MISCONFIGURED
    assert "The warehouse&#x27;s URL is not valid (FLEETBENCH_WAREHOUSE_READ_URL" in page.text  # escaped in the page
    assert logged in caplog.text and "s3cret" not in caplog.text


def test_a_warehouse_an_upgrade_behind_says_so_in_the_view(history):
    """New code, the warehouse not yet migrated (the DAG's next run, or airflow-init, does it): the view answered 503
    "not reachable" (SQLite's "no such column" is an OperationalError) with no word of `fleetbench db upgrade`."""
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app
    from fleetbench.warehouse import downgrade

    downgrade(history, "0020")
    with TestClient(create_app(engine_factory=lambda: history), raise_server_exceptions=False) as c:
        page, data, metrics = c.get("/"), c.get("/report.json"), c.get("/metrics")
    assert page.status_code == data.status_code == 200 and data.json()["state"] == "outdated"
    assert "revision 0020, older than this fleetbench" in data.json()["notes"][0]
    assert "fleetbench db upgrade" in page.text and "not reachable" not in page.text
    assert metrics.status_code == 503 and "revision 0020" in metrics.json()["detail"]
    assert "fleetbench db upgrade" in metrics.json()["detail"]


def test_a_sqlite_warehouse_file_that_is_not_there_is_not_created_by_the_view(tmp_path, monkeypatch):
    """A mistyped FLEETBENCH_WAREHOUSE_READ_URL: the view made an empty warehouse there, said "No results yet" and
    served an empty /metrics (a scrape that succeeds: alerts on the last run's age never fired)."""
    from fastapi.testclient import TestClient

    from fleetbench.report.web import MISCONFIGURED, create_app

    wrong = tmp_path / "wrong-name.db"
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_READ_URL", f"sqlite:///{wrong}")
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        page, metrics = c.get("/"), c.get("/metrics")
    assert (page.status_code, metrics.status_code) == (503, 503)
    assert metrics.json()["detail"] == MISCONFIGURED and not wrong.exists()
    # the default warehouse, under the data folder, before the first run: not a setting of anyone's, no results yet
    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_READ_URL")
    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_URL", raising=False)
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "data"))
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        page, metrics = c.get("/report.json"), c.get("/metrics")
    assert (page.status_code, page.json()["state"]) == (200, "no_tables")
    assert (metrics.status_code, metrics.text) == (200, "# EOF\n")


def test_open_regressions_count_each_change_once(tmp_path):
    """A new driver 20 % slower on one case: images/sec down, wall time and cost up. One change, as `regressions
    list` shows it, so the major gauge is 1, not 3 (the time and cost findings name it in same_change_as)."""
    import random

    from fleetbench.report.queries import open_regressions
    from fleetbench.warehouse import upgrade
    from regression_rows import assess_night, night_row, store_night

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    rng = random.Random(8)
    for n in range(36):
        slow = n >= 30
        v = (80.0 if slow else 100.0) * (1 + rng.gauss(0, 0.005))
        store_night(engine, n, [night_row(n, value=v, duration_s=6000 / v, cost_usd=6000 / v / 3600 * 2.0,
                                          driver_version="B" if slow else "A")])
        assess_night(engine, n)
    with engine.connect() as conn:
        found = open_regressions(conn, Filters())
    assert {(r["metric"], r["same_change_as"]) for r in found} == {
        ("images_per_sec", None), ("duration_s", "images_per_sec"), ("cost_usd", "images_per_sec")}
    got = parse(openmetrics.render(openmetrics.collect(engine)))
    regs = {(dict(k)["host"], dict(k)["severity"]): v for k, v in got["fleetbench_open_regressions"].items()}
    assert regs == {("h1", "major"): 1, ("h1", "minor"): 0}
    engine.dispose()


def test_mig_and_multi_node_series_carry_labels_that_keep_them_apart(tmp_path):
    """A 1g.10gb MIG slice, a 2-node set's total and a whole GPU all had num_gpus="1" and the same gpu: an alert on
    the 1-GPU A100 minimum fired for the slice. mig_profile, nodes and host_set tell them apart."""
    from fleetbench.warehouse import upgrade
    from warehouse_rows import result_row, run_row

    engine = get_engine(f"sqlite:///{tmp_path}/m.db")
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("whole", ips=102.0),
        result_row("slice", ips=32.0, mig_profile="1g.10gb"),
        result_row("set", ips=192.0, nodes=2, host_set="h1,h2")])
    got = parse(openmetrics.render(openmetrics.collect(engine)))
    labels = {dict(k)["case_key"]: {n: dict(k)[n] for n in ("num_gpus", "mig_profile", "nodes", "host_set")}
              for k in got["fleetbench_images_per_second"]}
    assert labels == {"whole": {"num_gpus": "1", "mig_profile": "", "nodes": "1", "host_set": ""},
                      "slice": {"num_gpus": "1", "mig_profile": "1g.10gb", "nodes": "1", "host_set": ""},
                      "set": {"num_gpus": "1", "mig_profile": "", "nodes": "2", "host_set": "h1,h2"}}
    engine.dispose()
