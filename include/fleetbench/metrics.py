"""Derived metrics: the runbook's five, as pure functions over a measurement, plus `derive` for a run's rows.

1. Training time: the case's wall time (`duration_s`, measured around the container); the time the
   N measured batches took, `time_for_batches_s`; the time to a target accuracy when the harness
   reports accuracy (`time_to_accuracy_s`).
2. Throughput: total images/sec (the harness's own figure, `images_per_sec`); the median, spread
   and coefficient of variation of the per-step images/sec printed after warm-up.
3. Speedup efficiency: N-GPU throughput / (N x 1-GPU throughput) of the same host, model, batch
   per device, precision, torch_synthetic variant (eager or compiled, NCHW or NHWC) and run, matched
   automatically.
4. Cost: price per GPU-hour (the host's `price_per_gpu_hour`, else the GPU catalog's default) x
   GPUs (a MIG case's instances: their share of the GPU, `mig_share`) x hours; a CPU case (or a GPU
   case without a GPU price): the host's `price_per_hour` x hours; cost per million images at the
   measured throughput, and (`per_unit`, at read time) cost and energy per unit of any harness's
   primary metric: $ and Wh per 10^6 images or samples, per GB moved.
5. Power and energy: mean W, J, kWh, images per joule. GPU cases: measured by the telemetry
   wrapper (NVML) or estimated from the catalog's TDP; CPU cases: measured by the host's RAPL
   counters, else estimated as CodeCarbon does, the CPU's TDP x the container's CPU utilisation
   (`energy_source = "estimated"`); none for a case that never ran. Optional carbon from the
   fleet's `carbon_g_per_kwh`.

Everything here is a pure function except the loader at the edge, `load_catalog` (the GPU catalog,
`include/config/gpu_catalog.yaml` or `FLEETBENCH_GPU_CATALOG`); `MetricSettings.from_plan` takes the
prices and fleet settings a run was planned with. A function that lacks an input returns None rather
than guessing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetbench.paths import PROJECT_ROOT

log = logging.getLogger(__name__)

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6

# energy_source values on a result row.
MEASURED, ESTIMATED, NONE = "measured", "estimated", "none"


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


# -- 1. training time ---------------------------------------------------------------------------
def time_for_batches_s(num_batches: int | None, batch_size_global: int | None,
                       images_per_sec: float | None) -> float | None:
    """Seconds the N measured batches took: t = N x B_global / X.

    tf_cnn_benchmarks computes its ``total images/sec`` X as N x B_global / t over the measured
    (post-warm-up) loop, so t follows back from it. Example: 100 batches of 64 images at
    292.85 images/sec took 100 x 64 / 292.85 = 21.854 s.
    """
    if not (num_batches and batch_size_global and _positive(images_per_sec)):
        return None
    return num_batches * batch_size_global / images_per_sec


def time_to_accuracy_s(points: Iterable[tuple[float, float]], target: float | None) -> float | None:
    """The first elapsed time at which the reported accuracy reached the target: min{t : acc(t) >= target}.

    `points` are (elapsed seconds, accuracy) pairs as the harness reports them; tf_cnn_benchmarks
    reports one final accuracy (``Accuracy @ 1``), so there t is the case's wall time when the final
    accuracy reached the target, else None (the target was not reached).
    """
    if target is None:
        return None
    hits = [t for t, acc in points if t is not None and acc is not None and acc >= target]
    return min(hits) if hits else None


# -- 2. throughput ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepStats:
    """Spread of the per-step throughput samples.

    n: samples used; median; mean; stdev: sample standard deviation (n - 1 in the denominator);
    spread: max - min; cv: coefficient of variation, stdev / mean (0 for a single sample).
    """

    n: int
    median: float
    mean: float
    stdev: float
    spread: float
    cv: float


def step_stats(values: Sequence[float | None], warmup_steps: int = 0) -> StepStats | None:
    """Median, spread (max - min) and coefficient of variation (s / mean) of the step samples after warm-up.

    The first `warmup_steps` samples are dropped. tf_cnn_benchmarks (and the CPU smoke harness) run
    `--num_warmup_batches` before they print step 1, so their printed steps are all after warm-up
    and `warmup_steps` is 0. Their step value is the mean images/sec since step 1, so the spread
    of these samples shows the drift of the running mean, not the jitter of single batches.
    None when no sample is left.
    """
    xs = [float(v) for v in values[warmup_steps:] if v is not None and math.isfinite(v)]
    if not xs:
        return None
    mean = statistics.fmean(xs)
    stdev = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return StepStats(n=len(xs), median=statistics.median(xs), mean=mean, stdev=stdev,
                     spread=max(xs) - min(xs), cv=stdev / mean if mean else 0.0)


# -- 3. speedup efficiency ----------------------------------------------------------------------
def speedup_efficiency(images_per_sec: float | None, num_gpus: int | None,
                       one_gpu_images_per_sec: float | None) -> float | None:
    """E = X_N / (N x X_1): 1.0 is linear scaling, 0.5 means half of the added GPUs' worth is lost."""
    if not (num_gpus and num_gpus > 0 and _positive(images_per_sec) and _positive(one_gpu_images_per_sec)):
        return None
    return images_per_sec / (num_gpus * one_gpu_images_per_sec)


# What makes two cases comparable for speedup: everything but the GPU count (a MIG case's count of instances of
# its profile: 2 x 3g.40gb scales against 1 x 3g.40gb, not against 1 x 1g.10gb), and torch_synthetic's variant
# (`variant_of`: an eager case scales against the eager 1-GPU case, a compiled one against the compiled).
SPEEDUP_MATCH = ("dag_id", "run_id", "host", "benchmark", "image_name", "model", "batch_size_per_device",
                 "precision", "variable_update", "device", "mig_profile")


def _speedup_key(row: Mapping[str, Any]) -> tuple:
    return (*(row.get(k) for k in SPEEDUP_MATCH), variant_of(row.get("command")))


def match_speedup(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[float, str]]:
    """{(host, case_key): (efficiency, the 1-GPU case_key it was computed against)} for every ok GPU row
    whose run has an ok 1-GPU row with the same `SPEEDUP_MATCH` fields and `variant_of` its command (the 1-GPU
    row itself gets 1.0)."""
    ok = [r for r in rows
          if r.get("status") == "ok" and (r.get("num_gpus") or 0) >= 1 and _positive(r.get("images_per_sec"))]
    baselines = {_speedup_key(r): r for r in ok if r["num_gpus"] == 1}
    out = {}
    for r in ok:
        base = baselines.get(_speedup_key(r))
        if base is None:
            continue
        eff = speedup_efficiency(r["images_per_sec"], r["num_gpus"], base["images_per_sec"])
        if eff is not None:
            out[(r["host"], r["case_key"])] = (eff, base["case_key"])
    return out


# What makes a 1-node case the baseline of a multi-node one: the same image, model, batch and GPUs per node (and run,
# harness, device, precision and torch_synthetic variant), on a host of the set. Not the benchmark: a
# distributed_replicated case takes its 1-node baseline from a benchmark of its own (fleetbench.config); but a
# 1-node row of the case's own benchmark wins over another's (`match_nodes`).
NODES_MATCH = ("dag_id", "run_id", "harness", "image_name", "model", "batch_size_per_device", "num_gpus", "device",
               "precision", "mig_profile")


def _nodes_key(row: Mapping[str, Any]) -> tuple:
    return (*(row.get(k) for k in NODES_MATCH), variant_of(row.get("command")))


def match_nodes(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[float, float]]:
    """{(host, case_key): (efficiency, 1-node images/sec)} for every ok multi-node row whose run has ok 1-node
    rows with the same `NODES_MATCH` fields (and `variant_of` its command) on hosts of its set: E = total / (nodes
    x the mean of those 1-node figures). 1.0 is linear scaling across hosts. On each host the 1-node row of the
    row's own benchmark is taken, else the only matching one; of a benchmark with several 1-node rows there (one per
    `variable_update`), the one of the row's own variable_update, else none. A host where several other benchmarks,
    or several variable updates, match (which one is the baseline is not known: the last one listed was taken), or
    where none is ok (its 1-node case failed), gives the row none, as a failed 1-GPU case gives a multi-GPU row no
    speedup efficiency."""
    ok = [r for r in rows if r.get("status") == "ok" and _positive(r.get("images_per_sec"))]
    single: dict[tuple, dict[str, dict[Any, dict[Any, float]]]] = {}
    for r in ok:
        if (r.get("nodes") or 1) == 1:
            (single.setdefault(_nodes_key(r), {}).setdefault(r["host"], {}).setdefault(r.get("benchmark"), {})
             [r.get("variable_update")]) = r["images_per_sec"]
    out = {}
    for r in ok:
        nodes = r.get("nodes") or 1
        if nodes <= 1 or _ranks_per_node(r) != 1:
            continue
        per_host = single.get(_nodes_key(r), {})
        hosts = (r.get("host_set") or "").split(",")
        figures = []
        for h in hosts:
            by_bench = per_host.get(h, {})
            by_update = by_bench.get(r.get("benchmark")) or (next(iter(by_bench.values())) if len(by_bench) == 1
                                                              else {})
            if r.get("variable_update") in by_update:
                figures.append(by_update[r.get("variable_update")])
            elif len(by_update) == 1:
                figures.extend(by_update.values())
        if figures and len(figures) == len(hosts):  # every host's: a baseline of some of them is another set's
            base = sum(figures) / len(figures)
            out[(r["host"], r["case_key"])] = (r["images_per_sec"] / (nodes * base), base)
    return out


def _first_gpu_model(row: Mapping[str, Any]) -> str | None:
    """The GPU model a row's price and TDP come from: a multi-node row of a set with several models names each
    host's (`fleetbench.measure.set_provenance`: `A+B`), and is priced at its first host's, as README says."""
    model = row.get("gpu_model")
    if model and (row.get("nodes") or 1) > 1:
        return model.split("+", 1)[0]
    return model


def _ranks_per_node(row: Mapping[str, Any]) -> int:
    """CPU processes per host of a launcher (torchrun) row, or CPU workers per host of a ps_worker row
    (`workers_per_node`), else 1: a CPU 1-node case is one process, so only a 1-rank-per-host CPU case has a 1-node
    baseline with the same processes per node (a GPU case's ranks are its GPUs per node, which the match compares
    already)."""
    if row.get("device") != "cpu":
        return 1
    roles = _roles(row)
    workers: dict[Any, int] = {}
    for r in roles:
        if r.get("job") == "worker":
            workers[r.get("host")] = workers.get(r.get("host"), 0) + 1
    return max([r.get("procs") or 1 for r in roles] + list(workers.values()) + [1])


def _workers_per_step_line(row: Mapping[str, Any]) -> int:
    """How many workers' throughput a row's step lines are a share of: a ps_worker case's (nodes > 1) chief prints
    its own images/sec at each step while its `total images/sec` is the cluster's (the real TF 2.15 run of
    tests/fixtures/real-tf215-dist: steps ~69, total 139.24 with two workers), so its step figures are scaled to the
    cluster, the unit of `images_per_sec`; 1 otherwise (one process, or a launcher's ranks reporting together)."""
    if (row.get("nodes") or 1) <= 1:
        return 1
    return max(1, sum(1 for r in _roles(row) if r.get("job") == "worker"))


def _roles(row: Mapping[str, Any]) -> list[dict]:
    """A multi-node row's roles (`roles_json`: host, job, task_index, procs), [] without them or unreadable."""
    try:
        return [r for r in json.loads(row.get("roles_json") or "[]") if isinstance(r, dict)]
    except (TypeError, ValueError):
        return []


_FP16_FLAG = re.compile(r"^--(no)?(use_fp16|auto_mixed_precision)(?:=(.*))?$")  # absl: `--noflag` is `--flag=false`
_PRECISION_FLAG = re.compile(r"^--precision=(fp32|fp16|bf16)$")  # torch_synthetic's precision axis
_FALSE = {"false", "0", "no", "off", "f", "n"}


def command_argv(command: Sequence[str] | str | None) -> list | None:
    """A stored command as its argv: the list itself, or its JSON text (other text split on blanks); None when
    there is none."""
    if isinstance(command, str):
        try:
            command = json.loads(command)
        except ValueError:
            command = command.split()
    return list(command) if isinstance(command, (list, tuple)) else None


def precision_of(command: Sequence[str] | str | None) -> str | None:
    """torch_synthetic's `--precision=fp32|fp16|bf16`; 'fp16' when the tf_cnn_benchmarks command line turns on
    `--use_fp16` or `--auto_mixed_precision`; else 'fp32' (the harnesses' default); None without a command.
    Accepts a list or its JSON text. A flag given twice counts as the programs read it, the last one (absl and
    argparse both), and absl's `--nouse_fp16` turns it off: an image's `--use_fp16` overridden by a benchmark's
    `extra_args` runs fp32. (Precision splits speedup baselines and capacity profiles: a bf16 case is neither scaled
    against nor predicted from fp32 ones.)"""
    command = command_argv(command)
    if command is None:
        return None
    precision, fp16 = None, {}
    for arg in command:
        if (m := _PRECISION_FLAG.match(str(arg))) is not None:
            precision = m.group(1)
        elif (m := _FP16_FLAG.match(str(arg))) is not None:
            fp16[m.group(2)] = m.group(1) is None and (m.group(3) is None or m.group(3).strip().lower() not in _FALSE)
    return precision or ("fp16" if any(fp16.values()) else "fp32")


_VARIANT_FLAG = re.compile(r"^--(channels_last|compile)=([01])$")  # torch_synthetic's channels_last, compile axes


def variant_of(command: Sequence[str] | str | None) -> str | None:
    """torch_synthetic's memory format and execution mode, as its case key names them: 'nchw.eager',
    'nhwc.compiled', ... from `--channels_last=0|1` and `--compile=0|1` (the last of each, as its argparse reads
    them); None for a command without both flags (the other harnesses, no command). Accepts a list or its JSON
    text. (Like precision, the variant splits speedup baselines: torch.compile or channels_last change the
    throughput of 1 GPU as of N, so an eager 8-GPU case scales against the eager 1-GPU case.)"""
    flags: dict[str, str] = {}
    for arg in command_argv(command) or ():
        if (m := _VARIANT_FLAG.match(str(arg))) is not None:
            flags[m.group(1)] = m.group(2)
    if len(flags) < 2:
        return None
    return f"{'nhwc' if flags['channels_last'] == '1' else 'nchw'}.{'compiled' if flags['compile'] == '1' else 'eager'}"


# -- 4. cost ------------------------------------------------------------------------------------
# "Per unit" of a rate metric (higher is better, a unit "<thing>/s"): the amount of <thing> the figures are per. Bytes
# per 1 of their unit (GB moved, TB); counted things (images, samples, tokens) per million.
BYTE_UNITS = ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")
RATE_UNIT = re.compile(r"^\s*(?P<thing>[^/\s][^/]*?)\s*/\s*(s|sec|second)\s*$")


def work_unit(unit: str | None, better: str | None) -> tuple[str, float] | None:
    """(work, amount) the cost and energy of a rate metric are given per: ("GB", 1) for "GB/s", ("images", 1e6)
    for "images/s"; None for a metric that is not a rate where higher is better (a latency has no work done)."""
    m = RATE_UNIT.match(unit or "")
    if better != "higher" or m is None:
        return None
    thing = m.group("thing")
    return (thing, 1.0) if thing in BYTE_UNITS else (thing, 1e6)


def per_unit(row: Mapping[str, Any]) -> dict:
    """Cost and energy per unit of a result's primary metric: the run's cost (energy) / the work it did at the
    measured rate (value x wall time), per `work_unit`. With cost = hourly price x wall hours this is the hourly
    price / (3600 x rate), the steady-state figure `cost_per_million_images_usd` also is; energy likewise the
    mean power / rate. {"per": "10^6 images" | "GB" | None, "cost_per_unit_usd", "energy_per_unit_wh"} (None where
    an input is missing, the metric is no higher-is-better rate, or energy is not known)."""
    out: dict[str, Any] = {"per": None, "cost_per_unit_usd": None, "energy_per_unit_wh": None}
    unit, better, value = row.get("unit"), row.get("better"), row.get("value")
    if not row.get("metric") and row.get("images_per_sec") is not None:  # stored before rows named their metric
        unit, better, value = "images/s", "higher", row["images_per_sec"]
    unit = work_unit(unit, better)
    duration = row.get("duration_s")
    if unit is None or not (_positive(value) and _positive(duration)) or not math.isfinite(value * duration):
        return out
    thing, amount = unit
    work = value * duration / amount
    out["per"] = f"10^6 {thing}" if amount == 1e6 else thing
    cost = row.get("cost_usd")
    if cost is not None and math.isfinite(cost):
        out["cost_per_unit_usd"] = cost / work
    energy = row.get("energy_j")
    if energy is not None and math.isfinite(energy) and row.get("energy_source") in (MEASURED, ESTIMATED):
        out["energy_per_unit_wh"] = energy / 3600.0 / work
    return out


def gpu_hour_price(host_price: float | None, catalog_price: float | None) -> tuple[float | None, str | None]:
    """(price per GPU-hour, where it came from): the host's configured price wins, else the catalog's default."""
    if host_price is not None:
        return float(host_price), "host"
    if catalog_price is not None:
        return float(catalog_price), "catalog"
    return None, None


def cost_usd(price_per_gpu_hour: float | None, num_gpus: int | None, duration_s: float | None) -> float | None:
    """What the case cost: C = P x N x t / 3600 (P USD per GPU-hour, N GPUs, t seconds of wall time)."""
    if price_per_gpu_hour is None or not num_gpus or duration_s is None or duration_s < 0:
        return None
    return price_per_gpu_hour * num_gpus * duration_s / SECONDS_PER_HOUR


def cost_per_million_images_usd(price_per_gpu_hour: float | None, num_gpus: int | None,
                                images_per_sec: float | None) -> float | None:
    """What a million images cost at the measured throughput: P x N / (3600 x X) x 10^6.

    Startup and warm-up are not in it (they are in `cost_usd`), so it compares hosts and GPU
    counts at steady state.
    """
    if price_per_gpu_hour is None or not num_gpus or not _positive(images_per_sec):
        return None
    return price_per_gpu_hour * num_gpus / (SECONDS_PER_HOUR * images_per_sec) * 1e6


def hourly_rate(gpu_price: float | None, num_gpus: float, host_price: float | None) -> tuple[float | None, str | None]:
    """(USD per hour the case's hardware costs, which price it is): P_gpu x N for a GPU case with a GPU price (N in
    whole GPUs: a MIG case's `mig_gpu_equivalents`), else the host's `price_per_hour` (the whole machine, CPU cases
    and GPU hosts priced by the hour)."""
    if num_gpus > 0 and gpu_price is not None:
        return gpu_price * num_gpus, "gpu"
    if host_price is not None:
        return float(host_price), "host_hour"
    return None, None


# Compute slices of a GPU in MIG mode, as NVIDIA's MIG User Guide gives them ("Supported GPUs": the most instances;
# "Supported MIG Profiles": a profile `<N>g.<mem>` has N of them, its fraction of the SMs): 7 on the A100, H100, H20,
# H200, B200 and GB200; 4 on the A30 and the RTX PRO 6000 Blackwell; 2 on the RTX PRO 5000 and 4500 Blackwell.
MIG_SLICES_DEFAULT = 7
MIG_SLICES = ((re.compile(r"^A30\b", re.IGNORECASE), 4), (re.compile(r"^RTX PRO 6000\b", re.IGNORECASE), 4),
              (re.compile(r"^RTX PRO (?:5000|4500)\b", re.IGNORECASE), 2))
_MIG_PROFILE_SLICES = re.compile(r"^(?:(\d{1,2})c\.)?(\d{1,2})g\.")


def mig_share(profile: str | None, gpu_model: str | None) -> float:
    """The share of its GPU that one instance of a MIG profile is: its compute slices / the GPU's (`MIG_SLICES`),
    at most 1. `3g.40gb` on an A100 is 3/7; a compute-instance profile `1c.3g.20gb` is its compute instance's 1 slice
    (the others of that GPU instance can run other work), 1/7. 1.0 for whole GPUs (no profile) and a profile of
    another shape."""
    m = _MIG_PROFILE_SLICES.match(profile or "")
    if m is None:
        return 1.0
    name = normalise_gpu_name(gpu_model or "")
    total = next((n for pattern, n in MIG_SLICES if pattern.match(name)), MIG_SLICES_DEFAULT)
    return min(int(m.group(1) or m.group(2)) / total, 1.0)


def mig_gpu_equivalents(num_gpus: int | None, profile: str | None, gpu_model: str | None) -> float:
    """Whole GPUs' worth of a case: its GPUs, or for a MIG case (`num_gpus` instances of `profile`) instances x
    `mig_share`: 2 x 1g.10gb on an A100 are 2/7 of a GPU, priced and (without a measurement) powered as such."""
    return (num_gpus or 0) * mig_share(profile, gpu_model)


def mig_measured_share(gpu_equivalents: float, telemetry_json: str | None) -> float:
    """The part of a MIG case's measured energy that is its own. NVML has no per-instance power: the telemetry
    wrapper reads the boards its instances are on, the other instances' draw included. The case's share is its
    whole-GPU equivalents (`mig_gpu_equivalents`) over the boards measured (the report's `gpus`; 1 when unknown),
    at most 1: 2 x 1g.10gb on one A100 board get 2/7 of its energy, on two boards 1/7 of each. The report in
    `telemetry_json` keeps the boards' own figures."""
    try:
        boards = len(json.loads(telemetry_json or "{}").get("gpus") or []) or 1
    except (ValueError, AttributeError):
        boards = 1
    return min(1.0, gpu_equivalents / boards)


# -- 5. power and energy ------------------------------------------------------------------------
# CodeCarbon's TDP for a CPU it cannot name: 4 W per logical CPU (its DEFAULT_POWER_PER_CORE).
DEFAULT_CPU_W_PER_THREAD = 4.0
# CodeCarbon's table of CPU TDPs per socket (codecarbon 3.3.2, data/hardware/cpu_power.csv, MIT licence:
# include/config/cpu_tdp.LICENSE), e.g. "Intel Xeon Platinum 8375C,300".
CPU_TDP_TABLE = PROJECT_ROOT / "include" / "config" / "cpu_tdp.csv"


_TRADEMARK = re.compile(r"\((?:R|TM)\)", re.IGNORECASE)
_FREQUENCY = re.compile(r"@.*$")
_CORE_COUNT = re.compile(r"\b\d+-Core Processor\b.*$", re.IGNORECASE)
_CPU_WORD = re.compile(r"\b(?:CPU|Processor)\b", re.IGNORECASE)


def normalise_cpu_name(name: str) -> str:
    """/proc/cpuinfo's model name as the table writes it, lower case: 'Intel(R) Xeon(R) Platinum 8375C CPU @
    2.90GHz' -> 'intel xeon platinum 8375c', 'AMD EPYC 7763 64-Core Processor' -> 'amd epyc 7763'.

    Each pattern runs only on a name that can match it: the table's ~4,900 names, normalised once a process
    when a CPU case is stored, mostly match none (13 -> 2 ms)."""
    lower = name.lower()
    if "(" in name:
        name = _TRADEMARK.sub("", name)
    if "@" in name:
        name = _FREQUENCY.sub("", name)
    if "processor" in lower:
        name = _CORE_COUNT.sub("", name)
    if "cpu" in lower or "processor" in lower:
        name = _CPU_WORD.sub("", name)
    return " ".join(name.split()).lower()


@lru_cache(maxsize=4)
def cpu_tdp_table(path: str | None = None) -> dict[str, float]:
    """{normalised CPU name: TDP per socket in W} (the first of a repeated name); {} when the file is unreadable."""
    import csv

    table: dict[str, float] = {}
    try:
        with open(path or CPU_TDP_TABLE, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    tdp = float(row.get("TDP") or "")
                except ValueError:
                    continue
                key = normalise_cpu_name(row.get("Name") or "")
                if key and _positive(tdp):
                    table.setdefault(key, tdp)
    except OSError as exc:
        log.error("CPU TDP table not used: %s", exc)
    return table


def cpu_tdp_w(host_tdp_w: float | None, threads: int | None, model: str | None = None,
              sockets: int | None = None) -> tuple[float | None, str | None]:
    """(the CPUs' TDP in W, where it came from): the host's `cpu_tdp_w` (`host`); else the model's TDP in
    CodeCarbon's table x the sockets (`table`; an exact match of the normalised name, never a guess); else
    CodeCarbon's default of 4 W per logical CPU (`default_per_thread`); else None."""
    if _positive(host_tdp_w):
        return float(host_tdp_w), "host"
    per_socket = cpu_tdp_table().get(normalise_cpu_name(model)) if model else None
    if per_socket is not None:
        return per_socket * (sockets or 1), "table"
    if threads and threads > 0:
        return DEFAULT_CPU_W_PER_THREAD * threads, "default_per_thread"
    return None, None


def estimated_cpu_power_w(tdp_w: float | None, util_pct: float | None) -> float | None:
    """CodeCarbon's CPU-load model for a process (here: a container): P = TDP x u, u the container's share of
    the host's logical CPUs (CPU seconds / (wall seconds x CPUs)), in [0, 1]. So E = P x t = TDP / CPUs x CPU
    seconds: each CPU-second of the container costs one thread's share of the TDP."""
    if not _positive(tdp_w) or util_pct is None or not math.isfinite(util_pct):
        return None
    return tdp_w * min(max(util_pct / 100.0, 0.0), 1.0)



def estimated_power_w(tdp_w: float | None, num_gpus: float | None, utilisation: float = 1.0) -> float | None:
    """Utilisation model of board power: P = N x TDP x u, u in [0, 1] (N in whole GPUs: a MIG case's
    `mig_gpu_equivalents`).

    u is the measured mean GPU utilisation when the telemetry had one (NVML without power readings),
    else 1.0: a training benchmark keeps its GPUs busy, and the board's TDP is its power ceiling, so
    the estimate is an upper bound.
    """
    if not num_gpus or not _positive(tdp_w):
        return None
    u = min(max(utilisation, 0.0), 1.0)
    return num_gpus * tdp_w * u


def energy_j(mean_power_w: float | None, duration_s: float | None) -> float | None:
    """E = P x t (W x s = J)."""
    if mean_power_w is None or duration_s is None or duration_s < 0:
        return None
    return mean_power_w * duration_s


def kwh(joules: float | None) -> float | None:
    """kWh = J / 3.6e6."""
    return None if joules is None else joules / JOULES_PER_KWH


def images_per_joule(images_per_sec: float | None, mean_power_w: float | None) -> float | None:
    """Images per joule at the measured throughput: X / P ((images/s) / (J/s))."""
    if not (_positive(images_per_sec) and _positive(mean_power_w)):
        return None
    return images_per_sec / mean_power_w


def carbon_g(energy_kwh: float | None, g_per_kwh: float | None) -> float | None:
    """gCO2e = kWh x grid intensity (gCO2e/kWh)."""
    if energy_kwh is None or g_per_kwh is None:
        return None
    return energy_kwh * g_per_kwh


# -- the GPU catalog ----------------------------------------------------------------------------
NUMERIC_FIELDS = ("memory_gib", "tdp_w", "price_per_gpu_hour_usd")
Numeric = Literal["memory_gib", "tdp_w", "price_per_gpu_hour_usd"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a price of .inf: every cost inf


class CatalogSource(_Frozen):
    url: str = Field(pattern=r"^https?://\S+$")
    via: str | None = Field(None, pattern=r"^https?://\S+$")
    read_on: date
    supports: list[Numeric] = Field(min_length=1)
    says: str = Field(min_length=1)


class Unsourced(_Frozen):
    field: Numeric
    note: str = Field(min_length=1)


class GpuModel(_Frozen):
    """One catalog entry (see the header of include/config/gpu_catalog.yaml)."""

    name: str = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)
    memory_gib: float = Field(gt=0)
    tdp_w: float = Field(gt=0)
    price_per_gpu_hour_usd: float | None = Field(None, ge=0)
    sources: list[CatalogSource] = Field(min_length=1)
    unsourced: list[Unsourced] = []

    @field_validator("patterns")
    @classmethod
    def _regexes(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {p!r} ({exc})") from None
        return patterns

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> "GpuModel":
        backed = {f for s in self.sources for f in s.supports} | {u.field for u in self.unsourced}
        missing = [f for f in NUMERIC_FIELDS if getattr(self, f) is not None and f not in backed]
        if missing:
            raise ValueError(f"no source and not marked unsourced: {', '.join(missing)}")
        return self

    def matches(self, gpu_name: str) -> bool:
        name = normalise_gpu_name(gpu_name)
        return any(re.fullmatch(p, name, re.IGNORECASE) for p in self.patterns)


def normalise_gpu_name(name: str) -> str:
    """'NVIDIA  A100-SXM4-40GB ' -> 'A100-SXM4-40GB': whitespace collapsed, a leading 'NVIDIA ' dropped."""
    name = " ".join(name.split())
    return name[7:] if name.lower().startswith("nvidia ") else name


class GpuCatalog(_Frozen):
    gpus: list[GpuModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "GpuCatalog":
        names = [g.name for g in self.gpus]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate names: {', '.join(dupes)}")
        return self

    def lookup(self, gpu_model: str | None) -> GpuModel | None:
        """The first entry matching the host's GPU name; None for no GPU, an unknown model or a mix
        of models (`HostFacts.gpu_model` joins several names with ', ')."""
        if not gpu_model or "," in gpu_model:
            return None
        return next((g for g in self.gpus if g.matches(gpu_model)), None)


def catalog_path() -> Path:
    """`FLEETBENCH_GPU_CATALOG`, else include/config/gpu_catalog.yaml."""
    return Path(os.environ.get("FLEETBENCH_GPU_CATALOG") or PROJECT_ROOT / "include" / "config" / "gpu_catalog.yaml")


def parse_catalog(data: Any, source: str = "<catalog>") -> GpuCatalog:
    """Validate catalog data; errors name the field (`gpus[3].tdp_w: must be > 0, got -1`)."""
    from fleetbench.config import ConfigError, format_validation_error

    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): must be a mapping with a gpus list"])
    try:
        return GpuCatalog.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None


def load_catalog(path: str | Path | None = None) -> GpuCatalog:
    """Read and validate the GPU catalog (`catalog_path()` by default); raises `ConfigError` naming the field."""
    from fleetbench.config import read_yaml

    # as the fleet config is read: libyaml (the pure-Python loader took ~20 ms for this file, on every store),
    # errors with their line, a repeated key named
    path = Path(path) if path is not None else catalog_path()
    return parse_catalog(read_yaml(path), str(path))


def load_catalog_or_none(path: str | Path | None = None) -> GpuCatalog | None:
    """`load_catalog`, but a missing or broken catalog is logged and gives None: results are stored
    without catalog-based figures (TDP estimates, default prices) rather than not at all."""
    from fleetbench.config import ConfigError

    try:
        return load_catalog(path)
    except (ConfigError, ValueError, OSError) as exc:
        log.error("GPU catalog not used: %s", exc)
        return None


# -- settings and derive ------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSettings:
    """What `derive` needs from the fleet config: host prices, the grid's carbon intensity, an accuracy target."""

    host_prices: Mapping[str, float | None] = field(default_factory=dict)
    carbon_g_per_kwh: float | None = None
    target_accuracy_top1: float | None = None
    host_hour_prices: Mapping[str, float | None] = field(default_factory=dict)  # hosts[].price_per_hour
    host_cpu_tdp_w: Mapping[str, float | None] = field(default_factory=dict)  # hosts[].cpu_tdp_w

    @classmethod
    def _of(cls, hosts, fleet) -> "MetricSettings":
        hosts = list(hosts)
        return cls(host_prices={h.name: h.price_per_gpu_hour for h in hosts},
                   host_hour_prices={h.name: h.price_per_hour for h in hosts},
                   host_cpu_tdp_w={h.name: h.cpu_tdp_w for h in hosts},
                   carbon_g_per_kwh=fleet.carbon_g_per_kwh, target_accuracy_top1=fleet.target_accuracy_top1)

    @classmethod
    def from_config(cls, cfg) -> "MetricSettings":
        """From a `fleetbench.config.FleetConfig`."""
        return cls._of(cfg.hosts, cfg.fleet)

    @classmethod
    def from_plan(cls, plan) -> "MetricSettings":
        """From a `fleetbench.run_model.RunPlan`: the prices and fleet settings the run was planned with."""
        return cls._of(plan.hosts, plan.run.fleet_settings)




def derive(rows: Sequence[Mapping[str, Any]], steps: Iterable[Mapping[str, Any]], catalog: GpuCatalog | None,
           config: MetricSettings | None) -> list[dict]:
    """A run's result rows with every derived metric filled in (new dicts; the input is not changed).

    `steps` are the run's step rows (host, case_key, step, images_per_sec); `catalog` may be None
    (no TDP or default price then); `config` the fleet's `MetricSettings`. Energy: a row the
    telemetry wrapper (GPUs) or the host's RAPL counters (CPU) measured keeps its numbers; a GPU case
    that ran without a measurement gets N x TDP x u over its wall time, a CPU case TDP x its CPU
    utilisation, flagged `energy_source = "estimated"`; cases that never ran (skipped, or refused at container
    start: 0 s of wall time) or a CPU case without telemetry get `energy_source = "none"`.
    """
    config = config or MetricSettings()
    by_case: dict[tuple, list[Mapping[str, Any]]] = {}
    for s in steps:
        by_case.setdefault((s["host"], s["case_key"]), []).append(s)

    out = [dict(r) for r in rows]
    for r in out:
        if r.get("precision") is None:
            r["precision"] = precision_of(r.get("command"))
    speedups = match_speedup([r for r in out if (r.get("nodes") or 1) == 1])
    node_speedups = match_nodes(out)

    for r in out:
        gpus = r.get("num_gpus") or 0
        ips = r.get("images_per_sec")
        duration = r.get("duration_s")
        gpu = catalog.lookup(_first_gpu_model(r)) if catalog is not None and gpus > 0 else None
        r["gpu_catalog_name"] = gpu.name if gpu else None

        # 1. training time
        r["time_for_batches_s"] = time_for_batches_s(r.get("num_batches"), r.get("batch_size_global"), ips)
        accuracy = r.get("accuracy_top1")
        r["time_to_accuracy_s"] = time_to_accuracy_s([(duration, accuracy)], config.target_accuracy_top1)

        # 2. throughput of the steps
        per = _workers_per_step_line(r)  # a cluster's chief prints its own steps, the total is the cluster's
        samples = [s.get("images_per_sec") for s in sorted(by_case.get((r.get("host"), r.get("case_key")), []),
                                                           key=lambda s: s["step"])]
        samples = [v * per if v is not None else None for v in samples]
        stats = step_stats(samples)
        r["step_median_images_per_sec"] = stats.median if stats else None
        r["step_spread_images_per_sec"] = stats.spread if stats else None
        r["step_cv"] = stats.cv if stats else None

        # 3. speedup
        eff, base = speedups.get((r.get("host"), r.get("case_key")), (None, None))
        r["speedup_efficiency"], r["speedup_baseline_case_key"] = eff, base
        r["node_efficiency"], r["node_baseline_images_per_sec"] = node_speedups.get(
            (r.get("host"), r.get("case_key")), (None, None))

        # 4. cost: the GPUs' price when there is one, else the host's by the hour
        price, price_source = (gpu_hour_price(config.host_prices.get(r.get("host")),
                                              gpu.price_per_gpu_hour_usd if gpu else None)
                               if gpus > 0 else (None, None))
        host_price = config.host_hour_prices.get(r.get("host"))
        # a MIG case's instances are their share of the GPU (num_gpus counts instances, gpu_model is the GPU's)
        gpu_equivalents = mig_gpu_equivalents(gpus, r.get("mig_profile"), r.get("gpu_model"))
        rate, kind = hourly_rate(price, gpu_equivalents, host_price)
        r["price_per_gpu_hour"] = price
        r["price_per_hour"] = host_price if kind == "host_hour" else None
        r["price_source"] = price_source if kind == "gpu" else kind
        # a multi-node case pays for every host of its set (at its first host's price)
        r["cost_usd"] = cost_usd(rate, r.get("nodes") or 1, duration)
        r["cost_per_million_images_usd"] = cost_per_million_images_usd(rate, r.get("nodes") or 1, ips)

        # 5. power and energy
        r["cpu_tdp_w"] = None
        if r.get("energy_source") == MEASURED and r.get("energy_j") is not None:
            if r.get("mig_profile") and gpus > 0:  # NVML measures whole boards: the case's share of them
                share = mig_measured_share(gpu_equivalents, r.get("telemetry_json"))
                r["energy_j"] = r["energy_j"] * share
                r["mean_power_w"] = r["mean_power_w"] * share if r.get("mean_power_w") is not None else None
        elif gpus > 0 and _positive(duration) and gpu is not None:  # a case that never started ran 0 s
            util = r.get("mean_gpu_util_pct")
            # num_gpus is per host: a multi-node case draws on every host of its set (at its first host's GPU,
            # as its cost is at its first host's price), as its images/sec is the set's total
            power = estimated_power_w(gpu.tdp_w, gpu_equivalents * (r.get("nodes") or 1),
                                      util / 100.0 if util is not None else 1.0)
            r["mean_power_w"], r["energy_j"], r["energy_source"] = power, energy_j(power, duration), ESTIMATED
        elif (gpus == 0 and _positive(duration) and r.get("mean_cpu_util_pct") is not None
              and (tdp := cpu_tdp_w(config.host_cpu_tdp_w.get(r.get("host")), r.get("cpu_threads"), r.get("cpu_model"),
                                    r.get("cpu_sockets"))[0])):
            power = estimated_cpu_power_w(tdp, r["mean_cpu_util_pct"])
            r["cpu_tdp_w"] = tdp
            r["mean_power_w"], r["energy_j"], r["energy_source"] = power, energy_j(power, duration), ESTIMATED
        else:
            r["energy_source"], r["energy_j"] = NONE, None
        r["energy_kwh"] = kwh(r.get("energy_j"))
        r["images_per_joule"] = images_per_joule(ips, r.get("mean_power_w")) if r["energy_source"] != NONE else None
        r["carbon_g_per_kwh"] = config.carbon_g_per_kwh if r["energy_kwh"] is not None else None
        r["carbon_g"] = carbon_g(r["energy_kwh"], config.carbon_g_per_kwh)
    return out
