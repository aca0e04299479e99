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
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

NVIDIA_SMI_QUERY = (
    "index,name,uuid,driver_version,memory.total,memory.used,power.limit,clocks.max.sm,pci.bus_id"
)
PROBE_TIMEOUT_S = 15.0
# A GPU smoke container may have to pull its (small) image first.
GPU_SMOKE_TIMEOUT_S = 120.0
GPU_SMOKE_FILE = "gpu-smoke.txt"
GPU_SMOKE_LABEL = "org.fleetbench.probe=gpu-smoke"  # finds a smoke container that outlived its `--rm`
PROBES_FILE = "probes.json"
# Same shape as fleetbench.config.IMAGE_REF_PATTERN; it never starts with "-", so it cannot be taken for an option.
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._:/-]*[a-z0-9](:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class Probe:
    filename: str
    argv: tuple[str, ...]
    timeout_s: float | None = None  # None: gather's default


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


def gpu_smoke_probe(image: str) -> Probe:
    """`docker run --rm --network none --gpus all IMAGE nvidia-smi -L`: does a GPU container start at all?

    The NVIDIA runtime mounts `nvidia-smi` into any image, so a small base image is enough.
    Raises ValueError for anything that is not an image reference.
    """
    if not _IMAGE_REF.match(image or ""):
        raise ValueError(f"not an image reference: {image!r}")
    argv = ("docker", "run", "--rm", "--network", "none", "--label", GPU_SMOKE_LABEL, "--gpus", "all", image,
            "nvidia-smi", "-L")
    return Probe(GPU_SMOKE_FILE, argv, timeout_s=GPU_SMOKE_TIMEOUT_S)


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

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]:
        try:
            proc = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, env=self.env, check=False)
        except FileNotFoundError:
            return None, b"", f"{argv[0]}: command not found".encode()
        except OSError as exc:  # e.g. not executable
            return None, b"", f"{argv[0]}: {exc.strerror or exc}".encode()
        except subprocess.TimeoutExpired as exc:
            return None, exc.stdout or b"", f"timed out after {timeout_s:g} s".encode()
        return proc.returncode, proc.stdout, proc.stderr


def gather(runner: CommandRunner, out_dir: Path, timeout_s: float = PROBE_TIMEOUT_S, probes: tuple[Probe, ...] = PROBES,
           gpu_smoke_image: str | None = None) -> list[ProbeResult]:
    """Run every probe, write `<filename>` (its stdout; stdout and stderr when it failed) and `probes.json`.

    With `gpu_smoke_image` (only when the host's cases need GPUs) the GPU smoke container runs last;
    an image that is not an image reference raises ValueError before anything runs. An unreachable
    host is recorded in `probes.json` (`unreachable`) and ends the gathering; that never raises.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if gpu_smoke_image:
        probes = (*probes, gpu_smoke_probe(gpu_smoke_image))
    results: list[ProbeResult] = []
    unreachable = None
    try:
        for probe in probes:
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


def _run_probe(runner: CommandRunner, probe: Probe, out_dir: Path, timeout_s: float) -> ProbeResult:
    start = time.monotonic()
    code, out, err = runner.run(probe.argv, timeout_s)
    duration = time.monotonic() - start
    ok = code == 0
    (out_dir / probe.filename).write_bytes(out if ok else _everything_said(out, err))
    error = None if ok else (err.decode(errors="replace").strip()[-500:] or f"exit code {code}")
    return ProbeResult(probe.filename, list(probe.argv), code, round(duration, 3), error)


def _everything_said(out: bytes, err: bytes) -> bytes:
    """A failed command keeps all it said: nvidia-smi reports its errors on stdout, docker on stderr."""
    if out and err and not out.endswith(b"\n"):
        out += b"\n"
    return out + err
