"""Airflow 3's Edge executor for tests, as local processes: api-server (HTTPS only), scheduler and
dag-processor with the EdgeExecutor on a fresh PostgreSQL metadata database (`airflow_cluster`), and
one edge worker per entry of `workers` ({name: queues}).

An edge worker gets what a GPU host that may only reach the api-server over HTTPS would hold: the
Edge API's URL, the JWT secret it signs its requests with, the CA that signed the api-server's
certificate, the DAG files and its own AIRFLOW_HOME. Nothing else: no Airflow setting of the central
processes, no Fernet key, no broker, and a metadata database URL that refuses every connection, so
a worker that reached for the database instead of the API would fail its tasks.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import time
from pathlib import Path

from sqlalchemy import text

from airflow_cluster import AIRFLOW, ROOT, RestAirflow, as_from_a_terminal, stop_processes

EDGE_EXECUTOR = "airflow.providers.edge3.executors.EdgeExecutor"
# Port 9 (discard) on loopback has no listener: any use of the metadata DB fails at connect.
NO_DATABASE = "postgresql+psycopg2://nobody:nothing@127.0.0.1:9/no_metadata_db_on_edge_workers"


class EdgeAirflow(RestAirflow):
    """RestAirflow with the EdgeExecutor and its worker API (`[edge] api_enabled`), served over HTTPS
    with `tls` (`celery_cluster.make_tls_material`). `worker_env` adds variables to one worker's
    environment (its fleetbench settings); each worker's log is `<home>/edge-<name>.log`."""

    def __init__(self, home: Path, pg_url: str, workers: dict[str, list[str]], tls: dict[str, Path],
                 env: dict[str, str] | None = None, worker_env: dict[str, dict[str, str]] | None = None,
                 parallelism: int = 8):
        self.workers = workers
        self.worker_env = worker_env or {}
        self.tls = tls
        edge_env = {
            "AIRFLOW__CORE__EXECUTOR": EDGE_EXECUTOR,
            "AIRFLOW__EDGE__API_ENABLED": "True",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": "default",
            "AIRFLOW__EDGE__JOB_SUCCESS_PURGE": "60",  # minutes: keep the run's jobs for the test to read
            **(env or {}),
        }
        super().__init__(home, pg_url, env=edge_env, parallelism=parallelism, tls=tls)
        self.api_url = f"{self.base_url}/edge_worker/v1/rpcapi"
        self.env["AIRFLOW__EDGE__API_URL"] = self.api_url
        self.worker_procs: dict[str, subprocess.Popen] = {}
        self.final_workers: list[dict] = []  # the edge_worker table after the workers stopped

    def __enter__(self) -> "EdgeAirflow":
        super().__enter__()
        try:
            for name, queues in self.workers.items():
                self.start_worker(name, queues)
            self.wait_for_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def worker_environment(self, name: str) -> dict[str, str]:
        """The environment of the edge worker `name`: the GPU host's side of the deployment."""
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "FLEETBENCH_"))}
        return {
            **plain,
            "AIRFLOW_HOME": str(self.home / f"edge-{name}"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": NO_DATABASE,
            "AIRFLOW__EDGE__API_URL": self.api_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": self.env["AIRFLOW__API_AUTH__JWT_SECRET"],
            "SSL_CERT_FILE": str(self.tls["ca_cert"]),  # trust the api-server's CA (Edge API and execution API)
            "AIRFLOW__EDGE__JOB_POLL_INTERVAL": "1",
            "AIRFLOW__EDGE__HEARTBEAT_INTERVAL": "5",
            **self.worker_env.get(name, {}),
        }

    def start_worker(self, name: str, queues: list[str]) -> None:
        log = open(self.home / f"edge-{name}.log", "w")
        proc = subprocess.Popen([AIRFLOW, "edge", "worker", "--queues", ",".join(queues), "--concurrency", "1",
                                 "--edge-hostname", name],
                                env=self.worker_environment(name), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=as_from_a_terminal)  # drained by Ctrl-C
        self.procs.append(proc)
        self.worker_procs[name] = proc

    def try_worker(self, name: str, timeout: float = 120, **changes: str | None) -> subprocess.CompletedProcess:
        """Run an edge worker whose environment differs by `changes` (None removes a variable), on a queue no
        task uses, with one attempt per API call, until it exits: a worker the api-server refuses does."""
        env = {**self.worker_environment(name), "AIRFLOW__EDGE__API_RETRIES": "1", **changes}
        env = {k: v for k, v in env.items() if v is not None}
        return subprocess.run([AIRFLOW, "edge", "worker", "--queues", f"{name}-queue", "--edge-hostname", name],
                              env=env, capture_output=True, text=True, timeout=timeout)

    def edge_workers(self) -> list[dict]:
        """The scheduler's view of the edge workers (`edge_worker` table): name, state, queues."""
        engine = self.metadata()
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("select worker_name, state, queues from edge_worker order by worker_name"))
                # the provider stores the queue list as its Python repr (EdgeWorkerModel.queues)
                return [{**r._mapping, "queues": ast.literal_eval(r.queues or "None")} for r in rows]
        finally:
            engine.dispose()

    def edge_jobs(self, run_id: str, timeout: float = 60) -> list[dict]:
        """The EdgeExecutor's jobs of a run (`edge_job`): which worker fetched each task, from which queue. Waits
        until none is queued or running (a worker reports a job done after its task instance finished)."""
        engine = self.metadata()
        deadline = time.monotonic() + timeout
        try:
            while True:
                with engine.connect() as conn:
                    rows = conn.execute(text("select task_id, map_index, queue, state, edge_worker from edge_job "
                                             "where run_id = :r order by task_id, map_index"), {"r": run_id})
                    jobs = [dict(r._mapping) for r in rows]
                if all(j["state"] not in ("queued", "running") for j in jobs) or time.monotonic() > deadline:
                    return jobs
                time.sleep(1)
        finally:
            engine.dispose()

    def wait_for_workers(self, timeout: float = 120) -> None:
        """Until every worker registered over the Edge API and reported itself idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.worker_procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"edge worker {name} exited early ({proc.returncode}):\n{self.logs()}")
            idle = {w["worker_name"] for w in self.edge_workers() if w["state"] == "idle"}
            if idle >= set(self.worker_procs):
                return
            time.sleep(1)
        raise TimeoutError(f"edge workers not idle in {timeout} s: {self.edge_workers()}\n{self.logs()}")

    def processes_left(self) -> list[str]:
        """Processes still running from this deployment: each was started in a session of its own, and the
        processes it starts (an edge worker's task supervisors and task processes: new process groups, same
        session) stay in it."""
        import psutil

        sessions = {proc.pid for proc in self.procs}
        left = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if os.getsid(proc.pid) in sessions and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])}")
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return left

    def __exit__(self, *exc) -> None:
        # Workers first, as Ctrl-C stops them: SIGINT drains (running tasks finish), then each signs off.
        for proc in self.worker_procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in self.worker_procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        stop_processes(list(self.worker_procs.values()))  # SIGTERM, then SIGKILL, what did not stop
        try:
            self.final_workers = self.edge_workers()
        except Exception:  # the metadata DB never came up
            self.final_workers = []
        super().__exit__(*exc)


__all__ = ["EDGE_EXECUTOR", "EdgeAirflow", "NO_DATABASE"]
