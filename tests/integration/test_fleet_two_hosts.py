"""A fleet of two hosts, one local and one over SSH (the test sshd on this same machine), with one made unfit.

The unfit host's cases become `skipped` rows carrying the reason; the other host's cases run for
real; both hosts' facts and verdicts land in `host_facts`.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
from sqlalchemy import text

from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config
from ssh_hosts import define_ssh_connection, sshd  # noqa: F401 - sshd is a fixture

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def results_and_host_facts(run_id: str) -> tuple[dict, dict]:
    from fleetbench.warehouse import fetch_results, get_engine

    engine = get_engine()
    rows = {r["host"]: r for r in fetch_results(engine, run_id=run_id)}
    with engine.connect() as conn:
        facts = {r.host: r for r in conn.execute(text("select * from host_facts where run_id = :r"), {"r": run_id})}
    engine.dispose()
    return rows, facts


def test_unreachable_ssh_host_is_skipped_and_the_local_host_runs(airflow_db, data_dir, smoke_image, docker_api,
                                                                 sshd, tmp_path, monkeypatch):  # noqa: F811
    conn_id = define_ssh_connection(monkeypatch, "fleet_ssh_down", port=closed_port())
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), hosts=[
        {"name": "localhost", "connection": "local"},
        {"name": "sshhost", "connection": conn_id, "docker_url": "unix:///var/run/docker.sock"}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"

    rows, facts = results_and_host_facts(dag_run.run_id)
    assert (rows["localhost"]["status"], rows["localhost"]["failure_class"]) == ("ok", None)
    assert rows["localhost"]["images_per_sec"] > 0
    skipped = rows["sshhost"]
    assert (skipped["status"], skipped["failure_class"]) == ("skipped", "host_unfit")
    assert "reachable: unreachable: 127.0.0.1:" in skipped["failure_detail"]
    assert "connection refused" in skipped["failure_detail"]

    assert (facts["localhost"].verdict, facts["localhost"].kernel) == ("ready", os.uname().release)
    assert facts["sshhost"].verdict == "unfit" and facts["sshhost"].kernel is None
    assert json.loads(facts["sshhost"].checks_json) == [
        {"name": "reachable", "status": "fail", "detail": json.loads(facts["sshhost"].facts_json)["unreachable"]}]
    assert containers_of(docker_api, dag_run.run_id) == []


def test_ssh_host_runs_its_cases_while_the_unfit_local_host_is_skipped(airflow_db, data_dir, smoke_image, docker_api,
                                                                      sshd, tmp_path, monkeypatch):  # noqa: F811
    conn_id = define_ssh_connection(monkeypatch, "fleet_ssh")
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8, 16), hosts=[
        {"name": "localhost", "connection": "local", "docker_url": "unix:///nonexistent/docker.sock"},
        {"name": "sshhost", "connection": conn_id, "docker_url": "unix:///var/run/docker.sock"}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"

    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(), run_id=dag_run.run_id)
    by_host = {h: sorted((r["batch_size_per_device"], r["status"], r["failure_class"]) for r in rows if r["host"] == h)
               for h in ("localhost", "sshhost")}
    assert by_host == {"localhost": [(8, "skipped", "host_unfit"), (16, "skipped", "host_unfit")],
                       "sshhost": [(8, "ok", None), (16, "ok", None)]}
    assert all("Docker engine not reachable" in r["failure_detail"] for r in rows if r["host"] == "localhost")

    _, facts = results_and_host_facts(dag_run.run_id)
    ssh_facts = facts["sshhost"]
    assert (ssh_facts.verdict, ssh_facts.kernel) == ("ready", os.uname().release)
    assert ssh_facts.docker_version == docker_api.version()["Version"]
    assert ssh_facts.gpu_count == 0 and ssh_facts.nvidia_runtime is not None and not ssh_facts.nvidia_runtime
    checks = {c["name"]: c for c in json.loads(ssh_facts.checks_json)}
    assert checks["reachable"] == {"name": "reachable", "status": "pass", "detail": "probes ran (ssh:fleet_ssh)"}
    # the sshd is on this machine, so its docker_url (this machine's socket) is the host's own engine
    assert checks["engine"] == {"name": "engine", "status": "pass",
                                "detail": "docker_url is the host's own Docker engine"}
    assert facts["localhost"].verdict == "unfit"

    # the probe outputs were kept, one file per command, in the run's artifact folder
    from fleetbench.runs import run_dir

    folder = run_dir("fleet_benchmark", dag_run.run_id) / "hosts" / "sshhost" / "facts"
    assert json.loads((folder / "probes.json").read_text())["runner"] == "ssh:fleet_ssh"
    assert (folder / "uname-r.txt").read_text().strip() == os.uname().release
    assert containers_of(docker_api, dag_run.run_id) == []


@pytest.fixture()
def another_engine():
    """A Docker engine API on 127.0.0.1 that is not this machine's engine: it answers `version` and `info` (the
    ID of another engine) and nothing else (a pull or a container there would fail the test)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked = []

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = ({"ApiVersion": "1.41", "Version": "24.0.0"} if self.path.endswith("/version")
                    else {"ID": "another-engine-0000", "ServerVersion": "24.0.0"} if self.path.endswith("/info")
                    else None)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body or {"message": "not here"}).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()


def test_an_ssh_host_whose_docker_url_is_another_engine_is_unfit(
        airflow_db, data_dir, smoke_image, docker_api, sshd, another_engine, tmp_path, monkeypatch):  # noqa: F811
    """The probes run on the host over SSH; images and cases go to its docker_url. When that is another machine's
    engine (e.g. the default unix:// socket, the Airflow worker's own), its cases would run there under the host's
    name: the host check compares the two engines' IDs and makes the host unfit instead."""
    url, asked = another_engine
    conn_id = define_ssh_connection(monkeypatch, "fleet_ssh_other")
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), hosts=[
        {"name": "sshhost", "connection": conn_id, "docker_url": url}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "failed"  # every host unfit

    rows, facts = results_and_host_facts(dag_run.run_id)
    row = rows["sshhost"]
    assert (row["status"], row["failure_class"]) == ("skipped", "host_unfit")
    own = docker_api.info()["ID"]
    assert f"engine: docker_url reaches Docker engine another-engine-0000, not the host's own ({own[:40]}" in (
        row["failure_detail"])
    checks = {c["name"]: c for c in json.loads(facts["sshhost"].checks_json)}
    assert checks["engine"]["status"] == "fail"
    assert [p for p in asked if not p.endswith(("/version", "/info"))] == []  # nothing was pulled or run there


def test_one_host_check_that_dies_does_not_take_the_other_hosts_with_it(airflow_db, data_dir, smoke_image, docker_api,
                                                                        tmp_path, monkeypatch):
    """A host check that dies (a crash in its lane's `cases` task) costs that host's cases only: the other hosts
    are prepared and run; the run fails, naming the task; every case has its row."""
    from fleetbench.airflow import pipeline

    checked = pipeline.validate_host

    def validate(host, run, **kwargs):
        if host["name"] == "wedged":
            raise RuntimeError("the host check of wedged crashed")
        return checked(host, run, **kwargs)

    monkeypatch.setattr(pipeline, "validate_host", validate)
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), hosts=[
        {"name": "localhost", "connection": "local"}, {"name": "wedged", "connection": "local"}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "failed"
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert states[("host_localhost.run_case", 0)] == "success"
    assert states[("store", -1)] == "success"
    rows, _ = results_and_host_facts(dag_run.run_id)
    assert (rows["localhost"]["status"], rows["localhost"]["failure_class"]) == ("ok", None)
    assert (rows["wedged"]["status"], rows["wedged"]["failure_class"]) == ("failed", "host_check_failed")
    assert containers_of(docker_api, dag_run.run_id) == []
