"""GPU hosts that may only reach the api-server over HTTPS: Airflow 3's Edge executor (provider edge3),
an edge worker per host, as local processes (README "Deploying at fleet scale", topology (c)).

PostgreSQL metadata and warehouse databases, api-server (HTTPS only, with the Edge worker API),
scheduler and dag-processor with the EdgeExecutor, and two edge workers: `central` on the default
queue (on the Airflow machine: plan, store, report, and the lanes of hosts without a queue) and `gpu-b`
on its host's queue. The GPU host's worker holds only the API URL, the JWT secret and the CA; its
metadata DB and warehouse URLs refuse every connection. fleet_benchmark is triggered and watched over
the REST API.
"""

from __future__ import annotations

import secrets
import urllib.request
import uuid

import pytest
from sqlalchemy import create_engine, text

from celery_cluster import make_tls_material
from edge_cluster import NO_DATABASE, EdgeAirflow
from fleet_configs import containers_of, smoke_config, write_config

OWN_QUEUE = "fleet-gpu-b"
LANE_ON_HOST = {"cases", "run_case"}  # what an own-queue host's worker runs: its lane (validate, pull, cases)


@pytest.mark.integration
@pytest.mark.scheduler
def test_edge_workers_run_each_host_on_its_own_queue_over_https(tmp_path, pg_url, smoke_image, docker_api):
    cfg = smoke_config(smoke_image, hosts=[{"name": "central", "connection": "local"},
                                           {"name": "gpu-b", "connection": "local", "queue": OWN_QUEUE}],
                       models=("trivial",), batch_sizes=(8, 16), num_batches=5)
    cfg["fleet"]["schedule"] = None  # only the run this test triggers
    config = write_config(tmp_path / "fleet.yaml", cfg)

    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    warehouse_db = f"fb_wh_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{warehouse_db}"'))
    warehouse = f"{pg_url.rsplit('/', 1)[0]}/{warehouse_db}"
    data = str(tmp_path / "data")  # one machine: both workers see the same artifact folder
    central = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse, "FLEETBENCH_DATA_DIR": data}
    # The GPU host's worker: the fleet config and its own artifact folder; no database it could reach.
    gpu = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_DATA_DIR": data, "FLEETBENCH_WAREHOUSE_URL": NO_DATABASE}
    run_id = "edge-fleet"
    try:
        with EdgeAirflow(tmp_path / "airflow", pg_url, workers={"central": ["default"], "gpu-b": [OWN_QUEUE]},
                         tls=make_tls_material(tmp_path / "tls"), env=central,
                         worker_env={"central": central, "gpu-b": gpu}) as airflow:
            assert airflow.base_url.startswith("https://")
            with pytest.raises(OSError):  # plain HTTP gets no answer: the api-server speaks TLS only
                urllib.request.urlopen(f"http://127.0.0.1:{airflow.port}/api/v2/monitor/health", timeout=10)
            registered = {w["worker_name"]: w["queues"] for w in airflow.edge_workers()}
            assert registered == {"central": ["default"], "gpu-b": [OWN_QUEUE]}
            assert len(airflow.processes_left()) >= 5  # api-server, scheduler, dag-processor, two workers

            # The api-server lets in only workers that sign with its JWT secret and trust its certificate.
            forged = airflow.try_worker("intruder", AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(32))
            assert forged.returncode != 0 and "403" in forged.stdout + forged.stderr, forged
            untrusting = airflow.try_worker("no-ca", SSL_CERT_FILE=None)
            assert untrusting.returncode != 0, untrusting
            assert "CERTIFICATE_VERIFY_FAILED" in untrusting.stdout + untrusting.stderr, untrusting
            assert {w["worker_name"] for w in airflow.edge_workers()} == {"central", "gpu-b"}
            airflow.wait_for_dag("fleet_benchmark")
            airflow.trigger_api("fleet_benchmark", run_id)
            run = airflow.wait_for_run_api("fleet_benchmark", run_id, timeout=600)
            tis = airflow.task_instances_api("fleet_benchmark", run_id)
            jobs = airflow.edge_jobs(run_id)
            assert run["state"] == "success", airflow.logs()
        assert airflow.stopped()  # Ctrl-C (SIGINT) drained and stopped both workers, then the rest stopped
        assert airflow.processes_left() == []  # task processes too (the worker starts each in its own group)
        assert {w["worker_name"]: w["state"] for w in airflow.final_workers} == {
            "central": "offline", "gpu-b": "offline"}  # each signed off over the API

        ran = [ti for ti in tis if ti["state"] in ("success", "failed")]
        on_host = [ti for ti in ran
                   if ti["task_id"].startswith("host_gpu-b.") and ti["task_id"].split(".")[1] in LANE_ON_HOST]
        assert sorted({ti["task_id"] for ti in on_host}) == sorted(f"host_gpu-b.{s}" for s in LANE_ON_HOST)
        assert {(ti["queue"], ti["hostname"]) for ti in on_host} == {(OWN_QUEUE, "gpu-b")}, on_host
        others = [ti for ti in ran if ti not in on_host]
        assert {(ti["queue"], ti["hostname"]) for ti in others} == {("default", "central")}, others
        assert {"plan", "store", "report", "host_central.run_case"} <= {ti["task_id"] for ti in others}
        cases = {host: sorted(ti["rendered_map_index"] for ti in ran if ti["task_id"] == f"host_{host}.run_case")
                 for host in ("central", "gpu-b")}
        assert cases["central"] == cases["gpu-b"] and len(cases["gpu-b"]) == 2, cases
        # The executor's own record: every job of the run went through the Edge API to the worker of its queue.
        assert len(jobs) == len(ran) and {j["state"] for j in jobs} == {"success"}, jobs
        assert {(j["queue"], j["edge_worker"]) for j in jobs if j["task_id"].startswith("host_gpu-b.")} == {
            (OWN_QUEUE, "gpu-b")}, jobs
        assert {(j["queue"], j["edge_worker"]) for j in jobs if not j["task_id"].startswith("host_gpu-b.")} == {
            ("default", "central")}, jobs

        from fleetbench.warehouse import fetch_results, get_engine

        engine = get_engine(warehouse)
        rows = fetch_results(engine, run_id=run_id)
        engine.dispose()
        digest = docker_api.inspect_distribution(smoke_image)["Descriptor"]["digest"]
        assert sorted((r["host"], r["batch_size_per_device"], r["status"]) for r in rows) == [
            ("central", 8, "ok"), ("central", 16, "ok"), ("gpu-b", 8, "ok"), ("gpu-b", 16, "ok")]
        assert all(r["images_per_sec"] > 0 and r["image_digest"] == digest for r in rows), rows
        assert containers_of(docker_api, run_id) == []
    finally:
        from pg_databases import drop_database

        drop_database(admin, warehouse_db)
        admin.dispose()
