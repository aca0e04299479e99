"""Bake: the runbook's `docker commit`, as a cached, repeatable step.

From the pinned base image, a setup container gets the harness (files copied from `include/`,
and/or a git branch checked out), runs the configured setup command, and is committed with a
message, an author and labels into a deterministic tag::

    fleetbench/<name>:<base-tag>-<first 12 hex of the inputs hash>

The inputs hash covers the base image's digest, the copied files' contents and destinations, the
git URL, branch and the commit it resolves to, and the setup command and its network. The same
inputs give the same tag, and an existing image with that tag and inputs label is reused (logged as
a cache hit); with `push_to`, the fleet's registry is also looked up before baking and the result is
pushed there, so one host's bake serves the others.

Where git runs: on the Airflow worker (`git ls-remote` resolves the branch to a commit before the
cache lookup, `git clone --depth 1 --branch` on a miss), and the checkout is copied into the
container with the Docker API. So the image needs no git and the GPU host needs no network; the
worker does. The `.git` folder is not copied; the commit is recorded in the labels.

Labels of a baked image (`org.fleetbench.` prefix): managed=true, kind=baked, image (config name),
bake.inputs (full hash), bake.base_ref, bake.base_digest, harness.source, harness.revision, version.
Caveat of `docker commit`: the image's CMD/ENTRYPOINT are reset to the base's; a base with neither
would keep the setup command as its CMD (cases pass their own command, so they are unaffected).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import stat
import subprocess
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from fleetbench import __version__
from fleetbench.config import BakeSpec
from fleetbench.engines import engine_now
from fleetbench.images import (
    PERMANENT,
    PreparedImage,
    check_disk,
    classify_pull_error,
    free_disk_bytes,
    pull_with_progress,
    ref_tag,
)
from fleetbench.paths import PROJECT_ROOT
from fleetbench.runs import LABEL_PREFIX

log = logging.getLogger(__name__)

LABEL = LABEL_PREFIX
# Set on the setup container only (the committed image gets it blanked): marks a container fleetbench created.
STEP_LABEL = f"{LABEL}.bake.step"
LOG_TAIL_LINES = 20
GIT_TIMEOUT_S = 600


class BakeError(Exception):
    """A bake that did not produce an image; `failure_class` names why (bake_failed, registry_auth, ...)."""

    def __init__(self, failure_class: str, message: str):
        super().__init__(message)
        self.failure_class = failure_class


@dataclass
class BakeResult:
    ref: str  # the deterministic tag, fleetbench/<name>:<base-tag>-<hash12>
    image_id: str
    cache_hit: bool
    inputs: str  # full sha256 of the inputs
    source: str  # harness source: copy:<src>,... and/or git:<url>#<branch>
    revision: str  # harness revision: git commit and/or sha256 of the copied files
    labels: dict
    pushed_ref: str | None = None  # <push_to>/fleetbench/<name>@sha256:... when pushed

    def to_dict(self) -> dict:
        return asdict(self)


# -- inputs -----------------------------------------------------------------------------------
def _files_of(src: Path) -> list[tuple[Path, bool]]:
    """(path, is_link) of every regular file and symlink under `src` (or `src` itself), without .git.

    Links are never followed: a link is baked as a link (its target is resolved in the image, never on
    the worker), so a harness tree with `creds.txt -> /secret` cannot carry the worker's file into an
    image. Anything else (FIFOs, sockets, devices) is left out.
    """
    if src.is_file():
        return [(src, False)]
    out = []
    for folder, dirs, files in os.walk(src):  # does not descend into linked folders
        dirs[:] = [d for d in dirs if d != ".git" or Path(folder, d).is_symlink()]
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                out.append((path, True))
            elif name in files and stat.S_ISREG(path.lstat().st_mode):
                out.append((path, False))
    return sorted(out)


def resolve_src(src: str, project_root: Path = PROJECT_ROOT) -> Path:
    """A copy source inside `<project>/include/` (symlinks resolved): anything else is refused."""
    include = (project_root / "include").resolve()
    path = (project_root / src).resolve()
    if not path.is_relative_to(include):
        raise BakeError("bake_failed", f"bake copy src {src!r} resolves outside {include}")
    if not path.exists():
        raise BakeError("bake_failed", f"bake copy src {src!r} does not exist under {project_root}")
    return path


def tree_hash(root: Path) -> str:
    """sha256 over (relative path, executable bit, content) of every file under `root` (or of the file)."""
    h = hashlib.sha256()
    for f, is_link in _files_of(root):
        rel = f.name if root.is_file() else f.relative_to(root).as_posix()
        if is_link:
            h.update(f"{rel}\0link\0{os.readlink(f)}\0".encode())
            continue
        h.update(f"{rel}\0{int(os.access(f, os.X_OK))}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def copy_inputs(sources: list) -> list[dict]:
    """What each (copy spec, resolved source) adds to the bake's identity: its `dest` and content, and whether it is a
    file: a folder holding only run.sh hashes as the file run.sh, and one `dest` takes either (the file at
    dest/run.sh, or at dest), so the two layouts had one tag (folders are written as before: their tags stand)."""
    return [{"dest": c.dest, "sha256": tree_hash(p), **({"file": True} if p.is_file() else {})} for c, p in sources]


def inputs_hash(base_digest: str, copies: list[dict], git: dict | None, run: list[str], network: str,
                platform: str | None = None) -> str:
    """The bake's identity: same inputs -> same hash -> same tag (see module doc). `platform` is the engine's
    (`linux/x86_64`): a multi-arch base has one digest on every architecture, and what `run` built (nccl-tests'
    `make`) is of one; a bake pushed from an arm64 host is not an x86 host's."""
    blob = json.dumps({"base": base_digest, "copy": copies, "git": git, "run": run, "network": network,
                       "platform": platform}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def baked_repository(name: str) -> str:
    return f"fleetbench/{name.lower()}"


def baked_tag(base_ref: str, inputs: str) -> str:
    """`<base-tag>-<hash12>`; a base pinned by digest only uses its first 12 hex digits as the base tag."""
    base = ref_tag(base_ref) or (base_ref.split("@sha256:", 1)[1][:12] if "@sha256:" in base_ref else "latest")
    return f"{base[:100]}-{inputs[:12]}"


# -- git on the worker ------------------------------------------------------------------------
def public_url(url: str) -> str:
    """`url` without the user and password an https URL may carry (a token: https://bot:ghp_...@host/x.git): what
    the image's labels, its commit message, XCom, the rows, the logs and errors say of the source. Only the git
    calls see `url` itself."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            scheme, sep, rest = url.partition("://")
            if sep and "@" in rest:  # a password with an unencoded '/', '?' or '#' (base64): the host part ends
                return f"{scheme}://{rest.rpartition('@')[2]}"  # there for urlsplit; all up to the last '@' goes
            return url
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # IPv6
        return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))
    except ValueError:  # not a URL urlsplit can read (e.g. a bad port): say nothing of it
        return "<git url>"


def _git(*args: str, cwd: str | None = None) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}

    def public(text: str) -> str:  # git (and a timeout's message: the whole command) may quote the URL, token and all
        for arg in args:
            if (shown := public_url(arg)) != arg:
                text = text.replace(arg, shown)
        return text

    try:
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BakeError("bake_failed", f"git {args[0]}: no answer within {GIT_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise BakeError("bake_failed", public(f"git {args[0]}: {exc}")) from None
    if proc.returncode != 0:
        raise BakeError("bake_failed", f"git {args[0]} exited with {proc.returncode}: {_tail(public(proc.stderr))}")
    return proc.stdout


def git_revision(url: str, branch: str) -> str:
    """The commit `branch` points at in `url` (git ls-remote, no clone)."""
    out = _git("ls-remote", "--heads", "--", url, f"refs/heads/{branch}")
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}":
            return sha
    raise BakeError("bake_failed", f"git: branch {branch!r} not found in {public_url(url)}")


# -- the harness as a tar archive for put_archive ----------------------------------------------
def _add_tree(tar: tarfile.TarFile, src: Path, dest: str) -> None:
    """Add `src` (file or folder, without .git) as `dest` (absolute path in the container).

    Only file and symlink entries (links as links, never followed): the engine creates missing parent
    folders (0755) and leaves existing ones, with their modes, alone.
    """
    for f, is_link in _files_of(src):
        name = dest.strip("/") if src.is_file() else f"{dest.strip('/')}/{f.relative_to(src).as_posix()}"
        info = tarfile.TarInfo(name)
        if is_link:
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(f), 0o777
            info.mtime = int(f.lstat().st_mtime)
            tar.addfile(info)
            continue
        info.size = f.stat().st_size
        info.mode = 0o755 if os.access(f, os.X_OK) else 0o644
        info.mtime = int(f.stat().st_mtime)
        with f.open("rb") as fh:
            tar.addfile(info, fh)


# -- the bake ---------------------------------------------------------------------------------
def bake_image(api: docker.APIClient, name: str, spec: BakeSpec, base_ref: str, base_pinned_ref: str, base_digest: str,
               push_auth_config: dict | None = None, project_root: Path = PROJECT_ROOT,
               min_free_gb: float | None = None, free_bytes_hint: int | None = None,
               extra_labels: dict[str, str] | None = None) -> BakeResult:
    """Bake `spec` on top of `base_pinned_ref`, or reuse the image these inputs already made. Raises BakeError."""
    sources = [(c, resolve_src(c.src, project_root)) for c in spec.copy_]
    copies = copy_inputs(sources)
    git = None
    if spec.git:
        git = {"url": public_url(spec.git.url), "branch": spec.git.branch, "dest": spec.git.dest,
               "revision": git_revision(spec.git.url, spec.git.branch)}  # the clone uses spec.git.url (_bake)
    info = api.info()
    platform = f"{info.get('OSType') or 'linux'}/{info.get('Architecture') or 'unknown'}"
    inputs = inputs_hash(base_digest, copies, git, list(spec.run), spec.network, platform)
    repo, tag = baked_repository(name), baked_tag(base_ref, inputs)
    ref = f"{repo}:{tag}"
    source = ",".join(([f"git:{git['url']}#{git['branch']}"] if git else [])
                      + [f"copy:{c.src}" for c in spec.copy_]) or "run-only"
    copy_rev = hashlib.sha256("".join(c["sha256"] for c in copies).encode()).hexdigest() if copies else None
    revision = ",".join(([git["revision"]] if git else []) + ([f"sha256:{copy_rev}"] if copy_rev else [])) or "none"
    labels = {
        f"{LABEL}.managed": "true", f"{LABEL}.kind": "baked", f"{LABEL}.image": name,
        f"{LABEL}.bake.inputs": inputs, f"{LABEL}.bake.base_ref": base_ref, f"{LABEL}.bake.base_digest": base_digest,
        f"{LABEL}.harness.source": source, f"{LABEL}.harness.revision": revision, f"{LABEL}.version": __version__,
        STEP_LABEL: "", **(extra_labels or {}),
    }

    image_id = _cached(api, ref, inputs)
    if image_id is None and (image_id := _cached(api, f"{repo}:current", inputs, warn=False)):
        api.tag(image_id, repo, tag)  # a bake of these inputs lost the tag to another lane's, then cleanup took it
    if image_id is None and spec.push_to:
        image_id = _cached_in_registry(api, f"{spec.push_to}/{repo}", tag, inputs, ref, push_auth_config)
    cache_hit = image_id is not None
    if cache_hit:
        log.info("bake %s: cache hit, reusing %s (%s) for inputs %s", name, ref, image_id[:19], inputs[:12])
    else:
        log.info("bake %s: cache miss for inputs %s; baking %s from %s", name, inputs[:12], ref, base_pinned_ref)
        probe = PreparedImage(name=name, ref=ref)
        free = free_disk_bytes(api)
        if not check_disk(probe, min_free_gb, free if free is not None else free_bytes_hint, "baking"):
            raise BakeError(probe.failure_class, probe.error)
        image_id = _bake(api, name, spec, base_pinned_ref, sources, git, repo, tag, labels, source, revision)
    make_current(api, repo, image_id)
    result = BakeResult(ref=ref, image_id=image_id, cache_hit=cache_hit, inputs=inputs, source=source,
                        revision=revision, labels=labels)
    if spec.push_to:
        result.pushed_ref = push(api, image_id, f"{spec.push_to}/{repo}", tag, push_auth_config)
    return result


SUPERSEDED_TAG = "superseded-"  # + when the bake stopped being `current` (Unix time) + its ID: cleanup ages from then


def make_current(api: docker.APIClient, repo: str, image_id: str) -> None:
    """Tag `image_id` `<repo>:current` (the bake cleanup keeps). The bake that was current until now gets
    `<repo>:superseded-<unix time>-<id12>`: cleanup ages a superseded bake from that moment, not from its build, so a
    run that pinned it before this bake (and still has cases to run) keeps its image for `image_max_age_h`."""
    try:
        previous = api.inspect_image(f"{repo}:current")
    except NotFound:
        previous = None
    if previous is not None and previous["Id"] != image_id:
        stale = [t for t in previous.get("RepoTags") or [] if t.startswith(f"{repo}:{SUPERSEDED_TAG}")]
        # the image's own ID in the tag: two bakes superseded within a second must not share (and move) one tag
        short = previous["Id"].split(":", 1)[-1][:12]
        # on the engine's clock, as cleanup ages it: the worker that bakes may be another machine (a TLS engine)
        api.tag(previous["Id"], repo, f"{SUPERSEDED_TAG}{int(engine_now(api))}-{short}", force=True)
        for tag in stale:  # one stamp per image: the latest supersession counts
            try:
                api.remove_image(tag)
            except (NotFound, APIError):
                pass
    api.tag(image_id, repo, "current", force=True)


def _cached(api: docker.APIClient, ref: str, inputs: str, warn: bool = True) -> str | None:
    try:
        info = api.inspect_image(ref)
    except NotFound:
        return None
    if (info.get("Config") or {}).get("Labels", {}).get(f"{LABEL}.bake.inputs") != inputs:
        if warn:
            log.warning("bake: %s exists but was made from other inputs; baking again", ref)
        return None
    return info["Id"]


def _cached_in_registry(api: docker.APIClient, remote: str, tag: str, inputs: str, ref: str,
                        auth: dict | None) -> str | None:
    """Pull `<remote>:<tag>` if the fleet's registry has it (another host baked it); tag it as `ref`."""
    try:
        pull_with_progress(api, f"{remote}:{tag}", auth)
    except (DockerException, requests.RequestException) as exc:  # requests: the engine's connection broke
        kind = classify_pull_error(exc)
        (log.info if kind == "image_not_found" else log.warning)(
            "bake: %s:%s not in the registry (%s)", remote, tag, kind)
        return None
    image_id = _cached(api, f"{remote}:{tag}", inputs)
    if image_id:
        repo, _, t = ref.rpartition(":")
        api.tag(image_id, repo, t)
    return image_id


def _bake(api: docker.APIClient, name: str, spec: BakeSpec, base_pinned_ref: str, sources: list, git: dict | None,
          repo: str, tag: str, labels: dict, source: str, revision: str) -> str:
    """Run the setup container and commit it; the container is removed however this ends."""
    base = api.inspect_image(base_pinned_ref)["Config"] or {}
    container = api.create_container(
        image=base_pinned_ref, command=list(spec.run) or ["true"],
        labels={**labels, STEP_LABEL: labels[f"{LABEL}.bake.inputs"]},
        host_config=api.create_host_config(network_mode=spec.network), use_config_proxy=False,
    )
    cid = container["Id"]
    try:
        with tempfile.TemporaryDirectory(prefix="fleetbench-bake-") as tmp:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                if git:
                    checkout = Path(tmp) / "checkout"
                    _git("clone", "--quiet", "--depth", "1", "--branch", git["branch"], "--", spec.git.url,
                         str(checkout))
                    head = _git("rev-parse", "HEAD", cwd=str(checkout)).strip()
                    if head != git["revision"]:
                        raise BakeError("bake_failed", f"git: {git['branch']} moved from {git['revision'][:12]} "
                                                       f"to {head[:12]} while baking; the next try bakes "
                                                       "the new commit")
                    _add_tree(tar, checkout, git["dest"])
                for copy, path in sources:
                    _add_tree(tar, path, copy.dest)
            if git or sources:
                api.put_archive(cid, "/", buf.getvalue())
        if spec.run:
            _run_step(api, cid, spec)
        message = f"fleetbench bake {name}: {source} at {revision} on {base_pinned_ref}"
        committed = api.commit(cid, repository=repo, tag=tag, message=message, author=f"fleetbench {__version__}",
                               conf={"Labels": labels, "Cmd": base.get("Cmd"), "Entrypoint": base.get("Entrypoint")})
    except APIError as exc:
        raise BakeError("bake_failed", f"bake {name}: {exc.explanation or exc}") from None
    finally:
        try:
            api.remove_container(cid, force=True)
        except DockerException as exc:
            log.warning("bake: removing setup container %s failed: %s", cid[:12], exc)
    image_id = committed["Id"]
    log.info("bake %s: committed %s:%s (%s)", name, repo, tag, image_id[:19])
    return image_id


def _run_step(api: docker.APIClient, cid: str, spec: BakeSpec) -> None:
    """Start the setup container and wait; a non-zero exit or a timeout raises bake_failed with the log's tail."""
    api.start(cid)
    try:
        status = api.wait(cid, timeout=spec.timeout_s).get("StatusCode")
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        api.stop(cid, timeout=5)
        status = None
    output = api.logs(cid, stdout=True, stderr=True).decode(errors="replace")
    for line in output.splitlines()[-200:]:
        log.info("bake step: %s", line)
    if status is None:
        raise BakeError("bake_failed", f"bake step {spec.run} timed out after {spec.timeout_s} s; last lines:\n"
                                       f"{_tail(output)}")
    if status != 0:
        raise BakeError("bake_failed", f"bake step {spec.run} exited with {status}; last lines:\n{_tail(output)}")


def push(api: docker.APIClient, image_id: str, remote: str, tag: str, auth: dict | None, attempts: int = 3) -> str:
    """Push the baked image as `<remote>:<tag>`; returns `<remote>@sha256:...`. Raises BakeError with a named class."""
    api.tag(image_id, remote, tag)
    for attempt in range(1, attempts + 1):
        try:
            digest = None
            for event in api.push(remote, tag=tag, stream=True, decode=True, auth_config=auth):
                if "error" in event:
                    raise APIError(event["error"])
                digest = (event.get("aux") or {}).get("Digest", digest)
            log.info("bake: pushed %s:%s (%s)", remote, tag, digest)
            return f"{remote}@{digest}"
        except (DockerException, requests.RequestException) as exc:  # requests: the engine's connection broke
            kind = classify_pull_error(exc)
            if kind in PERMANENT or attempt == attempts:
                raise BakeError(kind, f"push {remote}:{tag}: {getattr(exc, 'explanation', None) or exc}") from None
            log.warning("push %s:%s failed (attempt %d/%d, %s); retrying in %d s", remote, tag, attempt, attempts,
                        kind, 2 ** attempt)
            time.sleep(2 ** attempt)
    raise AssertionError("unreachable")


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])

