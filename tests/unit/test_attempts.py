"""Attempts on SQLite: the rule, a rerun adds an attempt, a retry replaces it, the migration."""

from __future__ import annotations

from attempts_contract import (
    check_failed_rerun_keeps_the_previous_attempt,
    check_migration_keeps_superseded_attempts_without_a_host_check,
    check_migration_makes_stored_rows_attempt_1,
    check_rerun_adds_attempts_and_a_retry_replaces,
    check_superseded_attempts_keep_their_host_check,
    host_check,
)
from fleetbench.warehouse import get_engine
from fleetbench.warehouse.attempts import attempt_id, current_attempt, decide, remeasure_reasons


def engine_at(tmp_path):
    return get_engine(f"sqlite:///{tmp_path}/w.db")


def test_decide_numbers_attempts():
    assert decide(None, 0, "x") == (1, False)  # first store
    assert decide(None, 2, "x") == (3, False)  # planned again after its attempts were superseded
    assert decide((1, "x"), 0, "x") == (1, False)  # the same outcome stored again: replaced in place
    assert decide((1, "x"), 0, "y") == (2, True)  # a new execution
    assert decide((1, None), 0, "x") == (2, True)  # migrated row (identity unknown): kept, the new one added
    assert decide((2, "y"), 1, "z") == (3, True)


def test_current_attempt_is_the_one_stored_last():
    assert current_attempt([{"attempt": 1}, {"attempt": 3}, {"attempt": 2}]) == {"attempt": 3}
    assert current_attempt([]) is None


def test_attempt_id_follows_the_container_outcome():
    outcome = {"container_name": "fb-1-h1-a", "started_at": "2026-12-01T02:00:05.123456+00:00",
               "finished_at": "2026-12-01T02:01:05.5+00:00", "exit_code": 0}
    same = attempt_id("h1", "a", {**outcome, "measurement": {"fields": {}}})  # re-read from the outcome file
    assert attempt_id("h1", "a", outcome) == same
    assert attempt_id("h1", "a", {**outcome, "started_at": "2026-12-02T02:00:05+00:00"}) != same
    assert attempt_id("h2", "a", outcome) != same
    not_run = attempt_id("h1", "a", None, ("2026-12-01T02:00:01", "2026-12-01T02:00:02", "skipped", "host_unfit"))
    assert not_run == attempt_id("h1", "a", None, ("2026-12-01T02:00:01", "2026-12-01T02:00:02", "skipped",
                                                    "host_unfit"))
    assert not_run != attempt_id("h1", "a", None, ("2026-12-02T02:00:01", "2026-12-02T02:00:02", "skipped",
                                                    "host_unfit"))


def test_remeasure_reasons():
    a = {"driver_version": "550.127.05", "image_digest": "sha256:1", "status": "ok"}
    assert remeasure_reasons(a, {**a, "driver_version": "590.48.01"}) == ["driver 550.127.05 -> 590.48.01"]
    assert remeasure_reasons(a, {**a, "image_digest": "sha256:2"}) == ["image changed"]
    assert remeasure_reasons({**a, "status": "failed"}, a) == ["rerun of a failed result"]
    assert remeasure_reasons(a, a) == ["rerun"]


def test_rerun_adds_attempts_and_a_retry_replaces(tmp_path):
    check_rerun_adds_attempts_and_a_retry_replaces(engine_at(tmp_path))


def test_failed_rerun_keeps_the_previous_attempt(tmp_path, monkeypatch):
    check_failed_rerun_keeps_the_previous_attempt(engine_at(tmp_path), monkeypatch)


def test_migration_makes_stored_rows_attempt_1(tmp_path):
    check_migration_makes_stored_rows_attempt_1(engine_at(tmp_path))


def backfilled(engine) -> None:
    """Three nights measured on driver A, then measured again on driver B (a backfill after the upgrade)."""
    from fleetbench.warehouse import store_run, upgrade
    from warehouse_rows import result_row, run_row, step_rows

    upgrade(engine)
    for attempt, driver, base, health in (("A", "550.127.05", 100.0, "healthy"), ("B", "590.48.01", 120.0, "degraded")):
        for n in (1, 2, 3):
            day = f"2026-11-0{n}T00:00:00+00:00"
            rows = [result_row(c, run_id=f"night{n}", ips=base + 10 * i + n, driver_version=driver, logical_date=day,
                               attempt_id=f"{attempt}{n}{c}", started_at=f"2026-11-0{n}T0{n}:00:00+00:00",
                               host_gpu_health=health)
                    for i, c in enumerate(("a", "b"))]
            steps = [s for c in ("a", "b") for s in step_rows(c, 3, run_id=f"night{n}", base=base)]
            checked = f"2026-11-0{n}T0{n}:00:00+00:00" if attempt == "A" else f"2026-11-10T0{n}:00:00+00:00"
            check = host_check(driver, checked, run_id=f"night{n}", health=health,
                               verdict="ready" if attempt == "A" else "degraded",
                               gpu_health_issues=None if attempt == "A" else "gpu_ecc:warn")
            store_run(engine, {**run_row(f"night{n}"), "logical_date": day}, [check], rows, steps)


def test_cli_results_and_compare_across_attempts(tmp_path, monkeypatch, capsys):
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/w.db"
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    backfilled(get_engine(url))

    assert main(["results", "--run-id", "night2", "--attempts"]) == 0
    out = capsys.readouterr().out
    assert "1 (superseded)" in out and "2 (current)" in out and "550.127.05" in out and "590.48.01" in out
    # each attempt with the driver, CUDA driver, GPU health and host check it ran under
    lines = {line.split()[1] + " " + line.split()[2] + line.split()[3]: line.split() for line in out.splitlines()
             if line.startswith("h1 ")}
    assert lines["a 1(superseded)"][4:9] == ["550.127.05", "12.2", "healthy", "ready", "ok"]
    assert lines["a 2(current)"][4:10] == ["590.48.01", "12.2", "degraded", "(gpu_ecc:warn)", "degraded", "ok"]
    assert "4 attempt(s) of 2 case(s): 2 current, 2 superseded" in out
    assert main(["results", "--run-id", "night2"]) == 0  # current attempts only
    assert "2 case(s): 2 ok" in capsys.readouterr().out
    # every night's attempts: newest night first, as `results --all` lists them; a case's attempts oldest first
    import json

    assert main(["results", "--all", "--attempts", "--format", "json"]) == 0
    listed = [(r["logical_date"][:10], r["case_key"], r["attempt"]) for r in json.loads(capsys.readouterr().out)]
    assert listed == [(f"2026-11-0{n}", c, a) for n in (3, 2, 1) for c in "ab" for a in (1, 2)]

    # The old driver's nights are superseded: a plain compare says where they are.
    assert main(["compare", "--before", "550.127.05", "--after", "590.48.01"]) == 2
    assert "add --attempts" in capsys.readouterr().err
    assert main(["compare", "--before", "550.127.05", "--after", "590.48.01", "--attempts", "--format", "json"]) == 0
    rows = {r["case_key"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"a", "b"}
    a = rows["a"]
    assert (a["before_driver_version"], a["after_driver_version"], a["before_n"], a["after_n"]) == (
        "550.127.05", "590.48.01", 3, 3)
    assert (a["before_value"], a["after_value"]) == (102.0, 122.0)
    assert rows["b"]["after_value"] == 132.0 and a["delta_pct"] > 19
    assert (a["before_host_gpu_health"], a["after_host_gpu_health"]) == ("healthy", "degraded")
    assert main(["compare", "--before", "550.127.05", "--after", "590.48.01", "--attempts"]) == 0
    out = capsys.readouterr().out
    assert "2 case(s)" in out and "550.127.05 -> 590.48.01, healthy -> degraded" in out

    # the JSON and CSV of `results --attempts` carry the host check of each attempt
    assert main(["results", "--run-id", "night1", "--attempts", "--format", "json"]) == 0
    checks = {(r["case_key"], r["attempt"]): (r["host_driver_version"], r["host_verdict"], r["host_checked_at"])
              for r in json.loads(capsys.readouterr().out)}
    assert checks == {("a", 1): ("550.127.05", "ready", "2026-11-01T01:00:00+00:00"),
                      ("b", 1): ("550.127.05", "ready", "2026-11-01T01:00:00+00:00"),
                      ("a", 2): ("590.48.01", "degraded", "2026-11-10T01:00:00+00:00"),
                      ("b", 2): ("590.48.01", "degraded", "2026-11-10T01:00:00+00:00")}
    # one night against one: no interval; the JSON says null for its bounds (it said -Infinity/Infinity, which
    # JSON parsers other than Python's refuse)
    def strict(text):
        def refuse(name):
            raise ValueError(f"not JSON: {name}")
        return json.loads(text, parse_constant=refuse)

    assert main(["compare", "--before", "2026-11-01", "--after", "2026-11-02", "--format", "json"]) == 0
    one = strict(capsys.readouterr().out)
    assert one and one[0]["verdict"] == "not enough nights to tell"
    assert one[0]["ci_low_pct"] is None and one[0]["ci_high_pct"] is None

    # as CSV: current and superseded rows have the same columns (superseded ones carried an internal
    # host_collected_at, and a CSV whose first row was a current one raised ValueError)
    import csv
    import io

    assert main(["results", "--run-id", "night3", "--attempts", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(table) == 4 and {r["current"] for r in table} == {"True", "False"}
    assert "host_collected_at" not in table[0] and all(None not in r for r in table)


def test_report_counts_current_attempts_and_marks_remeasured_nights(tmp_path):
    from fleetbench.report import build_report, write_report

    engine = engine_at(tmp_path)
    backfilled(engine)
    report = build_report(engine)
    assert report["summary"]["results"] == 6 and report["summary"]["runs"] == 3  # not 12: current attempts only
    assert [(r["run_id"], r["host"], r["superseded"], r["reasons"]) for r in report["remeasured"]] == [
        (f"night{n}", "h1", 2, ["driver 550.127.05 -> 590.48.01"]) for n in (3, 2, 1)]
    written = write_report(tmp_path / "report", engine=engine)
    html = open(written["html"]).read()
    assert "Re-measured nights" in html and "driver 550.127.05 -&gt; 590.48.01" in html


def test_report_says_why_a_failed_night_was_measured_again(tmp_path):
    from fleetbench.report import build_report
    from fleetbench.warehouse import store_run, upgrade
    from warehouse_rows import result_row, run_row

    engine = engine_at(tmp_path)
    upgrade(engine)
    store_run(engine, run_row(), [], [result_row("a", status="failed", ips=None, attempt_id="1")])
    store_run(engine, run_row(), [], [result_row("a", attempt_id="2", image_digest="sha256:" + "b" * 64)])
    assert [r["reasons"] for r in build_report(engine)["remeasured"]] == [
        ["image changed", "rerun of a failed result"]]
    store_run(engine, run_row(), [], [result_row("b", attempt_id="3")])  # a no longer planned
    assert build_report(engine)["remeasured"][0]["reasons"] == [
        "image changed", "rerun of a failed result", "no longer planned"]


def test_superseded_attempts_keep_their_host_check(tmp_path):
    check_superseded_attempts_keep_their_host_check(engine_at(tmp_path))


def test_migration_keeps_superseded_attempts_without_a_host_check(tmp_path):
    check_migration_keeps_superseded_attempts_without_a_host_check(engine_at(tmp_path))
