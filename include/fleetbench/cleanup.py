"""Maintenance: remove stopped containers, orphaned case containers, superseded baked images and the telemetry
wrapper's volumes of other versions that fleetbench created.

"Labelled `org.fleetbench.managed=true`" is not enough to tell: labels are inherited. Every image
built from fleetbench's base or smoke image carries that label, and so does every container
started from one, whoever started it. So the rules look for marks only fleetbench sets:

- a container is fleetbench's when it has a *creator mark* that it did not inherit from its image:
  `org.fleetbench.run_id` (benchmark cases) or a non-empty `org.fleetbench.bake.step` (bake setup
  containers), with a value different from the image's label of that name. Only stopped ones
  (created, exited, dead) older than the container age limit are removed, and running case
  containers that are past their own `org.fleetbench.timeout_s` plus a grace: the task that would
  have stopped them is gone (its worker was SIGKILLed or lost), and they hold their GPUs forever.
- a host check's GPU smoke container (`org.fleetbench.probe=gpu-smoke` and a `fleetbench-gpu-smoke-` name, which no
  image can give) still there past the probe's 120 s plus the grace: a hung `nvidia-smi` never exits, so its
  `--rm` never removes it (its check removes it by name when the probe times out; this catches one it could not).
- an image is a fleetbench bake when it has kind=baked, its bake.inputs label, and one of its tags
  is the deterministic bake tag `[registry/]fleetbench/<name>:<...>-<inputs[:12]>` (an image built
  FROM a baked image inherits the labels, not the tag). Per image name, the one tagged
  `fleetbench/<name>:current` (else the newest) is kept; the others are *superseded* and removed
  when not used by any container and superseded longer ago than the image age limit: aged from the
  `fleetbench/<name>:superseded-<unix time>-<id12>` tag the next bake gave it when it took `current` (else from
  its build), so a run that pinned a bake before a newer one took over keeps its image.

`scope` narrows everything to objects carrying all the given labels (one DAG's, one test's).
The decisions are pure functions over the engine's listings (`plan_cleanup`), so they are tested
without an engine; `clean_engine` gathers the listings and removes.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime

import docker
from docker.errors import APIError, NotFound

from fleetbench.engines import engine_now
from fleetbench.runs import LABEL_PREFIX

log = logging.getLogger(__name__)

LABEL = LABEL_PREFIX
CREATOR_MARKS = (f"{LABEL}.run_id", f"{LABEL}.bake.step")
STOPPED = ("created", "exited", "dead")
RUNNING = ("running", "paused", "restarting")
TIMEOUT_LABEL = f"{LABEL}.timeout_s"  # a case container's own timeout, set when it is created
ORPHAN_GRACE_S = 300  # past its timeout plus this, a running case container has no task any more


@dataclass
class CleanupReport:
    removed_containers: list[dict] = field(default_factory=list)  # {id, name, reason}
    removed_images: list[dict] = field(default_factory=list)  # {id, tags, reason}
    removed_volumes: list[dict] = field(default_factory=list)  # {name, reason}
    kept: list[dict] = field(default_factory=list)  # fleetbench objects left in place, with the reason
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _labels(obj: dict | None) -> dict:
    return (obj or {}).get("Labels") or {}


def in_scope(labels: dict, scope: dict[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (scope or {}).items())


def created_by_fleetbench(container_labels: dict, image_labels: dict) -> bool:
    """True when the container carries a creator mark it did not inherit from its image."""
    if container_labels.get(f"{LABEL}.managed") != "true":
        return False
    return any(container_labels.get(k) and container_labels.get(k) != image_labels.get(k) for k in CREATOR_MARKS)


def bake_tag_of(image: dict) -> str | None:
    """The image's fleetbench tag, when it is a fleetbench bake (see module doc): its deterministic tag, else the
    `current` or `superseded-` tag `bake.make_current` gave it. Two lanes on one engine that baked the same inputs at
    once both committed the deterministic tag: the first bake kept only its `current`, then `superseded-` tag, and
    was never removed. An image built FROM a bake has its labels but none of these tags."""
    labels = _labels(image)
    name, inputs = labels.get(f"{LABEL}.image"), labels.get(f"{LABEL}.bake.inputs")
    if labels.get(f"{LABEL}.kind") != "baked" or labels.get(f"{LABEL}.managed") != "true" or not name or not inputs:
        return None
    repo = rf"^(.+/)?fleetbench/{re.escape(name.lower())}:"
    tags = image.get("RepoTags") or []
    deterministic = re.compile(rf"{repo}.+-{re.escape(inputs[:12])}$")
    given = re.compile(rf"{repo}(current|superseded-\d+(-[0-9a-f]+)?)$")
    return next((t for t in tags if deterministic.match(t)), None) or next((t for t in tags if given.match(t)), None)


def plan_cleanup(containers: list[dict], images: list[dict], now: float, container_max_age_s: float,
                 image_max_age_s: float, scope: dict[str, str] | None = None,
                 orphan_grace_s: float = ORPHAN_GRACE_S) -> tuple[list[dict], list[dict], list[dict]]:
    """Decide what to remove. Pure: takes listings, returns (containers, images, kept) with reasons.

    `containers`: dicts with Id, Names, State, Labels, ImageID, ImageLabels (the image's labels, added
    by the caller) and Age (seconds since it stopped, or since it was created if it never ran).
    `images`: the engine's image list entries (Id, RepoTags, Labels, Created). A running container's
    RunningFor (seconds since it started) and its `timeout_s` label tell an orphaned case (`_overdue`).
    """
    remove_c, remove_i, kept = [], [], []
    for c in containers:
        if gpu_smoke_probe(c):
            if scope is None:  # a host check's, of no run
                _plan_smoke(c, orphan_grace_s, remove_c, kept)
            continue
        if not in_scope(_labels(c), scope) or not created_by_fleetbench(_labels(c), c.get("ImageLabels") or {}):
            continue
        name = (c.get("Names") or ["?"])[0].lstrip("/")
        overdue = _overdue(c, orphan_grace_s)
        if overdue:
            remove_c.append({"id": c["Id"], "name": name, "running": True, "reason": overdue})
        elif c.get("State") not in STOPPED:
            kept.append({"id": c["Id"], "name": name, "reason": f"container is {c.get('State')}"})
        elif c["Age"] < container_max_age_s:
            kept.append({"id": c["Id"], "name": name,
                         "reason": f"stopped {c['Age']:.0f} s ago, younger than {container_max_age_s:.0f} s"})
        else:
            remove_c.append({"id": c["Id"], "name": name,
                             "reason": f"stopped fleetbench container, {c['Age']:.0f} s old"})
    removed = {c["id"] for c in remove_c}
    in_use = {c.get("ImageID"): (c.get("Names") or ["?"])[0].lstrip("/") for c in containers if c["Id"] not in removed}

    baked: dict[str, list[dict]] = {}
    for img in images:
        if bake_tag_of(img) and in_scope(_labels(img), scope):
            baked.setdefault(_labels(img)[f"{LABEL}.image"].lower(), []).append(img)
    for name, group in baked.items():
        current_tag = f"fleetbench/{name}:current"
        current = next((i for i in group if current_tag in (i.get("RepoTags") or [])), None)
        current = current or max(group, key=lambda i: i.get("Created", 0))
        for img in group:
            tags = sorted(img.get("RepoTags") or [])
            age = now - max(img.get("Created", now), superseded_at(img, name) or 0)
            if img is current:
                kept.append({"id": img["Id"], "tags": tags, "reason": f"current bake of {name}"})
            elif img["Id"] in in_use:
                kept.append({"id": img["Id"], "tags": tags,
                             "reason": f"superseded but used by container {in_use[img['Id']]}"})
            elif age < image_max_age_s:
                kept.append({"id": img["Id"], "tags": tags,
                             "reason": f"superseded {age:.0f} s old, younger than {image_max_age_s:.0f} s"})
            else:
                # fleetbench's own tags of it (`[registry/]fleetbench/<name>:...`) go; a tag someone else gave it
                # (`docker tag ... teamb/harness:prod`) keeps the image
                own = re.compile(rf"^(.+/)?fleetbench/{re.escape(name)}:")
                theirs = [t for t in tags if not own.match(t)]
                reason = f"superseded bake of {name}, {age:.0f} s old"
                if theirs:
                    reason += f"; only fleetbench's tags removed, the image stays for {', '.join(theirs)}"
                remove_i.append({"id": img["Id"], "tags": [t for t in tags if own.match(t)], "reason": reason,
                                 "keep_image": bool(theirs)})
    return remove_c, remove_i, kept


def superseded_at(image: dict, name: str) -> float | None:
    """When the bake stopped being `current` (its `fleetbench/<name>:superseded-<unix time>-<id12>` tag, see
    `bake.make_current`); None for a bake superseded before fleetbench stamped that (aged by its build time)."""
    stamp = re.compile(rf"^(.+/)?fleetbench/{re.escape(name)}:superseded-(\d+)(-[0-9a-f]+)?$")
    times = [int(m.group(2)) for m in map(stamp.match, image.get("RepoTags") or []) if m]
    return max(times) if times else None


def gpu_smoke_probe(c: dict) -> bool:
    """A host check's GPU smoke container (`fleetbench.hosts.probes.gpu_smoke_probe`): its label and its name, which
    an image cannot give a container as it can a label."""
    from fleetbench.hosts.probes import GPU_SMOKE_LABEL, GPU_SMOKE_NAME_PREFIX

    key, _, value = GPU_SMOKE_LABEL.partition("=")
    return (_labels(c).get(key) == value
            and any(n.lstrip("/").startswith(GPU_SMOKE_NAME_PREFIX) for n in c.get("Names") or []))


def _plan_smoke(c: dict, grace_s: float, remove_c: list, kept: list) -> None:
    """A smoke container still there after its probe gave up: a hung `nvidia-smi` never exits, so its `--rm` never
    removes it, and it holds the host's GPUs (its check removes it by name when it times out; this is for a check
    that could not, e.g. its host went away meanwhile)."""
    from fleetbench.hosts.probes import GPU_SMOKE_TIMEOUT_S

    name = (c.get("Names") or ["?"])[0].lstrip("/")
    age = c.get("RunningFor") if c.get("State") == "running" else c.get("Age")
    if age is not None and age > GPU_SMOKE_TIMEOUT_S + grace_s:
        remove_c.append({"id": c["Id"], "name": name, "running": c.get("State") == "running",
                         "reason": f"a host check's GPU smoke container, {c.get('State')} for {age:.0f} s (its check "
                                   f"gave up after {GPU_SMOKE_TIMEOUT_S:g} s)"})
    else:
        kept.append({"id": c["Id"], "name": name, "reason": "a host check's GPU smoke container, within its time"})


def _overdue(c: dict, grace_s: float) -> str | None:
    """Why a running case container is an orphan: it has run past its own `timeout_s` label plus a grace
    (its task would have stopped it by then, so the worker that ran it is gone, e.g. SIGKILLed)."""
    if c.get("State") not in RUNNING:
        return None
    try:
        timeout_s = float(_labels(c).get(TIMEOUT_LABEL) or "nan")
    except ValueError:
        return None
    running_s = c.get("RunningFor")
    if running_s is None or math.isnan(timeout_s) or running_s <= timeout_s + grace_s:
        return None
    return f"case container running for {running_s:.0f} s, past its timeout of {timeout_s:.0f} s: its task is gone"


def _stamp(value: str | None) -> float | None:
    if not value or value.startswith("0001-"):
        return None
    head, _, _ = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp()


def _ages(api: docker.APIClient, c: dict, now: float) -> dict:
    """Age (since it stopped, or was created if it never ran) and RunningFor (since it started, while running)."""
    state = api.inspect_container(c["Id"]).get("State") or {}
    finished, started = _stamp(state.get("FinishedAt")), _stamp(state.get("StartedAt"))
    running = state.get("Running") and started is not None
    return {"Age": now - finished if finished and not running else now - c.get("Created", now),
            "RunningFor": now - started if running else None}


def clean_engine(api: docker.APIClient, container_max_age_s: float = 24 * 3600, image_max_age_s: float = 7 * 24 * 3600,
                 scope: dict[str, str] | None = None, dry_run: bool = False, now: float | None = None,
                 orphan_grace_s: float = ORPHAN_GRACE_S) -> CleanupReport:
    """Remove stopped fleetbench containers and superseded baked images on one engine (see module doc).

    Ages are taken on the engine's own clock (`SystemTime`), as its containers' times are: a GPU host whose clock is
    behind this worker's would otherwise make a live case look past its timeout."""
    now = engine_now(api) if now is None else now
    report = CleanupReport(dry_run=dry_run)
    listed = api.containers(all=True)
    image_labels: dict[str, dict] = {}
    containers = []
    for c in listed:
        if _labels(c).get(f"{LABEL}.managed") == "true" or gpu_smoke_probe(c):
            if c["ImageID"] not in image_labels:
                try:
                    image_labels[c["ImageID"]] = ((api.inspect_image(c["ImageID"]).get("Config") or {}).get("Labels")
                                                  or {})
                except NotFound:
                    image_labels[c["ImageID"]] = {}
            try:
                c = {**c, "ImageLabels": image_labels[c["ImageID"]], **_ages(api, c, now)}
            except NotFound:  # removed meanwhile
                continue
        containers.append(c)
    images = api.images(filters={"label": [f"{LABEL}.kind=baked"]})
    remove_c, remove_i, report.kept = plan_cleanup(containers, images, now, container_max_age_s, image_max_age_s, scope,
                                                            orphan_grace_s)
    for c in remove_c:
        log.info("%sremove container %s (%s): %s", "would " if dry_run else "", c["name"], c["id"][:12], c["reason"])
        if not dry_run:
            try:
                if c.get("running"):
                    api.stop(c["id"], timeout=10)
                api.remove_container(c["id"], v=True, force=bool(c.get("running")))
                report.removed_containers.append(c)
            except NotFound:
                pass
            except APIError as exc:
                report.errors.append(f"container {c['name']}: {exc.explanation or exc}")
        else:
            report.removed_containers.append(c)
    for img in remove_i:
        log.info("%sremove image %s (%s): %s", "would " if dry_run else "", ", ".join(img["tags"]), img["id"][:19],
                 img["reason"])
        if dry_run:
            report.removed_images.append(img)
            continue
        try:
            for tag in img["tags"]:  # untag one by one (no force): the last untag deletes the image
                api.remove_image(tag)
            if img.get("keep_image"):  # tagged by someone else too: their tag keeps it
                report.removed_images.append(img)
                continue
            try:
                api.remove_image(img["id"])
            except NotFound:
                pass
            except APIError as exc:
                if "dependent child images" not in str(exc):
                    raise
                img = {**img, "reason": img["reason"] + "; untagged, its layers stay while child images use them"}
            report.removed_images.append(img)
        except APIError as exc:  # e.g. a child image or a container created meanwhile
            report.errors.append(f"image {img['id'][:19]}: {exc.explanation or exc}")
    if scope is None:  # the telemetry wrapper's volumes are the engine's, not one DAG's or test's
        _clean_telemetry_volumes(api, report, dry_run)
    for k in report.kept:
        log.info("keep %s: %s", k.get("name") or ", ".join(k.get("tags", [])) or k["id"][:19], k["reason"])
    for e in report.errors:
        log.warning("cleanup: %s", e)
    return report


def _clean_telemetry_volumes(api: docker.APIClient, report: CleanupReport, dry_run: bool) -> None:
    """Remove the telemetry wrapper's volumes of other wrapper versions (`fleetbench.telemetry.ensure_volume`);
    one a container still uses stays (Docker refuses), and the next cleanup removes it."""
    from fleetbench import telemetry

    current = telemetry.volume_name()
    listed = api.volumes(filters={"label": telemetry.VOLUME_LABEL}).get("Volumes") or []
    for v in listed:
        if v["Name"] == current:
            continue
        reason = "the telemetry wrapper of another fleetbench version"
        log.info("%sremove volume %s: %s", "would " if dry_run else "", v["Name"], reason)
        if not dry_run:
            try:
                api.remove_volume(v["Name"])
            except NotFound:
                continue
            except APIError as exc:  # in use by a container
                report.errors.append(f"volume {v['Name']}: {exc.explanation or exc}")
                continue
        report.removed_volumes.append({"name": v["Name"], "reason": reason})


def clean_url(docker_url: str, container_max_age_h: float, image_max_age_h: float, scope: dict[str, str] | None = None,
              dry_run: bool = False, docker_tls_conn_id: str | None = None) -> dict:
    """`clean_engine` on the engine at `docker_url` (over TLS with the certificates of `docker_tls_conn_id`, the
    same client the cases use), with ages in hours; returns the report as a dict."""
    from fleetbench.engines import engine_client

    with engine_client(docker_url, docker_tls_conn_id, timeout=120) as api:
        report = clean_engine(api, container_max_age_h * 3600, image_max_age_h * 3600, scope=scope, dry_run=dry_run)
    return {"docker_url": docker_url, **report.to_dict()}


def engines_of(config_path: str | None = None) -> list[dict]:
    """The distinct Docker engines of the fleet config, each with the queue whose worker reaches it:
    [{hosts, docker_url, docker_tls_conn_id, queue}]. A host with a queue of its own (topology b) is
    cleaned by its own worker: its `unix://` socket is that machine's, not the central worker's."""
    from fleetbench.config import load_config
    from fleetbench.paths import default_config_path

    cfg = load_config(config_path or default_config_path())
    engines: dict[tuple, list[str]] = {}
    for host in cfg.hosts:
        engines.setdefault((host.queue, host.docker_url, host.docker_tls_conn_id), []).append(host.name)
    return [{"queue": queue, "docker_url": url, "docker_tls_conn_id": tls, "hosts": names}
            for (queue, url, tls), names in engines.items()]
