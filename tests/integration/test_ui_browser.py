"""`make ui` as a new user meets it: scripts/ui.sh starts api-server, scheduler, dag-processor and triggerer
as local processes and prints a login; in Debian's headless Chromium a person signs in with that login,
opens fleet_benchmark's Trigger form, finds the fleet's hosts and models offered as choices, picks some,
triggers, and the run (LocalExecutor, the real Docker engine and CPU smoke image) stores its rows in the
warehouse, which the results view then shows. Ctrl-C (SIGINT) stops every process.

The fleet is a copy of the default one without its nightly schedule, so the only run is the one the form
starts. Screenshots are kept in tests/artifacts/ (gitignored).
Needs: chromium and tests/browser's npm packages (`bash scripts/ensure-browser.sh`), the CPU smoke image.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_report_browser import ARTIFACTS, BROWSER_DIR, CHROMIUM, browser, open_page  # noqa: F401 (a fixture)

from airflow_cluster import as_from_a_terminal, free_port

pytestmark = [pytest.mark.integration, pytest.mark.scheduler]

ROOT = Path(__file__).resolve().parents[2]
DAG = "fleet_benchmark"


class UiScript:
    """`bash scripts/ui.sh` in its own session, on a free port, with its own AIRFLOW_HOME and warehouse."""

    def __init__(self, tmp: Path):
        config = yaml.safe_load((ROOT / "include" / "config" / "fleet.yaml").read_text())
        config["fleet"]["schedule"] = None
        (tmp / "fleet.yaml").write_text(yaml.safe_dump(config))
        self.config = config
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.home = tmp / "airflow"
        self.warehouse_url = f"sqlite:///{tmp}/warehouse.db"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "FLEETBENCH_")) or k == "AIRFLOW__CORE__UNIT_TEST_MODE"}
        self.env = {**env, "AIRFLOW_HOME": str(self.home), "FLEETBENCH_UI_PORT": str(self.port),
                    "FLEETBENCH_CONFIG": str(tmp / "fleet.yaml"), "FLEETBENCH_DATA_DIR": str(tmp / "data"),
                    "FLEETBENCH_WAREHOUSE_URL": self.warehouse_url}
        self.proc: subprocess.Popen | None = None
        self.printed = ""

    def __enter__(self) -> "UiScript":
        self.proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "ui.sh")], env=self.env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=as_from_a_terminal)  # its Ctrl-C is tested
        deadline = time.monotonic() + 300
        while not re.search(r"^  logs:", self.printed, re.M):  # the last line of what it prints
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"scripts/ui.sh printed no login (exit {self.proc.returncode}):\n{self.printed}")
            if select.select([self.proc.stdout], [], [], 1)[0]:  # unbuffered reads: select sees all that is left
                self.printed += os.read(self.proc.stdout.fileno(), 65536).decode()
        found = re.search(r"login:\s+(\S+) / (\S+)", self.printed)
        assert found, self.printed
        self.user, self.password = found.groups()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        for pid in self.leftovers():  # what a failed Ctrl-C left (the Airflow processes run in sessions of their own)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def leftovers(self) -> list[int]:
        """Processes still running with this script's AIRFLOW_HOME."""
        marker = f"AIRFLOW_HOME={self.home}\0".encode()
        left = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if marker in environ.read_bytes():
                    left.append(int(environ.parent.name))
            except (OSError, ValueError):  # gone meanwhile, or not ours to read
                pass
        return left

    def stop(self) -> int | None:
        """Ctrl-C, as a person stops it; returns ui.sh's exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def token(self) -> str:
        req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                     data=json.dumps({"username": self.user, "password": self.password}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)["access_token"]

    def run_state(self, run_id: str, token: str) -> str:
        req = urllib.request.Request(f"{self.base}/api/v2/dags/{DAG}/dagRuns/{urllib.request.quote(run_id)}",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)["state"]

    def logs(self) -> str:
        files = sorted((self.home / "logs" / "ui").glob("*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in files)


    def wait_for_dag(self, timeout: float = 240) -> None:
        """Until the dag-processor has parsed the DAG and the api-server lists it."""
        req = urllib.request.Request(f"{self.base}/api/v2/dags/{DAG}",
                                     headers={"Authorization": f"Bearer {self.token()}"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(req, timeout=30):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or time.monotonic() > deadline:
                    raise AssertionError(f"{DAG} is not in the UI after {timeout} s:\n{self.logs()}") from exc
            time.sleep(2)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    with UiScript(tmp_path_factory.mktemp("make-ui")) as server:
        server.wait_for_dag()
        yield server


def trigger_from_form(ui: UiScript, *args: str) -> dict:
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.glob("trigger-form*.png"):
        old.unlink()
    proc = subprocess.run(["node", str(BROWSER_DIR / "trigger_form.mjs"), ui.base, DAG, ui.user, ui.password,
                           str(ARTIFACTS), *args], cwd=BROWSER_DIR, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CHROMIUM": CHROMIUM})
    lines = proc.stdout.strip().splitlines()
    assert lines, f"trigger_form.mjs printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    seen = json.loads(lines[-1])
    assert proc.returncode == 0, f"{seen.get('failure')}\n{seen.get('response')}\n{proc.stderr[-3000:]}"
    return seen


def test_ui_script_prints_a_login_that_signs_in(ui):
    assert f"fleetbench UI: {ui.base}" in ui.printed
    generated = json.loads((ui.home / "simple_auth_manager_passwords.json.generated").read_text())
    assert ui.user == "admin" and ui.password == generated["admin"]
    assert ui.token().count(".") == 2  # a JWT: the printed password is the one the auth manager checks


def test_a_run_triggered_from_the_form_stores_rows(browser, ui):  # noqa: F811 (the browser fixture)
    from fleetbench.warehouse import fetch_results, get_engine

    seen = trigger_from_form(ui, "--pick", "models=trivial", "--number", "num_batches=5")
    # the form: every parameter, and the fleet's hosts and models as choices
    assert {"Hosts", "Models", "Batch sizes per device", "Number of batches", "Dry run"} <= set(seen["fields"])
    benchmark = ui.config["benchmarks"][0]
    assert seen["choices"] == {"hosts": [h["name"] for h in ui.config["hosts"]],
                               "models": sorted(benchmark["models"])} == {"hosts": ["localhost"],
                                                                          "models": ["lenet", "trivial"]}
    for shot in ("trigger-form.png", "trigger-form-hosts-choices.png", "trigger-form-models-choices.png",
                 "trigger-form-filled.png"):
        assert (ARTIFACTS / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
    print(f"screenshots: {ARTIFACTS}/trigger-form*.png")
    # what the form sent: the picked model and the typed number, the rest as defaults
    conf = seen["request"]["conf"]
    assert conf["models"] == ["trivial"] and conf["num_batches"] == 5 and conf["hosts"] == [] and not conf["dry_run"]
    run = seen["response"]["body"]
    assert run["triggered_by"] == "ui" and run["triggering_user_name"] == ui.user and run["conf"] == conf

    token = ui.token()
    deadline = time.monotonic() + 600
    while (state := ui.run_state(run["dag_run_id"], token)) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"the run is still {state} after 600 s:\n{ui.logs()}"
        time.sleep(3)
    assert state == "success", ui.logs()

    engine = get_engine(ui.warehouse_url)
    rows = fetch_results(engine, run_id=run["dag_run_id"])
    engine.dispose()
    assert sorted((r["host"], r["model"], r["batch_size_per_device"], r["num_batches"], r["status"]) for r in rows) == [
        ("localhost", "trivial", bs, 5, "ok") for bs in sorted(benchmark["batch_sizes"])]
    assert all(r["images_per_sec"] > 0 and r["dag_id"] == DAG for r in rows)

    # the results view inside Airflow's UI shows the run's numbers
    view = open_page(f"{ui.base}/plugin/fleetbench", "trigger-form-results-view.png", "--frame", "/fleetbench",
                     "--cookie", f"_token={token}", "--wait", "table#throughput-table")
    shown = {(r["host"]["text"], r["case_key"]["text"]): r["latest"]["value"]
             for r in view["tables"]["throughput-table"]["rows"]}
    assert shown == {(r["host"], r["case_key"]): r["images_per_sec"] for r in rows}


def test_ctrl_c_stops_every_process(ui):
    assert ui.stop() == 0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", ui.port)) != 0, "the api-server still listens after Ctrl-C"
    left = []
    for pid in ui.leftovers():
        try:
            left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile
            pass
    assert left == []
