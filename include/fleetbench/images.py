"""Image preparation: check disk, pull with a pull policy and retries, pin the sha256 digest, optionally bake.

Every case of a run uses the pinned reference that was prepared for that run (`repo@sha256:...`, or an
image id), so a tag that moves while the run is going does not change what is measured.

`fleetbench.prepare` is the whole stage for one image on one engine: disk check -> pull
(`prepare_image`, here) -> bake (`fleetbench.bake`). Registry trouble never raises: the result names
the failure (`failure_class`, see `fleetbench.failures`) with a message for people. Nothing here imports Airflow;
registry credentials arrive as a Docker `auth_config` dict and are never logged.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Callable

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from fleetbench import failures
from fleetbench.config import GB
from fleetbench.registry import repository_of

log = logging.getLogger(__name__)

# Failures that another attempt cannot fix: no retry.
PERMANENT = failures.PERMANENT


@dataclass
class PreparedImage:
    """What the prepare-image step hands to the rest of the run (JSON-able, via `to_dict`).

    - `ref`: the configured reference; `digest`: the registry digest (sha256:...) of the image that
      was *pulled* (the base image when baking). Result rows record this digest as `image_digest`.
    - `pinned_ref`: what every case of the run executes. Without a bake it is `repo@sha256:<digest>`
      (or the local image id for an image that never came from a registry); with a bake it is the
      baked image's id on this host.
    - A baked image records where it came from in its own labels (`org.fleetbench.bake.base_digest`,
      `.bake.inputs`, `.harness.source`, `.harness.revision`, `.version`); here `baked_ref` is its
      deterministic tag, `baked_id` its image id, `base_pinned_ref` the pinned base it was made from.
    """

    name: str
    ref: str
    pinned_ref: str | None = None
    digest: str | None = None
    image_id: str | None = None
    pulled: bool = False
    failure_class: str | None = None
    error: str | None = None
    pull_attempts: int = 0
    base_pinned_ref: str | None = None
    baked_ref: str | None = None
    baked_id: str | None = None
    bake_cache_hit: bool | None = None
    bake_inputs: str | None = None
    harness_source: str | None = None
    harness_revision: str | None = None
    pushed_ref: str | None = None
    free_bytes: int | None = None
    # layers the pull downloaded ("Pull complete"; 0: the engine had every one, the image took no space); None:
    # not pulled
    fetched_layers: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure_class is None

    def fail(self, failure_class: str, error: str) -> "PreparedImage":
        self.failure_class, self.error = failure_class, error
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def _repository(ref: str) -> str:
    """`host:5000/a/b:tag` -> `host:5000/a/b` (a port colon is not a tag separator)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref.rsplit(":", 1)[0] if ":" in last else ref


def ref_tag(ref: str) -> str | None:
    """The tag of a reference (`a/b:1.0@sha256:...` -> `1.0`), None when it has none."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def classify_pull_error(exc: Exception) -> str:
    """Name a pull/push failure from the engine's error (the daemon wraps most registry errors in a 500)."""
    text = str(exc).lower()
    if "no space left on device" in text:
        return "insufficient_disk"
    if ("unauthorized" in text or "authentication required" in text or "no basic auth credentials" in text
            or "incorrect username or password" in text or " 401 " in text):
        return "registry_auth"
    if (isinstance(exc, (NotFound, ImageNotFound)) or "manifest unknown" in text or "not found" in text
            or "repository does not exist" in text or "name unknown" in text
            or "no matching manifest for" in text):  # a manifest list without the host's platform: no retry helps
        return "image_not_found"
    if "denied" in text:
        return "registry_auth"
    if isinstance(exc, requests.ConnectionError) and not isinstance(exc, DockerException):
        # the connection to the engine itself broke or was refused (a dockerd restart mid-pull), not the registry's:
        # the engine wraps a registry's errors in its answers (an APIError), it does not drop our connection
        return "docker_unreachable"
    if any(s in text for s in ("connection refused", "no such host", "timeout", "timed out", "deadline exceeded",
                               "dial tcp",
                               "connection reset", "no route to host", "unexpected eof", "tls handshake",
                               "service unavailable", "bad gateway", "503", "502")):
        return "registry_unreachable"
    if isinstance(exc, requests.RequestException) and not isinstance(exc, DockerException):  # not an answer (an
        return "docker_unreachable"  # APIError is one, an HTTPError): the connection to the engine itself broke
    return "pull_failed"


class PullProgress:
    """Turns the engine's pull event stream into a few log lines and records the resolved digest.

    One line per layer state change ("Pulling fs layer", "Download complete", "Pull complete",
    "Already exists"), one per retry the engine makes of a layer ("Retrying in N seconds", not its
    countdown), a bytes line at most every `every_s` seconds while downloading, never one line per chunk.
    `digest` is the manifest digest the engine reports ("Digest: sha256:..."): the digest of exactly
    what this pull fetched, even if the tag moves a moment later.
    """

    DONE = ("Pull complete", "Already exists")

    def __init__(self, ref: str, every_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.ref = ref
        self.every_s = every_s
        self.clock = clock
        self.layers: dict[str, str] = {}
        self.current: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.digest: str | None = None
        self._last = clock()

    def feed(self, event: dict) -> list[str]:
        """Lines to log for one event (often none). Raises APIError for an error event."""
        if "error" in event:
            raise APIError(event["error"])
        layer, status = event.get("id"), event.get("status", "")
        lines = []
        if status.startswith("Digest: "):
            self.digest = status.split(" ", 1)[1].strip()
        if layer and status.startswith("Pulling from "):
            lines.append(f"{status}")
        elif layer and status:
            detail = event.get("progressDetail") or {}
            if status == "Downloading":
                if detail.get("total"):
                    self.total[layer] = detail["total"]
                self.current[layer] = detail.get("current", self.current.get(layer, 0))
            elif status in ("Download complete", "Pull complete") and layer in self.total:
                self.current[layer] = self.total[layer]
            quiet = status in ("Downloading", "Extracting", "Waiting", "Verifying Checksum")
            if not quiet and self.layers.get(layer) != status and not _countdown_tick(self.layers.get(layer), status):
                lines.append(f"layer {layer}: {status}")
            self.layers[layer] = status
            if status == "Downloading" and self.clock() - self._last >= self.every_s:
                lines.append(self.bytes_line())
                self._last = self.clock()
        elif status:
            lines.append(status)
        return lines

    def bytes_line(self) -> str:
        done = sum(1 for s in self.layers.values() if s in self.DONE)
        return (f"{done}/{len(self.layers)} layer(s) done, "
                f"{sum(self.current.values()) / 1e6:.1f} of {sum(self.total.values()) / 1e6:.1f} MB downloaded")

    def summary(self) -> str:
        fetched = sum(1 for s in self.layers.values() if s == "Pull complete")
        cached = sum(1 for s in self.layers.values() if s == "Already exists")
        return (f"{len(self.layers)} layer(s): {fetched} pulled, {cached} already present; "
                f"{sum(self.total.values()) / 1e6:.1f} MB downloaded; digest {self.digest}")


def _retry_delay_s(status: str | None) -> int | None:
    """N of the engine's "Retrying in N second(s)" layer status, else None."""
    words = (status or "").split()
    if len(words) >= 3 and words[:2] == ["Retrying", "in"] and words[2].isdigit():
        return int(words[2])
    return None


def _countdown_tick(previous: str | None, status: str) -> bool:
    """True for the engine's once-a-second countdown of a layer retry already logged ("Retrying in 24
    seconds" after "... 25 seconds"); a new retry starts a new countdown at a higher number."""
    before, now = _retry_delay_s(previous), _retry_delay_s(status)
    return before is not None and now is not None and now < before


def pull_with_progress(api: docker.APIClient, ref: str, auth_config: dict | None = None,
                       every_s: float = 15.0) -> PullProgress:
    """Pull `ref`, logging progress (see PullProgress); returns the progress with the resolved digest."""
    progress = PullProgress(ref, every_s=every_s)
    for event in api.pull(ref, stream=True, decode=True, auth_config=auth_config):
        for line in progress.feed(event):
            log.info("pull %s: %s", ref, line)
    log.info("pull %s: %s", ref, progress.summary())
    return progress


def free_disk_bytes(api: docker.APIClient) -> int | None:
    """Free bytes on the engine's data root when the engine runs on this machine (unix socket), else None.

    docker-py names a unix socket's engine `http+docker://localhost`; an `ssh://` engine is `http+docker://ssh`,
    on another machine, whose data root this machine's disk says nothing about."""
    if str(getattr(api, "base_url", "")) != "http+docker://localhost":
        return None
    try:
        root = api.info().get("DockerRootDir") or "/var/lib/docker"
        return shutil.disk_usage(root).free if os.path.isdir(root) else None
    except (DockerException, requests.RequestException, OSError):  # unknown: the pull that follows says why
        return None


def check_disk(result: PreparedImage, min_free_gb: float | None, free_bytes: int | None, what: str) -> bool:
    """Record `insufficient_disk` on `result` (and return False) when less than `min_free_gb` is free."""
    result.free_bytes = free_bytes
    if not min_free_gb:
        return True
    if free_bytes is None:
        log.warning("free space on the Docker data root is unknown; %s %s without the min_free_gb=%s check",
                    what, result.ref, min_free_gb)
        return True
    if free_bytes < min_free_gb * GB:
        result.fail("insufficient_disk", f"only {free_bytes / GB:.1f} GB free on Docker's data root, "
                                         f"{result.name} needs "
                                         f"min_free_gb={min_free_gb:g}: refused before {what} {result.ref}")
        log.error("%s", result.error)
        return False
    return True


def prepare_image(api: docker.APIClient, name: str, ref: str, pull_policy: str = "always",
                  auth_config: dict | None = None, attempts: int = 3, backoff_s: float = 1.0,
                  min_free_gb: float | None = None, free_bytes_hint: int | None = None,
                  progress_every_s: float = 15.0) -> PreparedImage:
    """Pull (per policy) and pin `ref`; never raises for registry trouble: the result names the failure.

    Transient failures are retried `attempts` times with exponential backoff (`backoff_s`, 2x, 4x...);
    a missing image, refused credentials or a full disk are not. Before a pull, the free space on
    Docker's data root (measured when the engine is local, else `free_bytes_hint` from the host's
    facts) must be at least `min_free_gb`.
    """
    result = PreparedImage(name=name, ref=ref)
    try:
        present = _exists(api, ref)
    except (DockerException, requests.RequestException) as exc:
        return result.fail("docker_unreachable", f"Docker engine not reachable: {exc}")
    want_pull = pull_policy == "always" or (pull_policy == "if-missing" and not present)
    digest = None
    if want_pull:
        free = free_disk_bytes(api)
        if not check_disk(result, min_free_gb, free if free is not None else free_bytes_hint, "pulling"):
            return result
        for attempt in range(1, attempts + 1):
            result.pull_attempts = attempt
            try:
                progress = pull_with_progress(api, ref, auth_config, every_s=progress_every_s)
                digest = progress.digest
                result.pulled = True
                result.fetched_layers = sum(1 for s in progress.layers.values() if s == "Pull complete")
                result.failure_class = result.error = None
                break
            except (DockerException, requests.RequestException) as exc:  # requests: the engine's connection
                result.fail(classify_pull_error(exc), f"pull {ref}: {_reason(exc)}")
                if result.failure_class in PERMANENT or attempt == attempts:
                    log.error("pull %s failed (%s) after %d attempt(s): %s", ref, result.failure_class, attempt,
                              _reason(exc))
                    return result
                delay = backoff_s * 2 ** (attempt - 1)
                log.warning("pull %s failed (attempt %d/%d, %s: %s); retrying in %.1f s",
                            ref, attempt, attempts, result.failure_class, _reason(exc), delay)
                time.sleep(delay)
    elif not present:
        return result.fail("image_not_found", f"{ref} is not on the host and pull_policy is 'never'")
    return _pin(api, result, digest)


def _pin(api: docker.APIClient, result: PreparedImage, digest: str | None) -> PreparedImage:
    """Pin to `repo@digest` (the digest the pull reported, else the image's RepoDigest), or the image id."""
    ref = result.ref
    repo = _repository(ref)
    if "@" in ref:
        digest = ref.split("@", 1)[1]
    try:
        info = api.inspect_image(f"{repo}@{digest}" if digest else ref)
    except requests.RequestException as exc:  # the engine broke off after the pull: this image's failure, named
        return result.fail("docker_unreachable", f"Docker engine not reachable pinning {ref}: {exc}")
    except DockerException as exc:
        return result.fail("image_not_found", f"inspect {ref}: {exc}")
    result.image_id = info.get("Id")
    if not digest:
        # RepoDigests are in Docker's short form (`ubuntu@sha256:...` for docker.io/library/ubuntu): compared as
        # Docker normalises names, so a reference written in full is pinned too
        want = repository_of(repo)
        digests = [d.split("@", 1)[1] for d in info.get("RepoDigests") or []
                   if repository_of(d.split("@", 1)[0]) == want]
        if len(digests) > 1:
            log.warning("image %s has %d digests for %s; pinning the first: %s", ref, len(digests), repo, digests[0])
        digest = digests[0] if digests else None
    if digest:
        result.digest = digest
        result.pinned_ref = f"{repo}@{digest}"
    else:  # a local-only image (never pushed): pin to the immutable image id
        result.pinned_ref = result.image_id
    result.base_pinned_ref = result.pinned_ref
    log.info("image %s pinned to %s (image id %s)", ref, result.pinned_ref, (result.image_id or "")[:19])
    return result


def _reason(exc: Exception) -> str:
    """The engine's explanation without docker-py's 'NNN Server Error for http+docker://...' prefix."""
    text = str(exc)
    explanation = getattr(exc, "explanation", None)
    return str(explanation) if explanation else text


def _exists(api: docker.APIClient, ref: str) -> bool:
    try:
        api.inspect_image(ref)
        return True
    except (NotFound, ImageNotFound):
        return False
