"""Reader for Horovod's synthetic benchmarks.

``examples/pytorch/pytorch_synthetic_benchmark.py`` and
``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` print, from rank 0
only (under ``mpirun --tag-output`` every line carries ``[1,0]<stdout>:``)::

    Model: resnet50
    Batch size: 32
    Number of GPUs: 4
    Running warmup...
    Running benchmark...
    Iter #0: 220.5 img/sec per GPU          # newer: "..., iteration time 145.1 ms"
    Img/sec per GPU: 221.3 +-2.1
    Total img/sec on 4 GPU(s): 885.2 +-8.4

Steps are the ``Iter`` lines and keep the printed *per-GPU* rate;
``total_images_per_sec`` is the ``Total img/sec`` value (per-GPU mean x GPUs),
when it is a positive number (see ``model.result_value``).
These scripts only train, in fp32, on synthetic data, so once their header is
seen forward_only is False, precision "fp32" and data "synthetic".
"""

from __future__ import annotations

import re

from .model import FORMAT_HOROVOD, NUMBER, LogLine, ParsedLog, Step, Steps, result_value, to_number

#: Named in the no_result failure detail.
RESULT_LINE = "Total img/sec"

#: Strings that only the Horovod synthetic benchmarks print; ``detect`` counts them.
MARKERS = (
    re.compile(r"Iter #\d{1,9}:[ \t]{0,16}\d{1,15}(?:\.\d{1,15})?[ \t]{1,16}img/sec per"),
    re.compile(r"Total img/sec on \d"),
    re.compile(r"Img/sec per (?:GPU|CPU):"),
    re.compile(r"Number of (?:GPU|CPU)s:[ \t]{0,16}\d"),
    re.compile(r"_synthetic_benchmark"),
)

_MODEL_RE = re.compile(r"^Model:\s{0,32}(\S{1,200})")
_BATCH_RE = re.compile(rf"^Batch size:\s{{0,32}}({NUMBER})\s{{0,32}}$")
"""Per-worker batch size; unlike tf_cnn_benchmarks there is no ``global`` word."""

_WORKERS_RE = re.compile(r"^Number of (GPU|CPU)s:\s{0,32}(\d{1,9})")
_ITER_RE = re.compile(rf"^Iter #(\d{{1,9}}):\s{{0,32}}({NUMBER})\s{{1,32}}img/sec per (?:GPU|CPU)")
_TOTAL_RE = re.compile(r"Total img/sec on (\d{1,9}) (GPU|CPU)\(s\):[ \t]{0,64}(\S{0,64})")
"""The result, ``... on 4 GPU(s): 885.2 +-8.4``; its value is the whole token after the colon."""


def parse(lines: list[LogLine], primary_rank: int | None) -> tuple[ParsedLog, int | None]:
    """Read Horovod synthetic benchmark fields from ``lines``.

    Returns the ParsedLog (status not yet decided) and the index in ``lines``
    of the first header line, or None when no header was printed.
    """
    reader = Reader(primary_rank)
    for index, line in enumerate(lines):
        reader.feed(index, line)
    return reader.result(), reader.header_index


class Reader:
    """Accumulates what one pass over the lines finds; ``detect`` streams lines into it.

    ``rejected_total`` keeps the first result value that was not a positive number,
    so that a log without a usable result can say why.
    """

    def __init__(self, primary_rank: int | None) -> None:
        self.primary_rank = primary_rank
        self.header_index: int | None = None
        self.model: str | None = None
        self.batch: float | None = None
        self.workers: tuple[str, int] | None = None  # ("GPU" | "CPU", count)
        self.steps = Steps()
        self.total: float | None = None
        self.total_workers: tuple[str, int] | None = None
        self.rejected_total: str | None = None

    def feed(self, index: int, line: LogLine) -> None:
        if not line.belongs_to(self.primary_rank):
            return
        text = line.text
        if self._iter(text) or self._total(text):
            return
        self._header(index, text)

    def _iter(self, text: str) -> bool:
        match = _ITER_RE.match(text)
        if match is None:
            return False
        self.steps.add(Step(int(match.group(1)), float(match.group(2)), None, None, None))
        return True

    def _total(self, text: str) -> bool:
        match = _TOTAL_RE.search(text)
        if match is None:
            return False
        if self.total_workers is None:
            self.total_workers = (match.group(2), int(match.group(1)))
        value = result_value(match.group(3))
        if value is None:
            if self.rejected_total is None:
                self.rejected_total = match.group(3)
        elif self.total is None:
            self.total = value
        return True

    def _header(self, index: int, text: str) -> None:
        found = False
        if (match := _MODEL_RE.match(text)) is not None:
            found = True
            self.model = self.model or match.group(1)
        elif (match := _BATCH_RE.match(text)) is not None:
            found = True
            if self.batch is None:
                self.batch = to_number(match.group(1))
        elif (match := _WORKERS_RE.match(text)) is not None:
            found = True
            if self.workers is None:
                self.workers = (match.group(1), int(match.group(2)))
        if found and self.header_index is None:
            self.header_index = index

    def result(self) -> ParsedLog:
        known = self.header_index is not None or bool(self.steps.count) or self.total_workers is not None
        workers = self.workers or self.total_workers
        return ParsedLog(
            format=FORMAT_HOROVOD,
            model=self.model,
            num_gpus=_gpu_count(workers),
            batch_size_per_device=self.batch,
            batch_size_global=_global_batch(self.batch, workers),
            variable_update="horovod" if known else None,
            precision="fp32" if self.header_index is not None else None,
            forward_only=False if known else None,
            data="synthetic" if known else None,
            step_count=self.steps.count,
            steps=self.steps.kept,
            total_images_per_sec=self.total,
        )


def _gpu_count(workers: tuple[str, int] | None) -> int | None:
    """``Number of GPUs: 4`` (or the ``Total ... on 4 GPU(s)`` line) -> 4; CPU runs -> 0."""
    if workers is None:
        return None
    kind, count = workers
    return count if kind == "GPU" else 0


def _global_batch(batch: float | None, workers: tuple[str, int] | None) -> float | None:
    """Every worker trains on ``Batch size`` images: global = batch x workers."""
    if batch is None or workers is None:
        return None
    value = batch * workers[1]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
