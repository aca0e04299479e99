"""A host's CPU energy from its RAPL counters (Linux powercap), read the way CodeCarbon reads them.

Each CPU package is a powercap zone `intel-rapl:N` (also on AMD Zen) named `package-N`, with a
cumulative counter `energy_uj` that wraps to 0 after `max_energy_range_uj`. A case's CPU energy is
the sum over the packages of counter deltas from the container's start to its end; a delta that went
backwards wrapped once (end + range - start). Sampling at least every `SAMPLE_S` keeps it at one
wrap per interval: the largest range seen, 262,143 J, lasts about 20 minutes at 200 W.

As CodeCarbon does by default, only package zones count: not their `core`/`uncore`/`dram`
sub-zones (dram is not in the package's TDP, core is part of the package) and not `psys` (the
platform). The counters measure the whole package, so a case's figure includes anything else the
host ran meanwhile: one benchmark per host keeps that small.

Unreadable counters (no powercap, a VM, Docker's masked /sys, or `energy_uj` readable by root only,
as Linux has it since 5.10) raise `RaplUnavailable` with the reason; the case's energy is then
estimated from the CPU's TDP instead (`fleetbench.metrics`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
SAMPLE_S = 60.0


class RaplUnavailable(Exception):
    """No readable RAPL package counter; the message says why."""


@dataclass
class Zone:
    path: Path
    name: str
    max_range_uj: int
    last_uj: int = 0
    energy_uj: int = 0  # accumulated since start
    wraps: int = 0


def _read_int(path: Path) -> int:
    text = path.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{path}: {text[:40]!r} is not a counter")
    return int(text)


def package_zones(root: Path | None = None) -> list[Zone]:
    """The readable package zones under `root` (default `POWERCAP`), their counters read once; raises
    RaplUnavailable saying why not."""
    root = Path(root) if root is not None else POWERCAP
    try:
        entries = sorted(p for p in root.iterdir() if p.name.startswith("intel-rapl:") and p.name.count(":") == 1)
    except FileNotFoundError:
        raise RaplUnavailable(f"{root} does not exist (no powercap on this machine)") from None
    except OSError as exc:
        raise RaplUnavailable(f"cannot list {root}: {exc.strerror or exc}") from None
    zones, problems = [], []
    for entry in entries:
        try:
            name = (entry / "name").read_text().strip()
        except OSError as exc:
            problems.append(f"{entry / 'name'}: {exc.strerror or exc}")
            continue
        if not name.startswith("package"):
            continue  # psys (the platform): not the CPU's
        try:
            zone = Zone(entry, name, _read_int(entry / "max_energy_range_uj"))
            zone.last_uj = _read_int(entry / "energy_uj")
        except (OSError, ValueError) as exc:
            problems.append(str(exc) if isinstance(exc, ValueError) else
                            f"{exc.filename or entry}: {exc.strerror or exc}")
            continue
        zones.append(zone)
    if not zones:
        why = "; ".join(problems) if problems else "no intel-rapl package zone"
        raise RaplUnavailable(f"no readable RAPL package counter under {root}: {why}")
    return zones


def counter_delta(start_uj: int, end_uj: int, max_range_uj: int) -> tuple[int, bool]:
    """(microjoules from start to end, whether the counter wrapped): a counter that went backwards wrapped once."""
    if end_uj >= start_uj:
        return end_uj - start_uj, False
    return end_uj + max_range_uj - start_uj, True


@dataclass
class RaplMeter:
    """Package energy from `start` on; `sample` (also on a background thread, every `period_s`) adds each
    zone's delta since the last reading, `stop` takes the last one and returns the figures."""

    zones: list[Zone]
    period_s: float = SAMPLE_S
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, root: Path | None = None, period_s: float = SAMPLE_S, background: bool = True) -> "RaplMeter":
        meter = cls(package_zones(root), period_s)
        if background:
            meter._thread = threading.Thread(target=meter._loop, name="fleetbench-rapl", daemon=True)
            meter._thread.start()
        return meter

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            for zone in self.zones:
                try:
                    now = _read_int(zone.path / "energy_uj")
                except (OSError, ValueError):
                    continue  # read again at the next sample
                delta, wrapped = counter_delta(zone.last_uj, now, zone.max_range_uj)
                zone.energy_uj += delta
                zone.wraps += wrapped
                zone.last_uj = now

    def stop(self) -> dict:
        """{"energy_j", "zones": [names], "wraps"}: the packages' energy since start (later calls: no new reading)."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.sample()
        return {"energy_j": round(sum(z.energy_uj for z in self.zones) / 1e6, 6),
                "zones": [z.name for z in self.zones], "wraps": sum(z.wraps for z in self.zones)}
