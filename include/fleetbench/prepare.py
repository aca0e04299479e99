"""The prepare-image stage: per host, every image its cases need, pulled and pinned, then baked if configured.

`prepare(api, spec)` is one image on one engine: disk check -> pull and pin (`fleetbench.images`) ->
bake (`fleetbench.bake`). It sits above both modules, so neither imports the other's caller.
"""

from __future__ import annotations

import docker
import requests

from fleetbench.bake import BakeError, bake_image
from fleetbench.images import PreparedImage, classify_pull_error, prepare_image


def pulled_bytes(api: docker.APIClient, ref: str, fetched_layers: int | None) -> int:
    """What a pull of `ref` added to the engine's data root, at most: the image's size when it downloaded a layer
    (the layers it had count too), 0 when the engine had them all ("Already exists": an image that is up to date
    took nothing; each night's `pull_policy: always` counted a cached image's whole size, and the next image was
    refused). `fetched_layers`: `PreparedImage.fetched_layers` (None: not known, counted as downloaded)."""
    if fetched_layers == 0:
        return 0
    try:
        return int(api.inspect_image(ref).get("Size") or 0)
    except (docker.errors.DockerException, requests.RequestException):
        return 0


def prepare(api: docker.APIClient, spec, auth_config: dict | None = None, push_auth_config: dict | None = None,
            free_bytes_hint: int | None = None, attempts: int = 3, backoff_s: float = 2.0,
            extra_labels: dict[str, str] | None = None) -> PreparedImage:
    """The prepare-image stage for one `ImageSpec` on one engine: pull and pin, then bake if configured.

    With a bake, `pinned_ref` becomes the baked image's id, and `digest` stays the pulled base's
    registry digest (see PreparedImage).
    """
    result = prepare_image(api, spec.name, spec.ref, spec.pull_policy, auth_config=auth_config, attempts=attempts,
                           backoff_s=backoff_s, min_free_gb=spec.min_free_gb, free_bytes_hint=free_bytes_hint)
    if not result.ok or spec.bake is None:
        return result
    if free_bytes_hint is not None and result.pulled:  # a remote engine: the bake's check follows its base's pull
        free_bytes_hint = max(0, free_bytes_hint - pulled_bytes(api, result.pinned_ref or result.ref,
                                                                result.fetched_layers))
    try:
        baked = bake_image(api, spec.name, spec.bake, base_ref=spec.ref, base_pinned_ref=result.pinned_ref,
                           base_digest=result.digest or result.image_id, push_auth_config=push_auth_config,
                           min_free_gb=spec.min_free_gb, free_bytes_hint=free_bytes_hint, extra_labels=extra_labels)
    except BakeError as exc:
        return result.fail(exc.failure_class, str(exc))
    except (docker.errors.DockerException, requests.RequestException) as exc:
        # the engine broke off (or refused a call) mid-bake: this image's failure, named; the lane and the host's
        # other images go on (before, the lane's task failed and every case of the host read `task_failed`)
        failure = classify_pull_error(exc)
        failure = failure if failure in ("docker_unreachable", "insufficient_disk") else "bake_failed"
        return result.fail(failure, f"bake of {spec.name}: {type(exc).__name__}: {exc}"[:2000])
    result.pinned_ref = baked.image_id
    result.baked_ref, result.baked_id, result.bake_cache_hit = baked.ref, baked.image_id, baked.cache_hit
    result.bake_inputs, result.harness_source, result.harness_revision = baked.inputs, baked.source, baked.revision
    result.pushed_ref = baked.pushed_ref
    return result
