"""Registry credentials go only to their registry, whatever image a manual run asks for.

A recording registry on a loopback port answers every request with a Basic challenge and keeps the
`Authorization` header of each: the real Docker engine is what decides whether to send credentials,
so what it sent is what an attacker's registry would have received. The positive control (a
connection *for* the recorder) shows the recorder does see credentials when they are sent.
"""

from __future__ import annotations

import base64
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_images import REGISTRY, delete_manifest, push_as, remove_images, unique_image

from fleet_configs import run_fleet_dag, smoke_config, write_config
from fleetbench.config import ImageSpec

pytestmark = pytest.mark.integration

LOGIN = "svc"


class RecordingRegistry:
    """An HTTP server that refuses everything with `WWW-Authenticate: Basic` and records each request."""

    def __init__(self):
        requests_seen = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def _refuse(self):
                requests_seen.append((self.command, self.path, self.headers.get("Authorization")))
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="recorder"')
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = _refuse

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def authorizations(self) -> list[str]:
        return [auth for _, _, auth in self.requests if auth]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def recorder():
    rec = RecordingRegistry()
    yield rec
    rec.close()


@pytest.fixture()
def password(monkeypatch) -> str:
    """A connection `fb_cred` for the fleet's registry 127.0.0.1:5000 (login svc, a fresh password)."""
    secret = uuid.uuid4().hex
    monkeypatch.setenv("AIRFLOW_CONN_FB_CRED",
                       f'{{"conn_type": "docker", "host": "127.0.0.1", "port": 5000, "login": "{LOGIN}", '
                       f'"password": "{secret}"}}')
    return secret


def basic(secret: str) -> str:
    return "Basic " + base64.b64encode(f"{LOGIN}:{secret}".encode()).decode()


def prepare(ref: str, conn_id: str) -> dict:
    from fleetbench.airflow.pipeline import prepare_host_images

    spec = ImageSpec(name="smoke", ref=ref, command=["true"], credentials_conn_id=conn_id)
    host = {"name": "localhost", "docker_url": "unix:///var/run/docker.sock", "images": [spec.model_dump(mode="json")]}
    return prepare_host_images(host, [{"host": "localhost", "verdict": "ready", "facts": {}}])["images"]["smoke"]


def test_the_engine_sends_no_credentials_to_another_registry(docker_api, recorder, password, monkeypatch, caplog):
    result = prepare(f"{recorder.address}/evil/x:1", "fb_cred")
    assert recorder.requests, "the engine never asked the recording registry"
    assert recorder.authorizations == []
    assert result["failure_class"] == "registry_auth"
    # Positive control: credentials whose connection names the recorder do reach it.
    host, port = recorder.address.split(":")
    monkeypatch.setenv("AIRFLOW_CONN_FB_REC",
                       f'{{"conn_type": "docker", "host": "{host}", "port": {port}, "login": "{LOGIN}", '
                       f'"password": "{password}"}}')
    prepare(f"{recorder.address}/evil/x:1", "fb_rec")
    assert basic(password) in recorder.authorizations
    assert password not in caplog.text


def fleet_with_credentials(ref: str, **image) -> dict:
    cfg = smoke_config(ref, models=("trivial",), batch_sizes=(8,), num_batches=3)
    cfg["images"][0].update(credentials_conn_id="fb_cred", **image)
    return cfg


@pytest.mark.dagrun
def test_a_manual_run_cannot_send_the_fleet_credentials_elsewhere(
        airflow_db, data_dir, docker_api, smoke_image, recorder, password, tmp_path, monkeypatch):
    """The audit's reproduction: a configured image with credentials and a manual run with
    `{"image": "<another registry>/evil/x:1"}`. By default (allow_override: same_repository) the run is
    refused when it is planned and the other registry hears nothing; with allow_override: any the image is
    pulled anonymously (the recorder sees no credentials) and the case is a failed row, registry_auth."""
    from fleetbench.warehouse import fetch_results, get_engine

    evil = {"image": f"{recorder.address}/evil/x:1"}
    refused = run_fleet_dag(monkeypatch, write_config(tmp_path / "default.yaml", fleet_with_credentials(smoke_image)),
                            evil)
    assert refused.state == "failed"
    assert recorder.requests == []

    cfg = fleet_with_credentials(smoke_image, allow_override="any")
    anonymous = run_fleet_dag(monkeypatch, write_config(tmp_path / "any.yaml", cfg), evil)
    assert recorder.requests and recorder.authorizations == []
    rows = fetch_results(get_engine(), run_id=anonymous.run_id)
    assert ([(r["status"], r["failure_class"], r["image_ref"]) for r in rows]
            == [("failed", "registry_auth", evil["image"])])


@pytest.mark.dagrun
def test_an_overridden_image_is_never_baked_or_pushed(airflow_db, data_dir, docker_api, smoke_image, tmp_path,
                                                      monkeypatch):
    """Another tag of the configured repository (allowed by default) runs as it is: the configured bake
    (a setup step, then a push to the fleet registry) is not applied to it, so nothing is committed or pushed."""
    import requests

    from fleetbench.warehouse import fetch_results, get_engine

    uid = uuid.uuid4().hex[:8]
    repository, name = f"{REGISTRY}/fleetbench/cpu-smoke", f"override-{uid}"
    image_id = unique_image(docker_api, smoke_image, uid)
    digest = push_as(docker_api, image_id, repository, uid)
    try:
        cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), num_batches=3)
        cfg["images"][0].update(name=name, bake={"run": ["true"], "push_to": REGISTRY})
        cfg["benchmarks"][0]["image"] = name
        run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg), {"image": f"{repository}:{uid}"})
        rows = fetch_results(get_engine(), run_id=run.run_id)
        assert ([(r["status"], r["image_ref"], r["image_digest"]) for r in rows]
                == [("ok", f"{repository}:{uid}", digest)])
        assert docker_api.images(filters={"label": f"org.fleetbench.image={name}"}) == []
        tags = requests.get(f"http://{REGISTRY}/v2/fleetbench/{name}/tags/list", timeout=5)
        assert tags.status_code == 404 or not tags.json().get("tags"), tags.text
    finally:
        remove_images(docker_api, image_id)
        delete_manifest(repository, digest)
