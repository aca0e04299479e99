"""Probe commands that gather a host's facts, and the runners that execute them.

Each probe's output (or its error output) is saved as one file per command in a folder, plus
`probes.json` with exit codes, durations and how the host was reached, so a verdict can be
re-evaluated offline from the folder alone (`fleetbench host-check --facts DIR`). Commands are
fixed argument lists; the only value that comes from outside (the GPU smoke image) is checked
against the image-reference pattern before it is put into one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from fleetbench.config import DCGM_TIMEOUT_S, IMAGE_REF_PATTERN

NVIDIA_SMI_QUERY = (
    "index,name,uuid,driver_version,memory.total,memory.used,power.limit,clocks.max.sm,pci.bus_id"
)
PROBE_TIMEOUT_S = 15.0
# A GPU smoke container may have to pull its (small) image first.
GPU_SMOKE_TIMEOUT_S = 120.0
GPU_SMOKE_FILE = "gpu-smoke.txt"
GPU_SMOKE_LABEL = "org.fleetbench.probe=gpu-smoke"  # finds a smoke container that outlived its `--rm`
# Each smoke container's name: removed by it when its probe timed out (a hung `nvidia-smi` never exits, so `--rm`
# never removes it, and killing the docker CLI leaves the container to the engine, holding every GPU); maintenance
# removes one still there past GPU_SMOKE_TIMEOUT_S (the name, which an image cannot give, marks it as fleetbench's).
GPU_SMOKE_NAME_PREFIX = "fleetbench-gpu-smoke-"
CLEANUP_TIMEOUT_S = 30.0
PROBES_FILE = "probes.json"
# A reference never starts with "-", so it cannot be taken for an option.
_IMAGE_REF = re.compile(IMAGE_REF_PATTERN)


@dataclass(frozen=True)
class Probe:
    filename: str
    argv: tuple[str, ...]
    timeout_s: float | None = None  # None: gather's default
    on_timeout: tuple[str, ...] = ()  # run (best effort) when the probe did not end: what it leaves behind goes


PROBES: tuple[Probe, ...] = (
    Probe("uname-r.txt", ("uname", "-r")),
    Probe("nvidia-smi-query.csv", ("nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv")),
    Probe("nvidia-smi.txt", ("nvidia-smi",)),
    Probe("proc-driver-nvidia-version.txt", ("cat", "/proc/driver/nvidia/version")),
    Probe("docker-version.txt", ("docker", "version")),
    Probe("docker-info.json", ("docker", "info", "--format", "{{json .}}")),
    Probe("df-docker-root.txt", ("sh", "-c", "df -Pk \"$(docker info --format '{{.DockerRootDir}}' 2>/dev/null "
                                             "|| echo /var/lib/docker)\"")),
)


# GPU health (only when the host's cases need GPUs): nvidia-smi's full query (XML, and text as a fallback),
# the topology matrix, the GPU list with its MIG devices (`nvidia-smi -L`), the kernel log's XID lines and,
# when configured, a DCGM diagnostic.
SMI_XML_FILE = "nvidia-smi-q.xml"
SMI_TEXT_FILE = "nvidia-smi-q.txt"
TOPO_FILE = "nvidia-smi-topo-m.txt"
GPU_LIST_FILE = "nvidia-smi-L.txt"  # the GPUs and their MIG devices (profile, MIG- UUID)
XID_FILE = "kernel-xid.txt"
DCGM_FILE = "dcgmi-diag.txt"
HEALTH_TIMEOUT_S = 60.0
_TOOL_DIR = re.compile(r"^(/[A-Za-z0-9_.+-]{1,100}){1,20}/?$")
# The kernel log's XID lines of the last N hours: journalctl -k (already limited to the window), else dmesg
# (seconds since boot; the first line carries the uptime, so the window is applied when reading). A log that
# cannot be read (no permission, no journal) says so and fails, so that it never reads as "no XID". No `-q`:
# it would hide journalctl's own "No journal files ..." / "not seeing messages" lines (and it exits 0 then).
XID_SCRIPT = r"""h=$1
if out=$(journalctl -k --since "-${h}h" --no-pager 2>&1); then
  case "$out" in
    *"insufficient permissions"*|*"No journal files"*|*"not seeing messages"*) ;;
    *) echo "# kernel log: journalctl -k --since -${h}h, window $((h * 3600)) s"
       printf '%s
' "$out" | grep 'NVRM: Xid' | tail -n 1000; exit 0 ;;
  esac
fi
jout=$out
if out=$(dmesg 2>&1); then
  echo "# kernel log: dmesg, window $((h * 3600)) s, uptime $(cut -d' ' -f1 /proc/uptime)"
  printf '%s
' "$out" | grep 'NVRM: Xid' | tail -n 1000; exit 0
fi
echo "# kernel log: none"
printf 'journalctl -k: %s
' "$jout" | tail -n 3
printf 'dmesg: %s
' "$out" | tail -n 3
exit 1"""


def health_probes(xid_window_hours: int = 24, dcgm_level: int | None = None) -> tuple[Probe, ...]:
    """The GPU health probes; raises ValueError for a window or level out of range, before anything runs."""
    if type(xid_window_hours) is not int or not 1 <= xid_window_hours <= 24 * 90:
        raise ValueError(f"XID window must be 1 to 2160 hours, got {xid_window_hours!r}")
    # nvidia-smi -q takes seconds per GPU on a busy 8-GPU host: more time than the one-line probes get.
    probes = [Probe(SMI_XML_FILE, ("nvidia-smi", "-q", "-x"), timeout_s=HEALTH_TIMEOUT_S),
              Probe(SMI_TEXT_FILE, ("nvidia-smi", "-q"), timeout_s=HEALTH_TIMEOUT_S),
              Probe(TOPO_FILE, ("nvidia-smi", "topo", "-m"), timeout_s=HEALTH_TIMEOUT_S),
              Probe(XID_FILE, ("sh", "-c", XID_SCRIPT, "xid", str(xid_window_hours)), timeout_s=HEALTH_TIMEOUT_S),
              Probe(GPU_LIST_FILE, ("nvidia-smi", "-L"), timeout_s=HEALTH_TIMEOUT_S)]
    if dcgm_level is not None:
        if dcgm_level not in DCGM_TIMEOUT_S:
            raise ValueError(f"dcgmi diag level must be 1 to 4, got {dcgm_level!r}")
        probes.append(Probe(DCGM_FILE, ("dcgmi", "diag", "-r", str(dcgm_level)), timeout_s=DCGM_TIMEOUT_S[dcgm_level]))
    return tuple(probes)


def on_path(probes: tuple[Probe, ...], folders: tuple[str, ...]) -> tuple[Probe, ...]:
    """The probes with `folders` put before PATH (where nvidia-smi or dcgmi live when a non-interactive SSH
    login does not find them). Each must be an absolute path of plain characters: raises ValueError else."""
    for folder in folders:
        if not isinstance(folder, str) or not _TOOL_DIR.match(folder):
            raise ValueError(f"not a plain absolute folder: {folder!r}")
    if not folders:
        return probes
    prefix = ":".join(folders)
    wrap = ("sh", "-c", 'PATH="$0:$PATH"; export PATH; exec "$@"', prefix)
    return tuple(Probe(p.filename, (*wrap, *p.argv), p.timeout_s, (*wrap, *p.on_timeout) if p.on_timeout else ())
                 for p in probes)


def gpu_smoke_probe(image: str) -> Probe:
    """`docker run --rm --network none --gpus all IMAGE nvidia-smi -L`: does a GPU container start at all?

    The NVIDIA runtime mounts `nvidia-smi` into any image, so a small base image is enough.
    Raises ValueError for anything that is not an image reference.
    """
    if not _IMAGE_REF.match(image or ""):
        raise ValueError(f"not an image reference: {image!r}")
    name = GPU_SMOKE_NAME_PREFIX + uuid.uuid4().hex[:12]
    argv = ("docker", "run", "--rm", "--name", name, "--network", "none", "--label", GPU_SMOKE_LABEL, "--gpus", "all",
            image, "nvidia-smi", "-L")
    return Probe(GPU_SMOKE_FILE, argv, timeout_s=GPU_SMOKE_TIMEOUT_S, on_timeout=("docker", "rm", "-f", name))


class HostUnreachable(Exception):
    """The host could not be reached at all (connection refused or timed out, host key refused, no login)."""


@dataclass
class ProbeResult:
    filename: str
    command: list[str]
    exit_code: int | None  # None: could not run at all (not found, timed out)
    duration_s: float
    error: str | None


class CommandRunner(Protocol):
    """Runs one argument list on a host: returns (exit_code, stdout, stderr); exit_code None if it could not run.

    Raises HostUnreachable when the host itself cannot be reached; gather then stops probing.
    """

    name: str

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]: ...


def runner_for(connection: str, docker_url: str):
    """Where a host's probes run: this machine (`connection: local`, with `docker_url` as its engine) or the
    host over its Airflow SSH connection (docker then runs on the host itself)."""
    if connection == "local":
        return LocalRunner(env={**os.environ, "DOCKER_HOST": docker_url})
    from fleetbench.hosts.ssh import SSHRunner  # imports the SSH provider only when a fleet uses it

    return SSHRunner(connection)


class LocalRunner:
    name = "local"
    # The base probes (`PROBES`: queries that change nothing) run at once here: each is a process of its own, and
    # nvidia-smi on a multi-GPU host and the docker CLI take 0.1-1 s each, one after the other.
    concurrent = True

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self._cancelled = False

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]:
        try:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
        except FileNotFoundError:
            return None, b"", f"{argv[0]}: command not found".encode()
        except OSError as exc:  # e.g. not executable
            return None, b"", f"{argv[0]}: {exc.strerror or exc}".encode()
        with self._lock:
            self._live.add(proc)
            if self._cancelled:  # started as the gathering was called off
                proc.kill()
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:  # as subprocess.run: what it said so far (a child of the probe
            proc.kill()  # that holds its output open would make a second communicate() wait for that child)
            proc.wait()
            return None, exc.stdout or b"", f"timed out after {timeout_s:g} s".encode()
        except BaseException:  # the check's deadline (or the task's SIGTERM) in this thread: the probe goes too
            proc.kill()
            proc.wait()
            raise
        finally:
            with self._lock:
                self._live.discard(proc)
        return proc.returncode, out, err

    def cancel(self) -> None:
        """Kill every probe still running, and any that starts after: the gathering was called off (the check's
        deadline passed in the thread that waits for the probes running at once)."""
        with self._lock:
            self._cancelled = True
            for proc in self._live:
                proc.kill()


def gather(runner: CommandRunner, out_dir: Path, timeout_s: float = PROBE_TIMEOUT_S, probes: tuple[Probe, ...] = PROBES,
           gpu_smoke_image: str | None = None, extra: tuple[Probe, ...] = (),
           path: tuple[str, ...] = ()) -> list[ProbeResult]:
    """Run every probe, write `<filename>` (its stdout; stdout and stderr when it failed) and `probes.json`.

    `extra` probes (the GPU health probes) run after `probes`, one at a time; `path` folders go before PATH for all
    of them (see `on_path`; a folder that is not a plain absolute path raises ValueError before anything runs).
    With `gpu_smoke_image` (only when the host's cases need GPUs) the GPU smoke container runs last;
    an image that is not an image reference raises ValueError before anything runs. An unreachable
    host is recorded in `probes.json` (`unreachable`) and ends the gathering; that never raises.
    On a runner that says it can (`concurrent`: this machine's), `probes` run at once; the results keep their order.
    """
    after = (*extra, *((gpu_smoke_probe(gpu_smoke_image),) if gpu_smoke_image else ()))
    probes, after = on_path(tuple(probes), tuple(path)), on_path(after, tuple(path))
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[ProbeResult] = []
    unreachable = None
    try:
        if getattr(runner, "concurrent", False) and len(probes) > 1:
            results.extend(_at_once(runner, probes, out_dir, timeout_s))
            probes = ()
        for probe in (*probes, *after):
            results.append(_run_probe(runner, probe, out_dir, probe.timeout_s or timeout_s))
    except HostUnreachable as exc:
        unreachable = str(exc)
    finally:
        close = getattr(runner, "close", None)
        if close:
            close()
    record = {"runner": runner.name, "unreachable": unreachable, "probes": [asdict(r) for r in results]}
    (out_dir / PROBES_FILE).write_text(json.dumps(record, indent=2))
    return results


def _at_once(runner, probes: tuple[Probe, ...], out_dir: Path, timeout_s: float) -> list[ProbeResult]:
    """Each probe in a thread of its own, their results in the probes' order. Called off (the check's deadline, or
    the task's SIGTERM, raised in this thread while it waits), every probe still running is killed and this returns
    at once, as a probe run alone returned: a thread waiting on a process that cannot die (a probe stuck in the
    kernel on a lost GPU) stays behind as a daemon, holding nothing up, not even the interpreter's exit."""
    results: list[ProbeResult | None] = [None] * len(probes)
    errors: list[BaseException | None] = [None] * len(probes)

    def one(i: int, probe: Probe) -> None:
        try:
            results[i] = _run_probe(runner, probe, out_dir, probe.timeout_s or timeout_s)
        except BaseException as exc:  # said in the gathering thread, as when it ran the probe itself
            errors[i] = exc

    threads = [threading.Thread(target=one, args=(i, p), daemon=True, name=f"probe {p.filename}")
               for i, p in enumerate(probes)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        runner.cancel()
        raise
    for error in errors:
        if error is not None:
            raise error
    return results  # type: ignore[return-value]


def _run_probe(runner: CommandRunner, probe: Probe, out_dir: Path, timeout_s: float) -> ProbeResult:
    start = time.monotonic()
    code, out, err = runner.run(probe.argv, timeout_s)
    duration = time.monotonic() - start
    if code is None and probe.on_timeout:  # it did not end (or could not run): remove what it may have left
        try:
            runner.run(probe.on_timeout, CLEANUP_TIMEOUT_S)
        except HostUnreachable:
            pass  # the host went away meanwhile: maintenance removes it once it answers
    ok = code == 0
    (out_dir / probe.filename).write_bytes(out if ok else _everything_said(out, err))
    error = None if ok else (err.decode(errors="replace").strip()[-500:] or f"exit code {code}")
    return ProbeResult(probe.filename, list(probe.argv), code, round(duration, 3), error)


def _everything_said(out: bytes, err: bytes) -> bytes:
    """A failed command keeps all it said: nvidia-smi reports its errors on stdout, docker on stderr."""
    if out and err and not out.endswith(b"\n"):
        out += b"\n"
    return out + err
