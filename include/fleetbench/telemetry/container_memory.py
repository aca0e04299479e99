"""A container's peak memory while a case runs, read by the case's operator on the worker.

Where it comes from, best first:
- `cgroup_v2`: the container's `memory.peak` (kernel 5.19+), when its engine runs on this machine;
- `cgroup_v1`: its `memory.max_usage_in_bytes`, same condition;
- `engine_stats`: the engine's stats stream (one sample a second): `max_usage` where the engine
  reports it (cgroup v1), else the largest `usage` seen. The only source for a remote engine.

The cgroup goes with the container's last process, so it is read every `period_s` while the container
runs (the counter only grows: the last reading before exit is the peak, up to what the final
`period_s` added). Readings that are not a positive number of at most MAX_MIB are ignored.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_MIB = 16 * 1024 * 1024  # 16 TiB: any reading above it is not a container's memory
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_files(cid: str, root: Path = CGROUP_ROOT) -> list[tuple[Path, str]]:
    """Candidate peak-memory files of container `cid` (cgroupfs and systemd drivers, v2 and v1), best first."""
    return [
        (root / "system.slice" / f"docker-{cid}.scope" / "memory.peak", "cgroup_v2"),
        (root / "docker" / cid / "memory.peak", "cgroup_v2"),
        (root / "memory" / "docker" / cid / "memory.max_usage_in_bytes", "cgroup_v1"),
        (root / "memory" / "system.slice" / f"docker-{cid}.scope" / "memory.max_usage_in_bytes", "cgroup_v1"),
    ]


def mib(value: Any) -> float | None:
    """Bytes -> MiB, or None for a reading that is not a positive, believable number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if not (0 < v / MIB <= MAX_MIB):  # also false for NaN
        return None
    return round(v / MIB, 3)


def stats_peak_mib(sample: dict) -> float | None:
    """One engine stats sample -> the peak it shows (`max_usage` on cgroup v1, else `usage`)."""
    mem = sample.get("memory_stats") or {}
    return mib(mem.get("max_usage")) or mib(mem.get("usage"))


class PeakMemory:
    """Samples one container's peak memory in a thread from `start()` until `stop()`; `result()` -> (MiB, source)."""

    def __init__(self, cli, cid: str, local: bool, period_s: float = 0.1, root: Path = CGROUP_ROOT):
        self.cli, self.cid, self.local, self.period_s, self.root = cli, cid, local, period_s, root
        self.peak: float | None = None
        self.source: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # stop() reads on the caller's thread while the sampler may be noting
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"peak-memory-{cid[:12]}")

    def start(self) -> "PeakMemory":
        self._thread.start()
        return self

    def stop(self) -> tuple[float | None, str | None]:
        """Read once more (the cgroup may still be there), end the sampling, and return what was seen."""
        self._read_cgroup()
        self._stop.set()
        self._thread.join(timeout=5)
        return self.result()

    def result(self) -> tuple[float | None, str | None]:
        return self.peak, self.source

    def _note(self, value: float | None, source: str) -> None:
        with self._lock:
            if value is not None and (self.peak is None or value > self.peak):
                self.peak, self.source = value, source

    def _cgroup_file(self) -> tuple[Path, str] | None:
        return next(((p, s) for p, s in cgroup_files(self.cid, self.root) if p.is_file()), None)

    def _read_cgroup(self) -> bool:
        found = self._cgroup_file() if self.local else None
        if found is None:
            return False
        try:
            self._note(mib(found[0].read_text().strip()), found[1])
        except OSError:  # the container's cgroup went away between the check and the read
            return False
        return True

    def _run(self) -> None:
        try:
            if self.local and self._read_cgroup():
                while not self._stop.wait(self.period_s):
                    self._read_cgroup()
                return
            self._run_stats()
        except Exception as exc:  # sampling is best effort: the case's outcome never depends on it
            log.warning("peak memory of container %s: sampling stopped: %s", self.cid[:12], exc)

    def _run_stats(self) -> None:
        """The engine's stats stream (ends when the container stops); reading a cgroup when one appears."""
        for sample in self.cli.stats(self.cid, decode=True, stream=True):
            if self._stop.is_set():
                return
            if self.local and self._read_cgroup():
                continue
            self._note(stats_peak_mib(sample or {}), "engine_stats")
