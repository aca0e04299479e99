"""What every harness shares: metric samples, a case's point in its benchmark's matrix, and the Harness shape.

A harness (one module each, registered in `fleetbench.harnesses`) answers two questions: which argv (and
environment) runs one case, and what the case's log measured, as metric samples
``(metric, value, unit, better, labels)`` of which one is the case's primary metric.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec

HIGHER, LOWER = "higher", "lower"
BETTER = (HIGHER, LOWER)

# Units a metric may carry; a sample with another unit is dropped (a typo must not start a new series).
# Time units default to "lower is better", everything else to "higher".
TIME_UNITS = ("s", "ms", "us", "ns", "min", "h")
UNITS = frozenset({
    "images/s", "samples/s", "tok/s", "tokens/s", "items/s", "requests/s", "steps/s", "ops/s", "queries/s",
    "GB/s", "MB/s", "KB/s", "B/s", "Gbit/s", "Mbit/s", "GiB/s", "MiB/s",
    "FLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s",
    *TIME_UNITS, "%", "J", "kJ", "W", "B", "KiB", "MiB", "GiB", "KB", "MB", "GB", "count", "1",
})
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,99}$")
MAX_METRICS = 1000  # samples a case keeps; more are dropped and counted
MAX_LABELS = 16
MAX_LABEL_CHARS = 200
MAX_LABELS_JSON = 1000  # result_metrics.labels holds 2,000 characters; it is part of the key, never cut


def default_better(unit: str) -> str:
    return LOWER if unit in TIME_UNITS else HIGHER


@dataclass(frozen=True)
class MetricSample:
    metric: str
    value: float
    unit: str
    better: str = HIGHER
    labels: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        return asdict(self)


def sample_problem(metric: Any, value: Any, unit: Any, better: Any, labels: Any) -> str | None:
    """Why a sample cannot be stored (a short reason, counted in failure_detail), or None."""
    if not isinstance(metric, str) or not METRIC_NAME.match(metric):
        return "bad metric name"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if not math.isfinite(value):
        return "not finite"
    if unit not in UNITS:
        return "unknown unit"
    if better not in BETTER:
        return "better not higher|lower"
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or any(
            not isinstance(k, str) or len(k) > MAX_LABEL_CHARS or not isinstance(v, (str, int, float, bool))
            or len(str(v)) > MAX_LABEL_CHARS for k, v in labels.items()) \
            or len(json.dumps(labels, sort_keys=True)) > MAX_LABELS_JSON:
        return "bad labels"
    return None


@dataclass
class Measured:
    """What a harness read from one case's log. `failure_class` is the row's name (fleetbench.failures) for
    what the log itself shows (it fails the case); None when the log shows no failure of its own."""

    samples: list[MetricSample] = field(default_factory=list)
    primary: str | None = None  # the primary metric's name; its sample (labels {}) is the row's value
    failure_class: str | None = None
    failure_detail: str | None = None
    steps: list[dict] = field(default_factory=list)
    step_count: int = 0
    images_per_sec: float | None = None  # benchmark_results.images_per_sec, for image throughput harnesses
    accuracy_top1: float | None = None
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> samples dropped

    def primary_sample(self) -> MetricSample | None:
        return next((s for s in self.samples if s.metric == self.primary and not s.labels), None)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def dropped_detail(self) -> str | None:
        if not self.dropped:
            return None
        total = sum(self.dropped.values())
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        return f"dropped {total} metric sample(s): {parts}"


class SampleSink:
    """Collects samples for a Measured: checks each, keeps the last of a (metric, labels), caps the count."""

    def __init__(self, measured: Measured):
        self.measured = measured
        self.by_key: dict[tuple, MetricSample] = {}

    def add(self, metric: Any, value: Any, unit: Any, better: Any = None, labels: Any = None) -> None:
        labels = {} if labels is None else labels
        better = default_better(unit) if better is None and isinstance(unit, str) else better
        problem = sample_problem(metric, value, unit, better, labels)
        if problem:
            self.measured.drop(problem)
            return
        key = (metric, tuple(sorted((k, str(v)) for k, v in labels.items())))
        if key not in self.by_key and len(self.by_key) >= MAX_METRICS:
            self.measured.drop(f"over {MAX_METRICS} metrics")
            return
        self.by_key.pop(key, None)  # the last value of a metric wins (a progress line before the final one)
        self.by_key[key] = MetricSample(metric, float(value), unit, better, dict(labels))

    def done(self) -> Measured:
        self.measured.samples = list(self.by_key.values())
        return self.measured


@dataclass(frozen=True)
class CasePoint:
    """One point of a benchmark's matrix: its case_key and the values that become the row's columns."""

    case_key: str
    model: str | None
    batch_size: int | None
    num_gpus: int
    variable_update: str | None
    axes: dict[str, Any] = field(default_factory=dict, hash=False)  # every axis value of the point


class Harness:
    """One harness. Subclasses set `name`, `axes` (the BenchmarkSpec matrix fields it has), `required` and
    `primary`, and implement `points`, `command` and `measure`."""

    name: str = ""
    axes: tuple[str, ...] = ("num_gpus",)
    required: tuple[str, ...] = ()
    primary: tuple[str, str, str] = ("", "", HIGHER)  # metric, unit, better
    description: str = ""
    fields: tuple[str, ...] = ()  # the harness-specific BenchmarkSpec fields it reads (command, metrics, ...)
    needs_argv: bool = True  # runs the image's command (or the benchmark's): it must not be empty
    gpu_only: bool = False
    abbreviated_flags: bool = False  # the program reads an unambiguous prefix as the flag (argparse, getopt_long)
    passes_num_batches: bool = False  # `command` passes the benchmark's num_batches (the num_batches parameter's)
    # Matrix axes on the command line (`--flag=value`, and the value the harness takes without one) that change a
    # case's peak memory beyond its model, batch and precision: capacity profiles are per their values.
    memory_flags: tuple[tuple[str, str], ...] = ()

    def points(self, bench: "BenchmarkSpec") -> list[CasePoint]:
        raise NotImplementedError

    def command(self, prefix: Iterable[str], bench: "BenchmarkSpec", point: CasePoint) -> list[str]:
        raise NotImplementedError

    def env(self, bench: "BenchmarkSpec", point: CasePoint) -> dict[str, str]:
        return {}

    def settings(self, bench: "BenchmarkSpec") -> dict:
        """What `measure` needs from the config on the worker (plain data; travels with the case)."""
        return {}

    def measure(self, path: str, settings: dict) -> Measured:
        """The samples of a saved log (a regular file; OSError when it cannot be read)."""
        raise NotImplementedError

    def primary_metric(self, settings: dict) -> tuple[str | None, str | None, str | None]:
        """(metric, unit, better) of the primary metric a case is planned to report, as far as the config says
        (for the rows of cases that measured none); None where it does not say."""
        metric, unit, better = self.primary
        return (metric or None, unit or None, better) if metric else (None, None, None)

    def check(self, bench: dict, path: str) -> list[str]:
        """Harness-specific config errors of a raw benchmark mapping, each `path.field: message`."""
        return []

    def own_flags(self, bench: dict) -> dict[str, str]:
        """The `--flags` `command` gives the cases of a raw benchmark mapping, each with where its value comes from.
        `extra_args` go after them and the programs keep a flag's last value, so repeating one would run other
        settings than the case's key, row and container request say: the config check refuses it."""
        return {}

    def memory_variant(self, command: Any) -> str:
        """`memory_flags` as a case's command (a list or its JSON text) sets them, `flag=value` comma-separated
        (the last of a repeated flag, as the harness's own parser keeps it); "" for a harness without any. Read
        from the stored command, as its precision is, so results stored before need no new column."""
        if not self.memory_flags:
            return ""
        from fleetbench.metrics import command_argv

        values = dict(self.memory_flags)
        for arg in command_argv(command) or []:
            name, eq, value = str(arg).partition("=")
            if eq and name[:2] == "--" and name[2:] in values:
                values[name[2:]] = value
        return ",".join(f"{flag}={value}" for flag, value in values.items())
