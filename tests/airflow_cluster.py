"""A real Airflow deployment for tests: api-server, scheduler and dag-processor as local processes
with the LocalExecutor, on a fresh PostgreSQL metadata database. Unlike `dags test`, it honours
pools, schedules, backfills and parallelism.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def as_from_a_terminal() -> None:
    """Popen's preexec_fn for a process that a test stops with Ctrl-C (SIGINT): SIGINT and SIGQUIT back to their
    defaults, as a terminal starts a program. A suite started in the background of a non-interactive shell
    (`cmd &`, nohup) has them ignored, every child inherits that, and bash cannot trap a signal ignored on entry:
    `ui.sh` would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(procs, grace_s: float = 30) -> None:
    """SIGTERM each still running process group, wait up to `grace_s` for each, then SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_for_url(url: str, procs, timeout: float, logs, context: ssl.SSLContext | None = None) -> None:
    """Poll `url` until it answers; raise (with `logs()`) when one of `procs` exits first or `timeout` passes."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited early ({proc.returncode}):\n{logs()}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout} s:\n{logs()}")


class LocalService:
    """A context manager around one local server process (its own process group), its output in
    `home/<log_name>`: `_start` launches it and waits until `ready_url` answers; leaving stops it."""

    home: Path
    log_name = "service.log"
    proc: subprocess.Popen | None = None

    def _start(self, argv: list[str], ready_url: str, timeout: float, env: dict | None = None):
        log = open(self.home / self.log_name, "w")
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_url(ready_url, [self.proc], timeout, self.log)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            stop_processes([self.proc])

    def log(self) -> str:
        path = self.home / self.log_name
        return path.read_text()[-4000:] if path.exists() else ""


class LocalAirflow:
    """With `tls` ({"server_cert", "server_key", "ca_cert"}: paths), the api-server serves HTTPS only."""

    def __init__(self, home: Path, pg_url: str, env: dict[str, str] | None = None, parallelism: int = 8,
                 tls: dict[str, Path] | None = None):
        self.home = home
        self.pg_url = pg_url
        self.db = f"fb_airflow_{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ssl_context = ssl.create_default_context(cafile=str(tls["ca_cert"])) if tls else None
        self.procs: list[subprocess.Popen] = []
        base = pg_url.rsplit("/", 1)[0]
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{base}/{self.db}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            **({"AIRFLOW__API__SSL_CERT": str(tls["server_cert"]), "AIRFLOW__API__SSL_KEY": str(tls["server_key"])}
               if tls else {}),
            **(env or {}),
        }

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "LocalAirflow":
        self.home.mkdir(parents=True, exist_ok=True)
        admin = create_engine(self.pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.db}"'))
        admin.dispose()
        self.cli("db", "migrate")
        try:
            self._start("api-server", "api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1")
            self._start("scheduler", "scheduler")
            self._start("dag-processor", "dag-processor")
            self._wait_api()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop_processes(self.procs)
        from pg_databases import drop_database

        admin = create_engine(self.pg_url, isolation_level="AUTOCOMMIT")
        drop_database(admin, self.db)
        admin.dispose()

    def _start(self, name: str, *args: str) -> None:
        log = open(self.home / f"{name}.log", "w")
        self.procs.append(subprocess.Popen([AIRFLOW, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def _wait_api(self, timeout: float = 120) -> None:
        wait_for_url(f"{self.base_url}/api/v2/monitor/health", self.procs, timeout, self.logs, self.ssl_context)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-tail:]}" for p in sorted(self.home.glob("*.log")))

    # -- commands -------------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        return proc

    def metadata(self):
        return create_engine(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Until the dag-processor has serialized the DAG (the scheduler only runs serialized DAGs)."""
        engine = self.metadata()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    found = conn.execute(text("select count(*) from serialized_dag where dag_id = :d"),
                                         {"d": dag_id}).scalar()
                if found:
                    return
                time.sleep(1)
        finally:
            engine.dispose()
        raise TimeoutError(f"{dag_id} was not parsed in {timeout} s:\n{self.logs()}")

    def runs(self, dag_id: str) -> list[dict]:
        engine = self.metadata()
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("select run_id, state, run_type, logical_date from dag_run where dag_id = :d "
                                         "order by logical_date"), {"d": dag_id}).all()
        finally:
            engine.dispose()
        return [dict(r._mapping) for r in rows]

    def wait_for_runs(self, dag_id: str, count: int, timeout: float = 600, run_type: str | None = None) -> list[dict]:
        """Until `count` runs of the DAG (of `run_type`, if given) exist and all are finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [r for r in self.runs(dag_id) if run_type is None or r["run_type"] == run_type]
            if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
                return runs
            time.sleep(2)
        raise TimeoutError(f"runs of {dag_id} did not finish in {timeout} s: {self.runs(dag_id)}\n{self.logs()}")

    def wait_for_backfills(self, timeout: float = 120) -> None:
        """Until the scheduler has marked every backfill completed (only one may run per DAG)."""
        engine = self.metadata()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    if not conn.execute(text("select count(*) from backfill where completed_at is null")).scalar():
                        return
                time.sleep(1)
        finally:
            engine.dispose()
        raise TimeoutError(f"a backfill did not complete in {timeout} s")

    def import_pools(self, config_path: Path) -> None:
        """One single-slot pool per host of the fleet config, as the README tells operators to create them."""
        pools = self.home / "pools.json"
        pools.write_text(subprocess.run([str(Path(sys.executable).parent / "fleetbench"), "pools", "export", "--config",
                                         str(config_path)], capture_output=True, text=True, check=True).stdout)
        self.cli("pools", "import", str(pools))

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> None:
        args = ["dags", "trigger", dag_id]
        if conf is not None:
            args += ["--conf", json.dumps(conf)]
        if run_id:
            args += ["--run-id", run_id]
        self.cli(*args)


class RestAirflow(LocalAirflow):
    """LocalAirflow driven through its public REST API, as a user or CI job would: the simple auth manager
    has a user `fleetbench` (role admin) whose password is `self.password`; every process shares one
    Fernet key (and LocalAirflow's JWT secret)."""

    def __init__(self, home: Path, pg_url: str, env: dict[str, str] | None = None, parallelism: int = 8,
                 tls: dict[str, Path] | None = None):
        from cryptography.fernet import Fernet

        self.password = secrets.token_urlsafe(16)
        rest_env = {
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "fleetbench:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            **(env or {}),
        }
        super().__init__(home, pg_url, env=rest_env, parallelism=parallelism, tls=tls)
        self._token: str | None = None

    def __enter__(self):
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({"fleetbench": self.password}))
        return super().__enter__()

    def stopped(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def api(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(f"{self.base_url}{path}", method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=120, context=self.ssl_context) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None

    def token(self) -> str:
        """A JWT from the simple auth manager's `POST /auth/token` (user fleetbench)."""
        if self._token is None:
            self._token = self.api("POST", "/auth/token", {"username": "fleetbench", "password": self.password},
                                   auth=False)["access_token"]
        return self._token

    def trigger_api(self, dag_id: str, run_id: str, conf: dict | None = None) -> dict:
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                        {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}})

    def wait_for_run_api(self, dag_id: str, run_id: str, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(3)
        raise TimeoutError(f"{dag_id} {run_id} did not finish in {timeout} s:\n{self.logs()}")

    def task_instances_api(self, dag_id: str, run_id: str) -> list[dict]:
        out, offset = [], 0
        while True:
            page = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100&offset={offset}")
            out += page["task_instances"]
            offset += len(page["task_instances"])
            if not page["task_instances"] or offset >= page["total_entries"]:
                return out
