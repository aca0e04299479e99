"""Pure parts of image preparation, baking and cleanup: error naming, pull progress, bake identity,
the bake config, and the cleanup rules. No engine needed; inputs are the engine's real messages and
listings (recorded from Docker 20.10 and docker-registry on this machine)."""

from __future__ import annotations

import os

import pytest
from docker.errors import APIError, NotFound

from fleetbench.bake import BakeError, baked_tag, inputs_hash, resolve_src, tree_hash
from fleetbench.cleanup import bake_tag_of, created_by_fleetbench, plan_cleanup
from fleetbench.config import ConfigError, parse_config
from fleetbench.images import PreparedImage, PullProgress, _repository, check_disk, classify_pull_error, ref_tag

# What the engine said, verbatim (docker-py wraps the daemon's message in an APIError or NotFound).
ENGINE_ERRORS = [
    (NotFound, 'manifest for 127.0.0.1:5000/fleetbench/cpu-smoke:nope not found: manifest unknown: manifest unknown',
     "image_not_found"),
    (APIError, 'Get "http://127.0.0.1:57809/v2/": dial tcp 127.0.0.1:57809: connect: connection refused',
     "registry_unreachable"),
    (APIError, 'Head "http://127.0.0.1:5001/v2/fleetbench/cpu-smoke/manifests/latest": no basic auth credentials',
     "registry_auth"),
    (APIError, "unauthorized: authentication required", "registry_auth"),
    (APIError, "pull access denied for nope, repository does not exist or may require 'docker login'",
     "image_not_found"),
    (APIError, "write /var/lib/docker/tmp/GetImageBlob123: no space left on device", "insufficient_disk"),
    (APIError, "received unexpected HTTP status: 503 Service Unavailable", "registry_unreachable"),
    (APIError, "something nobody has seen before", "pull_failed"),
    # an arm64 host (GH200) pulling a tag published for amd64 only: permanent, named, not retried as pull_failed
    (APIError, "500 Server Error: no matching manifest for linux/arm64/v8 in the manifest list entries",
     "image_not_found"),
]


@pytest.mark.parametrize("cls, message, expected", ENGINE_ERRORS,
                         ids=[e[2] + str(i) for i, e in enumerate(ENGINE_ERRORS)])
def test_engine_errors_get_their_names(cls, message, expected):
    assert classify_pull_error(cls(message)) == expected


@pytest.mark.parametrize("ref, repo, tag", [
    ("127.0.0.1:5000/fleetbench/cpu-smoke:latest", "127.0.0.1:5000/fleetbench/cpu-smoke", "latest"),
    ("127.0.0.1:5000/fleetbench/cpu-smoke", "127.0.0.1:5000/fleetbench/cpu-smoke", None),
    ("nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "nvcr.io/nvidia/tensorflow", "23.03-tf1-py3"),
    ("a/b:1.0@sha256:" + "a" * 64, "a/b", "1.0"),
])
def test_repository_and_tag_of_a_reference(ref, repo, tag):
    assert (_repository(ref), ref_tag(ref)) == (repo, tag)


# A real pull stream (one cached layer, one 3 MB layer), one "Downloading" event per chunk in reality.
PULL_EVENTS = [
    {"status": "Pulling from fleetbench/probe-cap", "id": "t"},
    {"status": "Already exists", "progressDetail": {}, "id": "ded2691ed5d4"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "374fc532e4cc"},
    *[{"status": "Downloading", "progressDetail": {"current": c, "total": 3001131}, "id": "374fc532e4cc"}
      for c in range(36412, 3001131, 36412)],
    {"status": "Verifying Checksum", "progressDetail": {}, "id": "374fc532e4cc"},
    {"status": "Download complete", "progressDetail": {}, "id": "374fc532e4cc"},
    *[{"status": "Extracting", "progressDetail": {"current": c, "total": 3001131}, "id": "374fc532e4cc"}
      for c in range(32768, 3001131, 32768)],
    {"status": "Pull complete", "progressDetail": {}, "id": "374fc532e4cc"},
    {"status": "Digest: sha256:1c76ce37f3ba27c425f4df11ef188d2c14aa8631660819520eb7cbe929d2a4ff"},
    {"status": "Status: Downloaded newer image for 127.0.0.1:5000/fleetbench/probe-cap:t"},
]


def test_pull_progress_logs_layers_and_bytes_not_chunks_and_records_the_digest():
    ticks = iter(range(0, 10_000, 1))  # one "second" per clock read
    progress = PullProgress("r", every_s=20, clock=lambda: next(ticks))
    lines = [line for e in PULL_EVENTS for line in progress.feed(e)]
    assert len(PULL_EVENTS) > 150 and len(lines) < 20
    assert "layer ded2691ed5d4: Already exists" in lines
    assert "layer 374fc532e4cc: Pull complete" in lines
    byte_lines = [line for line in lines if "MB downloaded" in line]
    assert 1 <= len(byte_lines) <= 5, byte_lines
    assert progress.digest == "sha256:1c76ce37f3ba27c425f4df11ef188d2c14aa8631660819520eb7cbe929d2a4ff"
    assert progress.summary().startswith("2 layer(s): 1 pulled, 1 already present; 3.0 MB downloaded")


def test_pull_progress_raises_the_engines_error_event():
    with pytest.raises(APIError, match="unauthorized"):
        PullProgress("r").feed({"errorDetail": {"message": "unauthorized: authentication required"},
                                "error": "unauthorized: authentication required"})


def test_disk_check_refuses_with_the_numbers():
    result = PreparedImage("tf1", "nvcr.io/nvidia/tensorflow:23.03-tf1-py3")
    assert not check_disk(result, 40, 12 * 10**9, "pulling")
    assert result.failure_class == "insufficient_disk"
    assert ("only 12.0 GB free" in result.error and "min_free_gb=40" in result.error
            and "refused before pulling" in result.error)
    assert check_disk(PreparedImage("a", "b"), 40, 41 * 10**9, "pulling")
    assert check_disk(PreparedImage("a", "b"), 40, None, "pulling")  # unknown: warned, not refused
    assert check_disk(PreparedImage("a", "b"), None, 1, "pulling")


# -- bake identity ----------------------------------------------------------------------------
def test_inputs_hash_is_deterministic_and_covers_every_input():
    base = dict(base_digest="sha256:" + "1" * 64, copies=[{"dest": "/opt/h", "sha256": "ab"}],
                git={"url": "https://x/y.git", "branch": "b", "dest": "/w", "revision": "c" * 40},
                run=["sh", "-c", "true"], network="none", platform="linux/x86_64")
    h = inputs_hash(**base)
    assert h == inputs_hash(**base) and len(h) == 64
    # the platform too: a multi-arch base has one digest on arm64 and x86, what `run` built is of one of them
    for key, other in [("base_digest", "sha256:" + "2" * 64), ("copies", [{"dest": "/opt/h", "sha256": "ac"}]),
                       ("git", {**base["git"], "revision": "d" * 40}), ("run", ["true"]), ("network", "host"),
                       ("platform", "linux/aarch64")]:
        assert inputs_hash(**{**base, key: other}) != h, key


def test_baked_tag_is_base_tag_plus_short_hash():
    h = "0123456789ab" + "f" * 52
    assert baked_tag("nvcr.io/nvidia/tensorflow:23.03-tf1-py3", h) == "23.03-tf1-py3-0123456789ab"
    assert baked_tag("127.0.0.1:5000/x@sha256:" + "9" * 64, h) == "999999999999-0123456789ab"
    assert baked_tag("127.0.0.1:5000/x", h) == "latest-0123456789ab"


def test_tree_hash_sees_content_and_exec_bit(tmp_path):
    (tmp_path / "h").mkdir()
    f = tmp_path / "h" / "run.py"
    f.write_text("print(1)\n")
    first = tree_hash(tmp_path / "h")
    assert tree_hash(tmp_path / "h") == first
    os.chmod(f, 0o755)
    assert tree_hash(tmp_path / "h") != first
    f.write_text("print(2)\n")
    assert tree_hash(tmp_path / "h") != first


def test_copy_sources_must_stay_under_include(tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "secret").write_text("x")
    (tmp_path / "include" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(BakeError, match="outside"):
        resolve_src("include/link", tmp_path)
    with pytest.raises(BakeError, match="does not exist"):
        resolve_src("include/nope", tmp_path)


def _config(bake: dict) -> dict:
    return {"hosts": [{"name": "h"}],
            "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "command": ["python"],
                        "bake": bake}],
            "benchmarks": [{"name": "b", "image": "tf1", "models": ["resnet50"], "batch_sizes": [64]}]}


def test_bake_config_loads_and_names_bad_fields():
    cfg = parse_config(_config({"git": {"url": "https://github.com/tensorflow/benchmarks.git",
                                        "branch": "cnn_tf_v1.15_compatible", "dest": "/workspace/benchmarks"},
                                "copy": [{"src": "include/images/cpu-smoke", "dest": "/opt/smoke"}],
                                "push_to": "127.0.0.1:5000"}))
    assert cfg.images[0].bake.copy_[0].dest == "/opt/smoke"
    assert cfg.images[0].model_dump(mode="json")["bake"]["copy"][0]["src"] == "include/images/cpu-smoke"
    with pytest.raises(ConfigError) as info:
        parse_config(_config({"copy": [{"src": "include/../../etc", "dest": "opt"}],
                              "git": {"url": "-uhttps://x", "branch": "--upload-pack=x", "dest": "/w"}}))
    fields = sorted(e.split(":")[0] for e in info.value.errors)
    assert fields == ["images[0].bake.copy[0].dest", "images[0].bake.copy[0].src", "images[0].bake.git.branch",
                      "images[0].bake.git.url"]
    with pytest.raises(ConfigError, match="bake needs at least one of copy, git or run"):
        parse_config(_config({}))


# -- cleanup rules ----------------------------------------------------------------------------
SMOKE_LABELS = {"org.fleetbench.managed": "true", "org.fleetbench.kind": "benchmark"}


def test_inherited_fleetbench_labels_do_not_make_a_container_fleetbenchs():
    case = {**SMOKE_LABELS, "org.fleetbench.run_id": "manual__1", "org.fleetbench.case_key": "k"}
    assert created_by_fleetbench(case, SMOKE_LABELS)
    # someone's `docker run` of our image
    assert not created_by_fleetbench({**SMOKE_LABELS, "other": "1"}, SMOKE_LABELS)
    baked = {**SMOKE_LABELS, "org.fleetbench.bake.step": ""}
    assert not created_by_fleetbench(baked, baked)  # a container of a baked image
    assert created_by_fleetbench({**baked, "org.fleetbench.bake.step": "abc"}, baked)  # a setup container
    committed = {**SMOKE_LABELS, "org.fleetbench.run_id": "manual__1"}  # someone committed a case container
    assert not created_by_fleetbench(committed, committed)


def _baked(iid: str, name: str, inputs: str, created: int, tags: list[str], **labels) -> dict:
    return {"Id": iid, "Created": created, "RepoTags": tags,
            "Labels": {"org.fleetbench.managed": "true", "org.fleetbench.kind": "baked", "org.fleetbench.image": name,
                       "org.fleetbench.bake.inputs": inputs, **labels}}


def test_cleanup_plan_removes_only_old_superseded_bakes_and_stopped_fleetbench_containers():
    now = 1_000_000
    old = _baked("sha256:old", "TF1", "a" * 64, now - 9000,
                 ["fleetbench/tf1:23.03-aaaaaaaaaaaa", "reg:5000/fleetbench/tf1:23.03-aaaaaaaaaaaa"])
    current = _baked("sha256:cur", "TF1", "b" * 64, now - 99000,
                     ["fleetbench/tf1:23.03-bbbbbbbbbbbb", "fleetbench/tf1:current"])
    young = _baked("sha256:young", "TF1", "c" * 64, now - 10, ["fleetbench/tf1:23.03-cccccccccccc"])
    used = _baked("sha256:used", "TF1", "d" * 64, now - 9000, ["fleetbench/tf1:23.03-dddddddddddd"])
    # FROM a bake: labels, not the tag
    child = _baked("sha256:child", "TF1", "a" * 64, now - 9000, ["someone/derived:1"])
    assert bake_tag_of(old) == "fleetbench/tf1:23.03-aaaaaaaaaaaa" and bake_tag_of(child) is None
    containers = [
        {"Id": "c1", "Names": ["/fb-case"], "State": "exited", "Age": 7200, "ImageID": "sha256:x",
         "Labels": {**SMOKE_LABELS, "org.fleetbench.run_id": "r"}, "ImageLabels": SMOKE_LABELS},
        {"Id": "c2", "Names": ["/fb-running"], "State": "running", "Age": 7200, "ImageID": "sha256:x",
         "Labels": {**SMOKE_LABELS, "org.fleetbench.run_id": "r"}, "ImageLabels": SMOKE_LABELS},
        {"Id": "c3", "Names": ["/fb-fresh"], "State": "exited", "Age": 5, "ImageID": "sha256:x",
         "Labels": {**SMOKE_LABELS, "org.fleetbench.run_id": "r"}, "ImageLabels": SMOKE_LABELS},
        {"Id": "c4", "Names": ["/users"], "State": "exited", "Age": 7200, "ImageID": "sha256:used",
         "Labels": SMOKE_LABELS, "ImageLabels": SMOKE_LABELS},
    ]
    rc, ri, kept = plan_cleanup(containers, [old, current, young, used, child], now, container_max_age_s=3600,
                                image_max_age_s=3600)
    assert [c["id"] for c in rc] == ["c1"]
    assert [i["id"] for i in ri] == ["sha256:old"]
    assert ri[0]["tags"] == sorted(old["RepoTags"])
    reasons = {k["id"]: k["reason"] for k in kept}
    assert reasons["sha256:cur"] == "current bake of tf1"
    assert "used by container users" in reasons["sha256:used"]
    assert "younger than" in reasons["sha256:young"] and "younger than" in reasons["c3"]
    assert reasons["c2"] == "container is running"
    assert "c4" not in reasons and "sha256:child" not in reasons  # not fleetbench's: not even listed
    # scope narrows to labelled objects
    rc, ri, _ = plan_cleanup(containers, [old, current], now, 3600, 3600, scope={"org.fleetbench.run_id": "other"})
    assert rc == [] and ri == []

    # a superseded bake someone else tagged too (`docker tag ... teamb/tf-harness:prod`): only fleetbench's tags go,
    # the image stays for theirs (every tag and then the image were removed)
    shared = {**old, "RepoTags": [*old["RepoTags"], "teamb/tf-harness:prod"]}
    _, ri, _ = plan_cleanup([], [shared, current], now, 3600, 3600)
    assert [(i["id"], i["tags"], i["keep_image"]) for i in ri] == [("sha256:old", sorted(old["RepoTags"]), True)]
    assert ri[0]["reason"].endswith("only fleetbench's tags removed, the image stays for teamb/tf-harness:prod")


def test_a_superseded_bake_is_aged_from_when_it_stopped_being_current():
    """A bake built 30 days ago that a newer bake superseded an hour ago may still be pinned by a run in progress:
    it stays for the image age limit from its `superseded-<unix time>` stamp (it was removed by its build time)."""
    now = 10_000_000
    old = _baked("sha256:old", "tf1", "a" * 64, now - 30 * 86400,
                 ["fleetbench/tf1:23.03-aaaaaaaaaaaa", f"fleetbench/tf1:superseded-{now - 3600}-0123456789ab"])
    current = _baked("sha256:cur", "tf1", "b" * 64, now - 3600, ["fleetbench/tf1:23.03-bbbbbbbbbbbb",
                                                               "fleetbench/tf1:current"])
    unstamped = _baked("sha256:older", "tf1", "c" * 64, now - 30 * 86400, ["fleetbench/tf1:23.03-cccccccccccc"])
    _, ri, kept = plan_cleanup([], [old, current, unstamped], now, 3600, image_max_age_s=7 * 86400)
    assert [i["id"] for i in ri] == ["sha256:older"]  # no stamp: aged by its build, as before
    assert {k["id"]: k["reason"] for k in kept}["sha256:old"] == "superseded 3600 s old, younger than 604800 s"
    # past the limit from the stamp it goes, with its stamp tag
    _, ri, _ = plan_cleanup([], [old, current], now + 7 * 86400, 3600, image_max_age_s=7 * 86400)
    assert [(i["id"], i["tags"]) for i in ri] == [("sha256:old", sorted(old["RepoTags"]))]


def test_a_bake_that_lost_its_tag_to_a_bake_of_the_same_inputs_is_still_cleaned_up():
    """Two lanes on one engine baking the same inputs at once both commit `fleetbench/tf1:23.03-<inputs12>`: the first
    image keeps only the `current` tag, then the `superseded-` stamp the second bake's make_current gives it. It was
    not recognised as a bake (no deterministic tag) and stayed for ever."""
    now = 10_000_000
    stamp = f"fleetbench/tf1:superseded-{now - 86400}-0123456789ab"
    lost = _baked("sha256:first", "tf1", "a" * 64, now - 86400, [stamp])
    won = _baked("sha256:second", "tf1", "a" * 64, now - 86400, ["fleetbench/tf1:23.03-aaaaaaaaaaaa",
                                                                 "fleetbench/tf1:current"])
    assert bake_tag_of(lost) == stamp
    _, ri, kept = plan_cleanup([], [lost, won], now, 3600, image_max_age_s=3600)
    assert [(i["id"], i["tags"]) for i in ri] == [("sha256:first", lost["RepoTags"])]
    assert {k["id"]: k["reason"] for k in kept} == {"sha256:second": "current bake of tf1"}
    # the other order: the second bake made current first, then the first; the second keeps the deterministic tag
    current_only = {**lost, "RepoTags": ["fleetbench/tf1:current"]}
    assert bake_tag_of(current_only) == "fleetbench/tf1:current"
    _, ri, kept = plan_cleanup([], [current_only, {**won, "RepoTags": won["RepoTags"][:1]}], now, 3600, 3600)
    assert [i["id"] for i in ri] == ["sha256:second"] and kept[0]["id"] == "sha256:first"
    # an image built FROM a bake, tagged anywhere else, is still not fleetbench's
    assert bake_tag_of({**lost, "RepoTags": ["someone/tf1:current", "fleetbench/other:current"]}) is None


def test_cleanup_plan_stops_case_containers_running_past_their_timeout():
    """An orphan of a SIGKILLed worker: running, with a run mark and its own timeout label, for longer than
    the timeout plus the grace. A case still within it, or a container without the label, is kept."""
    case = {**SMOKE_LABELS, "org.fleetbench.run_id": "r", "org.fleetbench.timeout_s": "600"}

    def running(cid, running_for, labels=case):
        return {"Id": cid, "Names": [f"/{cid}"], "State": "running", "Age": 0, "RunningFor": running_for,
                "ImageID": "sha256:x", "Labels": labels, "ImageLabels": SMOKE_LABELS}

    containers = [running("orphan", 600 + 301), running("in-time", 600 + 299), running("no-label", 99999, {
        **SMOKE_LABELS, "org.fleetbench.run_id": "r"}),
        running("odd-label", 99999, {**case, "org.fleetbench.timeout_s": "x"})]
    rc, _, kept = plan_cleanup(containers, [], 1_000_000, 3600, 3600, orphan_grace_s=300)
    assert [(c["id"], c["running"]) for c in rc] == [("orphan", True)]
    assert "past its timeout of 600 s" in rc[0]["reason"]
    assert {k["id"] for k in kept} == {"in-time", "no-label", "odd-label"}


def test_maintenance_engines_are_keyed_by_host_queue_and_tls(tmp_path):
    from fleetbench.cleanup import engines_of

    config = tmp_path / "fleet.yaml"
    config.write_text("""
hosts:
  - {name: central-a}
  - {name: central-b}
  - {name: gpu-b, queue: fleet-gpu-b}
  - {name: gpu-c, queue: fleet-gpu-c}
  - {name: remote, connection: ssh_remote, docker_url: "tcp://gpu-7:2376", docker_tls_conn_id: certs}
images: [{name: i, ref: "127.0.0.1:5000/x:1", command: [python3]}]
benchmarks: [{name: b, image: i, models: [m], batch_sizes: [1]}]
""")
    engines = sorted(engines_of(str(config)), key=lambda e: e["hosts"])
    assert engines == [
        {"queue": None, "docker_url": "unix:///var/run/docker.sock", "docker_tls_conn_id": None,
         "hosts": ["central-a", "central-b"]},
        {"queue": "fleet-gpu-b", "docker_url": "unix:///var/run/docker.sock", "docker_tls_conn_id": None,
         "hosts": ["gpu-b"]},
        {"queue": "fleet-gpu-c", "docker_url": "unix:///var/run/docker.sock", "docker_tls_conn_id": None,
         "hosts": ["gpu-c"]},
        {"queue": None, "docker_url": "tcp://gpu-7:2376", "docker_tls_conn_id": "certs", "hosts": ["remote"]},
    ]


class _Engine:
    """Docker Hub's side of an engine, which this machine cannot reach: an image that is there, as `inspect` shows
    it (RepoDigests in Docker's short form), and a pull that fails as `pull_error` says."""

    base_url = "http+docker://localhost"

    def __init__(self, repo_digests=(), pull_error=None):
        self.repo_digests, self.pull_error, self.pulls = list(repo_digests), pull_error, 0

    def inspect_image(self, ref):
        return {"Id": "sha256:" + "e" * 64, "RepoDigests": self.repo_digests}

    def pull(self, ref, **kwargs):
        self.pulls += 1
        raise self.pull_error

    def info(self):
        return {"DockerRootDir": "/"}


@pytest.mark.parametrize("ref", ["docker.io/library/ubuntu:22.04", "library/ubuntu:22.04", "ubuntu:22.04"])
def test_a_docker_hub_reference_written_in_full_is_pinned_to_its_digest(ref):
    from fleetbench.images import prepare_image

    digest = "sha256:" + "1" * 64
    result = prepare_image(_Engine([f"ubuntu@{digest}"]), "u", ref, pull_policy="if-missing")
    assert (result.digest, result.pinned_ref) == (digest, f"{ref.rsplit(':', 1)[0]}@{digest}")  # was the image id


def test_a_connection_that_breaks_mid_pull_is_retried_and_named_not_raised():
    import requests

    from fleetbench.images import prepare_image

    engine = _Engine(pull_error=requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected())"))
    result = prepare_image(engine, "u", "ubuntu:22.04", pull_policy="always", attempts=3, backoff_s=0)
    assert (result.failure_class, result.pull_attempts, engine.pulls) == ("docker_unreachable", 3, 3)
    assert classify_pull_error(requests.exceptions.ReadTimeout("Read timed out. (read timeout=600)")) == (
        "registry_unreachable")  # a pull that stalls at the registry
    # the engine restarting mid-pull: our connection to it reset, then refused (not the registry's doing)
    for text in ("('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))",
                 "('Connection aborted.', ConnectionRefusedError(111, 'Connection refused'))"):
        assert classify_pull_error(requests.exceptions.ConnectionError(text)) == "docker_unreachable", text
    from docker.errors import APIError

    assert classify_pull_error(APIError("500 Server Error: Get https://nvcr.io/v2/: dial tcp: connection refused")) \
        == "registry_unreachable"  # the engine's answer about the registry


def test_the_disk_is_measured_here_only_for_this_machines_engine():
    from fleetbench.images import free_disk_bytes

    assert free_disk_bytes(_Engine()) is not None  # a unix socket: this machine
    ssh = _Engine()
    ssh.base_url = "http+docker://ssh"  # docker-py's name for an ssh:// engine: another machine's disk
    assert free_disk_bytes(ssh) is None


@pytest.mark.parametrize("url, public", [
    ("https://ci-bot:ghp_SECRET@github.com/org/benchmarks.git", "https://github.com/org/benchmarks.git"),
    ("https://ghp_SECRET@git.example.com:8443/org/b.git", "https://git.example.com:8443/org/b.git"),
    ("https://github.com/tensorflow/benchmarks.git", "https://github.com/tensorflow/benchmarks.git"),
    ("file:///srv/git/benchmarks.git", "file:///srv/git/benchmarks.git"),
    # a password with an unencoded '/', '?' or '#' (a base64 one): urlsplit takes its start for the host
    ("https://bot-at-1:Ab3/Xy9+Qz=@git-codecommit.example/v1/repos/b", "https://git-codecommit.example/v1/repos/b"),
    ("https://bot:pa?ss#x@git.example/org/b.git", "https://git.example/org/b.git"),
])
def test_the_bakes_source_never_carries_the_git_urls_credentials(url, public):
    from fleetbench.bake import public_url

    assert public_url(url) == public


def test_a_failed_git_call_does_not_print_the_token():
    from fleetbench.bake import git_revision

    with pytest.raises(BakeError) as info:  # nothing listens on port 1: git fails at once, naming the URL
        git_revision("https://ci-bot:ghp_SECRET@127.0.0.1:1/org/benchmarks.git", "master")
    assert "ghp_SECRET" not in str(info.value) and "ci-bot" not in str(info.value)


def test_a_git_call_that_times_out_does_not_print_the_token(tmp_path, monkeypatch):
    """A slow git server: the timeout's message is the whole command line, the URL's token with it, and it went to
    XCom, the rows and the logs."""
    import fleetbench.bake as bake

    slow = tmp_path / "git"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(bake, "GIT_TIMEOUT_S", 0.2)
    with pytest.raises(BakeError) as info:
        bake.git_revision("https://ci-bot:ghp_SECRET@git.example/org/benchmarks.git", "master")
    assert str(info.value) == "git ls-remote: no answer within 0.2 s"


def test_a_git_url_with_a_token_is_a_config_warning():
    from fleetbench.config import config_warnings

    cfg = parse_config(_config({"git": {"url": "https://ci-bot:ghp_SECRET@github.com/org/b.git", "branch": "main",
                                        "dest": "/opt/b"}}))
    assert [w for w in config_warnings(cfg) if "bake.git.url" in w] == [
        "images[0].bake.git.url: carries a password or token: it stays out of the image, its labels, rows and logs, "
        "but the config and the run's plan (XCom) hold it; use a deploy key (ssh://) or git's credential helper on "
        "the workers"]
    bare = parse_config(_config({"git": {"url": "https://ghp_SECRET@github.com/org/b.git", "branch": "main",
                                         "dest": "/opt/b"}}))
    assert [w for w in config_warnings(bare) if "bake.git.url" in w]  # a token alone, without a user
    plain = parse_config(_config({"git": {"url": "https://github.com/org/b.git", "branch": "main", "dest": "/opt/b"}}))
    assert not [w for w in config_warnings(plain) if "bake.git.url" in w]
    encoded = parse_config(_config({"git": {"url": "https://bot:Sup3r%21pw@git.example/org/b.git", "branch": "main",
                                            "dest": "/opt/b"}}))  # a percent-encoded password is a URL too
    assert [w for w in config_warnings(encoded) if "bake.git.url" in w]
    base64 = parse_config(_config({"git": {"url": "https://bot:Ab3/Xy9+Qz@git.example/org/b.git", "branch": "main",
                                           "dest": "/opt/b"}}))  # a '/' in the password: a token all the same
    assert [w for w in config_warnings(base64) if "bake.git.url" in w]


@pytest.mark.parametrize("url, shown", [
    ("http://bot:ghp_SECRET@git.example/org/b.git", "http://git.example/org/b.git"),  # refused: http
    ("https://bot:ghp_SECRET@git.example/org/b.git#x", "https://git.example/org/b.git#x"),  # refused: '#'
    ("https://bot:ghp/SECRET=@git.example/org/b.git", "https://git.example/org/b.git"),  # refused: '='
])
def test_a_refused_git_url_is_named_without_its_token(url, shown):
    """The config error (the DAG's import error too, which anyone who sees the DAG can read) shows the URL without
    its user and password."""
    from fleetbench.config import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(_config({"git": {"url": url, "branch": "main", "dest": "/opt/b"}}))
    message = str(info.value)
    assert "images[0].bake.git.url: must match" in message and "SECRET" not in message and "bot" not in message
    assert f"got {shown!r}" in message


@pytest.mark.parametrize("error, failure_class", [
    ("reset", "docker_unreachable"), ("timeout", "bake_failed"), ("disk", "insufficient_disk")])
def test_an_engine_error_during_a_bake_is_that_images_failure_not_the_lanes(monkeypatch, error, failure_class):
    """The engine breaking off mid-bake (put_archive reset, commit timing out, tag out of space) raised out of the
    lane's task: every case of the host read `task_failed`, the host's other images lost. It is this image's named
    failure now."""
    import requests
    from docker.errors import APIError

    from fleetbench import prepare as P
    from fleetbench.config import parse_config

    raised = {"reset": requests.exceptions.ConnectionError("('Connection aborted.', ConnectionResetError(104))"),
              "timeout": requests.exceptions.ReadTimeout("Read timed out. (read timeout=600)"),
              "disk": APIError("500 Server Error: tag: no space left on device")}[error]
    pulled = PreparedImage("tf1", "127.0.0.1:5000/tf:1", pinned_ref="127.0.0.1:5000/tf@sha256:" + "a" * 64)
    monkeypatch.setattr(P, "prepare_image", lambda *a, **k: pulled)

    def bake(*args, **kwargs):
        raise raised

    monkeypatch.setattr(P, "bake_image", bake)
    spec = parse_config({"hosts": [{"name": "h"}], "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf:1",
                                                               "command": ["python3", "x.py"],
                                                               "bake": {"run": ["true"]}}],
                         "benchmarks": [{"name": "b", "image": "tf1", "models": ["m"], "batch_sizes": [8]}]}).images[0]
    result = P.prepare(object(), spec)
    assert (result.failure_class, result.ok) == (failure_class, False)
    assert result.error.startswith("bake of tf1: ")


def test_a_baked_images_name_must_be_a_docker_repository_name():
    from test_harnesses import config_errors

    bad = {"hosts": [{"name": "h"}], "images": [{"name": "cpu-smoke-", "ref": "127.0.0.1:5000/x:1",
                                                 "command": ["python3", "x.py"], "bake": {"run": ["true"]}}],
           "benchmarks": [{"name": "b", "image": "cpu-smoke-", "models": ["m"], "batch_sizes": [8]}]}
    assert config_errors(bad) == ["images[0].name: 'cpu-smoke-' cannot name its baked image fleetbench/cpu-smoke- "
                                  "(Docker repository names: letters and digits, separated by one '.', one or two "
                                  "'_', or '-')"]
    from fleetbench.config import parse_config

    parse_config({**bad, "images": [{**bad["images"][0], "bake": None}]})  # not baked: a name as any other


@pytest.mark.parametrize("layer_status, second_fails", [("Pull complete", True), ("Already exists", False)])
def test_a_remote_engines_free_space_goes_down_with_each_image_it_pulls(monkeypatch, layer_status, second_fails):
    """On a tcp:// engine the disk check reads the host check's df: each image's min_free_gb was checked against the
    same figure, so a second 15 GB image passed at "35 GB free" and filled the disk. Each pull that downloaded now
    counts; one the engine had every layer of ("Already exists", each night's `pull_policy: always` of a cached
    image) took no space, and it refused the next image every night."""
    from contextlib import contextmanager

    from docker.errors import ImageNotFound

    from fleetbench import engines
    from fleetbench.airflow.pipeline import prepare_host_images
    from fleetbench.config import parse_config
    from fleetbench.plan import build_plan
    from fleetbench.run_model import HostImages, HostVerdict

    gb = 10**9

    class TcpEngine:
        base_url = "https://gpu-a:2376"

        def __init__(self):
            self.pulled: dict[str, str] = {}

        def inspect_image(self, ref):
            repo = _repository(ref)
            if repo not in self.pulled:
                raise ImageNotFound("no such image")
            return {"Id": "sha256:" + "e" * 64, "RepoDigests": [f"{repo}@{self.pulled[repo]}"], "Size": 15 * gb}

        def pull(self, ref, **kwargs):
            repo = _repository(ref)
            self.pulled[repo] = "sha256:" + str(len(self.pulled) + 1) * 64
            yield {"id": "layer1", "status": layer_status}
            yield {"status": f"Digest: {self.pulled[repo]}"}

    engine = TcpEngine()

    @contextmanager
    def client(url, tls):
        yield engine

    monkeypatch.setattr(engines, "engine_client", client)
    cfg = parse_config({
        "hosts": [{"name": "gpu-a", "connection": "ssh_a", "docker_url": "tcp://gpu-a:2376",
                   "docker_tls_conn_id": "t"}],
        "images": [{"name": n, "ref": f"127.0.0.1:5000/{n}:1", "command": ["python3"], "min_free_gb": 30}
                   for n in ("tf1", "pt")],
        "benchmarks": [{"name": n, "image": n, "models": ["m"], "batch_sizes": [8]} for n in ("tf1", "pt")]})
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"})
    validation = HostVerdict(host="gpu-a", verdict="ready", facts={"docker_root_free_bytes": 35 * gb}).to_xcom()
    images = HostImages.load(prepare_host_images(plan.host("gpu-a").to_xcom(), [validation])).images
    if not second_fails:
        assert [(images[n]["failure_class"], images[n]["free_bytes"]) for n in sorted(images)] == [(None, 35 * gb)] * 2
        return
    first, second = (images[n] for n in sorted(images, key=lambda n: images[n].get("free_bytes") or 0, reverse=True))
    assert first["failure_class"] is None and first["free_bytes"] == 35 * gb
    assert (second["failure_class"], second["free_bytes"]) == ("insufficient_disk", 20 * gb)


def test_an_engine_that_breaks_off_after_a_pull_fails_that_image_named_and_the_lane_goes_on(monkeypatch):
    """The connection dropped on the inspect after a pull (the pin): it raised out of the lane's task, so the host's
    images already pinned were lost and every case of the host read `task_failed`, "see its task log" of a case
    task that never ran. It is that image's `docker_unreachable` now, the other image's cases run."""
    from contextlib import contextmanager

    import requests
    from docker.errors import ImageNotFound

    from fleetbench import engines
    from fleetbench.airflow.pipeline import prepare_host_images
    from fleetbench.config import parse_config
    from fleetbench.plan import build_plan
    from fleetbench.run_model import HostImages, HostVerdict

    class Engine:
        base_url = "http+docker://localhost"

        def __init__(self):
            self.pulled: set[str] = set()

        def info(self):
            raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected())")

        def inspect_image(self, ref):
            repo = _repository(ref)
            if repo not in self.pulled:
                raise ImageNotFound("no such image")
            if repo.endswith("/pt"):
                raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected())")
            return {"Id": "sha256:" + "e" * 64, "RepoDigests": [f"{repo}@sha256:{'1' * 64}"]}

        def pull(self, ref, **kwargs):
            self.pulled.add(_repository(ref))
            yield {"status": f"Digest: sha256:{'1' * 64}"}

    @contextmanager
    def client(url, tls):
        yield Engine()

    monkeypatch.setattr(engines, "engine_client", client)
    cfg = parse_config({
        "hosts": [{"name": "gpu-a"}],
        "images": [{"name": n, "ref": f"127.0.0.1:5000/{n}:1", "command": ["python3"]} for n in ("tf1", "pt")],
        "benchmarks": [{"name": n, "image": n, "models": ["m"], "batch_sizes": [8]} for n in ("tf1", "pt")]})
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"})
    validation = HostVerdict(host="gpu-a", verdict="ready").to_xcom()
    images = HostImages.load(prepare_host_images(plan.host("gpu-a").to_xcom(), [validation])).images
    assert images["tf1"]["failure_class"] is None and images["tf1"]["pinned_ref"].endswith("1" * 64)
    assert images["pt"]["failure_class"] == "docker_unreachable"
    assert images["pt"]["error"].startswith("Docker engine not reachable pinning 127.0.0.1:5000/pt:1: ")


def test_a_lane_that_failed_after_its_verdict_names_its_task_on_the_rows(tmp_path):
    """No images from a lane that gave its verdict: its `cases` task failed before they were ready, and no case task
    ran, so the rows name the lane's task, not a case task's log."""
    from fleetbench.airflow.pipeline import collect
    from fleetbench.config import parse_config
    from fleetbench.plan import build_plan
    from fleetbench.run_model import HostVerdict

    cfg = parse_config({"hosts": [{"name": "gpu-a"}],
                        "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf1:1", "command": ["python3"]}],
                        "benchmarks": [{"name": "b", "image": "tf1", "device": "cpu", "num_gpus": [0],
                                        "models": ["m"], "batch_sizes": [8]}]})
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"}).to_xcom()
    [row] = collect(plan, [HostVerdict(host="gpu-a", verdict="ready").to_xcom()], [None], [])["rows"]
    assert (row["status"], row["failure_class"]) == ("failed", "task_failed")
    assert row["failure_detail"] == ("the host's task host_gpu-a.cases failed after the host check, before the case's "
                                     "image was prepared (see its task log)")


def test_a_gpu_smoke_container_left_past_its_probes_time_is_removed_and_only_such_a_one():
    """A hung `nvidia-smi` in a host check's smoke container never exits, so `--rm` never removes it, and it holds the
    host's GPUs every night after. Maintenance removes one past the probe's time plus the grace; a label alone (an
    image can carry it) or a container within its time is not one to remove."""
    def smoke(cid, state, age, name=None, labels=None):
        return {"Id": cid, "Names": [f"/{name or 'fleetbench-gpu-smoke-' + cid}"], "State": state,
                "Age": age if state != "running" else 0, "RunningFor": age if state == "running" else None,
                "ImageID": "sha256:x", "Labels": {"org.fleetbench.probe": "gpu-smoke"} if labels is None else labels,
                "ImageLabels": {}}

    containers = [smoke("hung", "running", 120 + 301), smoke("young", "running", 100),
                  smoke("left", "exited", 3600), smoke("named-like", "running", 99999, name="my-gpu-job"),
                  smoke("no-label", "running", 99999, labels={})]
    rc, _, kept = plan_cleanup(containers, [], 1_000_000, 24 * 3600, 3600, orphan_grace_s=300)
    assert [(c["id"], c["running"]) for c in rc] == [("hung", True), ("left", False)]
    assert rc[0]["reason"] == ("a host check's GPU smoke container, running for 421 s (its check gave up after 120 s)")
    assert [k["id"] for k in kept] == ["young"]
    # one DAG's or one test's scope never covers a host check's container
    assert plan_cleanup(containers, [], 1_000_000, 24 * 3600, 3600, {"org.fleetbench.dag_id": "d"}, 300)[0] == []


def test_a_gpu_smoke_probe_that_times_out_removes_its_container_by_name(tmp_path):
    from fleetbench.hosts.probes import GPU_SMOKE_NAME_PREFIX, gather

    class Runner:
        name = "fake"

        def __init__(self):
            self.calls = []

        def run(self, argv, timeout_s):
            self.calls.append(list(argv))
            if "--gpus" in argv:  # the smoke container's `docker run`
                return None, b"", f"timed out after {timeout_s:g} s".encode()
            return 0, b"", b""

    runner = Runner()
    gather(runner, tmp_path, probes=(), gpu_smoke_image="fleetbench/base:bookworm")
    run, rm = runner.calls
    name = run[run.index("--name") + 1]
    assert name.startswith(GPU_SMOKE_NAME_PREFIX) and rm == ["docker", "rm", "-f", name]
    runner.calls.clear()
    gather(runner, tmp_path, probes=(), gpu_smoke_image="fleetbench/base:bookworm", path=("/opt/bin",))
    assert runner.calls[1][-4:] == ["docker", "rm", "-f", runner.calls[0][runner.calls[0].index("--name") + 1]]
    assert runner.calls[1][:2] == ["sh", "-c"]  # with the probes' PATH


def test_a_bake_on_a_remote_engine_is_checked_against_the_space_its_own_pull_left(monkeypatch):
    """A 20 GB base pulled from 50 GB free, then baked: the bake's min_free_gb check saw the 50 GB the pull started
    from."""
    import fleetbench.prepare as prep
    from fleetbench.bake import BakeResult
    from fleetbench.config import ImageSpec

    gb = 10**9

    class TcpEngine:
        base_url = "https://gpu-a:2376"
        had = set()

        def inspect_image(self, ref):
            from docker.errors import ImageNotFound

            if ref not in self.had and "@" not in ref:
                raise ImageNotFound("no such image")
            return {"Id": "sha256:" + "e" * 64, "RepoDigests": [f"127.0.0.1:5000/tf@sha256:{'1' * 64}"],
                    "Size": 20 * gb}

        def pull(self, ref, **kwargs):
            self.had.add(ref)
            yield {"id": "layer1", "status": "Pull complete"}
            yield {"status": f"Digest: sha256:{'1' * 64}"}

    seen = []

    def bake_image(api, name, spec, **kwargs):
        seen.append(kwargs["free_bytes_hint"])
        return BakeResult(ref="fleetbench/tf:1-x", image_id="sha256:" + "f" * 64, cache_hit=True, inputs="x" * 64,
                          source="run-only", revision="none", labels={})

    monkeypatch.setattr(prep, "bake_image", bake_image)
    spec = ImageSpec.model_validate({"name": "tf", "ref": "127.0.0.1:5000/tf:1", "command": ["python3"],
                                     "min_free_gb": 10, "bake": {"run": ["true"]}})
    assert prep.prepare(TcpEngine(), spec, free_bytes_hint=50 * gb).ok
    assert seen == [30 * gb]
