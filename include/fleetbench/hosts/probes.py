"""Probe commands that gather a host's facts, and the runners that execute them.

Each probe's output (or its error output) is saved as one file per command in a folder, plus
`probes.json` with exit codes and durations, so a verdict can be re-evaluated offline from the
folder alone (`fleetbench host-check --facts DIR`). Commands are fixed argument lists; nothing
from a config or a parameter is interpolated into them.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

NVIDIA_SMI_QUERY = (
    "index,name,uuid,driver_version,memory.total,memory.used,power.limit,clocks.max.sm,pci.bus_id"
)


@dataclass(frozen=True)
class Probe:
    filename: str
    argv: tuple[str, ...]


PROBES: tuple[Probe, ...] = (
    Probe("uname-r.txt", ("uname", "-r")),
    Probe("nvidia-smi-query.csv", ("nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv")),
    Probe("nvidia-smi.txt", ("nvidia-smi",)),
    Probe("proc-driver-nvidia-version.txt", ("cat", "/proc/driver/nvidia/version")),
    Probe("docker-version.txt", ("docker", "version")),
    Probe("docker-info.json", ("docker", "info", "--format", "{{json .}}")),
    Probe("df-docker-root.txt", ("sh", "-c", "df -Pk \"$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)\"")),
)


@dataclass
class ProbeResult:
    filename: str
    command: list[str]
    exit_code: int | None  # None: could not run at all (not found, timed out, host unreachable)
    duration_s: float
    error: str | None


class CommandRunner(Protocol):
    """Runs one argument list on a host: returns (exit_code, stdout, stderr); exit_code None if it could not run."""

    name: str

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]: ...


class LocalRunner:
    name = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]:
        try:
            proc = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, env=self.env, check=False)
        except FileNotFoundError:
            return None, b"", f"{argv[0]}: command not found".encode()
        except subprocess.TimeoutExpired as exc:
            return None, exc.stdout or b"", f"timed out after {timeout_s:g} s".encode()
        return proc.returncode, proc.stdout, proc.stderr


def gather(runner: CommandRunner, out_dir: Path, timeout_s: float = 15.0, probes: tuple[Probe, ...] = PROBES) -> list[ProbeResult]:
    """Run every probe, write `<filename>` (stdout, or stderr when it failed) and `probes.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[ProbeResult] = []
    for probe in probes:
        start = time.monotonic()
        code, out, err = runner.run(probe.argv, timeout_s)
        duration = time.monotonic() - start
        ok = code == 0
        (out_dir / probe.filename).write_bytes(out if ok else (err or out))
        error = None if ok else (err.decode(errors="replace").strip()[-500:] or f"exit code {code}")
        results.append(ProbeResult(probe.filename, list(probe.argv), code, round(duration, 3), error))
    (out_dir / "probes.json").write_text(json.dumps({"runner": runner.name, "probes": [asdict(r) for r in results]}, indent=2))
    return results
