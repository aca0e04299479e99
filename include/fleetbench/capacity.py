"""Capacity profiles: peak memory against batch size, fitted from the warehouse, used before a case runs.

A profile per (harness, model, precision, device kind, memory variant, benchmark) is a line through the
(per-device batch, peak memory per device) points of its ok results: peak GPU memory for GPU cases, the
container's peak memory for CPU cases, fitted by Siegel's repeated median (each point's median slope to the points
at other batch sizes, the median of those, then the median intercept) because a handful of nightly readings at a
few batch sizes is all a profile has, and one bad reading (a neighbour's process on the GPU, a page-cache spike) must
not tilt the line: it holds with up to half of the readings bad, needs no tuning constant (Huber needs a scale) and
the answer can be checked by hand. (Theil-Sen, the median of all pairwise slopes, let one spike at a batch size read
once carry every slope to that batch size.)
The memory variant is the harness's other axes that change peak memory (`Harness.memory_flags`:
torch_synthetic's channels_last and compile, read from the command as the precision is; "" for the rest): an
eager case's OOM must not skip the compiled case at that batch, nor its readings predict the compiled ones.
Next to the line: how many points, at how many batch sizes, and the residual spread
(`spread_mib`, 3 x 1.4826 x the median absolute residual, at least 2 % of the median reading), so
a prediction is `predicted_mib +- spread_mib`. And the smallest batch known to have died of OOM per
memory size (`ooms`): an OOM at batch b with C MiB means every batch >= b OOMs on C MiB or less, unless an
ok result of a later night (a `force_cases` rerun, a night after a fix) ran batch b or more on C MiB or less.

The plan asks `assess` for each case on a host whose memory is known (the container's `mem_limit`
for a CPU case; the GPUs' memory from the host's newest stored facts that have it for a GPU case). The case is
a predicted OOM when `predicted + spread > capacity x (1 - margin_pct / 100)` and no ok result at that batch or
above on that much memory or less is on record, or when an OOM at that batch or below on that much memory or more
is on record. What then happens is
`fleet.capacity.on_predicted_oom` (skip | warn | run); a profile with fewer than `confident_points`
points only warns. No profile (too few points, one batch size, bad readings, memory falling with
the batch, unknown capacity) means no prediction, and the case runs: the reason is in its row.
"""

from __future__ import annotations

import json
import logging
import math
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Iterable, Mapping

from fleetbench.harnesses import HARNESSES
from fleetbench.metrics import precision_of
from fleetbench.telemetry.container_memory import MAX_MIB

log = logging.getLogger(__name__)

DEFAULT_HARNESS = "tf_cnn_benchmarks"
OOM_CLASSES = ("gpu_oom", "oom_killed")
# The OOM that says the profiled memory ran out: the GPU's for a GPU case (a GPU case killed by the kernel
# ran out of host or container memory, which says nothing of its GPU), the container's for a CPU case.
PROFILED_OOM = {"gpu": "gpu_oom", "cpu": "oom_killed"}
PREDICTED_OOM = "predicted_oom"
MAD_TO_SIGMA = 1.4826
SPREAD_SIGMAS = 3.0
SPREAD_FLOOR = 0.02  # of the median reading: no reading is more exact than that (page cache, allocator slack)
# A reading this close to its device's memory is what the framework reserved, not what the batch needed: TensorFlow
# takes nearly all of a GPU up front unless told to grow (TF_FORCE_GPU_ALLOW_GROWTH=true, tf_cnn_benchmarks
# --allow_growth). A profile whose every reading is that is no line: fitted, it predicted every batch an OOM.
AT_CAPACITY = 0.95
_BYTES = re.compile(r"^([0-9]+)([bkmgBKMG]?)$")
_UNIT = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

# harness, model, precision, device kind, memory variant, benchmark: two benchmarks of one model differ in what
# memory a batch takes (a forward-only one, another --image_size or --xla in its extra_args, another image)
Key = tuple[str, str, str, str, str, str]


@dataclass(frozen=True)
class Settings:
    """`fleet.capacity` (fleetbench.config.CapacitySettings) as the fit and the plan use it."""

    on_predicted_oom: str = "skip"
    min_points: int = 3
    confident_points: int = 5
    margin_pct: float = 10.0
    window: int = 200


def key_of(row: Mapping[str, Any]) -> Key:
    """A result row's (or a case's dict's) profile key."""
    harness = row.get("harness") or DEFAULT_HARNESS
    return (harness, str(row.get("model")), row.get("precision") or precision_of(row.get("command")) or "fp32",
            row.get("device") or "gpu", variant_of(harness, row.get("command")), str(row.get("benchmark") or ""))


def variant_of(harness: str, command: Any) -> str:
    """The memory variant of a case of that harness with that command ("" for a harness without one)."""
    h = HARNESSES.get(harness)
    return h.memory_variant(command) if h is not None else ""


def reading(row: Mapping[str, Any]) -> Any:
    """The row's peak memory per device: GPU memory for a GPU case, the container's for a CPU case."""
    return row.get("peak_gpu_mem_mib") if (row.get("device") or "gpu") == "gpu" else row.get("peak_mem_mib")


def valid_mib(value: Any) -> float | None:
    """A memory reading in MiB, or None when it is not a positive, finite, believable number."""
    if isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and 0 < v <= MAX_MIB else None


@dataclass
class Profile:
    key: Key
    points: list[tuple[int, float]] = field(default_factory=list)  # (batch per device, MiB), newest first
    ooms: dict[float, int] = field(default_factory=dict)  # capacity MiB -> smallest batch that OOMed with it
    misses: list[dict] = field(default_factory=list)  # OOM rows whose prediction said the case fits
    dropped: dict[str, int] = field(default_factory=dict)  # readings left out, by why
    capacities: list[float | None] = field(default_factory=list)  # each point's device memory (MiB), None: unknown
    ran: dict[float, int] = field(default_factory=dict)  # capacity MiB -> largest batch that ran ok with it
    slope: float | None = None  # MiB per sample of per-device batch
    intercept: float | None = None  # MiB
    spread_mib: float | None = None
    reason: str | None = None  # why there is no line

    @property
    def n(self) -> int:
        return len(self.points)

    @property
    def batches(self) -> list[int]:
        return sorted({b for b, _ in self.points})

    @property
    def fitted(self) -> bool:
        return self.slope is not None

    def predict(self, batch: int) -> float | None:
        return round(self.intercept + self.slope * batch, 3) if self.fitted else None

    def ran_ok(self, batch: int, capacity_mib: float) -> tuple[int, float] | None:
        """(batch, capacity) of an ok result at this batch or above with this much memory or less."""
        hits = [(b, c) for c, b in self.ran.items() if b >= batch and c <= capacity_mib]
        return min(hits, key=lambda h: (h[1], -h[0])) if hits else None

    def known_oom(self, batch: int, capacity_mib: float) -> tuple[int, float] | None:
        """(batch, capacity) of a recorded OOM at this batch or below with this much memory or more."""
        hits = [(b, c) for c, b in self.ooms.items() if b <= batch and c >= capacity_mib]
        return min(hits) if hits else None

    def largest_fitting(self, capacity_mib: float, margin_pct: float, limit: int = 1 << 20) -> int | None:
        """The largest per-device batch predicted to fit (and below any recorded OOM on this much memory)."""
        if not self.fitted:
            return None
        usable = capacity_mib * (1 - margin_pct / 100) - self.spread_mib - self.intercept
        if usable < self.slope:  # not even batch 1
            return 0
        best = limit if self.slope <= 0 else min(limit, int(usable // self.slope))
        for c, b in self.ooms.items():
            if c >= capacity_mib:
                best = min(best, b - 1)
        return max(best, 0)

    def explain(self) -> str:
        name = "/".join(part for part in self.key if part)
        if not self.fitted:
            return f"{name}: no prediction: {self.reason}"
        return (f"{name}: peak MiB = {self.intercept:.1f} + {self.slope:.4f} x batch per device, +- "
                f"{self.spread_mib:.1f} MiB, from {self.n} point(s) at batch(es) {self.batches}")

    def to_dict(self) -> dict:
        return {"harness": self.key[0], "model": self.key[1], "precision": self.key[2], "device": self.key[3],
                "variant": self.key[4], "benchmark": self.key[5],
                "n": self.n, "batches": self.batches, "slope_mib_per_sample": self.slope,
                "intercept_mib": self.intercept, "spread_mib": self.spread_mib, "reason": self.reason,
                "ooms": [{"capacity_mib": c, "batch": b} for c, b in sorted(self.ooms.items())],
                "misses": self.misses, "dropped": self.dropped, "points": self.points}


def repeated_median(points: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """(slope, intercept, residuals): Siegel's repeated median, the median over the points of each point's median
    slope to the points at other batch sizes, then the median of y - slope x.

    Not Theil-Sen's median of all pairwise slopes: a profile's readings sit at a few batch sizes, so every slope to a
    batch size read once goes through that one reading, and one spike there (a neighbour's process on the GPU) was
    half of the slopes: a line 2-4x too steep, cases that fit skipped as predicted OOMs. The repeated median gives that
    reading one vote of n, and holds up to half of the readings being bad."""
    per_point = [median(slopes) for x1, y1 in points
                 if (slopes := [(y2 - y1) / (x2 - x1) for x2, y2 in points if x2 != x1])]
    slope = median(per_point)
    intercept = median(y - slope * x for x, y in points)
    return slope, intercept, [y - (intercept + slope * x) for x, y in points]


def fit(profile: Profile, settings: Settings) -> Profile:
    """Fit the profile's line in place (or say why not) and return it."""
    # Each reading at its device's memory is left out by itself (the framework reserved the memory up front: it says
    # nothing of what a batch needs), after the window: the nights before TF_FORCE_GPU_ALLOW_GROWTH was set stay out
    # of the line the nights after it draw (all of a profile's readings were judged at once, and a few below the
    # mark let the reserved ones in: every batch predicted to need the whole card).
    window = list(zip(profile.points, profile.capacities + [None] * (len(profile.points) - len(profile.capacities))))
    window = window[: settings.window]
    kept = [(pt, cap) for pt, cap in window if cap is None or pt[1] < AT_CAPACITY * cap]
    reserved = len(window) - len(kept)
    profile.points, profile.capacities = [pt for pt, _ in kept], [cap for _, cap in kept]
    if reserved:
        why = "at its device's memory (reserved up front)"
        profile.dropped[why] = profile.dropped.get(why, 0) + reserved
    if reserved and not profile.points:
        profile.reason = (f"every reading is at its device's memory ({reserved} of {len(window)} within "
                          f"{100 - AT_CAPACITY * 100:g} %): "
                          "the framework reserved the memory up front, so the readings say nothing of what a batch "
                          "needs (TensorFlow: set TF_FORCE_GPU_ALLOW_GROWTH=true in the benchmark's "
                          "container.environment)")
    elif profile.n < max(2, settings.min_points):
        profile.reason = f"{profile.n} usable point(s), fewer than min_points {max(2, settings.min_points)}"
    elif len(profile.batches) < 2:
        profile.reason = f"every point is at one batch size ({profile.batches[0]}): no slope"
    else:
        slope, intercept, residuals = repeated_median(profile.points)
        if slope < 0:
            profile.reason = f"peak memory falls as the batch grows (slope {slope:.3f} MiB per sample)"
        elif slope == 0:  # most readings on a fixed part (a floor the batch has not outgrown): every batch would fit
            profile.reason = ("peak memory does not grow with the batch over most readings (slope 0): no line to "
                              "size a larger batch by")
        else:
            mad = median(abs(r) for r in residuals)
            floor = SPREAD_FLOOR * median(y for _, y in profile.points)
            profile.slope, profile.intercept = round(slope, 6), round(intercept, 3)
            profile.spread_mib = round(max(SPREAD_SIGMAS * MAD_TO_SIGMA * mad, floor), 3)
    if profile.dropped:
        log.info("capacity %s: readings left out: %s", "/".join(profile.key), profile.dropped)
    return profile


def fit_profiles(rows: Iterable[Mapping[str, Any]], settings: Settings = Settings()) -> dict[Key, Profile]:
    """Profiles from result rows (newest first: the window keeps the newest points)."""
    profiles: dict[Key, Profile] = {}
    rows = [r for r in rows if isinstance(b := r.get("batch_size_per_device"), int) and not isinstance(b, bool)
            and b >= 1]
    ran = _ok_runs(rows)
    for row in rows:
        batch = row["batch_size_per_device"]
        key = key_of(row)
        p = profiles.setdefault(key, Profile(key))
        if row.get("failure_class") in OOM_CLASSES:
            if row.get("failure_class") != PROFILED_OOM.get(key[3]):
                continue  # another memory ran out: no bound on this profile's
            cap = valid_mib(row.get("capacity_mib"))
            if cap is not None and not _ran_since(ran.get(key, ()), batch, cap, row.get("logical_date")):
                p.ooms[cap] = min(batch, p.ooms.get(cap, batch))
            if str(row.get("capacity_note") or "").startswith("fits"):
                p.misses.append({k: row.get(k) for k in ("run_id", "host", "case_key", "batch_size_per_device",
                                                          "predicted_mem_mib", "capacity_mib", "failure_class")})
            continue
        if row.get("status") != "ok":
            continue
        if row.get("mig_profile"):  # an instance's reading is of the whole board (NVML): not a whole GPU's point
            p.dropped["MIG instance"] = p.dropped.get("MIG instance", 0) + 1
            continue
        raw = reading(row)
        if raw is None:
            continue
        value = valid_mib(raw)
        if value is None:
            why = "negative or zero" if isinstance(raw, (int, float)) and raw <= 0 else "not a believable number"
            p.dropped[why] = p.dropped.get(why, 0) + 1
            continue
        p.points.append((batch, value))
        p.capacities.append(valid_mib(row.get("capacity_mib")))
    for key, p in profiles.items():  # one entry per memory size (as `ooms`): `assess` reads it per case
        for b, c, _ in ran.get(key, ()):
            p.ran[c] = max(b, p.ran.get(c, b))
    return {k: fit(p, settings) for k, p in profiles.items()}


def _ok_runs(rows: list[Mapping[str, Any]]) -> dict[Key, list[tuple[int, float, Any]]]:
    """(batch, capacity MiB, logical date) of each ok result with a known capacity, per profile."""
    ran: dict[Key, list[tuple[int, float, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("logical_date") is not None:
            if (cap := valid_mib(row.get("capacity_mib"))) is not None:
                ran.setdefault(key_of(row), []).append((row["batch_size_per_device"], cap, row["logical_date"]))
    return ran


def _ran_since(ran, batch: int, capacity_mib: float, oom_date: Any) -> bool:
    """An ok result newer than the OOM (a `force_cases` rerun, a night after a fix) ran this batch or a larger one
    on this much memory or less: the OOM was not the batch's, so it bounds nothing."""
    if oom_date is None:
        return False
    return any(b >= batch and c <= capacity_mib and d > oom_date for b, c, d in ran)


# -- the plan ----------------------------------------------------------------------------------
def mem_limit_mib(value: str | None) -> float | None:
    """A container's `mem_limit` ("256m", "2g", bytes) in MiB; None without one."""
    m = _BYTES.match(str(value or ""))
    if not m:
        return None
    return valid_mib(int(m.group(1)) * _UNIT[m.group(2).lower()] / 1024**2)


def case_capacity(case, gpu_mib: Mapping[str, float | None]) -> tuple[float | None, str]:
    """(capacity MiB per device, what it is) for a case: its container limit (CPU) or the host's GPU memory."""
    if case.device == "cpu":
        limit = mem_limit_mib((case.container or {}).get("mem_limit"))
        return (limit, "container limit") if limit else (None, "the case has no container memory limit")
    if getattr(case, "mig_profile", None):  # a slice of a GPU: the host's GPU memory is not the case's
        return None, f"the memory of a MIG {case.mig_profile} instance is not known to the plan"
    hosts = list(getattr(case, "hosts", None) or [case.host])  # a multi-node case: its set's smallest GPU
    unknown = [h for h in hosts if not gpu_mib.get(h)]
    if unknown:
        return None, f"the GPU memory of host {', '.join(unknown)} is not known yet"
    mem = min(gpu_mib[h] for h in hosts)
    return mem, "GPU memory" if len(hosts) == 1 else f"GPU memory of the set's smallest ({len(hosts)} hosts)"


def case_row(case) -> dict:
    return {"harness": getattr(case, "harness", None), "model": case.model, "command": case.command,
            "device": case.device, "benchmark": case.benchmark}


def assess(case, profiles: Mapping[Key, Profile], gpu_mib: Mapping[str, float | None], settings: Settings,
           forced: bool = False) -> dict:
    """One case's capacity verdict: action (run | warn | skip), capacity, prediction, and a note in words.

    The note starts with "fits", "predicted OOM", "known OOM" or "no prediction" (a miss is an OOM
    row whose note starts with "fits")."""
    capacity, what = case_capacity(case, gpu_mib)
    batch = case.batch_size_per_device
    out = {"action": "run", "capacity_mib": capacity, "predicted_mem_mib": None, "spread_mib": None}
    profile = profiles.get(key_of(case_row(case)))
    if capacity is None:
        return {**out, "note": f"no prediction: {what}"}
    if profile is None:
        variant = key_of(case_row(case))[4]
        return {**out, "note": "no prediction: no result of this benchmark, harness, model, precision and device"
                               f"{f' ({variant})' if variant else ''} yet"}
    oom = profile.known_oom(batch, capacity)
    predicted = profile.predict(batch)
    out.update(predicted_mem_mib=predicted, spread_mib=profile.spread_mib)
    usable = capacity * (1 - settings.margin_pct / 100)
    if oom is not None:
        note = f"known OOM: batch {oom[0]} died of OOM with {oom[1]:.0f} MiB ({what} here {capacity:.0f} MiB)"
        confident = True
    elif predicted is None:
        return {**out, "note": f"no prediction: {profile.reason}"}
    elif predicted + profile.spread_mib > usable and (done := profile.ran_ok(batch, capacity)) is not None:
        # the line says no, a result on record says yes: a case near its limit (within the margin) that ran, e.g. the
        # `force_cases` rerun README suggests, is planned again rather than skipped every night after
        return {**out, "note": f"fits: ran ok at batch {done[0]} with {done[1]:.0f} MiB ({what} here {capacity:.0f} "
                               f"MiB; the line predicts {predicted:.0f} +- {profile.spread_mib:.0f} MiB of "
                               f"{usable:.0f} MiB)"}
    elif predicted + profile.spread_mib > usable:
        note = (f"predicted OOM: {predicted:.0f} +- {profile.spread_mib:.0f} MiB at batch {batch} > {usable:.0f} MiB "
                f"({what} {capacity:.0f} MiB less {settings.margin_pct:g} %); {profile.n} point(s)")
        confident = profile.n >= settings.confident_points
    else:
        return {**out, "note": f"fits: {predicted:.0f} +- {profile.spread_mib:.0f} MiB of {usable:.0f} MiB "
                               f"({what} {capacity:.0f} MiB less {settings.margin_pct:g} %)"}
    if forced:
        return {**out, "action": "run", "note": f"{note}; forced by force_cases"}
    action = settings.on_predicted_oom if confident else "warn"
    if action == "warn" and not confident and settings.on_predicted_oom == "skip":
        note += f" (fewer than confident_points {settings.confident_points}: warn only)"
    return {**out, "action": action, "note": note}


def gpu_memory_of(facts: Mapping[str, Any] | None) -> float | None:
    """The smallest GPU's memory (MiB) in a host's stored facts, or None."""
    gpus = (facts or {}).get("gpus") or []
    mems = [valid_mib(g.get("memory_total_mib")) for g in gpus if isinstance(g, Mapping)]
    mems = [m for m in mems if m]
    return min(mems) if mems else None


# -- the warehouse -----------------------------------------------------------------------------
MAX_ROWS = 100_000


def has_results(engine) -> bool:
    """The warehouse has been created (the capacity_features view exists)."""
    from sqlalchemy import inspect

    return "capacity_features" in inspect(engine).get_view_names()


def reported_memory_mib(engine, gpu) -> float | None:
    """The memory per GPU that the fleet's hosts of catalog model `gpu` report (nvidia-smi's memory.total, what the
    plan sizes their cases with: a T4 reports 15360 MiB of its nominal 16 GiB), the most common value among the
    whole-GPU results on record; None when the warehouse has no result on that model."""
    from sqlalchemy import text

    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT gpu_model, capacity_mib, COUNT(*) AS n FROM benchmark_results WHERE device = 'gpu' "
            "AND mig_profile IS NULL AND capacity_mib IS NOT NULL AND gpu_model IS NOT NULL "
            "GROUP BY gpu_model, capacity_mib")).all()
    counts: dict[float, int] = {}
    for model, mib, n in found:
        if "," not in model and "+" not in model and gpu.matches(model):  # not a mix of models
            counts[float(mib)] = counts.get(float(mib), 0) + int(n)
    return max(counts, key=lambda mib: (counts[mib], -mib)) if counts else None


# What a profile reads of a result (`key_of`, `fit_profiles`, a miss's evidence, the memory sizes known).
READ_COLUMNS = ("dag_id", "run_id", "logical_date", "host", "case_key", "benchmark", "harness", "model", "precision",
                "command", "device", "batch_size_per_device", "status", "failure_class", "peak_gpu_mem_mib",
                "peak_mem_mib", "capacity_mib", "predicted_mem_mib", "capacity_note", "mig_profile")
# An OOM bound is the smallest batch per (profile features, memory size, OOM class): `fit_profiles` keeps no more.
BOUND_COLUMNS = ("benchmark", "harness", "model", "precision", "device", "capacity_mib", "failure_class")
# OOM rows whose profile key needs their command: stored without a precision (before revision 0003), or of a
# harness with a memory variant (`memory_flags`, on the command line). The rest group on the OOM index alone.
BY_COMMAND = ("(precision IS NULL OR COALESCE(harness, '') IN ("
              + ", ".join(f"'{name}'" for name, h in sorted(HARNESSES.items()) if h.memory_flags) + "))")


def read_rows(engine, models: Iterable[str] | None = None, dag_ids: Iterable[str] | None = None) -> list[dict]:
    """The results that can teach a profile (an engine or a connection), current attempts only, each read on its
    own partial index (revision 0016), so a year of results is not scanned:

    - ok results with a memory reading, newest first, at most MAX_ROWS (a profile keeps its `window` newest);
    - every OOM's bound: per harness, model, precision, device, memory size, OOM class and batch, the newest
      night it died (one row each, `status` failed, no run; on the OOM rows' own index): a newer ok result at
      that batch or above on that much memory or less lifts it (`_ran_since`). Rows stored before revision
      0003 have no precision, and a harness with a memory variant has it on the command line (torch_synthetic's
      compile and channels_last): theirs are grouped by command too, as `key_of` reads both from the command;
    - OOMs whose plan said "fits" (the misses), newest first, at most MAX_ROWS, each as stored."""
    from sqlalchemy import text

    from fleetbench.warehouse.schema import MEMORY_READING_ROWS, MISSED_OOM_ROWS, OOM_ROWS

    where, params = "", {}
    models = sorted({m for m in models or [] if m is not None})  # a command benchmark's cases have no model
    if models:
        where += " AND model IN :models"
        params["models"] = models
    if dag_ids is not None:  # only the DAGs the reader may see
        where += " AND dag_id IN :dag_ids"
        params["dag_ids"] = sorted(dag_ids) or [""]
    columns = ", ".join(READ_COLUMNS)
    bound = ", ".join(BOUND_COLUMNS)
    newest = f"ORDER BY logical_date DESC, run_id DESC LIMIT {MAX_ROWS}"
    queries = [
        f"SELECT {columns} FROM benchmark_results WHERE {MEMORY_READING_ROWS}{where} {newest}",
        f"SELECT {bound}, batch_size_per_device, MAX(logical_date) AS logical_date, 'failed' AS status "
        f"FROM benchmark_results WHERE {OOM_ROWS}{where} AND NOT {BY_COMMAND} "
        f"GROUP BY {bound}, batch_size_per_device",
        f"SELECT {bound}, command, batch_size_per_device, MAX(logical_date) AS logical_date, 'failed' AS status "
        f"FROM benchmark_results WHERE {OOM_ROWS}{where} AND {BY_COMMAND} "
        f"GROUP BY {bound}, command, batch_size_per_device",
        f"SELECT {columns} FROM benchmark_results WHERE {MISSED_OOM_ROWS}{where} {newest}",
    ]
    with engine.connect() if hasattr(engine, "connect") else nullcontext(engine) as conn:
        return [dict(r._mapping) for sql in queries for r in conn.execute(_expanding(text(sql), params), params)]


def _expanding(stmt, params: Mapping[str, Any]):
    from sqlalchemy import bindparam

    for name in params:
        stmt = stmt.bindparams(bindparam(name, expanding=True))
    return stmt


#: How many of a host's newest stored facts `read_gpu_memory` looks through for its GPU memory.
GPU_MEMORY_LOOKBACK = 30


def read_gpu_memory(engine, hosts: Iterable[str]) -> dict[str, float | None]:
    """host -> its GPUs' memory (MiB) from its newest stored facts that have it: a night the host could not be checked
    (unreachable, nvidia-smi failing) stores facts without GPUs, after which the plan knew no memory for it and ran its
    known-OOM cases again. Among the host's `GPU_MEMORY_LOOKBACK` newest rows; one query more, for such hosts only."""
    from sqlalchemy import and_, func, select

    from fleetbench.warehouse.schema import host_facts as hf

    hosts = sorted(set(hosts))
    if not hosts:
        return {}
    newest = (select(hf.c.host, func.max(hf.c.collected_at).label("at")).where(hf.c.host.in_(hosts))
              .group_by(hf.c.host).subquery())
    q = select(hf.c.host, hf.c.facts_json).join(newest, and_(hf.c.host == newest.c.host,
                                                             hf.c.collected_at == newest.c.at))
    out: dict[str, float | None] = {}
    with engine.connect() as conn:
        for host, facts_json in conn.execute(q):
            mem = _stored_gpu_memory(facts_json)
            out[host] = mem if out.get(host) is None else out[host]
        if missing := [h for h in out if out[h] is None]:
            ranked = select(hf.c.host, hf.c.facts_json, func.row_number().over(
                partition_by=hf.c.host, order_by=hf.c.collected_at.desc()).label("n")).where(
                hf.c.host.in_(missing)).subquery()
            for host, facts_json in conn.execute(
                    select(ranked.c.host, ranked.c.facts_json).where(ranked.c.n > 1, ranked.c.n <= GPU_MEMORY_LOOKBACK)
                    .order_by(ranked.c.host, ranked.c.n)):
                if out[host] is None:
                    out[host] = _stored_gpu_memory(facts_json)
    return out


def _stored_gpu_memory(facts_json: str | None) -> float | None:
    try:
        return gpu_memory_of(json.loads(facts_json or "{}"))
    except (ValueError, TypeError, AttributeError):
        return None


# -- one run's plan ------------------------------------------------------------------------------
def settings_of(fleet_settings) -> Settings:
    return Settings(**fleet_settings.capacity.model_dump())


def configured_settings() -> tuple[Settings, str | None]:
    """The fleet's own `fleet.capacity` (`fleetbench.config.configured_fleet`), so that `fleetbench report`,
    `fleetbench capacity` and the UI view fit and suggest as the plan and the DAG's report do. A config that cannot
    be read gives the defaults and why; no fleet config at all, the defaults without a note."""
    from fleetbench.config import ConfigError, configured_fleet

    try:
        fleet = configured_fleet()
    except ConfigError as exc:
        return Settings(), f"capacity with the default settings: the fleet config could not be read ({exc})"
    return (settings_of(fleet) if fleet is not None else Settings()), None


def forced_cases(plan, force: Iterable[str]) -> set[tuple[str, str]]:
    """`force_cases` items ("case_key" on every host, or "host/case_key") -> the (host, case_key)s they name.
    A multi-node case runs on every host of its set, so any of them names it (it is planned under the first).

    Raises ConfigError naming an item that matches no planned case."""
    from fleetbench.config import ConfigError

    out, errors = set(), []
    for i, item in enumerate(force):
        host, _, key = item.rpartition("/")
        hits = {(c.host, c.case_key) for c in plan.cases if c.case_key == key and host in ("", *c.hosts)}
        if not hits:
            errors.append(f"force_cases[{i}]: {item!r} is not a case of this run's plan")
        out |= hits
    if errors:
        raise ConfigError("params", errors)
    return out


def plan_capacity(plan, engine=None):
    """The plan with each case's capacity verdict (`Case.capacity`), from the profiles the warehouse teaches.

    A warehouse that cannot be read means no prediction for any case (the reason is in each case's note)."""
    from dataclasses import replace

    run = plan.run
    settings = settings_of(run.fleet_settings)
    forced = forced_cases(plan, run.params.get("force_cases") or [])
    profiles: dict[Key, Profile] = {}
    gpu_mib: dict[str, float | None] = {}
    unreadable = None
    own = engine is None
    try:
        if own:
            from fleetbench.warehouse import get_engine

            engine = get_engine()
        try:
            if has_results(engine):  # a new warehouse has no tables yet: nothing learned, every case runs
                models = {c.model for c in plan.cases if c.model is not None}
                profiles = fit_profiles(read_rows(engine, models), settings) if models else {}
                gpu_mib = read_gpu_memory(engine, {h for c in plan.cases if c.device == "gpu"
                                                   for h in (getattr(c, "hosts", None) or [c.host])})
        finally:
            if own:
                engine.dispose()
    except Exception as exc:  # no warehouse yet, or one without this schema: run everything, say why
        unreadable = f"no prediction: the warehouse could not be read ({type(exc).__name__}: {str(exc)[:200]})"
        log.warning("capacity: %s", unreadable)
    for p in profiles.values():
        log.info("capacity profile %s", p.explain())
        for miss in p.misses:
            log.warning("capacity miss: %s", miss)
    cases = []
    for c in plan.cases:
        if unreadable:
            verdict = {"action": "run", "capacity_mib": case_capacity(c, {})[0], "predicted_mem_mib": None,
                       "spread_mib": None, "note": unreadable}
        else:
            verdict = assess(c, profiles, gpu_mib, settings, forced=(c.host, c.case_key) in forced)
        if verdict["action"] in ("skip", "warn"):
            log.warning("capacity: %s %s: %s -> %s", c.host, c.case_key, verdict["note"], verdict["action"])
        cases.append(replace(c, capacity=verdict))
    actions = [c.capacity["action"] for c in cases if not c.capacity["note"].startswith(("fits", "no prediction"))]
    log.info("capacity: %d case(s) predicted to fit, %d predicted or known OOM (%d skipped, %d warned), %d without "
             "a prediction", sum(c.capacity["note"].startswith("fits") for c in cases), len(actions),
             actions.count("skip"), actions.count("warn"), sum(c.capacity["note"].startswith("no prediction")
                                                               for c in cases))
    return plan.model_copy(update={"cases": cases})


def skipped(case) -> bool:
    """The plan skips this case: predicted (or known) to run out of memory."""
    return (case.capacity or {}).get("action") == "skip"


def row_fields(case) -> dict:
    """A case's capacity columns in its result row."""
    cap = case.capacity or {}
    return {"capacity_mib": cap.get("capacity_mib"), "predicted_mem_mib": cap.get("predicted_mem_mib"),
            "capacity_note": ((cap.get("note") or "") + (f" [{cap['action']}]" if cap.get("action") else ""))[:1000]
            or None}


# -- suggest ---------------------------------------------------------------------------------------
def suggest(profiles: Mapping[Key, Profile], settings: Settings, memory_mib: float | None = None,
            device: str | None = None, known: Mapping[Key, set[float]] | None = None) -> list[dict]:
    """Per profile: its evidence and, per memory size (the given one, else those its results ran with), the
    largest per-device batch predicted to fit (None with the reason when there is no line)."""
    out = []
    for key in sorted(profiles):
        p = profiles[key]
        if device and key[3] != device:
            continue
        sizes = [memory_mib] if memory_mib else sorted((known or {}).get(key, set()) | set(p.ooms))
        fits = [{"capacity_mib": c, "largest_batch": p.largest_fitting(c, settings.margin_pct),
                 "predicted_mem_mib": (p.predict(b) if (b := p.largest_fitting(c, settings.margin_pct)) else None)}
                for c in sizes]
        out.append({**p.to_dict(), "explain": p.explain(), "fits": fits, "margin_pct": settings.margin_pct})
    return out


def suggest_lines(items: list[dict]) -> list[str]:
    """`fleetbench capacity` as text: the line and its evidence, OOMs, misses, the largest batch that fits."""
    lines = []
    for s in items:
        lines.append(s["explain"])
        for k, v in sorted(s["dropped"].items()):
            lines.append(f"  left out: {v} reading(s) {k}")
        for o in s["ooms"]:
            lines.append(f"  OOM on record: batch {o['batch']} with {o['capacity_mib']:.0f} MiB")
        for m in s["misses"]:
            lines.append(f"  miss: {m['host']} {m['case_key']} (run {m['run_id']}) was predicted to fit "
                         f"({m['predicted_mem_mib']} MiB of {m['capacity_mib']} MiB) and died: {m['failure_class']}")
        for f in s["fits"]:
            where = f"{f['capacity_mib']:.0f} MiB (less {s['margin_pct']:g} %)"
            if f["largest_batch"] is None:
                lines.append(f"  {where}: no suggestion ({s['reason'] or 'no line'})")
            elif f["largest_batch"] == 0:
                lines.append(f"  {where}: not even batch 1 is predicted to fit")
            else:
                lines.append(f"  {where}: largest batch per device predicted to fit: {f['largest_batch']} "
                             f"(~{f['predicted_mem_mib']:.0f} +- {s['spread_mib']:.0f} MiB)")
        if not s["fits"]:
            lines.append("  no memory size known: give --memory-gib or --gpu-model")
    return lines


def report_section(conn, model: str | None = None, dag_ids: Iterable[str] | None = None,
                   settings: Settings = Settings()) -> list[dict]:
    """The report's capacity section: per profile its line, points, OOMs and misses, and the largest batch
    that fits each memory size its results ran with (`suggest`)."""
    rows = read_rows(conn, [model] if model else None, dag_ids)
    known: dict[Key, set[float]] = {}
    for r in rows:
        if valid_mib(r.get("capacity_mib")):
            known.setdefault(key_of(r), set()).add(float(r["capacity_mib"]))
    return suggest(fit_profiles(rows, settings), settings, known=known)
