"""Regression detection and the compare report against a real warehouse: SQLite and PostgreSQL.

A history of fourteen nights is written with `store_run`, as the DAG writes it. From night 10 on host
h1 runs a new driver and its case a lost 20 % of its throughput; everything else stays within noise,
h2's case a got faster from night 10, h2's case b runs a new image on the last night, and case c on
h1 exists since night 9.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from fleetbench.cli import main
from fleetbench.config import RegressionSettings
from fleetbench.regression import NoResults, accept, assess_run, compare, format_compare, store_findings
from fleetbench.warehouse import get_engine, store_run, upgrade
from fleetbench.warehouse.schema import regression_acceptances, regressions
from regression_rows import detect_for_run, fetch_regressions
from warehouse_rows import result_row, run_row, step_rows

pytestmark = pytest.mark.integration

OLD, NEW = "535.104.05", "550.54.14"
DIGEST, NEW_DIGEST = "sha256:" + "a" * 64, "sha256:" + "b" * 64
NIGHT0 = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
NOISE = [0.0, 0.4, -0.3, 0.2, -0.1, 0.1, -0.2, 0.3, -0.4, 0.2, 0.1, -0.1, 0.3, -0.2]  # % of night-to-night wobble
CHANGE, LAST = 10, 13
POWER_W, PRICE = 250.0, 2.0


def night_id(n: int) -> str:
    return f"scheduled__{(NIGHT0 + timedelta(days=n)).isoformat()}"


def result(n: int, host: str, case: str, ips: float, duration: float, **extra) -> dict:
    when = (NIGHT0 + timedelta(days=n)).isoformat()
    return result_row(case, run_id=night_id(n), host=host, ips=ips, logical_date=when, duration_s=duration,
                      energy_source="measured", energy_j=POWER_W * duration, cost_usd=PRICE * duration / 3600, **extra)


def store_night(engine, n: int, h1a_ips: float | None = None) -> None:
    """Night n (0..13). From night CHANGE: h1 runs driver NEW, h1/a is 20 % slower (or `h1a_ips` on the last
    night), h2/a 15 % faster. The last night: h2/b a new image."""
    w = 1 + NOISE[n] / 100
    changed, last = n >= CHANGE, n == LAST
    rows = []
    for host in ("h1", "h2"):
        driver = NEW if changed and host == "h1" else OLD
        for case, base in (("a", 1000.0), ("b", 400.0)):
            ips = base * w
            if changed and (host, case) == ("h1", "a"):
                ips = h1a_ips if h1a_ips is not None and last else ips * 0.8
            if changed and (host, case) == ("h2", "a"):
                ips *= 1.15
            digest = NEW_DIGEST if last and (host, case) == ("h2", "b") else DIGEST
            rows.append(result(n, host, case, ips, 100_000 / ips, driver_version=driver, image_digest=digest))
    if n >= 9:  # case c exists since night 9: four earlier nights on the last night
        rows.append(result(n, "h1", "c", 50.0 * w, 60.0, driver_version=NEW if changed else OLD))
    steps = [s for r in rows
             for s in step_rows(r["case_key"], 10, run_id=r["run_id"], host=r["host"], base=r["images_per_sec"] - 5)]
    run = {**run_row(night_id(n)), "logical_date": (NIGHT0 + timedelta(days=n)).isoformat()}
    store_run(engine, run, [], rows, steps)


@pytest.fixture(params=["sqlite", "postgresql"])
def warehouse(request, tmp_path):
    """(engine, url) of an empty, migrated warehouse holding the fourteen nights."""
    url = f"sqlite:///{tmp_path}/w.db" if request.param == "sqlite" else request.getfixturevalue("pg_database")
    engine = get_engine(url)
    upgrade(engine)
    for n in range(LAST + 1):
        store_night(engine, n)
    yield engine, url
    engine.dispose()


def test_detection_stores_the_regressions_of_the_latest_night_idempotently(warehouse, caplog):
    engine, _ = warehouse
    caplog.set_level("INFO", logger="fleetbench.regression")
    first = assess_run(engine, "fleet_benchmark", night_id(CHANGE))  # the new driver's first night: suspected
    assert {(f["host"], f["case_key"], f["metric"], f["kind"], f["status"]) for f in first.findings
            if f["metric"] == "images_per_sec"} == {("h1", "a", "images_per_sec", "regression", "suspected"),
                                                    ("h2", "a", "images_per_sec", "improvement", "suspected")}
    assert first.confirmed == []
    assessment = assess_run(engine, "fleet_benchmark", night_id(LAST))
    assert assessment.checked == 4  # h1/a, h1/b, h2/a, and h2/b (its new image is judged against the old one)
    assert assessment.insufficient_history == ["h1 c"]
    assert "h1 c: insufficient history (4 earlier ok result(s), need 10" in caplog.text
    assert {(i["host"], i["case_key"], i["metric"]) for i in assessment.improvements} >= {("h2", "a", "images_per_sec")}

    findings = detect_for_run(engine, "fleet_benchmark", night_id(LAST))
    assert store_findings(engine, "fleet_benchmark", night_id(LAST), findings) == len(findings)
    rows = [r for r in fetch_regressions(engine, run_id=night_id(LAST)) if r["kind"] == "regression"]
    # Slower -> more time, energy and cost too: one change, the others name it; the faster h2/a is no regression.
    assert [(r["host"], r["case_key"], r["metric"], r["direction"], r["severity"], r["status"], r["same_change_as"])
            for r in rows] == [
        ("h1", "a", "cost_usd", "lower", "major", "confirmed", "images_per_sec"),
        ("h1", "a", "duration_s", "lower", "major", "confirmed", "images_per_sec"),
        ("h1", "a", "energy_j", "lower", "major", "confirmed", "images_per_sec"),
        ("h1", "a", "images_per_sec", "higher", "major", "confirmed", None)]
    ips = rows[-1]
    assert ips["delta_pct"] == pytest.approx(-20.0, abs=0.5)
    assert ips["baseline_value"] == pytest.approx(1000.0, rel=0.005) and ips["value"] == pytest.approx(800.0, rel=0.01)
    # The baseline is the old driver's nights; the new driver's are the finding, since its first night.
    assert ips["baseline_n"] == 10 and ips["baseline_window"] == [night_id(n) for n in range(CHANGE - 1, -1, -1)]
    assert ips["since_run_id"] == night_id(CHANGE) and ips["basis"] == "segment"
    assert json.loads(ips["segment"])["driver_version"] == NEW
    assert json.loads(ips["baseline_segment"])["driver_version"] == OLD
    assert ips["changes"] == {"driver_version": {"before": OLD, "after": NEW}}
    assert ips["z_score"] < -3.5 and ips["detectable_pct"] == pytest.approx(3.0)

    # Detecting again replaces, never duplicates (same ids: upserted on the key).
    ids = [r["id"] for r in fetch_regressions(engine, run_id=night_id(LAST))]
    store_findings(engine, "fleet_benchmark", night_id(LAST), detect_for_run(engine, "fleet_benchmark", night_id(LAST)))
    assert [r["id"] for r in fetch_regressions(engine, run_id=night_id(LAST))] == ids

    # Another run's finding is left alone when the last night is rerun: h1/a's regression is still open
    # (the three nights before are still slow), h2/b's new image changes nothing.
    other = {**findings[0], "run_id": night_id(6)}
    store_findings(engine, "fleet_benchmark", night_id(6), [other])
    store_night(engine, LAST, h1a_ips=1001.0)
    again = detect_for_run(engine, "fleet_benchmark", night_id(LAST))
    assert {(f["host"], f["case_key"], f["metric"], f["status"]) for f in again if f["kind"] == "regression"} >= {
        ("h1", "a", "images_per_sec", "confirmed")}
    assert store_findings(engine, "fleet_benchmark", night_id(LAST), []) == 0
    assert fetch_regressions(engine, run_id=night_id(LAST)) == []
    assert [r["run_id"] for r in fetch_regressions(engine)] == [night_id(6)]


def test_the_baseline_is_the_trailing_window_before_the_run(warehouse):
    engine, _ = warehouse
    found = detect_for_run(engine, "fleet_benchmark", night_id(LAST), RegressionSettings(window=5, min_history=5))
    assert {tuple(f["baseline_window"]) for f in found if f["host"] == "h1"} == {
        tuple(night_id(n) for n in range(CHANGE - 1, CHANGE - 6, -1))}
    # A backfill of night 11 sees nights 0-10 only, not the nights after it.
    assessment = assess_run(engine, "fleet_benchmark", night_id(11))
    assert assessment.checked == 4 and {f["status"] for f in assessment.confirmed} == {"confirmed"}
    assert {(f["host"], f["case_key"]) for f in assessment.confirmed} == {("h1", "a")}
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(regressions)).scalar() == 0  # assess_run only reads


def test_accepting_the_new_driver_closes_the_regression(warehouse, monkeypatch, capsys):
    engine, url = warehouse
    store_findings(engine, "fleet_benchmark", night_id(LAST), detect_for_run(engine, "fleet_benchmark", night_id(LAST)))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["regressions", "list"]) == 0
    out = capsys.readouterr().out
    assert "confirmed  regression   fleet_benchmark  h1  a  images_per_sec  " in out
    assert " images/s (higher is better)  -20.2 % since 2026-12-11T02:00:00+00:00" in out
    done = accept(engine, "h1", "a", accepted_by="ops")
    assert [(a["case_key"], a["since"], a["had_open_regression"]) for a in done] == [
        ("a", NIGHT0 + timedelta(days=CHANGE), True)]
    assert [r for r in fetch_regressions(engine, run_id=night_id(LAST)) if r["host"] == "h1"] == []
    accept(engine, "h1", "a")  # again: harmless
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(regression_acceptances)).scalar() == 1
    assert main(["regressions", "list"]) == 0
    assert "h1  a" not in capsys.readouterr().out


def test_compare_report_before_and_after_the_driver_upgrade(warehouse, capsys, monkeypatch):
    engine, url = warehouse
    rows = compare(engine, OLD, NEW)
    by_case = {(r["host"], r["case_key"]): r for r in rows}
    assert set(by_case) == {("h1", "a"), ("h1", "b"), ("h1", "c")}  # h2 never ran NEW
    a = by_case[("h1", "a")]
    assert (a["verdict"], a["basis"], a["severity"], a["before_n"], a["after_n"]) == ("regression", "nights", "major",
                                                                                      CHANGE, LAST + 1 - CHANGE)
    assert a["delta_pct"] == pytest.approx(-20.0, abs=0.5) and a["ci_low_pct"] < a["delta_pct"] < a["ci_high_pct"] < 0
    assert a["energy_delta_pct"] == pytest.approx(25.0, abs=0.8) and a["cost_delta_pct"] == pytest.approx(25.0, abs=0.8)
    assert (a["before_driver_version"], a["after_driver_version"]) == (OLD, NEW)
    assert by_case[("h1", "b")]["verdict"] == "no change"
    assert (by_case[("h1", "c")]["before_n"], by_case[("h1", "c")]["verdict"]) == (1, "not enough nights to tell")
    assert "regression (major)" in format_compare(rows)

    # Dates: one night against the next is not enough to tell; ranges are.
    dated = {(r["host"], r["case_key"]): r for r in compare(engine, "2026-12-13", "2026-12-14", host="h2")}
    assert set(dated) == {("h2", "a"), ("h2", "b")}
    assert {r["verdict"] for r in dated.values()} == {"not enough nights to tell"}
    assert dated[("h2", "b")]["image_changed"] and not dated[("h2", "a")]["image_changed"]
    ranged = {(r["host"], r["case_key"]): r for r in compare(engine, "2026-12-01..2026-12-10",
                                                             "date=2026-12-11..2026-12-14", host="h2")}
    assert ranged[("h2", "a")]["verdict"] == "improvement" and ranged[("h2", "b")]["verdict"] == "no change"
    hosts = {r["case_key"]: r for r in compare(engine, "host=h2", "host=h1")}  # host against host, per case
    assert hosts["b"]["host"] == "h2 -> h1" and hosts["b"]["verdict"] == "no change"
    with pytest.raises(NoResults, match=f"no ok results with driver_version '{NEW}' on host 'h2'"):
        compare(engine, OLD, NEW, host="h2")
    with pytest.raises(NoResults, match="known: 535.104.05, 550.54.14"):
        compare(engine, "999.1", NEW)
    with pytest.raises(NoResults, match="logical date on 2027-01-01"):
        compare(engine, "2026-12-07", "2027-01-01")

    # The command line: a table, JSON, and one-line errors with exit code 2.
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["compare", "--before", f"driver={OLD}", "--after", f"driver={NEW}", "--host", "h1"]) == 0
    out = capsys.readouterr().out
    assert ("before (nights)" in out and "images_per_sec images/s (higher better)" in out
            and "regression (major)" in out
            and "3 case(s): 1 regression(s), 0 improvement(s), 1 without change, 1 not enough nights to tell" in out)
    assert main(["compare", "--before", OLD, "--after", NEW, "--format", "json"]) == 0
    assert ({(r["host"], r["case_key"], r["verdict"]) for r in json.loads(capsys.readouterr().out)}
            >= {("h1", "a", "regression")})
    for before, after, message in (("999.1", NEW, "no ok results with driver_version '999.1'"),
                                   ("2026-02-30", NEW, "--before/--after: '2026-02-30' is not a date"),
                                   ("colour=red", NEW, "unknown kind 'colour'")):
        assert main(["compare", "--before", before, "--after", after]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fleetbench compare: ") and message in err and "Traceback" not in err


def test_compare_on_an_empty_warehouse_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/nothing.db")
    assert main(["compare", "--before", OLD, "--after", NEW]) == 2  # no such file: said, none created
    err = capsys.readouterr().err
    assert f"no warehouse at {tmp_path}/nothing.db" in err and "Traceback" not in err
    assert not (tmp_path / "nothing.db").exists()
    (tmp_path / "nothing.db").touch()  # a database without tables
    assert main(["compare", "--before", OLD, "--after", NEW]) == 2
    err = capsys.readouterr().err
    assert "cannot read the warehouse" in err and "Traceback" not in err


def test_a_drop_after_the_gpus_went_degraded_is_judged_against_the_healthy_nights(tmp_path):
    """The host's GPU health is part of a baseline's segment: nights on degraded GPUs are not mixed into the
    healthy baseline, and the finding says the health changed."""
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    for n in range(LAST + 1):
        degraded = n >= CHANGE
        ips = 1000.0 * (1 + NOISE[n] / 100) * (0.9 if degraded else 1.0)
        row = result(n, "h1", "a", ips, 100_000 / ips, driver_version=OLD, image_digest=DIGEST,
                     host_gpu_health="degraded" if degraded else "healthy")
        run = {**run_row(night_id(n)), "logical_date": (NIGHT0 + timedelta(days=n)).isoformat()}
        store_run(engine, run, [], [row], step_rows("a", 10, run_id=night_id(n), host="h1", base=ips - 5))
    found = detect_for_run(engine, "fleet_benchmark", night_id(LAST))
    drop = next(f for f in found if f["metric"] == "images_per_sec")
    assert drop["kind"] == "regression" and drop["delta_pct"] == pytest.approx(-10, abs=1.5)
    assert drop["changes"]["host_gpu_health"] == {"before": "healthy", "after": "degraded"}
    assert drop["segment"]["host_gpu_health"] == "degraded"
    engine.dispose()
