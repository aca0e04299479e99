"""Image preparation: pull with a pull policy, resolve and pin the sha256 digest.

Every case of a run uses the pinned reference (`repo@sha256:...`) that was pulled for that run,
so a tag that moves while the run is going does not change what is measured.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

log = logging.getLogger(__name__)


@dataclass
class PreparedImage:
    name: str
    ref: str
    pinned_ref: str | None = None  # what cases run: repo@sha256:... (or the image id for local-only images)
    digest: str | None = None  # sha256:... of the registry manifest
    image_id: str | None = None
    pulled: bool = False
    failure_class: str | None = None  # image_not_found | registry_unreachable | registry_auth | docker_unreachable
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure_class is None

    def to_dict(self) -> dict:
        return asdict(self)


def _repository(ref: str) -> str:
    """`host:5000/a/b:tag` -> `host:5000/a/b` (a port colon is not a tag separator)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref.rsplit(":", 1)[0] if ":" in last else ref


def classify_pull_error(exc: Exception) -> str:
    text = str(exc).lower()
    if isinstance(exc, (NotFound, ImageNotFound)) or "manifest unknown" in text or "not found" in text:
        return "image_not_found"
    if "unauthorized" in text or "authentication required" in text or "401" in text or "denied" in text:
        return "registry_auth"
    if "connection refused" in text or "no such host" in text or "timeout" in text or "i/o timeout" in text or "dial tcp" in text:
        return "registry_unreachable"
    return "registry_unreachable" if isinstance(exc, APIError) and exc.status_code and exc.status_code >= 500 else "pull_failed"


def _pull_with_progress(api: docker.APIClient, ref: str, auth_config: dict | None) -> None:
    """Pull, logging one line per layer state change and a byte total, not one line per chunk."""
    layers: dict[str, str] = {}
    totals: dict[str, int] = {}
    for event in api.pull(ref, stream=True, decode=True, auth_config=auth_config):
        if "error" in event:
            raise APIError(event["error"])
        layer, status = event.get("id"), event.get("status", "")
        if layer and status and not status.startswith(("Downloading", "Extracting")):
            if layers.get(layer) != status:
                layers[layer] = status
                log.info("pull %s: %s %s", ref, layer, status)
        detail = event.get("progressDetail") or {}
        if layer and detail.get("total"):
            totals[layer] = detail["total"]
        if not layer and status:
            log.info("pull %s: %s", ref, status)
    if totals:
        log.info("pull %s: %d layer(s), %.1f MB downloaded", ref, len(totals), sum(totals.values()) / 1e6)


def prepare_image(api: docker.APIClient, name: str, ref: str, pull_policy: str = "always",
                  auth_config: dict | None = None, attempts: int = 3, backoff_s: float = 1.0) -> PreparedImage:
    """Pull (per policy) and pin `ref`; never raises for registry trouble: the result names the failure."""
    result = PreparedImage(name=name, ref=ref)
    try:
        present = bool(api.images(name=ref)) if "@" not in ref else _exists(api, ref)
    except DockerException as exc:
        result.failure_class, result.error = "docker_unreachable", f"Docker engine not reachable: {exc}"
        return result
    want_pull = pull_policy == "always" or (pull_policy == "if-missing" and not present)
    if want_pull:
        for attempt in range(1, attempts + 1):
            try:
                _pull_with_progress(api, ref, auth_config)
                result.pulled = True
                result.failure_class = result.error = None
                break
            except DockerException as exc:
                result.failure_class, result.error = classify_pull_error(exc), f"pull {ref}: {exc}"
                if result.failure_class in ("image_not_found", "registry_auth") or attempt == attempts:
                    log.warning("pull %s failed (%s): %s", ref, result.failure_class, exc)
                    return result
                delay = backoff_s * 2 ** (attempt - 1)
                log.warning("pull %s failed (attempt %d/%d, %s); retrying in %.1f s", ref, attempt, attempts, exc, delay)
                time.sleep(delay)
    elif not present:
        result.failure_class, result.error = "image_not_found", f"{ref} is not on the host and pull_policy is 'never'"
        return result
    try:
        info = api.inspect_image(ref)
    except DockerException as exc:
        result.failure_class, result.error = "image_not_found", f"inspect {ref}: {exc}"
        return result
    result.image_id = info.get("Id")
    repo = _repository(ref)
    digests = [d for d in info.get("RepoDigests") or [] if d.split("@", 1)[0] == repo]
    if digests:
        result.pinned_ref = digests[0]
        result.digest = digests[0].split("@", 1)[1]
    else:  # a local-only image (never pushed): pin to the immutable image id
        result.pinned_ref = result.image_id
    log.info("image %s pinned to %s", ref, result.pinned_ref)
    return result


def _exists(api: docker.APIClient, ref: str) -> bool:
    try:
        api.inspect_image(ref)
        return True
    except NotFound:
        return False
