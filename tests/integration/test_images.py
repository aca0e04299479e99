"""Pull and pin against the real registries: 127.0.0.1:5000 (no auth) and 127.0.0.1:5001 (htpasswd,
scripts/ensure-registry-auth.sh). Every failure class is produced for real: a tag the registry does
not have, a closed port, wrong or missing credentials, a disk check that cannot pass.

Each test pushes images of its own (a `docker commit` of the smoke or base image with a unique label,
so a unique digest) under a unique tag, and removes its images, tags and registry manifests at the
end; deleting a unique digest cannot touch a parallel run's tags."""

from __future__ import annotations

import logging
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from docker.errors import NotFound

from fleet_configs import run_fleet_dag, smoke_config, write_config
from fleetbench.config import ImageSpec
from fleetbench.images import prepare_image

pytestmark = pytest.mark.integration

REGISTRY = "127.0.0.1:5000"
AUTH_REGISTRY = "127.0.0.1:5001"
AUTH_CREDENTIALS = Path("/var/lib/fleetbench/registry-auth/credentials")
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


# -- helpers (also used by test_bake_and_cleanup.py) -------------------------------------------
def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def unique_image(api, source: str, uid: str) -> str:
    """A new image: `source` committed with label test.uid=<uid> (no new files); returns its id."""
    container = api.create_container(source, command=["true"], host_config=api.create_host_config(network_mode="none"))
    try:
        return api.commit(container["Id"], changes=[f"LABEL test.uid={uid}"])["Id"]
    finally:
        api.remove_container(container["Id"], force=True)


def remove_images(api, *image_ids: str) -> None:
    """Remove images this test made, with every tag and digest reference they got."""
    for image_id in image_ids:
        try:
            api.remove_image(image_id, force=True)
        except NotFound:
            pass


def push_as(api, image: str, repository: str, tag: str, auth: dict | None = None) -> str:
    """Tag `image` as repository:tag, push it, drop the local tag; returns the registry digest."""
    api.tag(image, repository, tag, force=True)
    digest = None
    try:
        for event in api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
            assert "error" not in event, event
            digest = (event.get("aux") or {}).get("Digest", digest)
    finally:
        api.remove_image(f"{repository}:{tag}")
    assert digest and digest.startswith("sha256:")
    return digest


def delete_manifest(repository: str, digest: str, auth: tuple[str, str] | None = None) -> None:
    """Delete one manifest from one repository of a local registry (the blobs, shared, stay)."""
    registry, _, repo = repository.partition("/")
    r = requests.delete(f"http://{registry}/v2/{repo}/manifests/{digest}", auth=auth, timeout=10)
    assert r.status_code in (202, 404), (r.status_code, r.text)


def registry_digest(repository: str, tag: str, auth: tuple[str, str] | None = None) -> str | None:
    registry, _, repo = repository.partition("/")
    r = requests.head(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_V2}, auth=auth,
                      timeout=10)
    return r.headers.get("Docker-Content-Digest") if r.status_code == 200 else None


def forget_local(api, *refs: str) -> None:
    """Remove local tags / digest references (the image stays while other references hold it)."""
    for ref in refs:
        try:
            api.remove_image(ref)
        except NotFound:
            pass


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@dataclass
class Pushed:
    repository: str
    tag: str
    digest: str
    image_id: str
    images: list[str] = field(default_factory=list)  # made by the test: removed at the end
    digests: list[str] = field(default_factory=list)  # pushed by the test: deleted at the end

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@pytest.fixture()
def pushed(docker_api, smoke_image):
    """A unique copy of the smoke image pushed as 127.0.0.1:5000/fleetbench/test-images:<uid>; cleaned up after."""
    uid = unique("t")
    image_id = unique_image(docker_api, smoke_image, uid)
    repository = f"{REGISTRY}/fleetbench/test-images"
    p = Pushed(repository, uid, push_as(docker_api, image_id, repository, uid), image_id, [image_id])
    p.digests.append(p.digest)
    yield p
    remove_images(docker_api, *p.images)
    for d in p.digests:
        delete_manifest(repository, d)


@pytest.fixture(scope="session")
def auth_registry() -> tuple[str, str]:
    """(user, password) of the htpasswd registry on 127.0.0.1:5001 (started by `make test`)."""
    try:
        user, password = AUTH_CREDENTIALS.read_text().strip().split(":", 1)
        ok = requests.get(f"http://{AUTH_REGISTRY}/v2/", auth=(user, password), timeout=3).status_code == 200
    except (OSError, ValueError, requests.RequestException) as exc:
        ok, user, password = False, "", str(exc)
    if not ok:
        pytest.fail(f"no registry with auth on {AUTH_REGISTRY} ({password}); "
                    "run `make test` or scripts/ensure-registry-auth.sh")
    return user, password


# -- pull and pin -----------------------------------------------------------------------------
def test_pull_by_tag_and_by_digest_pin_the_registry_digest(docker_api, pushed, caplog):
    caplog.set_level(logging.INFO, logger="fleetbench.images")
    by_tag = prepare_image(docker_api, "smoke", pushed.ref, "always")
    assert by_tag.ok and by_tag.pulled, by_tag.error
    assert ((by_tag.digest, by_tag.pinned_ref, by_tag.image_id)
            == (pushed.digest, f"{pushed.repository}@{pushed.digest}", pushed.image_id))
    assert f"pull {pushed.ref}: Digest: {pushed.digest}" in caplog.text
    assert "layer(s)" in caplog.text and "MB downloaded" in caplog.text

    by_digest_ref = f"{pushed.repository}@{pushed.digest}"
    forget_local(docker_api, pushed.ref, by_digest_ref)
    by_digest = prepare_image(docker_api, "smoke", by_digest_ref, "if-missing")
    assert by_digest.ok and by_digest.pulled
    assert ((by_digest.digest, by_digest.pinned_ref, by_digest.image_id)
            == (pushed.digest, by_digest_ref, pushed.image_id))

    again = prepare_image(docker_api, "smoke", by_digest_ref, "if-missing")
    assert again.ok and not again.pulled and again.pinned_ref == by_digest_ref
    forget_local(docker_api, by_digest_ref)
    never = prepare_image(docker_api, "smoke", by_digest_ref, "never")
    assert never.failure_class == "image_not_found" and "pull_policy is 'never'" in never.error


def test_a_tag_moved_after_prepare_does_not_change_the_pin(docker_api, pushed):
    """Push A as tag t, prepare (pin), push B as t: the pinned ref still names A; a new prepare gets B."""
    first = prepare_image(docker_api, "smoke", pushed.ref, "always")
    assert first.pinned_ref == f"{pushed.repository}@{pushed.digest}" and first.image_id == pushed.image_id

    image_b = unique_image(docker_api, "fleetbench/base:bookworm", pushed.tag)
    pushed.images.append(image_b)
    digest_b = push_as(docker_api, image_b, pushed.repository, pushed.tag)
    pushed.digests.append(digest_b)
    assert digest_b != pushed.digest and registry_digest(pushed.repository, pushed.tag) == digest_b

    assert docker_api.inspect_image(first.pinned_ref)["Id"] == pushed.image_id  # what cases run: still A
    second = prepare_image(docker_api, "smoke", pushed.ref, "always")
    assert (second.digest, second.image_id) == (digest_b, image_b)
    assert docker_api.inspect_image(first.pinned_ref)["Id"] == pushed.image_id


# -- named failures, for real -----------------------------------------------------------------
def test_unknown_tag_is_image_not_found_without_retries(docker_api, smoke_image):
    ref = f"{REGISTRY}/fleetbench/cpu-smoke:{unique('no-such-tag')}"
    result = prepare_image(docker_api, "smoke", ref, "always", attempts=3, backoff_s=5)
    assert result.failure_class == "image_not_found"
    assert result.pull_attempts == 1
    assert "manifest unknown" in result.error and ref.split("/", 1)[1] in result.error


def test_registry_down_is_registry_unreachable_after_bounded_retries(docker_api, caplog):
    ref = f"127.0.0.1:{closed_port()}/fleetbench/cpu-smoke:latest"
    result = prepare_image(docker_api, "smoke", ref, "always", attempts=3, backoff_s=0.05)
    assert result.failure_class == "registry_unreachable"
    assert result.pull_attempts == 3
    assert "connection refused" in result.error
    assert len([r for r in caplog.records if "retrying in" in r.getMessage()]) == 2


def test_disk_check_refuses_before_pulling(docker_api, pushed):
    forget_local(docker_api, pushed.ref)
    result = prepare_image(docker_api, "smoke", pushed.ref, "always", min_free_gb=10**6)
    assert result.failure_class == "insufficient_disk"
    assert "refused before pulling" in result.error and result.free_bytes > 0
    assert result.pull_attempts == 0
    with pytest.raises(NotFound):  # nothing was pulled
        docker_api.inspect_image(pushed.ref)


@pytest.fixture()
def pushed_with_auth(docker_api, smoke_image, auth_registry):
    """A unique copy of the smoke image in the htpasswd registry: (ref, digest, user, password); cleaned up after."""
    user, password = auth_registry
    uid = unique("t")
    image_id = unique_image(docker_api, smoke_image, uid)
    repository = f"{AUTH_REGISTRY}/fleetbench/test-auth"
    digest = push_as(docker_api, image_id, repository, uid, auth={"username": user, "password": password})
    yield f"{repository}:{uid}", digest, user, password
    remove_images(docker_api, image_id)
    delete_manifest(repository, digest, auth=(user, password))


def test_registry_credentials_good_bad_and_missing(docker_api, pushed_with_auth, caplog):
    ref, digest, user, password = pushed_with_auth
    bad = prepare_image(docker_api, "smoke", ref, "always", auth_config={"username": user, "password": "wrong"})
    assert (bad.failure_class, bad.pull_attempts) == ("registry_auth", 1)
    assert "unauthorized" in bad.error
    missing = prepare_image(docker_api, "smoke", ref, "always")
    assert missing.failure_class == "registry_auth" and "no basic auth credentials" in missing.error
    ok = prepare_image(docker_api, "smoke", ref, "always", auth_config={"username": user, "password": password})
    assert ok.ok and ok.digest == digest
    assert password not in caplog.text


def test_pipeline_takes_credentials_from_an_airflow_connection(docker_api, pushed_with_auth, monkeypatch, caplog):
    """prepare_host_images reads `credentials_conn_id` through Airflow; the password shows up nowhere."""
    from fleetbench.airflow.pipeline import prepare_host_images

    ref, digest, user, password = pushed_with_auth
    conn = '{{"conn_type": "docker", "host": "127.0.0.1", "port": 5001, "login": "{}", "password": "{}"}}'
    monkeypatch.setenv("AIRFLOW_CONN_FB_TEST_REGISTRY", conn.format(user, password))
    monkeypatch.setenv("AIRFLOW_CONN_FB_TEST_REGISTRY_BAD", conn.format(user, "wrong-password"))
    validation = [{"host": "localhost", "verdict": "ready", "facts": {}}]

    def host(conn_id):
        spec = ImageSpec(name="smoke", ref=ref, command=["true"], credentials_conn_id=conn_id)
        return {"name": "localhost", "docker_url": "unix:///var/run/docker.sock",
                "images": [spec.model_dump(mode="json")]}

    good = prepare_host_images(host("fb_test_registry"), validation)["images"]["smoke"]
    assert good["failure_class"] is None and good["pinned_ref"] == f"{ref.rsplit(':', 1)[0]}@{digest}"
    bad = prepare_host_images(host("fb_test_registry_bad"), validation)["images"]["smoke"]
    assert bad["failure_class"] == "registry_auth"
    absent = prepare_host_images(host("fb_test_no_such_conn"), validation)["images"]["smoke"]
    assert absent["failure_class"] == "registry_auth" and "fb_test_no_such_conn" in absent["error"]
    assert password not in str([good, bad, absent]) + caplog.text


# -- through the DAG --------------------------------------------------------------------------
@pytest.mark.dagrun
def test_fleet_run_keeps_the_pulled_digest_when_the_tag_moves_before_cases_run(
        airflow_db, data_dir, docker_api, pushed, tmp_path, monkeypatch):
    """fleet_benchmark with dag.test(): between prepare_image and run_case (in the task that schedules
    cases), the tag is moved to a copy of the bare base image, which has no harness. Cases still run
    the pulled image (rows ok; a case on the base would exit 2), and every row records the pulled
    digest, not the new one. (The move is injected by wrapping operators.case_kwargs: dag.test() runs
    the tasks in this process.)"""
    from fleetbench.airflow import operators

    schedule = operators.case_kwargs
    image_b = unique_image(docker_api, "fleetbench/base:bookworm", pushed.tag)
    pushed.images.append(image_b)

    def move_tag_then_schedule(*args, **kwargs):
        pushed.digests.append(push_as(docker_api, image_b, pushed.repository, pushed.tag))
        return schedule(*args, **kwargs)

    monkeypatch.setattr(operators, "case_kwargs", move_tag_then_schedule)
    cfg = smoke_config(pushed.ref, models=("trivial",), batch_sizes=(8,), num_batches=3)
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"
    assert len(pushed.digests) == 2  # the tag did move, mid-run
    assert registry_digest(pushed.repository, pushed.tag) == pushed.digests[1] != pushed.digest

    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(), run_id=dag_run.run_id)
    assert [(r["status"], r["image_digest"], r["image_ref"]) for r in rows] == [("ok", pushed.digest, pushed.ref)]
