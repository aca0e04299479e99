"""Reader for tf_cnn_benchmarks output (TensorFlow 1.4 to 2.x).

What a run prints, as seen in real logs (see tests/unit/test_parsing.py)::

    TensorFlow:  1.15
    Model:       resnet50
    Dataset:     imagenet (synthetic)          # missing in TF 1.4-era builds
    Mode:        training                      # or "forward-only" / "forward only"
    Batch size:  64 global
                 64 per device                 # indented or not; "64.0" in old builds
    Num batches: 100                           # missing in TF 1.4-era builds
    Devices:     ['/gpu:0']
    Variables:   replicated
    ==========
    Step    Img/sec total_loss                 # "loss" in old builds
    1       images/sec: 295.2 +/- 0.0 (jitter = 0.0)        8.220 1593716179
    ----------------------------------------------------------------
    total images/sec: 292.85

Header, step and accuracy lines come from the primary rank only (rank 0 under
mpirun, see ``detect``). ``total images/sec`` is the job total, printed by every
rank: rank 0's is taken (else the first of any rank), never a sum, and
only a positive number counts (see ``model.result_value``). The header
never names the precision, so it is only known from an echoed ``--use_fp16`` /
``--auto_mixed_precision`` flag or a ``Data type:`` line, else None. Status and
failure class are decided by ``detect``.
"""

from __future__ import annotations

import re

from .model import (
    FORMAT_TF_CNN,
    NUMBER,
    LogLine,
    ParsedLog,
    Step,
    Steps,
    result_value,
    to_float,
    to_number,
)

#: Named in the no_result failure detail.
RESULT_LINE = "total images/sec"

#: Strings that only tf_cnn_benchmarks output contains; ``detect`` counts them.
MARKERS = (
    re.compile(r"images/sec:[ \t]{0,16}\d{1,15}(?:\.\d{1,15})?[ \t]{0,16}\+/-"),
    re.compile(r"total images/sec:"),
    re.compile(r"TensorFlow:[ \t]{1,32}\d{1,4}\.\d{1,4}"),
    re.compile(r"Batch size:[ \t]{0,32}\d{1,15}(?:\.\d{1,15})?[ \t]{1,32}global"),
    re.compile(r"tf_cnn_benchmarks"),
)

_HEADER_RE = re.compile(
    r"^(TensorFlow|Model|Dataset|Mode|SingleSess|Batch size|Num batches|Num epochs"
    r"|Devices|NUMA bind|Data format|Layout optimizer|RewriterConfig|Optimizer"
    r"|Variables|AllReduce|Sync|Staged vars|Horovod on):\s*(.*)$"
)
"""A header line ``Key:  value``, separated by spaces or tabs, any build."""

_GLOBAL_BATCH_RE = re.compile(rf"^({NUMBER})\s+global")
"""Value of ``Batch size:``: ``64 global`` or, in old builds, ``64.0 global``."""

_PER_DEVICE_RE = re.compile(rf"^\s{{0,64}}({NUMBER})\s{{1,64}}per device")
"""The line under ``Batch size:``; indented by TF, unindented in Lambda's logs."""

_STEP_RE = re.compile(
    rf"^\s*(\d{{1,9}})\s+images/sec:\s*({NUMBER})"
    rf"(?:\s*\+/-\s*({NUMBER})\s*\(jitter\s*=\s*({NUMBER})\))?"
    rf"(?:\s+({NUMBER}))?"
)
"""``<step> images/sec: X +/- Y (jitter = Z) <loss> [top1 top5] [unix time]``.

Multi-worker runs print ``images/sec: X`` without the +/- and jitter part;
a ``nan`` loss (diverged fp16 run) leaves loss None.
"""

_EVAL_STEP_RE = re.compile(rf"^\s*(\d{{1,9}})\s+({NUMBER})\s+examples/sec")
"""Progress of ``--eval`` runs: ``<step> <X> examples/sec``."""

_TOTAL_RE = re.compile(r"total images/sec:[ \t]{0,64}(\S{0,64})")
"""The result; searched anywhere in a line so that a glued line still counts. The
value is the whole token after the colon, so that ``1.2e`` is not read as 1.2."""

_ACCURACY_RE = re.compile(rf"Accuracy @ 1 = ({NUMBER})\s{{1,16}}Accuracy @ 5 = ({NUMBER})")
"""Eval result: ``Accuracy @ 1 = 0.7500 Accuracy @ 5 = 0.9200 [50000 examples]``."""

_PRECISION_HINT_RE = re.compile(r"--(use_fp16|auto_mixed_precision)(?:=(\w{1,16}))?|Data type:\s{0,16}(\w{1,16})")
"""Precision evidence: an echoed ``--use_fp16[=True]`` / ``--auto_mixed_precision``
flag or a ``Data type: float16`` line. tf_cnn_benchmarks' own header never names
the precision, so without such a line precision stays None."""

_DEVICE_RE = re.compile(r"'([^']{0,256})'")
"""One entry of the Python list repr after ``Devices:``."""

_FALSE_WORDS = frozenset({"false", "0", "no", "off"})
_FP16_TYPES = frozenset({"float16", "half", "fp16", "bfloat16"})
_FP32_TYPES = frozenset({"float32", "float", "fp32"})


def parse(lines: list[LogLine], primary_rank: int | None) -> tuple[ParsedLog, int | None]:
    """Read tf_cnn_benchmarks fields from ``lines``.

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
        self.header: dict[str, str] = {}
        self.header_index: int | None = None
        self.per_device: str | None = None
        self.steps = Steps()
        self.eval_steps = Steps()
        self.primary_total: float | None = None
        self.any_total: float | None = None
        self.rejected_total: str | None = None
        self.accuracy: tuple[float | None, float | None] = (None, None)
        self.fp16_hint = False
        self.fp32_hint = False

    def feed(self, index: int, line: LogLine) -> None:
        """Each pattern runs only on lines holding its fixed text: a long log has millions of lines."""
        text = line.text
        primary = line.belongs_to(self.primary_rank)
        if "total images/sec:" in text:
            self._total(text, primary)
        if "--" in text or "Data type:" in text:
            self._precision(text)
        if primary:
            self._fields(index, text)

    def _fields(self, index: int, text: str) -> None:
        """The first of step, header, per-device batch, eval step and accuracy that the line is."""
        if "images/sec:" in text:
            if self.steps.full and text[:1].isdigit():  # a runaway log: count the rest of its steps, cheaply
                self.steps.count += 1
                return
            if self._step(text):
                return
        if ":" in text and self._header(index, text):
            return
        if "per device" in text and self._per_device(text):
            return
        if "examples/sec" in text and self._eval_step(text):
            return
        if "Accuracy @" in text:
            self._accuracy(text)

    def _step(self, text: str) -> bool:
        match = _STEP_RE.match(text)
        if match is None:
            return False
        step, ips, plusminus, jitter, loss = match.groups()
        self.steps.add(Step(int(step), float(ips), to_float(plusminus), to_float(jitter), to_float(loss)))
        return True

    def _header(self, index: int, text: str) -> bool:
        match = _HEADER_RE.match(text)
        if match is None:
            return False
        key, value = match.groups()
        self.header.setdefault(key, value.strip())
        if self.header_index is None:
            self.header_index = index
        return True

    def _per_device(self, text: str) -> bool:
        match = _PER_DEVICE_RE.match(text)
        if match is None:
            return False
        if self.per_device is None:
            self.per_device = match.group(1)
        return True

    def _eval_step(self, text: str) -> bool:
        match = _EVAL_STEP_RE.match(text)
        if match is None:
            return False
        self.eval_steps.add(Step(int(match.group(1)), float(match.group(2)), None, None, None))
        return True

    def _accuracy(self, text: str) -> None:
        match = _ACCURACY_RE.search(text)
        if match is not None:
            # A train_and_eval run evaluates repeatedly: the last (final) eval wins.
            self.accuracy = (to_float(match.group(1)), to_float(match.group(2)))

    def _total(self, text: str, primary: bool) -> None:
        """Every rank prints the same job total: take the primary rank's first one,
        falling back to the first total of any rank when the primary printed none."""
        match = _TOTAL_RE.search(text)
        if match is None:
            return
        value = result_value(match.group(1))
        if value is None:
            if self.rejected_total is None:
                self.rejected_total = match.group(1)
            return
        if primary and self.primary_total is None:
            self.primary_total = value
        if self.any_total is None:
            self.any_total = value

    def _precision(self, text: str) -> None:
        for match in _PRECISION_HINT_RE.finditer(text):
            flag, flag_value, data_type = match.groups()
            if flag is not None:
                enabled = flag_value is None or flag_value.lower() not in _FALSE_WORDS
                if enabled:
                    self.fp16_hint = True
                elif flag == "use_fp16":
                    self.fp32_hint = True
            elif data_type.lower() in _FP16_TYPES:
                self.fp16_hint = True
            elif data_type.lower() in _FP32_TYPES:
                self.fp32_hint = True

    def result(self) -> ParsedLog:
        header = self.header
        devices = _devices(header.get("Devices"))
        steps = self.steps if self.steps.count else self.eval_steps
        total = self.primary_total if self.primary_total is not None else self.any_total
        return ParsedLog(
            format=FORMAT_TF_CNN,
            model=header.get("Model") or None,
            num_gpus=_count_gpus(devices),
            batch_size_per_device=_per_device_batch(self.per_device),
            batch_size_global=_global_batch(header.get("Batch size")),
            variable_update=header.get("Variables") or None,
            precision=self._precision_name(),
            forward_only=_forward_only(header.get("Mode")),
            data=_data_kind(header.get("Dataset")),
            step_count=steps.count,
            steps=steps.kept,
            total_images_per_sec=total,
            accuracy_top1=self.accuracy[0],
            accuracy_top5=self.accuracy[1],
            devices=devices,
        )

    def _precision_name(self) -> str | None:
        if self.fp16_hint:
            return "fp16"
        if self.fp32_hint:
            return "fp32"
        return None


def _devices(value: str | None) -> list[str] | None:
    """``['/gpu:0', '/gpu:1']`` -> list; horovod runs list ``horovod/gpu:N`` per rank."""
    if value is None:
        return None
    return _DEVICE_RE.findall(value)


def _count_gpus(devices: list[str] | None) -> int | None:
    """Number of GPU entries in ``Devices:`` (ROCm GPUs are ``/gpu:N`` too); CPU-only runs give 0."""
    if devices is None:
        return None
    return sum(1 for device in devices if "gpu" in device.lower())


def _global_batch(value: str | None) -> float | None:
    match = _GLOBAL_BATCH_RE.match(value) if value else None
    return to_number(match.group(1)) if match else None


def _per_device_batch(value: str | None) -> float | None:
    return to_number(value) if value is not None else None


def _forward_only(mode: str | None) -> bool | None:
    """``forward-only`` (old) / ``forward only`` (new) and eval modes run no backward pass;
    ``training`` and ``train_and_eval`` do. Old builds spell eval ``evalation``."""
    if not mode:
        return None
    mode = mode.lower()
    if mode.startswith("forward") or mode.startswith("eval"):
        return True
    if mode.startswith("train"):
        return False
    return None


def _data_kind(dataset: str | None) -> str | None:
    """``imagenet (synthetic)`` -> synthetic; a dataset name without the marker -> real.
    TF 1.4-era builds print no ``Dataset:`` line: None."""
    if not dataset:
        return None
    return "synthetic" if "(synthetic)" in dataset else "real"
