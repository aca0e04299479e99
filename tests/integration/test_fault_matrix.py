"""Faults from outside a case, produced for real: each ends classified (or cleaned), with no container left.

Engine lost mid-case is in test_case_failures.py (a proxy in front of the engine is cut). Faults that stop,
restart or starve a service do it to a private instance of it (tests/private_services.py), never to the
registry, PostgreSQL or Docker engine that other tests share.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
from docker.errors import NotFound
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from test_images import push_as, remove_images

from fault_runs import AIRFLOW, KILL_DAG_ID, kill_dag_env, measured_outcomes, night, private_airflow_env, write_kill_dag
from fleetbench.cleanup import TIMEOUT_LABEL, clean_engine
from fleetbench.images import prepare_image
from private_services import PrivateDockerd, PrivatePostgres, PrivateRegistry, ThrottledRelay

pytestmark = pytest.mark.integration

BASE = "fleetbench/base:bookworm"

WORKER = """
import sys
from fleetbench.airflow.operators import BenchmarkCaseOperator

name, token, log_dir = sys.argv[1:4]
BenchmarkCaseOperator(
    task_id="run_case", image="%s", command=["sh", "-c", "echo case started; sleep 300"], container_name=name,
    labels={"org.fleetbench.managed": "true", "org.fleetbench.run_id": "sigkill-" + token,
            "org.fleetbench.test": token, "%s": "3"},
    case={"host": "localhost", "case_key": "sigkill." + token}, log_dir=log_dir, timeout_s=3,
).execute({})
""" % (BASE, TIMEOUT_LABEL)


def test_worker_sigkilled_mid_case_leaves_an_orphan_that_maintenance_reaps(docker_api, tmp_path):
    """The worker process running a case is SIGKILLed (no on_kill, no finally): its container keeps running,
    holding what it holds. Maintenance finds it past its own timeout label and stops and removes it."""
    token = uuid.uuid4().hex[:10]
    name = f"fbtest-{token}-sigkill"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, name, token, str(tmp_path)], env=os.environ.copy(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not docker_api.containers(filters={"name": name, "status": "running"}):
            assert worker.poll() is None, "the worker ended before its case started"
            time.sleep(0.2)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        scope = {"org.fleetbench.test": token}
        orphan = docker_api.containers(filters={"label": "org.fleetbench.test=" + token})
        assert [c["State"] for c in orphan] == ["running"]  # nobody stopped it

        early = clean_engine(docker_api, scope=scope, orphan_grace_s=60)
        assert early.removed_containers == [] and "container is running" in early.kept[0]["reason"]
        time.sleep(4)  # past its timeout of 3 s (grace 0 below)
        report = clean_engine(docker_api, scope=scope, orphan_grace_s=0)
        assert [c["name"] for c in report.removed_containers] == [name], report
        assert "past its timeout of 3 s" in report.removed_containers[0]["reason"] and report.errors == []
        assert docker_api.containers(all=True, filters={"label": "org.fleetbench.test=" + token}) == []
    finally:
        if worker.poll() is None:
            worker.kill()
        for c in docker_api.containers(all=True, filters={"label": "org.fleetbench.test=" + token}):
            docker_api.remove_container(c["Id"], force=True)


# -- 1. the registry stops mid-pull -------------------------------------------------------------
RANDOM_MB = 64
LINK_BYTES_PER_S = 16e6  # ~4 s for the random layer: time for the registry to die in the middle of it


def image_with_random_layer(api, uid: str, megabytes: int = RANDOM_MB) -> str:
    """`fleetbench/base:bookworm` plus a layer of `megabytes` MB from /dev/urandom (incompressible), labelled
    test.uid=<uid>: a unique image whose pull takes real time. Returns its id."""
    container = api.create_container(BASE, ["sh", "-c", f"head -c {megabytes}M /dev/urandom > /fault-blob"],
                                     host_config=api.create_host_config(network_mode="none"))
    try:
        api.start(container["Id"])
        assert api.wait(container["Id"], timeout=120)["StatusCode"] == 0
        return api.commit(container["Id"], changes=[f"LABEL test.uid={uid}"])["Id"]
    finally:
        api.remove_container(container["Id"], force=True)


def test_registry_killed_mid_pull_is_registry_unreachable_and_pins_nothing(docker_api, tmp_path, caplog):
    """A private docker-registry holds a unique image with a 64 MB random layer, reached over a slow link.
    The registry process is SIGKILLed (and its address goes dark) once ~8 MB of the layer have passed:
    `prepare_image` returns, bounded, with `registry_unreachable` after its retries; nothing is pinned and
    no image (whole or half) is on the engine."""
    caplog.set_level(logging.INFO, logger="fleetbench.images")
    uid = f"mid-pull-{uuid.uuid4().hex[:8]}"
    image_id = image_with_random_layer(docker_api, uid)
    relay = None
    with PrivateRegistry(tmp_path / "registry") as registry:
        try:
            push_as(docker_api, image_id, f"{registry.address}/fleetbench/fault-pull", uid)
            remove_images(docker_api, image_id)  # the pull has to fetch the random layer again
            relay = ThrottledRelay(registry.port, LINK_BYTES_PER_S)
            ref = f"127.0.0.1:{relay.port}/fleetbench/fault-pull:{uid}"
            killed_at: list[int] = []

            def kill_mid_layer():
                if relay.wait_forwarded(8_000_000, timeout_s=120):
                    registry.kill()
                    relay.close()
                    killed_at.append(relay.forwarded)

            killer = threading.Thread(target=kill_mid_layer, daemon=True)
            killer.start()
            started = time.monotonic()
            result = prepare_image(docker_api, "fault", ref, "always", attempts=3, backoff_s=0.5)
            elapsed = time.monotonic() - started
            killer.join(5)

            assert killed_at and killed_at[0] < RANDOM_MB * 1_000_000 * 0.9, f"not killed mid-layer: {killed_at}"
            assert (result.failure_class, result.pull_attempts) == ("registry_unreachable", 3), result
            assert "connection refused" in result.error
            # Bounded: the engine retries a broken layer itself (5 tries, 5 s more delay each time) before the
            # pull fails; then prepare_image's own attempts fail fast on the dead address.
            assert elapsed < 180, elapsed
            assert (result.pinned_ref, result.digest, result.image_id, result.pulled) == (None, None, None, False)
            with pytest.raises(NotFound):
                docker_api.inspect_image(ref)
            assert docker_api.images(all=True, filters={"label": f"test.uid={uid}"}) == []
            log_lines = [r.getMessage() for r in caplog.records]
            assert sum("retrying in" in m for m in log_lines) == 2  # prepare_image's own retries
            engine_retries = [m for m in log_lines if ": Retrying in " in m]
            assert 1 <= len(engine_retries) <= 5, engine_retries  # one line per engine retry, not its countdown
        finally:
            if relay is not None:
                relay.close()
            remove_images(docker_api, image_id)
            for found in docker_api.images(all=True, filters={"label": f"test.uid={uid}"}):
                remove_images(docker_api, found["Id"])


# -- 2. PostgreSQL restarts while the night is being stored --------------------------------------
def counts_per_key(conn, run_id: str) -> dict[str, tuple[int, int]]:
    """(rows, most rows of one key) of the run in every table the store writes."""
    from fleetbench.warehouse.schema import HOST_KEY, RESULT_KEY, RUN_KEY, STEP_KEY

    keys = {"runs": RUN_KEY, "host_facts": HOST_KEY, "benchmark_results": RESULT_KEY, "steps": STEP_KEY,
            "run_host_rollup": ("dag_id", "run_id", "host", "model", "gpu", "driver_version"),
            "run_case_rollup": ("dag_id", "run_id", "case_key", "gpu")}
    found = {}
    for table, key in keys.items():
        cols = ", ".join(key)
        sql = f"SELECT COUNT(*) FROM {table} WHERE run_id = :r GROUP BY {cols}"
        rows = conn.execute(text(sql), {"r": run_id}).scalars().all()
        found[table] = (sum(rows), max(rows, default=0))
    return found


def test_postgres_restarted_during_store_keeps_nothing_and_the_retry_stores_the_night_once(tmp_path, monkeypatch):
    """The store task writes a night to a private PostgreSQL cluster; another session holds the rollup tables,
    so the store's transaction stops there with the run, host, results and steps written but not committed.
    The server restarts (fast shutdown). The store raises; nothing of the night is stored. Called again, as
    Airflow's task retry would, it stores the night exactly once; a third call (a rerun) still leaves one
    row per key."""
    from fleetbench.airflow.pipeline import collect, store
    from fleetbench.warehouse import get_engine, upgrade

    run_id = f"pg-restart-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "data"))
    plan, validations, prepared = night(tmp_path, run_id, models=("trivial", "lenet"), batch_sizes=(8, 16))
    collected = collect(plan, validations, prepared, measured_outcomes(plan))
    cases, steps = len(collected["rows"]), len(collected["steps"])
    assert cases == 4 and steps > cases and all(r["status"] == "ok" for r in collected["rows"])

    with PrivatePostgres() as pg:
        monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", pg.url)
        engine = get_engine(pg.url)
        try:
            upgrade(engine)  # an earlier night migrated the warehouse
            blocker = engine.connect()
            blocker.begin()
            blocker.execute(text("LOCK TABLE run_host_rollup, host_month_rollup, run_case_rollup "
                                 "IN ACCESS EXCLUSIVE MODE"))
            blocker_pid = blocker.execute(text("SELECT pg_backend_pid()")).scalar()
            first: dict = {}

            def first_try():
                try:
                    first["stored"] = store(plan, collected)
                except BaseException as exc:  # expected: the server went away under it
                    first["error"] = exc

            writer = threading.Thread(target=first_try, daemon=True)
            writer.start()
            with engine.connect() as probe:
                deadline, holding = time.monotonic() + 60, set()
                while time.monotonic() < deadline and not {"benchmark_results", "steps"} <= holding:
                    pid = probe.execute(text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> :b"), {"b": blocker_pid}).scalar()
                    if pid:
                        holding = set(probe.execute(text(
                            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                            "WHERE l.pid = :p AND l.granted AND l.mode = 'RowExclusiveLock'"), {"p": pid}).scalars())
                    probe.commit()
                    time.sleep(0.1)
            assert {"runs", "host_facts", "benchmark_results", "steps"} <= holding, (holding, first)

            pg.restart("fast")
            writer.join(60)
            assert not writer.is_alive(), "the store did not return after the server restarted"
            try:
                blocker.close()
            except DBAPIError:
                pass
            assert "stored" not in first and isinstance(first.get("error"), DBAPIError), first
            assert "terminating connection" in str(first["error"]) or "server closed" in str(first["error"]), first
            engine.dispose()
            with engine.connect() as conn:
                assert all(n == 0 for n, _ in counts_per_key(conn, run_id).values()), counts_per_key(conn, run_id)

            for attempt in ("retry", "rerun"):
                stored = store(plan, collected)
                assert (stored["run_id"], stored["total"], stored["ok"]) == (run_id, cases, cases), (attempt, stored)
                with engine.connect() as conn:
                    found = counts_per_key(conn, run_id)
                    rollup_results = conn.execute(text("SELECT SUM(results) FROM run_host_rollup WHERE run_id = :r"),
                                                  {"r": run_id}).scalar()
                assert found["runs"] == (1, 1) and found["host_facts"] == (1, 1), (attempt, found)
                assert found["benchmark_results"] == (cases, 1) and found["steps"] == (steps, 1), (attempt, found)
                assert found["run_host_rollup"][1] == 1 and found["run_case_rollup"][1] == 1, (attempt, found)
                assert rollup_results == cases, (attempt, rollup_results)
        finally:
            engine.dispose()


# -- 3. the engine's disk fills up during a pull ------------------------------------------------
def test_disk_full_during_a_pull_is_insufficient_disk(docker_api, smoke_image):
    """A second dockerd whose data root is a 150 MB tmpfs pulls the smoke image (more than that unpacked)
    from the shared registry: the engine fails with "no space left on device", `prepare_image` names it
    `insufficient_disk` at once (no retries), pins nothing, and the engine keeps no image and, a moment
    later, none of the bytes it wrote. With
    min_free_gb=0.1 the check before the pull passes (the disk has more free than that) and the pull
    fails the same way: the check is a floor, the full disk is caught either way."""
    size = docker_api.inspect_image(smoke_image)["Size"]
    with PrivateDockerd(size_mb=150) as engine:
        free = shutil.disk_usage(engine.data_root).free
        assert size > free, (size, free)
        for min_free_gb in (None, 0.1):
            started = time.monotonic()
            result = prepare_image(engine.api, "smoke", smoke_image, "always", attempts=3, backoff_s=1,
                                   min_free_gb=min_free_gb)
            assert (result.failure_class, result.pull_attempts) == ("insufficient_disk", 1), result
            assert "no space left on device" in result.error and "refused before" not in result.error
            assert time.monotonic() - started < 60
            assert result.pinned_ref is None and result.image_id is None and not result.pulled
            assert result.free_bytes is not None and result.free_bytes < 0.2e9  # measured on the tmpfs
            assert engine.api.images(all=True) == []
            # The engine drops what the failed pull wrote (the blob, the half-unpacked layer) a moment after it
            # reports the error: the disk is as free as before.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and shutil.disk_usage(engine.data_root).free < free - 5_000_000:
                time.sleep(0.2)
            assert shutil.disk_usage(engine.data_root).free >= free - 5_000_000, "the failed pull kept its bytes"
        with pytest.raises(NotFound):
            engine.api.inspect_image(smoke_image)
        pid = engine.proc.pid
    assert not engine.still_mounted()
    assert engine.proc.poll() is not None, f"dockerd {pid} still runs"


# -- 4. a case task killed through Airflow's task runner -----------------------------------------
@pytest.fixture(scope="module")
def task_runner_airflow(tmp_path_factory) -> dict:
    """An `airflow` CLI environment (own home, SQLite, migrated once) whose DAG folder holds only the case-kill DAG."""
    root = tmp_path_factory.mktemp("task-runner")
    write_kill_dag(root / "dags")
    return private_airflow_env(root / "airflow", root / "dags")


@pytest.fixture()
def killed_case(tmp_path, data_dir, docker_api):
    """A one-case night whose case runs in the kill DAG (case_key and log folder as fleet_benchmark's), and
    a check that no container of it is left."""
    from fleetbench.runs import case_log_dir

    token = uuid.uuid4().hex[:10]
    run_id = f"kill-{token}"
    plan, validations, prepared = night(tmp_path, run_id)
    case_key = plan["cases"][0]["case_key"]
    log_dir = case_log_dir("fleet_benchmark", run_id, "localhost")
    case = {"token": token, "plan": plan, "validations": validations, "prepared": prepared, "case_key": case_key,
            "log_dir": log_dir, "env": kill_dag_env(token, BASE, case_key, log_dir)}
    yield case
    left = docker_api.containers(all=True, filters={"label": f"org.fleetbench.test={token}"})
    for c in left:
        docker_api.remove_container(c["Id"], force=True)
    assert left == [], f"containers left behind: {[(c['Names'], c['Status']) for c in left]}"


def wait_running(docker_api, token: str, proc: subprocess.Popen | None = None, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = docker_api.containers(filters={"label": f"org.fleetbench.test={token}", "status": "running"})
        if running:
            return running[0]
        assert proc is None or proc.poll() is None, "the task ended before its case started"
        time.sleep(0.3)
    raise AssertionError(f"the case container did not start in {timeout_s} s")


def pushed_outcome(engine, token: str) -> dict | None:
    """The kill DAG's run_case return value of the case with this token (its container name), as the metadata
    database holds it; None when nothing was pushed. (The module's tests share one metadata database.)"""
    from sqlalchemy import text

    with engine.connect() as conn:
        values = conn.execute(text("SELECT value FROM xcom WHERE dag_id = :d AND task_id = 'run_case' "
                                   "AND key = 'return_value'"), {"d": KILL_DAG_ID}).scalars().all()
    outcomes = []
    for value in values:
        while isinstance(value, (str, bytes)):  # JSON text (SQLite), possibly encoded twice
            value = json.loads(value)
        if token in str(value.get("container_name")):
            outcomes.append(value)
    assert len(outcomes) <= 1, outcomes
    return outcomes[0] if outcomes else None


def assert_killed_and_collected(case: dict, docker_api, kinds=("killed",), engine=None) -> dict:
    """The outcome file says the case was killed, no container is left, and collect makes it a failed row. With
    the run's metadata database (`engine`): the killed task pushed that outcome as its return value too, and
    collect makes the same row from it with the outcome file gone (`store` on a machine that does not share the
    folder; before, it recorded `task_failed`)."""
    from fleetbench.airflow.pipeline import collect
    from fleetbench.runs import log_path, outcome_path

    path = outcome_path(case["log_dir"], case["case_key"])
    left = [(c["Names"], c["Status"]) for c in
            docker_api.containers(all=True, filters={"label": f"org.fleetbench.test={case['token']}"})]
    assert path.exists() and not left, f"outcome file {path}: {'written' if path.exists() else 'missing'}; left: {left}"
    outcome = json.loads(path.read_text())
    assert outcome["killed_by_airflow"] or outcome["timed_out"], outcome
    [row] = collect(case["plan"], case["validations"], case["prepared"], [])["rows"]  # the task returned nothing
    assert (row["case_key"], row["status"]) == (case["case_key"], "failed")
    assert row["failure_class"] in kinds, row
    assert "case started" in log_path(case["log_dir"], case["case_key"]).read_text()  # what it printed until then
    if engine is not None:
        pushed = pushed_outcome(engine, case["token"])
        assert pushed is not None and pushed["killed_by_airflow"] and pushed["case_key"] == case["case_key"], pushed
        path.rename(path.with_suffix(".elsewhere"))
        [alone] = collect(case["plan"], case["validations"], case["prepared"], [pushed])["rows"]
        assert {k: alone[k] for k in ("status", "failure_class", "failure_detail")} == {
            k: row[k] for k in ("status", "failure_class", "failure_detail")}, alone
    return row


def metadata_db(env: dict):
    """The `airflow` CLI environment's SQLite metadata database."""
    from sqlalchemy import create_engine

    return create_engine(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


@pytest.mark.dagrun
def test_execution_timeout_of_the_task_runner_kills_the_case(task_runner_airflow, killed_case, docker_api):
    """The case sleeps; its run_case task has an execution_timeout of 4 s (its own timeout_s is 600). Airflow's
    task runner raises AirflowTaskTimeout into execute and calls on_kill: the task fails, the container is
    stopped and removed, and the outcome file it leaves makes collect record the case as killed."""
    env = {**task_runner_airflow, **killed_case["env"], "FB_FAULT_EXECUTION_TIMEOUT_S": "4"}
    started = time.monotonic()
    proc = subprocess.run([AIRFLOW, "dags", "test", KILL_DAG_ID], env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert "AirflowTaskTimeout" in out and "DagRun failed" in out, out[-4000:]
    assert time.monotonic() - started < 240
    row = assert_killed_and_collected(killed_case, docker_api, kinds=("killed", "timeout"),
                                      engine=metadata_db(task_runner_airflow))
    assert "execution_timeout of 0:00:04 passed" in row["failure_detail"], row


@pytest.mark.dagrun
def test_sigterm_to_the_task_runner_kills_the_case(task_runner_airflow, killed_case, docker_api, tmp_path):
    """SIGTERM reaches the process running the task (`airflow dags test`, Airflow's in-process task runner)
    while the case sleeps: the runner's SIGTERM handler calls on_kill, which stops and removes the container
    and writes the outcome file; collect records the case as killed."""
    env = {**task_runner_airflow, **killed_case["env"]}
    with open(tmp_path / "dags-test.log", "w") as log:
        proc = subprocess.Popen([AIRFLOW, "dags", "test", KILL_DAG_ID], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_running(docker_api, killed_case["token"], proc)
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    row = assert_killed_and_collected(killed_case, docker_api, engine=metadata_db(task_runner_airflow))
    assert "stopped answering" not in (row["failure_detail"] or ""), row  # a kill, not a lost engine


def _rest(port: int, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"{}")


@pytest.mark.scheduler
def test_task_marked_failed_in_a_deployment_kills_the_case(tmp_path, pg_url, killed_case, docker_api):
    """A real deployment (api-server, scheduler, LocalExecutor: each task under Airflow's supervisor in its own
    process). While the case sleeps, its task instance is marked failed through the REST API, as from the UI.
    The supervisor's next heartbeat learns it, sends SIGTERM to the task process (on_kill runs) and SIGKILL
    5 s later. The container must be gone and the outcome file must say killed."""
    from airflow_cluster import LocalAirflow

    write_kill_dag(tmp_path / "dags")
    password = secrets.token_urlsafe(16)
    (tmp_path / "passwords.json").write_text(json.dumps({"fleetbench": password}))
    env = {**killed_case["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "fleetbench:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp_path / "passwords.json")}
    with LocalAirflow(tmp_path / "airflow", pg_url, env=env) as airflow:
        airflow.wait_for_dag(KILL_DAG_ID)
        login = {"username": "fleetbench", "password": password}
        token = _rest(airflow.port, "POST", "/auth/token", login)["access_token"]
        airflow.trigger(KILL_DAG_ID, run_id="kill")
        wait_running(docker_api, killed_case["token"])
        time.sleep(1)
        _rest(airflow.port, "PATCH", f"/api/v2/dags/{KILL_DAG_ID}/dagRuns/kill/taskInstances/run_case",
              {"new_state": "failed"}, token)
        label = {"label": f"org.fleetbench.test={killed_case['token']}"}
        deadline = time.monotonic() + 60  # a heartbeat, then SIGTERM, then at most 5 s to SIGKILL
        while time.monotonic() < deadline and docker_api.containers(filters=label):
            time.sleep(0.5)
        deadline = time.monotonic() + 20  # stopped: removed and recorded within moments
        while time.monotonic() < deadline and docker_api.containers(all=True, filters=label):
            time.sleep(0.5)
        try:
            metadata = airflow.metadata()
            try:
                assert_killed_and_collected(killed_case, docker_api, engine=metadata)
            finally:
                metadata.dispose()
        finally:  # what the kill left, removed here so the fixture's check reports this test's failure only once
            for c in docker_api.containers(all=True, filters=label):
                docker_api.remove_container(c["Id"], force=True)
