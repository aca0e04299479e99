"""`fleetbench results`: the table, JSON and CSV of what the warehouse holds; clear errors, no secrets."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetbench.warehouse import get_engine, store_run, upgrade
from warehouse_rows import result_row, run_row

FLEETBENCH = str(Path(sys.executable).parent / "fleetbench")


def cli(*args, url: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([FLEETBENCH, *args], capture_output=True, text=True,
                          env={**os.environ, "FLEETBENCH_WAREHOUSE_URL": url})


@pytest.fixture()
def warehouse(tmp_path) -> str:
    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [result_row("a", run_id="r1", ips=101.5),
                                          result_row("b", run_id="r1", status="failed", ips=None)])
    store_run(engine, {**run_row("r2"), "finished_at": "2026-12-02T02:10:00+00:00"}, [],
              [result_row("a", run_id="r2", ips=99.0, energy_source="estimated", energy_j=7200.0, cost_usd=0.0125)])
    engine.dispose()
    return url


def test_table_shows_the_latest_run(warehouse):
    proc = cli("results", url=warehouse)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == "run r2"
    assert lines[1].split() == ["host", "model", "batch", "GPUs", "status", "images/sec", "duration", "s", "energy",
                                "Wh", "cost", "$", "image", "digest"]
    assert lines[3].split()[5:9] == ["99.00", "60.0", "~2.0000", "0.012500"]  # 7200 J estimated = ~2 Wh; USD
    assert lines[-1] == "1 case(s): 1 ok, 0 failed, 0 skipped"


def test_json_and_csv_of_a_run(warehouse):
    rows = json.loads(cli("results", "--format", "json", "--run-id", "r1", url=warehouse).stdout)
    assert ([(r["case_key"], r["status"], r["images_per_sec"]) for r in rows]
            == [("a", "ok", 101.5), ("b", "failed", None)])
    assert {"run_id", "logical_date", "host", "case_key", "model", "batch_size_per_device", "num_gpus", "image_ref",
            "image_digest", "status", "failure_class", "images_per_sec", "started_at", "finished_at",
            "duration_s"} <= set(rows[0])
    table = list(csv.DictReader(io.StringIO(cli("results", "--format", "csv", "--all", url=warehouse).stdout)))
    assert len(table) == 3


def test_unknown_run_and_empty_warehouse(warehouse, tmp_path):
    proc = cli("results", "--run-id", "nope", url=warehouse)
    assert proc.returncode == 2 and "no results for run id 'nope'" in proc.stderr and "Traceback" not in proc.stderr
    empty = f"sqlite:///{tmp_path}/empty.db"
    upgrade(get_engine(empty))
    assert cli("results", url=empty).stdout.strip() == "no results yet"


@pytest.mark.parametrize("url, message", [
    ("postgresql://fleet:s3cret-pw@127.0.0.1:1/none", "cannot read the warehouse at postgresql://fleet:***@127.0.0.1:1/none"),
    ("mysql://a@b/c", "mysql is not supported"),
    ("not a url", "not a database URL"),
])
def test_bad_warehouse_urls_are_one_line_without_the_password(url, message):
    proc = cli("results", url=url)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "s3cret-pw" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


def test_csv_quotes_text_that_a_spreadsheet_would_run_as_a_formula(tmp_path):
    """A failure detail comes from a container's log: text such as `=HYPERLINK(...)` must reach a spreadsheet as
    text."""
    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    evil = {**result_row("a", run_id="r1", status="failed", ips=None), "failure_detail": '=HYPERLINK("http://x","y")',
            "image_ref": "@SUM(1)"}
    store_run(engine, run_row("r1"), [], [evil])
    engine.dispose()
    proc = cli("results", "--format", "csv", url=url)
    assert proc.returncode == 0, proc.stderr
    [row] = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert row["failure_detail"] == '\'=HYPERLINK("http://x","y")' and row["image_ref"] == "'@SUM(1)"
    assert row["batch_size_per_device"] == "64"  # numbers stay numbers


def test_version_and_bare_command_print_and_exit_0(tmp_path):
    from fleetbench import __version__

    version = cli("--version", url=f"sqlite:///{tmp_path}/w.db")
    assert (version.returncode, version.stdout.strip()) == (0, f"fleetbench {__version__}")
    bare = cli(url=f"sqlite:///{tmp_path}/w.db")
    assert bare.returncode == 0 and "usage: fleetbench" in bare.stdout and "host-check" in bare.stdout
    assert bare.stderr == ""
