"""Fleet scale: the two topologies of README "Deploying at fleet scale", and the distributed setup itself.

(a) central workers drive a remote Docker engine over TLS: here the local engine behind a mutual-TLS
    proxy (`celery_cluster.DockerTLSProxy`), the client certificate from an Airflow Connection; the
    host's facts (uname, nvidia-smi, df, docker info) are probed on the host itself over its SSH
    connection (the test sshd on this same machine, whose docker CLI reaches the engine the proxy fronts);
(b) a Celery worker on the GPU host listens on the host's own queue and uses its local socket.

The last test is the docker-compose deployment without containers: PostgreSQL, Redis, api-server,
scheduler, dag-processor and two Celery workers on different queues, as local processes; the run
is triggered and watched through the REST API.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_cluster import CeleryAirflow, DockerTLSProxy, RedisServer, make_tls_material, tls_connection_json
from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config
from ssh_hosts import define_ssh_connection, ssh_connection, sshd  # noqa: F401 - sshd is a fixture

DAGS = Path(__file__).resolve().parents[2] / "dags"
TLS_CONN = "fb_docker_tls"
SSH_CONN = "fb_central_tls_ssh"  # topology (a): the TLS host's own SSH connection, for its probes
OWN_QUEUE = "fleet-gpu-b"
LANE_ON_HOST = {"cases", "run_case"}  # what a topology (b) host's own worker runs: its lane (validate, pull, cases)


def two_topologies(image: str, tls_url: str, **kwargs) -> dict:
    return smoke_config(image, hosts=[
        {"name": "central-tls", "connection": SSH_CONN, "docker_url": tls_url, "docker_tls_conn_id": TLS_CONN},
        {"name": "gpu-b", "connection": "local", "queue": OWN_QUEUE},
    ], **kwargs)


@pytest.fixture()
def certs(tmp_path):
    return make_tls_material(tmp_path / "tls")


@pytest.fixture()
def tls_engine(certs, docker_api):
    with DockerTLSProxy(certs) as proxy:
        yield proxy


# -- config and DAG shape (no services) -------------------------------------------------------
def test_topology_fields_are_checked_with_the_field_path():
    from fleetbench.config import ConfigError, parse_config

    base = {"images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
            "benchmarks": [{"name": "b", "image": "i", "models": ["m"], "batch_sizes": [1]}]}
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "hosts": [{"name": "h", "docker_tls_conn_id": "certs"}]})
    assert "hosts[0]: docker_tls_conn_id needs a tcp:// docker_url" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "hosts": [{"name": "h", "queue": "gpu b; rm"}]})
    assert "hosts[0].queue: must match" in str(info.value)
    # a remote engine with connection local (explicit or the default) would mix this worker's facts with its own
    for local in ({"connection": "local"}, {}):
        with pytest.raises(ConfigError) as info:
            parse_config({**base, "hosts": [{"name": "h", **local, "docker_url": "tcp://gpu-7:2376",
                                             "docker_tls_conn_id": "c"}]})
        assert "hosts[0].docker_url: connection local probes this worker" in str(info.value)
    host = parse_config({**base, "hosts": [{"name": "h", "connection": "gpu7_ssh", "docker_url": "tcp://gpu-7:2376",
                                             "docker_tls_conn_id": "c", "queue": "gpu-7"}]}).hosts[0]
    assert (host.connection, host.queue, host.docker_tls_conn_id) == ("gpu7_ssh", "gpu-7", "c")


def test_own_queue_hosts_are_validated_prepared_and_run_on_their_queue(tmp_path, monkeypatch):
    cfg = two_topologies("127.0.0.1:5000/fleetbench/cpu-smoke:latest", "tcp://127.0.0.1:2376")
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    queues = {t.task_id: t.queue for t in bag.dags["fleet_benchmark"].tasks}
    assert {tid: q for tid, q in queues.items() if q != "default"} == {
        f"host_gpu-b.{step}": OWN_QUEUE for step in LANE_ON_HOST}
    # topology (a): the same lane, validated, prepared and run by central workers
    assert queues["host_central-tls.cases"] == queues["host_central-tls.run_case"] == "default"
    # every lane has the same shape: cases -> run_case, one edge from the plan (a 1,000-host DAG parses fast)
    dag = bag.dags["fleet_benchmark"]
    assert {t for t in queues if t.startswith("host_gpu-b.")} == {f"host_gpu-b.{s}" for s in LANE_ON_HOST}
    assert dag.get_task("host_gpu-b.cases").upstream_task_ids == {"plan"}
    assert dag.get_task("host_central-tls.cases").upstream_task_ids == {"plan"}


# -- topology (a): TLS -----------------------------------------------------------------------
@pytest.mark.integration
def test_tls_engine_is_reached_only_with_the_connection_certificates(certs, tls_engine, smoke_image, docker_api,
                                                                      data_dir, sshd, monkeypatch, caplog):  # noqa: F811
    from fleetbench.airflow import pipeline
    from fleetbench.config import ImageSpec

    define_ssh_connection(monkeypatch, SSH_CONN)
    monkeypatch.setenv("AIRFLOW_CONN_FB_DOCKER_TLS", tls_connection_json(certs))  # PEM text in the extra
    monkeypatch.setenv("AIRFLOW_CONN_FB_DOCKER_TLS_FILES", tls_connection_json(certs, inline=False))  # file paths
    monkeypatch.setenv("AIRFLOW_CONN_FB_DOCKER_TLS_ROGUE", tls_connection_json(certs, client="rogue"))
    monkeypatch.setenv("AIRFLOW_CONN_FB_DOCKER_TLS_HALF", json.dumps({"conn_type": "docker", "extra": {
        "ca_cert": certs["ca_cert"].read_text()}}))
    run = {"dag_id": "tls", "run_id": f"tls-{uuid.uuid4().hex[:8]}"}
    image = ImageSpec(name="smoke", ref=smoke_image, command=["true"]).model_dump(mode="json")

    def host(conn_id):
        return {"name": "remote", "connection": SSH_CONN, "docker_url": tls_engine.url, "docker_tls_conn_id": conn_id,
                "needs": {"gpus": 0, "image_cuda": None}, "images": [image]}

    # Validation probes the host itself over SSH, its docker CLI included; the TLS engine is asked only for its ID,
    # with the connection's certificates, to check it is the host's own engine (check `engine`). An incomplete TLS
    # connection does not change the verdict (the engine is not asked; the image step names the problem).
    verdict = pipeline.validate_host(host(TLS_CONN), run)
    assert verdict["verdict"] == "ready", verdict
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["reachable"]["detail"] == f"probes ran (ssh:{SSH_CONN})"
    assert checks["engine"] == {"name": "engine", "status": "pass",
                                "detail": "docker_url is the host's own Docker engine"}
    assert verdict["facts"]["docker_version"] == docker_api.version()["Version"]
    assert tls_engine.clients == ["fleetbench-central-worker"]
    half_verdict = pipeline.validate_host(host("fb_docker_tls_half"), run)
    assert half_verdict["verdict"] == "ready" and "engine" not in {c["name"] for c in half_verdict["checks"]}
    assert tls_engine.clients == ["fleetbench-central-worker"]

    # Pull and pin go through the TLS engine, with the connection's certificates (PEM text or file paths).
    prepared = {}
    for conn_id in (TLS_CONN, "fb_docker_tls_files"):
        lane_images = pipeline.prepare_host_images(host(conn_id), [verdict])
        assert lane_images["api_version"] == docker_api.api_version  # what the lane's cases then speak
        prepared[conn_id] = lane_images["images"]["smoke"]
        assert prepared[conn_id]["failure_class"] is None, prepared[conn_id]
        assert prepared[conn_id]["pinned_ref"].startswith(smoke_image.rsplit(":", 1)[0] + "@sha256:")
    assert set(tls_engine.clients) == {"fleetbench-central-worker"}

    # Without certificates (plain HTTP to a TLS port) or with a certificate of another CA, the engine lets
    # nothing in: the image fails as docker_unreachable, the host stays ready.
    let_in = len(tls_engine.clients)
    for conn_id in (None, "fb_docker_tls_rogue"):
        prepared[conn_id] = pipeline.prepare_host_images(host(conn_id), [verdict])["images"]["smoke"]
        assert prepared[conn_id]["failure_class"] == "docker_unreachable", prepared[conn_id]
        assert "Docker engine not reachable" in prepared[conn_id]["error"], prepared[conn_id]
    assert len(tls_engine.clients) == let_in
    half = pipeline.prepare_host_images(host("fb_docker_tls_half"), [verdict])["images"]["smoke"]
    assert half["failure_class"] == "docker_unreachable" and "fb_docker_tls_half" in half["error"]
    assert "lacks client_cert, client_key" in half["error"]
    key = certs["client_key"].read_text().splitlines()[1]
    assert key not in caplog.text and key not in json.dumps([verdict, prepared, half])


@pytest.mark.integration
@pytest.mark.dagrun
def test_both_topologies_with_dag_test(airflow_db, data_dir, certs, tls_engine, smoke_image, docker_api,
                                       sshd, tmp_path, monkeypatch):  # noqa: F811
    """The whole DAG in one process (queues are not honoured by dag.test): a TLS engine and an own-queue host."""
    define_ssh_connection(monkeypatch, SSH_CONN)
    monkeypatch.setenv("AIRFLOW_CONN_FB_DOCKER_TLS", tls_connection_json(certs))
    config = write_config(tmp_path / "fleet.yaml", two_topologies(smoke_image, tls_engine.url, models=("trivial",),
                                                                  batch_sizes=(8, 16), num_batches=5))
    dag_run = run_fleet_dag(monkeypatch, config)
    assert dag_run.state == "success"
    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(), run_id=dag_run.run_id)
    assert sorted((r["host"], r["batch_size_per_device"], r["status"]) for r in rows) == [
        ("central-tls", 8, "ok"), ("central-tls", 16, "ok"), ("gpu-b", 8, "ok"), ("gpu-b", 16, "ok")]
    assert tls_engine.clients  # the TLS host's pull and cases went through the TLS engine (its probes over SSH)
    assert containers_of(docker_api, dag_run.run_id) == []

    # A run on the own-queue host only: the other lane does nothing (no case of the run on it); the lane's
    # cases task validates and prepares the host, and the run stores and checks the fleet.
    subset = run_fleet_dag(monkeypatch, config, run_conf={"hosts": ["gpu-b"]})
    assert subset.state == "success"
    states = {ti.task_id: ti.state for ti in subset.get_task_instances()}
    assert states["host_central-tls.cases"] == "success" and states["host_central-tls.run_case"] == "skipped"
    assert states["host_gpu-b.run_case"] == states["store"] == states["outcome"] == "success"
    validated = next(ti for ti in subset.get_task_instances() if ti.task_id == "host_gpu-b.cases")
    assert validated.xcom_pull(task_ids="host_gpu-b.cases", key="validation")["verdict"] == "ready"
    assert validated.xcom_pull(task_ids="host_gpu-b.cases", key="images")["images"]["cpu-smoke"]["digest"]
    assert [(r["host"], r["status"]) for r in fetch_results(get_engine(), run_id=subset.run_id)] == [
        ("gpu-b", "ok"), ("gpu-b", "ok")]

    # A run without it: its lane's cases task finds the host unplanned and does nothing.
    others = run_fleet_dag(monkeypatch, config, run_conf={"hosts": ["central-tls"]})
    assert others.state == "success"
    lane = {ti.task_id: ti for ti in others.get_task_instances() if ti.task_id.startswith("host_gpu-b.")}
    assert lane["host_gpu-b.cases"].state == "success"
    assert lane["host_gpu-b.cases"].xcom_pull(task_ids="host_gpu-b.cases", key="validation") is None
    assert lane["host_gpu-b.cases"].xcom_pull(task_ids="host_gpu-b.cases") == []
    assert [(r["host"], r["status"]) for r in fetch_results(get_engine(), run_id=others.run_id)] == [
        ("central-tls", "ok"), ("central-tls", "ok")]


# -- the distributed setup: CeleryExecutor, two workers, REST API ---------------------------------
@pytest.mark.integration
@pytest.mark.scheduler
def test_celery_workers_run_each_host_on_its_own_queue(tmp_path, pg_url, certs, tls_engine, smoke_image, docker_api,
                                                       sshd):  # noqa: F811
    cfg = two_topologies(smoke_image, tls_engine.url, models=("trivial", "lenet"), batch_sizes=(8,), num_batches=10)
    cfg["fleet"]["schedule"] = None  # only the run this test triggers
    config = write_config(tmp_path / "fleet.yaml", cfg)
    from fleetbench.runs import pools

    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    warehouse_db = f"fb_wh_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{warehouse_db}"'))
    warehouse = f"{pg_url.rsplit('/', 1)[0]}/{warehouse_db}"
    env = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse,
           # one machine: both workers see the same artifact folder, as a shared volume would give them
           "FLEETBENCH_DATA_DIR": str(tmp_path / "data")}
    run_id = "celery-fleet"
    try:
        with RedisServer(tmp_path / "redis") as redis, \
                CeleryAirflow(tmp_path / "airflow", pg_url, redis.url, env=env,
                              workers={"central": ["default"], "gpu-b": [OWN_QUEUE]}) as airflow:
            for name, pool in pools(parse(config)).items():
                airflow.api("POST", "/api/v2/pools", {"name": name, **pool})
            conn = json.loads(tls_connection_json(certs))
            airflow.api("POST", "/api/v2/connections", {"connection_id": TLS_CONN, "conn_type": conn["conn_type"],
                                                        "extra": json.dumps(conn["extra"])})
            ssh = ssh_connection()  # the TLS host's probes run on it, over SSH
            airflow.api("POST", "/api/v2/connections", {"connection_id": SSH_CONN, **ssh,
                                                        "extra": json.dumps(ssh["extra"])})
            airflow.wait_for_dag("fleet_benchmark")
            airflow.trigger_api("fleet_benchmark", run_id)
            run = airflow.wait_for_run_api("fleet_benchmark", run_id, timeout=600)
            tis = airflow.task_instances_api("fleet_benchmark", run_id)
            assert run["state"] == "success", airflow.logs()
        assert airflow.stopped() and redis.proc.poll() is not None  # everything shut down

        ran = [ti for ti in tis if ti["state"] in ("success", "failed")]
        on_host = [ti for ti in ran
                   if ti["task_id"].startswith("host_gpu-b.") and ti["task_id"].split(".")[1] in LANE_ON_HOST]
        assert sorted({ti["task_id"] for ti in on_host}) == sorted(f"host_gpu-b.{s}" for s in LANE_ON_HOST)
        assert {(ti["queue"], ti["hostname"]) for ti in on_host} == {(OWN_QUEUE, "gpu-b")}, on_host
        central = [ti for ti in ran if ti not in on_host]
        assert {(ti["queue"], ti["hostname"]) for ti in central} == {("default", "central")}, central
        cases = {host: sorted(ti["rendered_map_index"] for ti in ran if ti["task_id"] == f"host_{host}.run_case")
                 for host in ("central-tls", "gpu-b")}
        assert cases["central-tls"] == cases["gpu-b"] and len(cases["gpu-b"]) == 2, cases
        assert set(tls_engine.clients) == {"fleetbench-central-worker"}  # host central-tls went through TLS

        from fleetbench.warehouse import fetch_results, get_engine

        engine = get_engine(warehouse)
        rows = fetch_results(engine, run_id=run_id)
        engine.dispose()
        digest = docker_api.inspect_distribution(smoke_image)["Descriptor"]["digest"]
        assert sorted((r["host"], r["model"], r["status"]) for r in rows) == [
            ("central-tls", "lenet", "ok"), ("central-tls", "trivial", "ok"), ("gpu-b", "lenet", "ok"),
            ("gpu-b", "trivial", "ok")]
        assert all(r["images_per_sec"] > 0 and r["image_digest"] == digest for r in rows), rows
        assert containers_of(docker_api, run_id) == []
    finally:
        from pg_databases import drop_database

        drop_database(admin, warehouse_db)
        admin.dispose()


def parse(config: Path):
    from fleetbench.config import load_config

    return load_config(config)
