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
    assert lines[0] == "run r2 of fleet_benchmark"
    assert lines[1].split() == ["host", "case", "GPUs", "status", "metric", "value", "duration", "s",
                                "energy", "Wh", "cost", "$", "$", "per", "unit", "Wh", "per", "unit", "image", "digest"]
    # 7200 J estimated = ~2 Wh; USD; per unit: 99 images/s x 60 s = 5,940 images -> $0.0125 and 2 Wh per 5,940 images
    assert lines[3].split()[:4] == ["h1", "a", "1", "ok"]
    assert lines[3].split()[4:12] == ["images_per_sec", "99", "images/s", "60.0", "~2.0000", "0.012500", "2.104/10^6",
                                      "images"]
    assert lines[3].split()[12:14] == ["~336.7/10^6", "images"]
    assert lines[-1] == "1 case(s): 1 ok, 0 failed, 0 skipped"


def test_table_shows_each_primary_metric_with_its_unit_and_cost_per_unit(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [
        result_row("n", ips=None, harness="nccl_tests", metric="avg_busbw", value=180.0, unit="GB/s", better="higher",
                   energy_source="measured", energy_j=36000.0, cost_usd=0.54),
        result_row("l", ips=None, harness="command", metric="p99_latency", value=12.5, unit="ms", better="lower",
                   cost_usd=0.01)])
    engine.dispose()
    rows = {r.split()[4]: r for r in cli("results", url=url).stdout.splitlines()[3:5]}
    # 180 GB/s x 60 s = 10,800 GB: $0.54 / 10,800 = $5e-05 per GB, 10 Wh / 10,800 GB
    assert rows["avg_busbw"].split()[5:12] == ["180", "GB/s", "60.0", "10.0000", "0.540000", "5e-05/GB",
                                               "0.0009259/GB"]
    assert rows["p99_latency"].split()[5:13] == ["(lower", "better)", "12.5", "ms", "60.0", "-", "0.010000", "-"]
    data = {r["case_key"]: r for r in json.loads(cli("results", "--format", "json", url=url).stdout)}
    assert data["n"]["per"] == "GB" and data["n"]["cost_per_unit_usd"] == pytest.approx(5e-05)
    assert data["l"]["per"] is None and data["l"]["cost_per_unit_usd"] is None  # a latency does no work


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
    # libpq also takes the password, and a client key's passphrase, as query parameters
    ("postgresql://fleet@127.0.0.1:1/none?password=s3cret-pw&sslpassword=s3cret-pw-key",
     "cannot read the warehouse at postgresql://fleet@127.0.0.1:1/none?password=***&sslpassword=***: "),
    ("postgresql://fleet:s3cret-pw@127.0.0.1:abc/none", "not a database URL: <unparsable URL>"),  # a port not a number
    ("postgresql://fleet:s3cret-pw@x@127.0.0.1:1/none", "its password holds an '@': write it as %40"),
    ("postgresql+pyscopg2://fleet:s3cret-pw@127.0.0.1:1/none",
     "postgresql+pyscopg2://fleet:***@127.0.0.1:1/none: unknown driver 'postgresql+pyscopg2'"),
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


@pytest.fixture()
def fleet(tmp_path) -> str:
    """Two nights of 2 hosts x 2 models of images/sec (plus one failed case), and one night of an NCCL test."""
    url = f"sqlite:///{tmp_path}/f.db"
    engine = get_engine(url)
    upgrade(engine)
    primary = {"harness": "tf_cnn_benchmarks", "metric": "images_per_sec", "unit": "images/s", "better": "higher"}
    for night, run in enumerate(("n1", "n2")):
        rows = [result_row(f"{model}.{host}", run_id=run, host=host, model=model, ips=v + night * 10,
                           value=v + night * 10, cost_usd=0.01 * (night + 1), **primary)
                for host, model, v in (("gpu-a", "resnet50", 100.0), ("gpu-a", "vgg16", 50.0),
                                       ("gpu-b", "resnet50", 120.0), ("gpu-b", "vgg16", 60.0))]
        rows.append(result_row("broken", run_id=run, host="gpu-b", model="vgg16", ips=None, status="failed",
                               **primary))
        store_run(engine, {**run_row(run), "finished_at": f"2026-12-0{night + 1}T03:00:00+00:00"}, [], rows)
    store_run(engine, {**run_row("n3"), "finished_at": "2026-12-04T03:00:00+00:00"}, [], [
        result_row("nccl", run_id="n3", host="gpu-a", model="all_reduce", ips=None, harness="nccl_tests",
                   metric="avg_busbw", value=180.0, unit="GB/s", better="higher")])
    engine.dispose()
    return url


def test_pivot_of_the_primary_metric(fleet):
    proc = cli("results", "--all", "--metric", "images_per_sec", "--pivot", "model:host", url=fleet)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["host", "gpu-a", "gpu-b"] and lines[1].split() == ["model"]
    # the median of each cell's two nights; the failed case is not in it
    assert lines[2].split() == ["resnet50", "105", "125"] and lines[3].split() == ["vgg16", "55", "65"]
    as_csv = list(csv.reader(io.StringIO(cli("results", "--all", "--metric", "images_per_sec", "--pivot",
                                             "host x model", "--value", "cost_usd", "--agg", "max", "--format",
                                             "csv", url=fleet).stdout)))
    assert as_csv == [["host", "resnet50", "vgg16"], ["gpu-a", "0.02", "0.02"], ["gpu-b", "0.02", "0.02"]]
    data = json.loads(cli("results", "--all", "--metric", "images_per_sec", "--pivot", "date:model", "--agg",
                          "count", "--format", "json", url=fleet).stdout)
    assert data["columns"] == ["resnet50", "vgg16"] and data["data"] == [[4, 4]]  # one logical date: 2 hosts x 2 runs


def test_pivot_date_is_the_logical_dates_utc_day():
    """`date` is the UTC day of the logical date, also of a time given in another zone (as a PostgreSQL session in
    the server's zone gave them): the 02:00 UTC night of 2026-12-01 is that day, not 2026-11-30."""
    from datetime import datetime, timedelta, timezone

    from fleetbench.warehouse.frames import pivot, results_frame

    pacific = timezone(timedelta(hours=-8))
    rows = [{"logical_date": d, "host": h, "status": "ok", "metric": "m", "unit": "u", "value": 1.0}
            for d, h in (("2026-11-30T18:00:00-08:00", "h1"), (datetime(2026, 11, 30, 18, tzinfo=pacific), "h2"),
                         ("2026-12-01T02:00:00+00:00", "h3"), ("2026-12-01 02:00:00", "h4"))]
    table = pivot(results_frame(rows), "date:host", agg="count")
    assert list(table.index) == ["2026-12-01"] and list(table.columns) == ["h1", "h2", "h3", "h4"]


def test_pivot_labels_of_integer_fields_are_integers_when_some_rows_have_none(tmp_path):
    """An NCCL case has no batch size: a pivot over batch size (or GPU count) of a mixed fleet labels 64 as "64",
    not "64.0", in every format; the rows' Parquet keeps such a column integers with nulls."""
    import pandas as pd

    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    primary = {"metric": "images_per_sec", "unit": "images/s", "better": "higher"}
    store_run(engine, run_row(), [], [
        result_row("cnn.bs64", host="h1", value=100.0, **primary), result_row("cnn.bs64", host="h2", value=110.0,
                                                                             **primary),
        result_row("nccl.all_reduce", host="h1", harness="nccl_tests", model=None, batch_size_per_device=None,
                   batch_size_global=None, num_gpus=None, metric="avg_busbw", value=180.0, unit="GB/s")])
    engine.dispose()
    pivot = ["results", "--pivot", "batch_size_per_device:host", "--value", "duration_s"]
    table = cli(*pivot, url=url)
    assert table.returncode == 0 and table.stdout.splitlines()[2].split() == ["64", "60", "60"], table.stdout
    assert cli(*pivot, "--format", "csv", url=url).stdout.splitlines()[1] == "64,60.0,60.0"
    assert json.loads(cli(*pivot, "--format", "json", url=url).stdout)["index"] == ["64"]
    assert json.loads(cli("results", "--pivot", "num_gpus:host", "--value", "duration_s", "--format", "json",
                          url=url).stdout)["index"] == ["1"]
    out = tmp_path / "rows.parquet"
    assert cli("results", "--format", "parquet", "--out", str(out), url=url).returncode == 0
    frame = pd.read_parquet(out)
    assert str(frame["batch_size_per_device"].dtype) == "Int64"
    assert sorted(frame["batch_size_per_device"].dropna().tolist()) == [64, 64]


def test_pivot_csv_quotes_labels_a_spreadsheet_would_run_as_a_formula(tmp_path):
    """A run id is a label of a pivot; one starting with = (or + - @) reaches a spreadsheet as text."""
    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("=1+1"), [], [result_row("a", run_id="=1+1", host="@gpu")])
    engine.dispose()
    proc = cli("results", "--all", "--pivot", "run_id:host", "--value", "images_per_sec", "--format", "csv", url=url)
    assert proc.returncode == 0, proc.stderr
    assert list(csv.reader(io.StringIO(proc.stdout))) == [["run_id", "'@gpu"], ["'=1+1", "100.0"]]


def test_parquet_holds_the_rows_with_cost_per_unit(fleet, tmp_path):
    import pandas as pd

    out = tmp_path / "results.parquet"
    proc = cli("results", "--all", "--format", "parquet", "--out", str(out), url=fleet)
    assert proc.returncode == 0 and proc.stdout.strip() == f"wrote 11 row(s) to {out}"
    frame = pd.read_parquet(out)
    assert len(frame) == 11 and {"metric", "value", "unit", "better", "cost_per_unit_usd", "per"} <= set(frame.columns)
    nccl = frame[frame["case_key"] == "nccl"].iloc[0]
    assert (nccl["metric"], nccl["value"], nccl["unit"]) == ("avg_busbw", 180.0, "GB/s")
    pivot_out = tmp_path / "pivot.parquet"
    assert cli("results", "--all", "--metric", "images_per_sec", "--pivot", "model:host", "--format", "parquet",
               "--out", str(pivot_out), url=fleet).returncode == 0
    assert pd.read_parquet(pivot_out).loc["resnet50", "gpu-b"] == 125.0
    table_out = tmp_path / "table.txt"
    assert cli("results", "--all", "--out", str(table_out), url=fleet).returncode == 0
    assert "11 case(s): 9 ok, 2 failed, 0 skipped" in table_out.read_text()


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "parquet"])
def test_a_failed_results_command_leaves_the_out_file_as_it_was(fleet, tmp_path, fmt):
    """Rerunning an export's command line with a mistake (a typo in --metric, an unknown run id, a pivot the rows
    cannot give) ends with the usage error and leaves the earlier export at --out whole."""
    out = tmp_path / f"nights.{fmt}"
    assert cli("results", "--all", "--format", fmt, "--out", str(out), url=fleet).returncode == 0
    export = out.read_bytes()
    assert export
    for args in (["--all", "--metric", "images_per_secc"], ["--run-id", "nosuch"],
                 ["--all", "--metric", "images_per_sec", "--pivot", "gpu_catalog_name:host"]):
        proc = cli("results", *args, "--format", fmt, "--out", str(out), url=fleet)
        assert proc.returncode == 2 and proc.stderr.startswith("fleetbench results: "), proc.stderr
        assert out.read_bytes() == export, args


@pytest.mark.parametrize("args, message", [
    (["--format", "parquet"], "--format parquet writes a file: give --out FILE"),
    (["--pivot", "model"], "--pivot 'model': give ROWS:COLUMNS, e.g. model:host"),
    (["--pivot", "model:colour"], "--pivot 'model:colour': unknown field 'colour' (fields: host, model"),
    (["--pivot", "host:host"], "--pivot 'host:host': rows and columns are the same field"),
    (["--pivot", "model:host"], "the rows have 2 primary metrics (avg_busbw [GB/s], images_per_sec [images/s]): "
                                "pick one with --metric NAME"),
    (["--pivot", "model:host", "--value", "command"], "--value 'command': not a value column"),
    (["--value", "cost_usd"], "--value and --agg go with --pivot ROWS:COLUMNS"),
    (["--metric", "images_per_sec", "--pivot", "gpu_catalog_name:host"],
     "no ok result has both a 'gpu_catalog_name' and a 'host' to pivot on"),
    (["--metric", "tokens_per_sec"], "--metric 'tokens_per_sec': no result has that primary metric (these have: "
                                     "avg_busbw, images_per_sec)"),
    (["--format", "parquet", "--out", "/nonexistent/dir/x.parquet"],
     "--out /nonexistent/dir/x.parquet: no folder /nonexistent/dir"),
    (["--out", "/nonexistent/dir/x.txt"], "--out /nonexistent/dir/x.txt: no folder /nonexistent/dir"),
])
def test_bad_pivot_and_output_arguments_are_one_line(fleet, args, message):
    proc = cli("results", "--all", *args, url=fleet)
    assert proc.returncode == 2 and proc.stderr.startswith(f"fleetbench results: {message}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_dag_id_with_no_run_is_refused_and_keeps_an_earlier_export(tmp_path, monkeypatch, capsys):
    """A typo in --dag-id is a usage error naming the DAGs there, not "no results" (which, with --out, emptied
    an earlier export of the right DAG)."""
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [result_row("smoke.trivial.bs16.g0.parameter_server")], [])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    out = tmp_path / "nights.csv"
    assert main(["results", "--all", "--format", "csv", "--out", str(out), "--dag-id", "fleet_benchmark"]) == 0
    before = out.read_text()
    assert "smoke.trivial.bs16" in before
    for fmt in ("csv", "parquet", "table"):
        assert main(["results", "--all", "--format", fmt, "--out", str(out), "--dag-id", "fleet_benchmrk"]) == 2
        assert ("--dag-id 'fleet_benchmrk': no run of that DAG in the warehouse (DAGs there: fleet_benchmark)"
                in capsys.readouterr().err)
        assert out.read_text() == before


def test_read_commands_refuse_a_sqlite_warehouse_that_does_not_exist(tmp_path, monkeypatch, capsys):
    """A mistyped FLEETBENCH_WAREHOUSE_URL path read as an empty warehouse ("no results yet", or an empty report)
    and left an empty database file there; now each read command names the missing file, exit 2, creates nothing."""
    from fleetbench.cli import main

    missing = tmp_path / "typo.db"
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{missing}")
    for argv in (["results"], ["report", "--out", str(tmp_path / "rep")], ["capacity"], ["regressions", "list"],
                 ["compare", "--before", "2026-11-01", "--after", "2026-11-02"],
                 ["regressions", "accept", "--host", "gpu-01"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"no warehouse at {missing}" in err and "Traceback" not in err
        assert not missing.exists()
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "rep" / "x"))  # under a file that is not a folder
    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_URL")
    (tmp_path / "rep").write_text("a file")
    assert main(["results"]) == 2
    assert "FLEETBENCH_DATA_DIR" in capsys.readouterr().err


def test_regression_settings_of_a_broken_fleet_config(tmp_path, monkeypatch, capsys):
    """`regressions accept` stores findings assessed with the fleet's settings: a fleet config that cannot be read
    is refused, naming it; `compare` (which stores nothing) goes on with the defaults and says so."""
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [result_row("a", run_id="r1")], [])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(tmp_path / "nonexistent.yaml"))
    assert main(["regressions", "accept", "--host", "gpu-01"]) == 2
    err = capsys.readouterr().err
    assert "nonexistent.yaml" in err and "fix it or give --config" in err
    main(["compare", "--before", "2026-11-01", "--after", "2026-11-02"])
    assert "note: regression settings are the defaults" in capsys.readouterr().err


def test_gpu_catalog_and_dcgm_level_mistakes_are_one_line(tmp_path, monkeypatch, capsys):
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/w.db"
    upgrade(get_engine(url))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    monkeypatch.setenv("FLEETBENCH_GPU_CATALOG", str(tmp_path / "nonexistent.yaml"))
    assert main(["capacity", "--gpu-model", "A100 SXM4 40GB"]) == 2
    err = capsys.readouterr().err
    assert "--gpu-model needs the GPU catalog" in err and "nonexistent.yaml" in err and "Traceback" not in err
    assert main(["host-check", "--local", "--dcgm-level", "2"]) == 2
    assert "--dcgm-level runs the GPU health probes, which need --gpus N" in capsys.readouterr().err
    facts = tmp_path / "facts"
    facts.mkdir()
    assert main(["host-check", "--facts", str(facts), "--docker-url", "tcp://127.0.0.1:1"]) == 2
    assert "--docker-url is the engine --local probes" in capsys.readouterr().err
    assert main(["host-check", "--facts", str(facts), "--save", str(tmp_path / "s")]) == 2
    assert "--save keeps the outputs of probes that run" in capsys.readouterr().err


def test_the_latest_run_is_one_dags_even_when_another_dag_has_the_same_run_id(tmp_path):
    """Two DAGs on one cron share their run ids (`scheduled__<logical date>`): the latest run is a (DAG, run id),
    and its rows are that DAG's only."""
    url = f"sqlite:///{tmp_path}/two.db"
    engine = get_engine(url)
    upgrade(engine)
    night = "scheduled__2026-12-01T02:00:00+00:00"
    store_run(engine, run_row(night), [], [result_row("a", run_id=night, host="gpu-a")])
    store_run(engine, {**run_row(night), "dag_id": "nccl_nightly", "finished_at": "2026-12-01T03:00:00+00:00"}, [],
              [result_row("b", run_id=night, host="gpu-b", dag_id="nccl_nightly")])
    engine.dispose()
    proc = cli("results", "--format", "json", url=url)
    assert proc.returncode == 0, proc.stderr
    assert [(r["dag_id"], r["host"]) for r in json.loads(proc.stdout)] == [("nccl_nightly", "gpu-b")]
    table = cli("results", url=url).stdout.splitlines()
    assert table[0] == f"run {night} of nccl_nightly" and table[-1] == "1 case(s): 1 ok, 0 failed, 0 skipped"
    attempts = cli("results", "--attempts", url=url).stdout.splitlines()
    assert attempts[-1].startswith("1 attempt(s) of 1 case(s)")
    mine = cli("results", "--dag-id", "fleet_benchmark", "--format", "json", url=url)
    assert [(r["dag_id"], r["host"]) for r in json.loads(mine.stdout)] == [("fleet_benchmark", "gpu-a")]


def test_a_relative_data_dir_gives_an_absolute_warehouse_path(tmp_path, monkeypatch):
    """README: the default warehouse URL is an absolute path, also from a relative FLEETBENCH_DATA_DIR."""
    from fleetbench.paths import artifacts_dir
    from fleetbench.warehouse import warehouse_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_URL", raising=False)
    monkeypatch.delenv("FLEETBENCH_ARTIFACTS_DIR", raising=False)
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", "data")
    assert warehouse_url() == f"sqlite:///{tmp_path}/data/warehouse.db"
    assert artifacts_dir() == tmp_path / "data" / "artifacts"


def test_a_run_id_of_two_dags_shows_each_rows_dag_and_counts_their_cases_apart(tmp_path, monkeypatch, capsys):
    """DAGs on one schedule share run ids: `results --run-id ID --attempts` of both read as one case with two current
    attempts numbered out of order."""
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    run_id = "scheduled__2026-11-02T02:00:00+00:00"
    for dag in ("fleet_benchmark", "fleet_benchmark_nccl"):
        store_run(engine, run_row(run_id, dag), [], [result_row("a", run_id=run_id, dag_id=dag, attempt_id=dag,
                                                                driver_version="550.127.05")])
    store_run(engine, run_row(run_id, "fleet_benchmark"), [], [
        result_row("a", run_id=run_id, dag_id="fleet_benchmark", attempt_id="again", driver_version="590.48.01")])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["results", "--run-id", run_id, "--attempts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["DAG", "host", "case"]
    assert [line.split()[:4] for line in out[3:6]] == [
        ["fleet_benchmark", "h1", "a", "1"], ["fleet_benchmark", "h1", "a", "2"],
        ["fleet_benchmark_nccl", "h1", "a", "1"]]
    assert out[-1] == "3 attempt(s) of 2 case(s): 2 current, 1 superseded"
    assert main(["results", "--run-id", run_id]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:5]] == [
        "fleet_benchmark", "fleet_benchmark_nccl"]
    # one DAG's run: no DAG column
    assert main(["results", "--run-id", run_id, "--dag-id", "fleet_benchmark_nccl"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "host"


def test_a_pivot_piped_into_head_ends_quietly(fleet, monkeypatch, capsys):
    """`results --pivot ... | head -1`: the reader stops, the write gets EPIPE; it was a usage error naming an
    `--out None` nobody gave (exit 2), where the other formats end with 0."""
    from fleetbench.cli import main

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["results", "--all", "--metric", "images_per_sec", "--pivot", "date:host", "--format", "csv"]) == 0
    assert "--out" not in capsys.readouterr().err


def test_the_table_tells_cases_apart_and_names_a_sets_hosts(tmp_path):
    """Two variable_updates of one model and batch, and a 2-node case, on one host: the table showed four rows
    'gpu-01 resnet50 64 8', the 2-node total as if gpu-01 did it alone on 8 GPUs."""
    url = f"sqlite:///{tmp_path}/w.db"
    engine = get_engine(url)
    upgrade(engine)
    common = {"host": "gpu-01", "num_gpus": 8}
    store_run(engine, run_row("r1"), [], [
        result_row("cnn.resnet50.bs64.g8.replicated", ips=2500.0, **common),
        result_row("cnn.resnet50.bs64.g8.parameter_server", ips=2100.0, variable_update="parameter_server", **common),
        result_row("cnn-dist.resnet50.bs64.g8.distributed_replicated.n2", ips=5600.0, nodes=2,
                   host_set="gpu-01,gpu-02", **common)])
    engine.dispose()
    lines = cli("results", url=url).stdout.splitlines()[3:6]
    assert sorted(line.split()[:6] for line in lines) == [
        ["gpu-01", "cnn.resnet50.bs64.g8.parameter_server", "8", "ok", "images_per_sec", "2100"],
        ["gpu-01", "cnn.resnet50.bs64.g8.replicated", "8", "ok", "images_per_sec", "2500"],
        ["gpu-01+gpu-02", "cnn-dist.resnet50.bs64.g8.distributed_replicated.n2", "8", "x", "2", "nodes"]]


# -- exports of every night: written as the rows are read ------------------------------------------------------------
def _expected_rows(url: str) -> list[dict]:
    from fleetbench.metrics import per_unit
    from fleetbench.warehouse import fetch_results

    engine = get_engine(url)
    try:
        return [{**r, **per_unit(r)} for r in fetch_results(engine)]
    finally:
        engine.dispose()


def test_an_export_of_every_night_is_the_json_and_csv_of_all_rows(fleet):
    """The streamed JSON is byte for byte what one json.dump of the list writes; the CSV has every row and column."""
    from fleetbench.cli import _finite

    rows = _expected_rows(fleet)
    assert len(rows) == 11
    proc = cli("results", "--all", "--format", "json", url=fleet)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == json.dumps(_finite(rows), indent=2, default=str, allow_nan=False) + "\n"
    proc = cli("results", "--all", "--format", "csv", url=fleet)
    parsed = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [r["case_key"] for r in parsed] == [r["case_key"] for r in rows]
    assert list(parsed[0]) == list(rows[0])
    empty = fleet.replace("f.db", "empty.db")
    engine = get_engine(empty)
    upgrade(engine)
    engine.dispose()
    assert cli("results", "--all", "--format", "json", url=empty).stdout == "[]\n"
    assert cli("results", "--all", "--format", "csv", url=empty).stdout == ""


class _Watched(io.StringIO):
    """stdout that notes how many rows the source had given when the first byte was written."""

    def __init__(self, pulled: list[int]):
        super().__init__()
        self.pulled, self.at_first_write = pulled, None

    def write(self, text):
        if self.at_first_write is None and text:
            self.at_first_write = self.pulled[0]
        return super().write(text)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_an_export_of_every_night_is_written_as_the_rows_are_read(fleet, monkeypatch, fmt):
    """`results --all` wrote nothing until every row was in memory (1.05 M rows: 7.6 GB); now the first row is
    written after the first batch is read."""
    import fleetbench.warehouse.read as read
    from fleetbench.cli import main

    pulled = [0]
    original = read.iter_results

    def counted(*args, **kwargs):
        for row in original(*args, **{**kwargs, "batch": 2}):
            pulled[0] += 1
            yield row

    monkeypatch.setattr(read, "iter_results", counted)
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    out = _Watched(pulled)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["results", "--all", "--format", fmt]) == 0
    assert pulled[0] == 11 and out.at_first_write == 1, (pulled, out.at_first_write)


def test_an_export_that_fails_midway_leaves_the_earlier_file_and_no_part(fleet, tmp_path, monkeypatch, capsys):
    """A warehouse error after some rows were written (a dropped connection) is the one-line warehouse error, and
    --out keeps the earlier export: the rows went to a part file beside it, removed."""
    from sqlalchemy.exc import OperationalError

    import fleetbench.warehouse.read as read
    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    original = read.iter_results
    for fmt in ("csv", "json", "parquet"):
        out = tmp_path / f"nights.{fmt}"
        assert main(["results", "--all", "--format", fmt, "--out", str(out)]) == 0
        before = out.read_bytes()

        def broken(*args, **kwargs):
            for n, row in enumerate(original(*args, **kwargs)):
                if n == 5:
                    raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))
                yield row

        monkeypatch.setattr(read, "iter_results", broken)
        capsys.readouterr()
        assert main(["results", "--all", "--format", fmt, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fleetbench results: cannot read the warehouse at ") and "server closed" in err, err
        assert out.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
        monkeypatch.setattr(read, "iter_results", original)


def test_out_through_a_link_writes_its_file_and_a_pipe_is_written_as_it_is(fleet, tmp_path):
    import os
    import threading

    real = tmp_path / "exports" / "nights.csv"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.csv"
    link.symlink_to(real)
    assert cli("results", "--all", "--format", "csv", "--out", str(link), url=fleet).returncode == 0
    assert link.is_symlink() and real.read_text().startswith("id,dag_id,run_id")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    proc = cli("results", "--all", "--format", "json", "--out", str(fifo), url=fleet)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(got[0])) == 11 and fifo.exists() and not fifo.is_file()


def test_parquet_batches_keep_one_type_per_column(tmp_path):
    """A column NULL in the first batch and set in a later one (a MIG profile, an integer count) keeps the
    warehouse's type across row groups; integers read back as nullable integers."""
    import pandas as pd
    import pyarrow.parquet as pq

    from fleetbench.warehouse.frames import write_parquet_batches

    rows = [{"id": n, "host": f"h{n}", "logical_date": "2026-12-01T02:00:00+00:00", "mig_profile": None,
             "mig_instances": None, "energy_j": None, "per": None, "cost_per_unit_usd": None} for n in range(4)]
    rows.append({**rows[0], "id": 4, "mig_profile": "1g.10gb", "mig_instances": 7, "energy_j": 12.5,
                 "per": "10^6 images", "cost_per_unit_usd": 0.25})
    path = tmp_path / "x.parquet"
    assert write_parquet_batches(iter(rows), path, batch=2) == 5
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    frame = pd.read_parquet(path)
    assert str(frame["mig_instances"].dtype) == "Int64" and frame["mig_instances"].tolist()[3:] == [pd.NA, 7]
    assert frame["energy_j"].tolist()[4] == 12.5 and frame["mig_profile"].tolist()[4] == "1g.10gb"
    assert frame["date"].tolist() == ["2026-12-01"] * 5
    calls = []
    assert write_parquet_batches(iter([]), tmp_path / "e.parquet", before_empty=lambda: calls.append(1)) == 0
    assert calls == [1] and len(pd.read_parquet(tmp_path / "e.parquet")) == 0


# -- a window of nights, one host ------------------------------------------------------------------------------------
@pytest.fixture()
def nights(tmp_path) -> str:
    """Three nights (Nov 29, 30, Dec 1) of gpu-a and gpu-b; on the last, a 2-node case of gpu-a+gpu-c stored under
    gpu-a."""
    url = f"sqlite:///{tmp_path}/n.db"
    engine = get_engine(url)
    upgrade(engine)
    for day in (29, 30, 31):
        when = f"2026-11-{day}T02:00:00+00:00" if day < 31 else "2026-12-01T02:00:00+00:00"
        run = f"night-{day}"
        rows = [result_row(f"cnn.{h}", run_id=run, host=h, logical_date=when) for h in ("gpu-a", "gpu-b")]
        if day == 31:
            rows.append(result_row("cnn.2node", run_id=run, host="gpu-a", logical_date=when, nodes=2,
                                   host_set="gpu-a,gpu-c"))
        store_run(engine, {**run_row(run), "logical_date": when}, [], rows)
    engine.dispose()
    return url


def _runs(proc) -> list[tuple[str, str, str]]:
    assert proc.returncode == 0, proc.stderr
    return [(r["run_id"], r["host"], r["case_key"]) for r in json.loads(proc.stdout)]


def test_since_and_until_export_the_runs_of_those_days(nights):
    """--since/--until pick runs by logical date (whole UTC days, both ends included, or ISO moments) over every
    run, as --all does, in every format."""
    assert {r for r, _, _ in _runs(cli("results", "--since", "2026-11-30", "--format", "json", url=nights))} == {
        "night-30", "night-31"}
    assert {r for r, _, _ in _runs(cli("results", "--until", "2026-11-30", "--format", "json", url=nights))} == {
        "night-29", "night-30"}
    assert {r for r, _, _ in _runs(cli("results", "--since", "2026-11-30", "--until", "2026-11-30", "--format",
                                       "json", url=nights))} == {"night-30"}
    assert {r for r, _, _ in _runs(cli("results", "--since", "2026-11-30T03:00", "--format", "json",
                                       url=nights))} == {"night-31"}
    table = cli("results", "--since", "2026-11-30", url=nights)
    assert table.stdout.splitlines()[-1] == "5 case(s): 5 ok, 0 failed, 0 skipped", table.stdout
    assert cli("results", "--since", "2027-01-01", url=nights).stdout == "no results in that window\n"
    assert cli("results", "--since", "2027-01-01", "--format", "json", url=nights).stdout == "[]\n"


def test_host_narrows_to_its_rows_and_the_sets_it_was_in(nights):
    assert _runs(cli("results", "--host", "gpu-c", "--format", "json", url=nights)) == [
        ("night-31", "gpu-a", "cnn.2node")]
    assert _runs(cli("results", "--host", "gpu-b", "--format", "json", url=nights)) == [
        ("night-31", "gpu-b", "cnn.gpu-b")]  # the latest run's row of gpu-b
    assert [r for r, _, _ in _runs(cli("results", "--host", "gpu-b", "--all", "--format", "json", url=nights))] == [
        "night-31", "night-30", "night-29"]
    attempts = json.loads(cli("results", "--host", "gpu-b", "--since", "2026-11-30", "--attempts", "--format", "json",
                              url=nights).stdout)
    assert [(a["run_id"], a["host"], a["current"]) for a in attempts] == [("night-31", "gpu-b", True),
                                                                           ("night-30", "gpu-b", True)]
    lines = cli("results", "--host", "gpu-b", "--run-id", "night-29", url=nights).stdout.splitlines()
    assert lines[0] == "run night-29" and lines[-1] == "1 case(s): 1 ok, 0 failed, 0 skipped", lines


@pytest.mark.parametrize("args, message", [
    (["--since", "2026-13-01"], "--since: not a valid date: '2026-13-01'"),
    (["--until", "yesterday"], "--until: expected an ISO date (YYYY-MM-DD) or date-time"),
    (["--since", "2026-12-02", "--until", "2026-12-01"], "--since: 2026-12-02 is not before until 2026-12-01"),
    (["--since", "2026-11-30", "--run-id", "night-30"],
     "--since and --until choose runs by date: give them or --run-id, not both"),
    (["--host", "gpu a"], "--host: 'gpu a' is not a host name"),
    (["--host", "gpu-x"], "--host 'gpu-x': no result of that host in the warehouse"),
])
def test_bad_window_or_host_is_one_line(nights, args, message):
    proc = cli("results", *args, url=nights)
    assert proc.returncode == 2 and proc.stderr.startswith(f"fleetbench results: {message}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


# -- --out: what an operator's file keeps ------------------------------------------------------------------------------
def test_out_keeps_the_files_mode_and_other_names_and_writes_a_pipe(nights, tmp_path):
    import os
    import stat

    private = tmp_path / "private.csv"
    private.write_text("old")
    private.chmod(0o600)
    assert cli("results", "--all", "--format", "csv", "--out", str(private), url=nights).returncode == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.read_text().startswith("id,")
    fresh = tmp_path / "fresh.csv"
    umask = os.umask(0)
    os.umask(umask)
    assert cli("results", "--all", "--format", "csv", "--out", str(fresh), url=nights).returncode == 0
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open() makes it, not mkstemp's 0600
    other = tmp_path / "other-name.csv"
    os.link(private, other)
    assert cli("results", "--all", "--format", "json", "--out", str(private), url=nights).returncode == 0
    assert other.read_text() == private.read_text() and len(json.loads(other.read_text())) == 7  # still one file
    piped = cli("results", "--all", "--format", "csv", "--out", "/dev/stdout", url=nights)  # stdout is a pipe here
    assert piped.returncode == 0, piped.stderr
    assert len(list(csv.DictReader(io.StringIO(piped.stdout)))) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.csv", "n.db", "other-name.csv", "private.csv"]


def test_out_in_a_folder_that_takes_no_new_file_is_written_in_place(nights, tmp_path, monkeypatch):
    """A shared folder where the export may be written but no file made: the part goes to the temporary folder."""
    import tempfile

    from fleetbench.cli import main

    target = tmp_path / "shared" / "nights.csv"
    target.parent.mkdir()
    target.write_text("old")
    real = tempfile.mkstemp

    def no_new_file_there(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == target.parent:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", no_new_file_there)
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", nights)
    assert main(["results", "--all", "--format", "csv", "--out", str(target)]) == 0
    assert target.read_text().startswith("id,") and sorted(p.name for p in target.parent.iterdir()) == ["nights.csv"]


def test_sigterm_mid_export_leaves_the_earlier_file_and_no_part(fleet, tmp_path, monkeypatch):
    """`timeout`, systemd and Airflow stop a command with SIGTERM, whose default action skipped the clean-up."""
    import os
    import signal

    import fleetbench.warehouse.read as read
    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    out = tmp_path / "nights.json"
    assert main(["results", "--all", "--format", "json", "--out", str(out)]) == 0
    before = out.read_bytes()
    original = read.iter_results

    def stopped(*args, **kwargs):
        for n, row in enumerate(original(*args, **kwargs)):
            if n == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            yield row

    monkeypatch.setattr(read, "iter_results", stopped)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        main(["results", "--all", "--format", "json", "--out", str(out)])
    assert stop.value.code == 128 + signal.SIGTERM
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["f.db", "nights.json"]
    assert signal.getsignal(signal.SIGTERM) is handler  # put back


def test_a_run_ids_filters_are_named_not_the_run(nights, tmp_path):
    """With --run-id, a --metric typo or a host without rows in that run was reported as "no results for run id"."""
    proc = cli("results", "--run-id", "night-30", "--metric", "images_per_secc", url=nights)
    assert proc.returncode == 2 and proc.stderr == ("fleetbench results: --metric 'images_per_secc': no result has "
                                                    "that primary metric (these have: none)\n")
    only_a = cli("results", "--run-id", "night-31", "--host", "gpu-b", "--metric", "x", "--format", "json", url=nights)
    assert only_a.returncode == 2 and "--metric 'x'" in only_a.stderr
    proc = cli("results", "--run-id", "night-30", "--host", "gpu-c", url=nights)  # gpu-c ran on night 31 only
    assert (proc.returncode, proc.stdout) == (0, "no results of host gpu-c in run night-30\n"), proc.stderr
    proc = cli("results", "--run-id", "night-99", "--host", "gpu-c", url=nights)
    assert proc.returncode == 2 and proc.stderr == "fleetbench results: no results for run id 'night-99'\n"


def test_host_matches_its_name_exactly(nights):
    """SQLite's LIKE ignores case: GPU-C matched gpu-c's multi-node sets there (not on PostgreSQL)."""
    proc = cli("results", "--host", "GPU-C", "--all", url=nights)
    assert proc.returncode == 2 and "--host 'GPU-C': no result of that host" in proc.stderr


def test_out_that_cannot_be_written_is_one_line(fleet, tmp_path, monkeypatch, capsys):
    """A read-only file system or a full disk: the usage error naming --out, not a traceback, and
    the earlier export whole (the part was written beside it)."""
    import tempfile

    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert main(["results", "--all", "--format", "csv", "--out", str(tmp_path / "new.csv")]) == 2
    assert capsys.readouterr().err == f"fleetbench results: --out {tmp_path / 'new.csv'}: Read-only file system\n"
    monkeypatch.undo()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    out = tmp_path / "nights.csv"
    out.write_text("earlier")
    import fleetbench.cli as cli_module

    def full_disk(rows, fields=None):
        sys.stdout.write("id,dag_id\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_module, "_csv_stream", full_disk)
    assert main(["results", "--all", "--format", "csv", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"fleetbench results: --out {out}: No space left on device\n"
    assert out.read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["f.db", "nights.csv"]


def test_parquet_says_it_wrote_only_once_the_file_is_in_place(fleet, tmp_path, monkeypatch, capsys):
    import fleetbench.cli as cli_module
    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    out = tmp_path / "nights.parquet"

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    import os as os_module

    monkeypatch.setattr(os_module, "replace", refused)
    assert main(["results", "--all", "--format", "parquet", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"fleetbench results: --out {out}: Operation not permitted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.db"]
    monkeypatch.undo()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", fleet)
    assert cli_module.main(["results", "--all", "--format", "parquet", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote 11 row(s) to {out}\n"
