"""Hostile input: huge lines and files, FIFOs, devices, damaged probe records, absurd numbers.

Each case would take minutes (a pattern that is quadratic in a line's length), hang (a FIFO
read without a writer) or eat memory (a symlink to /dev/zero). None is a timed test: a
SIGALRM deadline turns a hang into a failure, and the assertions are on the results.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetbench.cli import main
from fleetbench.hosts import HostNeeds, facts_from_dir, host_check
from fleetbench.hosts.facts import MAX_PROBE_BYTES
from fleetbench.parsing import NotRegularFile, cli_parse, parse_log, parse_log_file

REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
FLEETBENCH = str(Path(sys.executable).parent / "fleetbench")
TF = "tf_cnn_benchmarks"


@contextlib.contextmanager
def deadline(seconds: int = 20):
    """Fail instead of hanging: SIGALRM interrupts blocking calls and the regex engine alike."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


DEVICE_LINK = "a character device (a symlink to /dev/zero), not a regular file"
NOT_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def zero_link(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


# -- log lines that are megabytes long ------------------------------------------------------------
def test_a_two_megabyte_line_of_nccl_is_read_in_linear_time():
    text = "nccl" * 500_000 + " Failed\nncclCommInitRank failed: unhandled system error\n"
    with deadline():
        log = parse_log(text, TF)
    assert (log.failure_class, log.failure_detail) == ("nccl", "ncclCommInitRank failed: unhandled system error")


@pytest.mark.parametrize("seed", [
    "nccl", "ncclX", "a.", "Aa", "images/sec: 1 ", "total images/sec: ", "TensorFlow:  ", "Batch size: 1 ",
    "Accuracy @ 1 = 1 ", "--use_fp16=", "Data type: ", "'", "INFO|", "[1,0]<stdout>:", "Iter #1: 1 ",
    "Total img/sec on 1 GPU(s): ", "Number of GPUs: ", "9", " ", "Check failed", "unhandled ",
])  # fmt: skip
def test_long_lines_of_repeated_pattern_starts(seed):
    line = seed * (2_000_000 // len(seed))
    with deadline():
        for fmt in (TF, "horovod_synthetic"):
            log = parse_log(line + "\n" + line, fmt)
            assert log.status == "failed"


def test_a_line_longer_than_the_cap_is_cut_and_never_a_result():
    log = parse_log("x" * 70_000 + "total images/sec: 100.0\n", TF)
    assert (log.status, log.failure_class) == ("failed", "no_result")


# -- logs that are files --------------------------------------------------------------------------
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    path = fifo(tmp_path / "run.log")
    with deadline(), pytest.raises(NotRegularFile, match="a FIFO, not a regular file"):
        parse_log_file(path)


def test_a_symlink_to_a_device_is_refused_naming_both(tmp_path):
    path = zero_link(tmp_path / "run.log")
    with deadline(), pytest.raises(NotRegularFile) as raised:
        parse_log_file(path)
    assert str(raised.value) == f"{path}: a character device (a symlink to /dev/zero), not a regular file"


def test_cli_parse_names_what_it_refused(tmp_path, capsys):
    good = REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"
    paths = [fifo(tmp_path / "a.log"), zero_link(tmp_path / "b.log"), good]
    out = io.StringIO()
    with deadline():
        code = cli_parse([str(p) for p in paths], "auto", out)
    assert code == 2
    assert [json.loads(line)["status"] for line in out.getvalue().splitlines()] == ["ok"]
    err = capsys.readouterr().err
    assert f"fleetbench parse: cannot read {paths[0]}: a FIFO, not a regular file" in err
    assert f"fleetbench parse: cannot read {paths[1]}: {DEVICE_LINK}" in err


def test_a_large_log_is_streamed_not_read_whole(tmp_path):
    """40 MB of real logs: reading it whole (and its lines) takes several times that."""
    body = "".join(p.read_text(errors="replace") for p in sorted(REAL_LOGS.glob("*.log")))
    path = tmp_path / "big.log"
    with path.open("w") as out:
        for _ in range(40_000_000 // len(body)):
            out.write(body)
        out.write((REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log").read_text())
    script = textwrap.dedent(f"""
        import resource, signal
        signal.alarm(120)
        from fleetbench.parsing import parse_log_file
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        log = parse_log_file({str(path)!r})
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(log.status, log.model, grown // 1024)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    status, model, grown_mib = proc.stdout.split()
    assert (status, model) == ("ok", "alexnet")  # the first header of the concatenated logs
    assert int(grown_mib) < 40


# -- probe folders ----------------------------------------------------------------------------------
def probes_json(folder: Path, record) -> None:
    (folder / "probes.json").write_text(record if isinstance(record, str) else json.dumps(record))


def check(folder: Path, gpus: int = 1) -> dict:
    with deadline():
        return host_check(facts_from_dir(folder), HostNeeds(gpus=gpus, image_cuda="12.1"))


def test_repeated_server_and_nvrm_lines_are_linear(tmp_path):
    (tmp_path / "docker-version.txt").write_text("Server:\n" * 40_000)
    (tmp_path / "proc-driver-nvidia-version.txt").write_text("NVRM version:" * 40_000 + "\n")
    (tmp_path / "nvidia-smi.txt").write_text("|  0  X" + " " * 60_000 + "\n" + "1" * 100_000 + "MiB\n")
    (tmp_path / "nvidia-smi-query.csv").write_text("index, name\n" + "No such file or directory nvidia-sm" * 20_000)
    (tmp_path / "uname-r.txt").write_text("6.1.0\n")
    with deadline():
        facts = facts_from_dir(tmp_path)
    assert facts.docker_version is None and facts.kernel_module_version is None and facts.kernel == "6.1.0"


def test_fifos_and_devices_in_a_probe_folder_are_named_not_read(tmp_path):
    fifo(tmp_path / "uname-r.txt")
    zero_link(tmp_path / "nvidia-smi.txt")
    fifo(tmp_path / "docker-info.json")
    fifo(tmp_path / "gpu-smoke.txt")
    assert check(tmp_path)["verdict"] == "degraded"  # nothing known, nothing failed
    facts = facts_from_dir(tmp_path)
    assert facts.probe_problems == {
        "uname-r.txt": "not read: a FIFO, not a regular file",
        "nvidia-smi.txt": f"not read: {DEVICE_LINK}",
        "docker-info.json": "not read: a FIFO, not a regular file",
        "gpu-smoke.txt": "not read: a FIFO, not a regular file",
    }
    assert facts.unknown["kernel"] == "uname-r.txt: not read: a FIFO, not a regular file"
    assert facts.unknown["gpus"] == f"nvidia-smi.txt: not read: {DEVICE_LINK}"
    assert facts.unknown["docker"] == "docker-info.json: not read: a FIFO, not a regular file"
    assert facts.gpu_smoke == "unknown"
    assert facts.gpu_smoke_detail == "gpu-smoke.txt: not read: a FIFO, not a regular file"


def test_a_huge_probe_output_is_read_up_to_the_cap(tmp_path):
    table = (HOSTS / "h100-590-cuda13.1" / "nvidia-smi.txt").read_text()
    (tmp_path / "nvidia-smi.txt").write_text(table + "x" * (MAX_PROBE_BYTES + 1))
    facts = facts_from_dir(tmp_path)
    assert facts.driver_version == "590.48.01" and len(facts.gpus) == 1
    assert facts.probe_problems == {"nvidia-smi.txt": "truncated: only its first 4 MiB were read"}


@pytest.mark.parametrize(("record", "problem"), [
    ("[" * 100_000, "not JSON (maximum recursion depth exceeded"),
    ([1, 2], "a list where an object was expected"),
    ({"runner": ["local"], "probes": []}, "'runner' is a list where text was expected"),
    ({"unreachable": 5, "probes": []}, "'unreachable' is a number where text was expected"),
    ({"probes": 5}, "'probes' is a number where a list was expected"),
    ({"probes": [{"filename": "nvidia-smi.txt", "error": 5}, {"filename": "gpu-smoke.txt", "exit_code": "0"}, "x"]},
     "3 of its probes are not objects with a text filename"),
])  # fmt: skip
def test_a_probes_json_of_the_wrong_shape_is_a_problem_not_a_crash(tmp_path, record, problem):
    probes_json(tmp_path, record)
    (tmp_path / "nvidia-smi.txt").write_text(NOT_DRIVER)
    (tmp_path / "gpu-smoke.txt").write_text("GPU 0: NVIDIA H100 (UUID: GPU-0000)\n")
    result = check(tmp_path)
    facts = facts_from_dir(tmp_path)
    assert facts.probe_problems["probes.json"].startswith(problem)
    assert facts.runner is None and facts.unreachable is None
    assert result["verdict"] == "unfit"  # judged on the outputs, as a folder captured by hand


@pytest.mark.parametrize(("name", "text"), [
    ("uname-r.txt", "5" * 5000 + "\n"),
    ("nvidia-smi-query.csv", "index, name, memory.total [MiB]\n0, NVIDIA H100, " + "8" * 5000 + " MiB\n"),
    ("nvidia-smi-query.csv", "index, name, driver_version\n" + "1" * 5000 + ", NVIDIA H100, " + "5" * 5000 + "\n"),
    ("nvidia-smi.txt", "| NVIDIA-SMI 590.48.01   Driver Version: " + "5" * 5000 + "   CUDA Version: " + "1" * 5000
                       + ".0 |\n|  " + "1" * 5000 + "  NVIDIA H100   On  | 00000000:61:00.0 Off |\n| " + "8" * 5000
                       + "MiB / 81559MiB |\n"),
    ("df-docker-root.txt", "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                           "/dev/sda1 1 1 " + "9" * 4000 + " 1% /\n"),
    ("docker-info.json", json.dumps({"ServerVersion": 5, "Runtimes": [{"a": 1}, {"b": 2}], "CDISpecDirs": [1, 2]})),
    ("docker-info.json", json.dumps({"ServerVersion": "2" * 5000})),
    ("docker-info.txt", "Server Version: " + "2" * 5000 + "\n"),
    ("docker-version.txt", "Server:\n Engine:\n  Version: " + "2" * 5000 + "\n"),
])  # fmt: skip
def test_absurd_numbers_and_types_leave_facts_unknown(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    result = check(tmp_path)
    facts = result["facts"]
    assert facts["kernel"] is None and facts["docker_version"] is None and facts["cuda_driver_version"] is None
    assert facts["driver_version"] in (None, "590.48.01")
    assert all(g["index"] < 10_000 and (g["memory_total_mib"] or 0) < 10**9 for g in facts["gpus"] or [])
    json.dumps(result)


# -- the command line -----------------------------------------------------------------------------
def test_host_check_notes_unreadable_probe_files(tmp_path, capsys):
    fifo(tmp_path / "uname-r.txt")
    probes_json(tmp_path, {"probes": "x"})
    with deadline():
        assert main(["host-check", "--facts", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "degraded"
    note = "fleetbench host-check: note:"
    assert f"{note} {tmp_path / 'uname-r.txt'}: not read: a FIFO, not a regular file\n" in captured.err
    assert f"{note} {tmp_path / 'probes.json'}: 'probes' is text where a list was expected\n" in captured.err


def db_upgrade(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLEETBENCH, "db", "upgrade", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FLEETBENCH_WAREHOUSE_URL": url})


def test_db_upgrade_on_an_unreachable_database_is_one_line_without_the_password():
    proc = db_upgrade("postgresql://fleet:s3cret@127.0.0.1:1/warehouse")
    assert proc.returncode == 2
    shown = "postgresql://fleet:***@127.0.0.1:1/warehouse"
    assert proc.stderr.startswith(f"fleetbench db: cannot upgrade the warehouse at {shown}: ")
    assert proc.stderr.count("\n") == 1 and "s3cret" not in proc.stderr and "Traceback" not in proc.stderr
    proc = db_upgrade("postgresql://fleet@127.0.0.1:1/warehouse?sslmode=prefer&password=s3cret")
    assert proc.returncode == 2 and "s3cret" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("fleetbench db: cannot upgrade the warehouse at "
                                  "postgresql://fleet@127.0.0.1:1/warehouse?password=***&sslmode=prefer: ")


def test_db_upgrade_to_a_folder_that_does_not_exist(tmp_path):
    proc = db_upgrade(f"sqlite:///{tmp_path}/missing/w.db")
    assert proc.returncode == 2
    assert proc.stderr == (f"fleetbench db: cannot upgrade the warehouse at sqlite:///{tmp_path}/missing/w.db: "
                           "(sqlite3.OperationalError) unable to open database file\n")


@pytest.mark.parametrize("revision", ["nope", "abc@-1"])
def test_db_upgrade_to_a_bad_revision_names_it(tmp_path, revision):
    proc = db_upgrade(f"sqlite:///{tmp_path}/w.db", "--revision", revision)
    assert proc.returncode == 2
    assert proc.stderr.startswith("fleetbench db: --revision") and proc.stderr.count("\n") == 1
    assert proc.stderr.count(revision) == 1, proc.stderr  # named once, not once by us and once by Alembic


def test_db_upgrade_names_the_revision_it_reached_and_refuses_to_go_back(tmp_path):
    """The success line names the revision the warehouse is at (not `head`); an older --revision than the
    warehouse's, which Alembic's upgrade passes over in silence, is a usage error that changes nothing."""
    from alembic.script import ScriptDirectory

    from fleetbench.warehouse import MIGRATIONS, current_revision, get_engine

    url = f"sqlite:///{tmp_path}/w.db"
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    for args, revision in ((("--revision", "0011"), "0011"), ((), head)):
        proc = db_upgrade(url, *args)
        assert (proc.returncode, proc.stdout) == (0, f"warehouse at {url} is at revision {revision}\n"), proc.stderr
    for older in ("0011", "base", "head-1", f"{head}-2", "-1"):  # relative ones too (they exited 0, unchanged)
        proc = db_upgrade(url, "--revision", older)
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == (f"fleetbench db: --revision {older}: the warehouse is at revision {head}, newer; "
                               "upgrade does not go back (nothing changed)\n")
    engine = get_engine(url)
    assert current_revision(engine) == head
    engine.dispose()


def test_a_warehouse_a_newer_fleetbench_upgraded_is_named_so(tmp_path):
    """A warehouse at a revision this fleetbench does not have: the error said "--revision 'head': Can't locate
    revision identified by '0099'", blaming an option nobody gave."""
    import sqlite3

    from alembic.script import ScriptDirectory

    from fleetbench.warehouse import MIGRATIONS, WarehouseTooNew, get_engine, upgrade

    url = f"sqlite:///{tmp_path}/w.db"
    assert db_upgrade(url).returncode == 0
    with sqlite3.connect(tmp_path / "w.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    proc = db_upgrade(url)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"fleetbench db: the warehouse is at revision 0099, which this fleetbench (newest {head}) "
                           "does not know: a newer fleetbench upgraded it; use that one (nothing changed)\n")
    engine = get_engine(url)
    with pytest.raises(WarehouseTooNew, match="revision 0099"):  # the DAG's store task says the same
        upgrade(engine)
    engine.dispose()


def test_a_huge_failed_log_is_classified_from_its_head_and_tail(tmp_path, monkeypatch):
    """Past twice FAILURE_WINDOW, failure evidence is read from the first and last FAILURE_WINDOW bytes only:
    an error at either end still names the failure; one lost in the middle does not (a bound, said in the docs)."""
    from fleetbench.parsing import detect

    monkeypatch.setattr(detect, "FAILURE_WINDOW", 64 * 1024)
    filler = "2026-12-01 02:00:00.000000: I tensorflow/core/common_runtime/executor.cc:1 still running\n" * 12_000
    nccl = "tensorflow.python.framework.errors_impl.UnknownError: ncclInternalError: unhandled system error\n"
    oom = "ResourceExhaustedError: OOM when allocating tensor with shape[64,3,224,224]\n"

    def parsed(text):
        path = tmp_path / "run.log"
        path.write_text(text)
        return parse_log_file(path, "tf_cnn_benchmarks")

    assert len(filler) > 8 * detect.FAILURE_WINDOW
    assert parsed(filler + nccl).failure_class == "nccl"  # in the tail
    assert parsed(oom + filler).failure_class == "oom"  # in the head
    assert parsed(filler + oom + filler).failure_class != "oom"  # beyond both windows
    assert parse_log(filler + oom + filler, "tf_cnn_benchmarks").failure_class == "oom"  # text in memory: all of it


@pytest.mark.parametrize("min_free_gb, status", [("80", "pass"), ("83.7", "fail")])
def test_host_check_min_free_gb_is_gb_as_in_the_fleet_config(min_free_gb, status, capsys):
    """83.6 GB (77.9 GiB) free: 80 GB passes, as the DAG's check of `min_free_gb: 80` does (it failed when the CLI
    counted GiB: 80 GiB is 85.9 GB)."""
    assert main(["host-check", "--facts", str(HOSTS / "local-vm-nogpu"), "--min-free-gb", min_free_gb]) == 0
    disk = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["disk"]
    assert disk["status"] == status, disk


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1000001"])
def test_host_check_refuses_a_min_free_gb_that_is_no_size(value, capsys):
    assert main(["host-check", "--facts", str(HOSTS / "local-vm-nogpu"), "--min-free-gb", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetbench host-check: --min-free-gb must be a number of GB from 0 to 1,000,000, got ")
    assert "Traceback" not in err


@pytest.mark.parametrize("revision, end", [("head-40", "first"), ("base-1", "first"), ("0010+20", "newest"),
                                           ("+30", "newest")])
def test_db_upgrade_to_a_relative_revision_past_the_chain_is_refused(tmp_path, revision, end):
    """Alembic failed an assertion (a traceback) on head-40 and took base-1 for head (upgrading all the way)."""
    from alembic.script import ScriptDirectory

    from fleetbench.warehouse import MIGRATIONS, current_revision, get_engine

    url = f"sqlite:///{tmp_path}/w.db"
    assert db_upgrade(url, "--revision", "0010").returncode == 0
    revisions = [r.revision for r in ScriptDirectory(str(MIGRATIONS)).walk_revisions()]
    proc = db_upgrade(url, "--revision", revision)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == (f"fleetbench db: --revision {revision}: past the {end} revision (the revisions are "
                           f"{revisions[-1]} to {revisions[0]}; nothing changed)\n")
    engine = get_engine(url)
    assert current_revision(engine) == "0010"
    engine.dispose()
    proc = db_upgrade(url, "--revision", "+2")  # within the chain: from the warehouse's own revision
    assert (proc.returncode, proc.stdout) == (0, f"warehouse at {url} is at revision 0012\n"), proc.stderr


def test_a_database_of_another_program_is_no_warehouse(tmp_path):
    """FLEETBENCH_WAREHOUSE_URL pointed at Airflow's metadata database (its own Alembic history): it was called a
    warehouse "a newer fleetbench upgraded"."""
    import sqlite3

    from fleetbench.warehouse import NotAWarehouse, get_engine, upgrade

    with sqlite3.connect(tmp_path / "airflow.db") as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('d2f4e1b3c5a7')")
        conn.execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)")
    url = f"sqlite:///{tmp_path}/airflow.db"
    proc = db_upgrade(url)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"fleetbench db: the database at {url} is no fleetbench warehouse: its Alembic revision "
                           "d2f4e1b3c5a7 is another program's (Airflow's metadata database?); check "
                           "FLEETBENCH_WAREHOUSE_URL (nothing changed)\n")
    engine = get_engine(url)
    with pytest.raises(NotAWarehouse):  # the DAG's store task says the same
        upgrade(engine)
    engine.dispose()
    with sqlite3.connect(tmp_path / "airflow.db") as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall() == [
            ("alembic_version",), ("dag_run",)]
