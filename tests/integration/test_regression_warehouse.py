"""Regression detection and the compare report against a real warehouse: SQLite and PostgreSQL.

A history of eight nights is written with `store_run`, as the DAG writes it. On the last night host
h1 got a new driver and case a lost 20 % of its throughput; everything else stays within noise,
h2's case a got faster, h2's case b runs a new image, and case c on h1 is new.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from fleetbench.cli import main
from fleetbench.config import RegressionSettings
from fleetbench.regression import NoResults, assess_run, compare, format_compare, store_findings
from fleetbench.warehouse import get_engine, store_run, upgrade
from fleetbench.warehouse.schema import regressions
from regression_rows import detect_for_run, fetch_regressions
from warehouse_rows import result_row, run_row, step_rows

pytestmark = pytest.mark.integration

OLD, NEW = "535.104.05", "550.54.14"
DIGEST, NEW_DIGEST = "sha256:" + "a" * 64, "sha256:" + "b" * 64
NIGHT0 = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
NOISE = [0.0, 0.4, -0.3, 0.2, -0.1, 0.1, -0.2, 0.3]  # % of night-to-night wobble
POWER_W, PRICE = 250.0, 2.0


def night_id(n: int) -> str:
    return f"scheduled__{(NIGHT0 + timedelta(days=n)).isoformat()}"


def result(n: int, host: str, case: str, ips: float, duration: float, **extra) -> dict:
    when = (NIGHT0 + timedelta(days=n)).isoformat()
    return result_row(case, run_id=night_id(n), host=host, ips=ips, logical_date=when, duration_s=duration,
                      energy_source="measured", energy_j=POWER_W * duration, cost_usd=PRICE * duration / 3600, **extra)


def store_night(engine, n: int, h1a_ips: float | None = None) -> None:
    """Night n (0..7). Night 7: h1 runs driver NEW, h1/a is 20 % slower (or `h1a_ips`), h2/a 15 % faster, h2/b a
    new image."""
    w = 1 + NOISE[n] / 100
    last = n == 7
    rows = []
    for host in ("h1", "h2"):
        driver = NEW if last and host == "h1" else OLD
        for case, base in (("a", 1000.0), ("b", 400.0)):
            ips = base * w
            if last and (host, case) == ("h1", "a"):
                ips = h1a_ips if h1a_ips is not None else ips * 0.8
            if last and (host, case) == ("h2", "a"):
                ips *= 1.15
            digest = NEW_DIGEST if last and (host, case) == ("h2", "b") else DIGEST
            rows.append(result(n, host, case, ips, 100_000 / ips, driver_version=driver, image_digest=digest))
    if n >= 5:  # case c exists since night 5: two earlier nights on night 7
        rows.append(result(n, "h1", "c", 50.0 * w, 60.0, driver_version=NEW if last else OLD))
    steps = [s for r in rows
             for s in step_rows(r["case_key"], 10, run_id=r["run_id"], host=r["host"], base=r["images_per_sec"] - 5)]
    run = {**run_row(night_id(n)), "logical_date": (NIGHT0 + timedelta(days=n)).isoformat()}
    store_run(engine, run, [], rows, steps)


@pytest.fixture(params=["sqlite", "postgresql"])
def warehouse(request, tmp_path):
    """(engine, url) of an empty, migrated warehouse holding the eight nights."""
    url = f"sqlite:///{tmp_path}/w.db" if request.param == "sqlite" else request.getfixturevalue("pg_database")
    engine = get_engine(url)
    upgrade(engine)
    for n in range(8):
        store_night(engine, n)
    yield engine, url
    engine.dispose()


def test_detection_stores_the_regressions_of_the_latest_night_idempotently(warehouse, caplog):
    engine, _ = warehouse
    caplog.set_level("INFO", logger="fleetbench.regression")
    assessment = assess_run(engine, "fleet_benchmark", night_id(7))
    assert assessment.checked == 3  # h1/a, h1/b, h2/a
    assert sorted(assessment.insufficient_history) == ["h1 c", "h2 b"]
    assert "h2 b: insufficient history (0 earlier ok result(s) with image digest " + NEW_DIGEST in caplog.text
    assert "h1 c: insufficient history (2 earlier ok result(s)" in caplog.text
    assert {(i["host"], i["case_key"], i["metric"]) for i in assessment.improvements} >= {("h2", "a", "images_per_sec")}

    findings = detect_for_run(engine, "fleet_benchmark", night_id(7))
    assert store_findings(engine, "fleet_benchmark", night_id(7), findings) == 4
    rows = fetch_regressions(engine, run_id=night_id(7))
    # Slower -> more time, energy and cost too; the faster h2/a is no regression.
    assert [(r["host"], r["case_key"], r["metric"], r["direction"], r["severity"]) for r in rows] == [
        ("h1", "a", "cost_usd", "lower", "major"), ("h1", "a", "duration_s", "lower", "major"),
        ("h1", "a", "energy_j", "lower", "major"), ("h1", "a", "images_per_sec", "higher", "major")]
    ips = rows[-1]
    assert ips["delta_pct"] == pytest.approx(-20.0, abs=0.5)
    assert ips["baseline_value"] == pytest.approx(1000.0, rel=0.005) and ips["value"] == pytest.approx(800.0, rel=0.005)
    assert ips["baseline_n"] == 7 and ips["baseline_window"] == [night_id(n) for n in range(6, -1, -1)]
    assert ips["changes"] == {"driver_version": {"before": OLD, "after": NEW}}
    assert ips["z_score"] < -3.5 and ips["p_value"] < 1e-3
    assert rows[0]["p_value"] is None  # step samples are images/sec: only that metric gets a p-value

    # Detecting again replaces, never duplicates (same ids: upserted on the key).
    ids = [r["id"] for r in rows]
    store_findings(engine, "fleet_benchmark", night_id(7), detect_for_run(engine, "fleet_benchmark", night_id(7)))
    assert [r["id"] for r in fetch_regressions(engine, run_id=night_id(7))] == ids

    # Another run's finding is left alone when night 7 is rerun and has recovered: its rows go.
    other = {**findings[0], "run_id": night_id(6)}
    store_findings(engine, "fleet_benchmark", night_id(6), [other])
    store_night(engine, 7, h1a_ips=1001.0)
    assert detect_for_run(engine, "fleet_benchmark", night_id(7)) == []
    assert store_findings(engine, "fleet_benchmark", night_id(7), []) == 0
    assert fetch_regressions(engine, run_id=night_id(7)) == []
    assert [r["run_id"] for r in fetch_regressions(engine)] == [night_id(6)]


def test_the_baseline_is_the_trailing_window_before_the_run(warehouse):
    engine, _ = warehouse
    found = detect_for_run(engine, "fleet_benchmark", night_id(7), RegressionSettings(window=3))
    assert {tuple(f["baseline_window"]) for f in found} == {(night_id(6), night_id(5), night_id(4))}
    # A backfill of night 3 sees nights 0-2 only, not the slower night 7 after it.
    assessment = assess_run(engine, "fleet_benchmark", night_id(3))
    assert assessment.checked == 4 and assessment.findings == []
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(regressions)).scalar() == 0  # assess_run only reads


def test_compare_report_before_and_after_the_driver_upgrade(warehouse, capsys, monkeypatch):
    engine, url = warehouse
    rows = compare(engine, OLD, NEW)
    by_case = {(r["host"], r["case_key"]): r for r in rows}
    assert set(by_case) == {("h1", "a"), ("h1", "b"), ("h1", "c")}  # h2 never ran NEW
    a = by_case[("h1", "a")]
    assert (a["verdict"], a["basis"], a["severity"], a["after_n"]) == ("regression", "runs", "major", 1)
    assert a["before_n"] == 7  # h1/a's nights 0-6 (h2/a also ran OLD, but the report is per host and case)
    assert a["delta_pct"] == pytest.approx(-20.0, abs=0.5)
    assert a["energy_delta_pct"] == pytest.approx(25.0, abs=0.8) and a["cost_delta_pct"] == pytest.approx(25.0, abs=0.8)
    assert a["p_value"] < 1e-3 and (a["before_driver_version"], a["after_driver_version"]) == (OLD, NEW)
    assert by_case[("h1", "b")]["verdict"] == "no change"
    assert by_case[("h1", "c")]["before_n"] == 2 and by_case[("h1", "c")]["basis"] == "steps"
    assert "regression (major)" in format_compare(rows)

    # Dates: the night before against the last night, one host.
    dated = {(r["host"], r["case_key"]): r for r in compare(engine, "2026-12-07", "2026-12-08", host="h2")}
    assert set(dated) == {("h2", "a"), ("h2", "b")}
    wobble = (1 + NOISE[7] / 100) / (1 + NOISE[6] / 100)
    assert dated[("h2", "a")]["delta_pct"] == pytest.approx((1.15 * wobble - 1) * 100)
    assert dated[("h2", "b")]["image_changed"] and not dated[("h2", "a")]["image_changed"]
    with pytest.raises(NoResults, match=f"no ok results with driver version '{NEW}' on host 'h2'"):
        compare(engine, OLD, NEW, host="h2")
    with pytest.raises(NoResults, match="known driver versions: 535.104.05, 550.54.14"):
        compare(engine, "999.1", NEW)
    with pytest.raises(NoResults, match="logical date on 2027-01-01"):
        compare(engine, "2026-12-07", "2027-01-01")

    # The command line: a table, JSON, and one-line errors with exit code 2.
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["compare", "--before", OLD, "--after", NEW, "--host", "h1"]) == 0
    out = capsys.readouterr().out
    assert ("before img/s (n)" in out and "regression (major)" in out
            and "3 case(s): 1 regression(s), 0 improvement(s)" in out)
    assert main(["compare", "--before", OLD, "--after", NEW, "--format", "json"]) == 0
    assert ({(r["host"], r["case_key"], r["verdict"]) for r in json.loads(capsys.readouterr().out)}
            >= {("h1", "a", "regression")})
    for before, after, message in (("999.1", NEW, "no ok results with driver version '999.1'"),
                                   ("2026-02-30", NEW, "--before/--after: '2026-02-30' is not a date")):
        assert main(["compare", "--before", before, "--after", after]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fleetbench compare: ") and message in err and "Traceback" not in err


def test_compare_on_an_empty_warehouse_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/nothing.db")
    assert main(["compare", "--before", OLD, "--after", NEW]) == 2
    err = capsys.readouterr().err
    assert "cannot read the warehouse" in err and "Traceback" not in err
