"""Bake (`docker commit` with labels, deterministic tag, cache) and cleanup, on the real engine and
registry. Everything a test creates carries the label test.scope=<uid> (bakes get it through
`extra_labels`) and is removed at the end; cleanup runs are narrowed to that scope so they never
touch what other tests or people have on this engine."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import time
from pathlib import Path

import pytest
from docker.errors import NotFound
from test_images import REGISTRY, delete_manifest, registry_digest, remove_images, unique

from fleet_configs import run_fleet_dag, smoke_config, write_config
from fleetbench import __version__
from fleetbench.bake import tree_hash
from fleetbench.cleanup import clean_engine
from fleetbench.config import ImageSpec
from fleetbench.prepare import prepare

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "include/images/cpu-smoke/tf_cnn_benchmarks.py"
SMOKE_CMD = ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py"]


@pytest.fixture()
def scope(docker_api):
    """{"test.scope": uid}; afterwards removes every container and image carrying it."""
    labels = {"test.scope": unique("s")}
    yield labels
    for c in docker_api.containers(all=True, filters={"label": f"test.scope={labels['test.scope']}"}):
        docker_api.remove_container(c["Id"], force=True)
    images = docker_api.images(filters={"label": f"test.scope={labels['test.scope']}"})
    remove_images(docker_api, *(i["Id"] for i in sorted(images, key=lambda i: -i["Created"])))  # children first


def run_in(api, image: str, script: str, **labels) -> str:
    """Output of `sh -c script` in a throwaway container of `image` (no network)."""
    c = api.create_container(image, command=["sh", "-c", script], labels=labels or None,
                             host_config=api.create_host_config(network_mode="none"))
    try:
        api.start(c)
        assert api.wait(c, timeout=60)["StatusCode"] == 0, api.logs(c).decode()
        return api.logs(c).decode()
    finally:
        api.remove_container(c, force=True)


def bake_spec(name: str, base: str, **bake) -> ImageSpec:
    return ImageSpec.model_validate({"name": name, "ref": base, "pull_policy": "if-missing", "command": SMOKE_CMD,
                                     "bake": bake})


def smoke_digest(api, smoke_image: str) -> str:
    return api.inspect_distribution(smoke_image)["Descriptor"]["digest"]


# -- bake -------------------------------------------------------------------------------------
def test_bake_copies_the_harness_labels_the_image_and_reuses_it(docker_api, smoke_image, scope, caplog):
    caplog.set_level(logging.INFO, logger="fleetbench")
    name = unique("test-bake")
    spec = bake_spec(name, smoke_image, copy=[{"src": HARNESS, "dest": "/opt/harness/tf_cnn_benchmarks.py"}],
                     run=["sh", "-c", "python3 /opt/harness/tf_cnn_benchmarks.py --model=trivial --batch_size=2 "
                                      "--num_batches=1 --num_warmup_batches=0 > /opt/harness/selftest.log"])
    first = prepare(docker_api, spec, extra_labels=scope)
    assert first.ok, first.error
    digest = smoke_digest(docker_api, smoke_image)
    assert first.bake_cache_hit is False
    assert first.digest == digest  # rows keep recording the pulled base's registry digest
    assert first.base_pinned_ref == f"{smoke_image.rsplit(':', 1)[0]}@{digest}"
    assert (first.pinned_ref == first.baked_id
            and first.baked_ref == f"fleetbench/{name}:latest-{first.bake_inputs[:12]}")

    info = docker_api.inspect_image(first.pinned_ref)
    labels = info["Config"]["Labels"]
    copied_rev = "sha256:" + hashlib.sha256(tree_hash(ROOT / HARNESS).encode()).hexdigest()
    assert {k: labels[k] for k in labels if k.startswith("org.fleetbench.") and k != "org.fleetbench.inputs"} == {
        "org.fleetbench.managed": "true", "org.fleetbench.kind": "baked", "org.fleetbench.image": name,
        "org.fleetbench.harness": "cpu-smoke",  # inherited from the base
        "org.fleetbench.bake.inputs": first.bake_inputs, "org.fleetbench.bake.base_ref": smoke_image,
        "org.fleetbench.bake.base_digest": digest, "org.fleetbench.bake.step": "",
        "org.fleetbench.harness.source": f"copy:{HARNESS}", "org.fleetbench.harness.revision": copied_rev,
        "org.fleetbench.version": __version__,
    }
    assert info["Author"] == f"fleetbench {__version__}"
    assert info["Comment"].startswith(f"fleetbench bake {name}: copy:{HARNESS} at {copied_rev} on ")
    assert info["Config"]["Cmd"] == docker_api.inspect_image(smoke_image)["Config"]["Cmd"]  # not the setup step
    assert sorted(info["RepoTags"]) == [f"fleetbench/{name}:current", first.baked_ref]

    out = run_in(docker_api, first.pinned_ref,
                 "sha256sum /opt/harness/tf_cnn_benchmarks.py; grep 'total images/sec' /opt/harness/selftest.log",
                 **scope)
    assert out.split()[0] == hashlib.sha256((ROOT / HARNESS).read_bytes()).hexdigest()
    assert "total images/sec:" in out
    assert docker_api.containers(all=True, filters={"label": ["org.fleetbench.bake.step",
                                                              f"test.scope={scope['test.scope']}"]}) == []

    caplog.clear()
    second = prepare(docker_api, spec, extra_labels=scope)
    assert second.ok and second.bake_cache_hit is True
    assert (second.pinned_ref, second.baked_ref, second.digest) == (first.pinned_ref, first.baked_ref, digest)
    assert f"bake {name}: cache hit, reusing {first.baked_ref}" in caplog.text

    # the deterministic tag lost (another lane's bake of the same inputs took it, and cleanup removed that one): the
    # current bake of these inputs is reused and tagged again, not baked again
    docker_api.remove_image(first.baked_ref)  # an untag: `current` still holds the image
    third = prepare(docker_api, spec, extra_labels=scope)
    assert third.ok and third.bake_cache_hit is True and third.pinned_ref == first.pinned_ref
    assert sorted(docker_api.inspect_image(first.pinned_ref)["RepoTags"]) == [f"fleetbench/{name}:current",
                                                                            first.baked_ref]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_bake_from_a_git_branch_is_pushed_and_reused_from_the_registry(docker_api, smoke_image, scope, tmp_path,
                                                                        caplog):
    """The runbook's checkout of tensorflow/benchmarks@cnn_tf_v1.15_compatible, from a local repository."""
    repo = tmp_path / "benchmarks"
    (repo / "scripts" / "tf_cnn_benchmarks").mkdir(parents=True)
    (repo / "scripts" / "tf_cnn_benchmarks" / "tf_cnn_benchmarks.py").write_bytes((ROOT / HARNESS).read_bytes())
    _git(repo, "init", "-q", "-b", "master")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "harness")
    _git(repo, "branch", "cnn_tf_v1.15_compatible")
    (repo / "master-only.txt").write_text("not on the branch\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "master moves on")
    revision = _git(repo, "rev-parse", "cnn_tf_v1.15_compatible")

    spec = bake_spec("test-bake-git", smoke_image, git={"url": f"file://{repo}", "branch": "cnn_tf_v1.15_compatible",
                                                        "dest": "/workspace/benchmarks"},
                     run=["test", "-f", "/workspace/benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py"],
                     push_to=REGISTRY)
    remote = f"{REGISTRY}/fleetbench/test-bake-git"
    pushed: list[str] = []
    try:
        first = prepare(docker_api, spec, extra_labels=scope)
        assert first.ok, first.error
        pushed.append(first.pushed_ref.split("@", 1)[1])
        labels = docker_api.inspect_image(first.pinned_ref)["Config"]["Labels"]
        assert labels["org.fleetbench.harness.source"] == f"git:file://{repo}#cnn_tf_v1.15_compatible"
        assert labels["org.fleetbench.harness.revision"] == first.harness_revision == revision
        # no .git, no master-only
        assert run_in(docker_api, first.pinned_ref, "ls -A /workspace/benchmarks", **scope).split() == ["scripts"]
        assert first.pushed_ref == f"{remote}@{registry_digest(remote, first.baked_ref.rsplit(':', 1)[1])}"

        (repo / "scripts" / "README").write_text("new commit on the branch\n")
        _git(repo, "checkout", "-q", "cnn_tf_v1.15_compatible")
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "branch moves")
        moved = prepare(docker_api, spec, extra_labels=scope)
        assert moved.ok and moved.bake_cache_hit is False and moved.baked_ref != first.baked_ref
        pushed.append(moved.pushed_ref.split("@", 1)[1])

        # Another host: nothing baked locally, but the fleet's registry has it -> pulled, a cache hit.
        _git(repo, "reset", "-q", "--hard", revision)  # the branch back where the first bake found it
        remove_images(docker_api, first.baked_id)
        caplog.set_level(logging.INFO, logger="fleetbench")
        caplog.clear()
        again = prepare(docker_api, spec, extra_labels=scope)
        assert again.ok and again.bake_cache_hit is True and again.baked_ref == first.baked_ref
        assert "cache hit" in caplog.text and f"pull {remote}:{first.baked_ref.rsplit(':', 1)[1]}" in caplog.text
    finally:
        for digest in pushed:
            delete_manifest(remote, digest)


def test_bake_failures_are_named_with_the_log_tail(docker_api, smoke_image, scope, tmp_path):
    name = unique("test-bake-fail")
    failing = bake_spec(name, smoke_image, copy=[{"src": HARNESS, "dest": "/opt/harness/h.py"}],
                        run=["sh", "-c", "echo preparing the harness; echo 'fatal: something broke' >&2; exit 3"])
    result = prepare(docker_api, failing, extra_labels=scope)
    assert result.failure_class == "bake_failed"
    assert ("exited with 3" in result.error and "preparing the harness" in result.error
            and "fatal: something broke" in result.error)
    assert docker_api.images(name=f"fleetbench/{name}") == []
    assert docker_api.containers(all=True, filters={"label": f"test.scope={scope['test.scope']}"}) == []

    (tmp_path / "f").write_text("x")
    _git(tmp_path, "init", "-q", "-b", "master")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "x")
    no_branch = bake_spec(name, smoke_image,
                          git={"url": f"file://{tmp_path}", "branch": "no-such-branch-anywhere", "dest": "/w"})
    result = prepare(docker_api, no_branch, extra_labels=scope)
    assert result.failure_class == "bake_failed" and "no-such-branch-anywhere" in result.error

    full = bake_spec(name, smoke_image, run=["true"]).model_copy(update={"min_free_gb": 10**6, "pull_policy": "never"})
    result = prepare(docker_api, full, extra_labels=scope)
    assert result.failure_class == "insufficient_disk" and "refused before baking" in result.error


@pytest.mark.dagrun
def test_fleet_run_cases_run_the_baked_image_and_rows_keep_the_base_digest(airflow_db, data_dir, docker_api,
                                                                            smoke_image, tmp_path, monkeypatch):
    name = unique("test-bake-dag")
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), num_batches=3)
    cfg["images"][0].update(name=name,
                            command=["python3", "/opt/harness/tf_cnn_benchmarks.py"],  # only in the baked image
                            bake={"copy": [{"src": HARNESS, "dest": "/opt/harness/tf_cnn_benchmarks.py"}]})
    cfg["benchmarks"][0]["image"] = name
    try:
        dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
        assert dag_run.state == "success"
        from fleetbench.warehouse import fetch_results, get_engine

        rows = fetch_results(get_engine(), run_id=dag_run.run_id)
        assert [(r["status"], r["image_digest"]) for r in rows] == [("ok", smoke_digest(docker_api, smoke_image))]
        assert docker_api.images(name=f"fleetbench/{name}")  # the bake happened on this engine
    finally:
        remove_images(docker_api, *(i["Id"] for i in docker_api.images(name=f"fleetbench/{name}")))


# -- cleanup ----------------------------------------------------------------------------------
def _container(api, image: str, scope: dict, start: str | None = None, **labels) -> str:
    """A container of `image` with `labels` (+ scope); started with `sh -c start` and waited for, if given."""
    cmd = ["sh", "-c", start] if start else ["true"]
    cid = api.create_container(image, command=cmd, labels={**scope, **labels},
                               host_config=api.create_host_config(network_mode="none"))["Id"]
    if start:
        api.start(cid)
        if "sleep" not in start:
            api.wait(cid, timeout=30)
    return cid


def _exists(api, kind: str, ref: str) -> bool:
    try:
        (api.inspect_container if kind == "container" else api.inspect_image)(ref)
        return True
    except NotFound:
        return False


def test_cleanup_leaves_a_superseded_bake_that_someone_else_tagged(docker_api, smoke_image, scope):
    """`docker tag <an old bake> teamb/...:prod`: cleanup removes fleetbench's tags of it, and the image stays for
    the other team's tag (cleanup removed every tag, then the image)."""
    api = docker_api
    name = unique("test-theirs")
    old, new = (prepare(api, bake_spec(name, smoke_image, run=["sh", "-c", f"echo {i} > /v"]), extra_labels=scope)
                for i in (1, 2))
    assert old.ok and new.ok, (old.error, new.error)
    theirs = f"other/{name}-harness"
    api.tag(old.baked_id, theirs, "prod")
    try:
        report = clean_engine(api, 0, 0, scope=scope)
        assert report.errors == [] and [i["id"] for i in report.removed_images] == [old.baked_id]
        assert api.inspect_image(old.baked_id)["RepoTags"] == [f"{theirs}:prod"]  # only fleetbench's tags went
        assert _exists(api, "image", new.baked_id)
    finally:
        api.remove_image(f"{theirs}:prod")


def test_cleanup_removes_only_stopped_fleetbench_containers_and_superseded_bakes(
        docker_api, smoke_image, scope, airflow_db, tmp_path, monkeypatch):
    api = docker_api
    name = unique("test-clean")
    bakes = [prepare(api, bake_spec(name, smoke_image, run=["sh", "-c", f"echo {i} > /v"]), extra_labels=scope)
             for i in (1, 2, 3)]
    assert all(b.ok for b in bakes), [b.error for b in bakes]
    v1, v2, v3 = (b.baked_id for b in bakes)  # v3 is current
    # each took `current` from the one before, which got its one stamp of when (cleanup ages it from then)
    stamps = {v: [t for t in api.inspect_image(v)["RepoTags"] if t.startswith(f"fleetbench/{name}:superseded-")]
              for v in (v1, v2, v3)}
    assert len(stamps[v1]) == len(stamps[v2]) == 1 and stamps[v3] == [], stamps
    assert abs(int(stamps[v2][0].rsplit("-", 2)[1]) - time.time()) < 300 and stamps[v2][0].endswith(v2[7:19])
    helper = _container(api, v3, scope)
    child = api.commit(helper, repository=f"other/{name}-child", tag="1")["Id"]  # an image FROM a bake, made by someone
    api.remove_container(helper)
    fb = {"org.fleetbench.managed": "true"}
    ours = {
        "case_exited": _container(api, smoke_image, scope, "true", **fb,
                                  **{"org.fleetbench.run_id": scope["test.scope"]}),
        "case_created": _container(api, smoke_image, scope, None, **fb,
                                   **{"org.fleetbench.run_id": scope["test.scope"]}),
        "bake_step_leaked": _container(api, smoke_image, scope, None, **fb, **{"org.fleetbench.bake.step": "abc"}),
    }
    theirs = {
        "case_running": _container(api, smoke_image, scope, "sleep 60", **fb,
                                   **{"org.fleetbench.run_id": scope["test.scope"]}),
        "users_base": _container(api, "fleetbench/base:bookworm", scope, None, other="1"),  # inherits managed=true
        "users_of_v2": _container(api, v2, scope, "true"),  # inherits every bake label; keeps v2 in use
    }
    assert api.inspect_container(theirs["users_base"])["Config"]["Labels"]["org.fleetbench.managed"] == "true"

    dry = clean_engine(api, 0, 0, scope=scope, dry_run=True)
    assert ({c["id"] for c in dry.removed_containers} == set(ours.values())
            and [i["id"] for i in dry.removed_images] == [v1])
    assert all(_exists(api, "container", c) for c in ours.values()) and _exists(api, "image", v1)

    report = clean_engine(api, 0, 0, scope=scope)
    assert report.errors == []
    assert {c["id"] for c in report.removed_containers} == set(ours.values())
    assert [i["id"] for i in report.removed_images] == [v1]
    assert not any(_exists(api, "container", c) for c in ours.values()) and not _exists(api, "image", v1)
    assert all(_exists(api, "container", c) for c in theirs.values())
    assert all(_exists(api, "image", i) for i in (v2, v3, child, smoke_image, "fleetbench/base:bookworm"))
    kept = {k["id"]: k["reason"] for k in report.kept}
    assert kept[v3] == f"current bake of {name}" and "used by container" in kept[v2]
    assert kept[theirs["case_running"]] == "container is running"

    # The same through the maintenance DAG, after a fourth bake supersedes v3 and a case container stops.
    v4 = prepare(api, bake_spec(name, smoke_image, run=["sh", "-c", "echo 4 > /v"]), extra_labels=scope)
    stopped = _container(api, smoke_image, scope, "true", **fb, **{"org.fleetbench.run_id": scope["test.scope"]})
    api.remove_image(f"other/{name}-child:1")  # the child holds v3's layers; let it go so v3 can really be deleted
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("fleetbench_maintenance")
    assert dag.tags and dag.default_args["retries"] >= 1
    run = dag.test(run_conf={"container_max_age_h": 0, "image_max_age_h": 0, "scope": scope})
    assert run.state == "success"
    assert not _exists(api, "container", stopped) and not _exists(api, "image", v3)
    assert _exists(api, "image", v4.baked_id) and _exists(api, "image", v2)
    assert all(_exists(api, "container", c) for c in theirs.values())
