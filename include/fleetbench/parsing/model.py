"""Data types (and two number helpers) shared by the benchmark log parsers.

Nothing here knows about any log format; the format modules (``tf_cnn``,
``horovod``) fill these in and ``detect`` decides status and failure class.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

FORMAT_TF_CNN = "tf_cnn_benchmarks"
FORMAT_HOROVOD = "horovod_synthetic"
FORMATS = (FORMAT_TF_CNN, FORMAT_HOROVOD)

STATUS_OK = "ok"
STATUS_FAILED = "failed"

FAILURE_OOM = "oom"
FAILURE_NCCL = "nccl"
FAILURE_IMPORT = "import_error"
FAILURE_CUDA_DRIVER = "cuda_driver"
FAILURE_CUDA_ERROR = "cuda_error"
FAILURE_NO_RESULT = "no_result"
FAILURE_OTHER = "other_error"
FAILURE_CLASSES = (
    FAILURE_OOM,
    FAILURE_NCCL,
    FAILURE_IMPORT,
    FAILURE_CUDA_DRIVER,
    FAILURE_CUDA_ERROR,
    FAILURE_NO_RESULT,
    FAILURE_OTHER,
)

#: failure_detail is cut to this many characters.
MAX_DETAIL_CHARS = 300

#: A log keeps this many step lines; later ones are only counted (``step_count``), so a
#: runaway log cannot fill the worker's memory. Real runs print tens to a few thousand.
MAX_STEPS = 100_000


class UnknownFormat(ValueError):
    """No known benchmark log format fits the text (or an unknown format name was asked for)."""


@dataclass(slots=True)
class Step:
    """One progress line: ``<step>  images/sec: X +/- Y (jitter = Z)  <loss>``.

    For Horovod synthetic benchmarks ``images_per_sec`` is the printed
    *per-GPU* value of an ``Iter #N`` line and the other fields are None.
    """

    step: int
    images_per_sec: float
    plusminus: float | None
    jitter: float | None
    loss: float | None


@dataclass
class ParsedLog:
    """Everything the parser could read from one benchmark log.

    Field order is the order of the JSON Lines written by ``cli_parse``.
    """

    format: str
    status: str = STATUS_FAILED
    failure_class: str | None = None
    failure_detail: str | None = None
    model: str | None = None
    num_gpus: int | None = None
    batch_size_per_device: float | None = None
    batch_size_global: float | None = None
    variable_update: str | None = None
    precision: str | None = None
    forward_only: bool | None = None
    data: str | None = None
    step_count: int = 0
    steps: list[Step] = field(default_factory=list)
    total_images_per_sec: float | None = None
    accuracy_top1: float | None = None
    accuracy_top5: float | None = None
    devices: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict in field order; steps become a list of dicts.

        Non-finite floats (which strict JSON cannot hold) become None.
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "steps":
                value = [_step_dict(s) for s in value]
            elif f.name == "devices" and value is not None:
                value = list(value)
            else:
                value = _finite(value)
            out[f.name] = value
        return out


def _step_dict(step: Step) -> dict[str, Any]:
    return {f.name: _finite(getattr(step, f.name)) for f in fields(step)}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class LogLine(NamedTuple):
    """One logical record of a log, after launcher and MPI rank prefixes are removed.

    ``rank`` is the MPI/Horovod rank from a ``[1,0]<stdout>:`` style prefix,
    or None when the line had no rank prefix. ``complete`` is False for a record
    that may have been cut mid-word: the last line of a log that ends without a
    line break, or a line longer than the parser reads.
    """

    rank: int | None
    text: str
    complete: bool = True

    def belongs_to(self, primary_rank: int | None) -> bool:
        """True for lines of the chosen rank and for lines without a rank prefix."""
        return self.rank is None or self.rank == primary_rank


#: A decimal number as benchmarks print them; digit runs are bounded so that
#: garbage input can never build an absurd int/float.
NUMBER = r"[-+]?\d{1,15}(?:\.\d{0,15})?(?:[eE][-+]?\d{1,3})?"


def to_number(text: str) -> float:
    """Parse a matched NUMBER; integral values come back as ``int`` (``64.0`` -> ``64``)."""
    value = float(text)
    if math.isfinite(value) and value.is_integer():
        return int(value)
    return value


class Steps:
    """Step lines in log order: all are counted, the first ``MAX_STEPS`` are kept."""

    __slots__ = ("kept", "count")

    def __init__(self) -> None:
        self.kept: list[Step] = []
        self.count = 0

    def add(self, step: Step) -> None:
        self.count += 1
        if len(self.kept) < MAX_STEPS:
            self.kept.append(step)

    @property
    def full(self) -> bool:
        """Further steps are only counted (a reader can skip building them)."""
        return len(self.kept) >= MAX_STEPS


_RESULT_VALUE_RE = re.compile(NUMBER)


def result_value(token: str) -> float | None:
    """A result line's value, or None unless ``token`` is one whole number, finite and > 0.

    A throughput of 0 or below is no measurement, and ``1.2e`` or ``12abc`` is a
    number cut short or glued to something else: neither may count as a result.
    """
    if _RESULT_VALUE_RE.fullmatch(token) is None:
        return None
    value = float(token)
    return value if math.isfinite(value) and value > 0 else None


def to_float(text: str | None) -> float | None:
    """Parse an optional matched NUMBER as float; None when absent or not finite."""
    if text is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None
