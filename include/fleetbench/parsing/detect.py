"""Format detection, line normalisation, failure classification and ``parse_log``.

Pipeline: split the text into logical lines (dropping launcher prefixes and
splitting on MPI rank prefixes), pick the primary rank, let the format module
read its fields, then decide ``status`` / ``failure_class`` / ``failure_detail``.
"""

from __future__ import annotations

import re

from . import horovod, tf_cnn
from .model import (
    FAILURE_CUDA_DRIVER,
    FAILURE_IMPORT,
    FAILURE_NCCL,
    FAILURE_NO_RESULT,
    FAILURE_OOM,
    FAILURE_OTHER,
    FORMAT_HOROVOD,
    FORMAT_TF_CNN,
    MAX_DETAIL_CHARS,
    STATUS_FAILED,
    STATUS_OK,
    LogLine,
    ParsedLog,
    UnknownFormat,
)

_FORMAT_MODULES = {FORMAT_TF_CNN: tf_cnn, FORMAT_HOROVOD: horovod}

# --- line normalisation -----------------------------------------------------

_LAUNCHER_PREFIX_RE = re.compile(
    r"^(?:"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\|[^|]*\|(?:[^|\t]{0,120}\|){0,4}"
    r"|\[\d{4}-\d\d-\d\d[^\]]{0,40}\]\s+\{[^}]{0,200}\}\s+[A-Z]+\s+-\s"
    r")"
)
"""Prefixes a launcher puts before the benchmark's own text:
``INFO|2020-01-01 00:00:00|host|stdout|`` (level|time|fields...|) and
Airflow task logs ``[2024-05-01T12:00:00.123+0000] {subprocess.py:93} INFO - ``."""

_RANK_PREFIX_RE = re.compile(r"\[(\d{1,9})(?:,(\d{1,9}))?\]<(?:stdout|stderr)>:")
"""``mpirun --tag-output`` prefix ``[jobid,rank]<stdout>:`` or horovodrun's
``[rank]<stderr>:``. Searched anywhere in a line: output of two ranks can be
glued onto one physical line (``...7.912[1,1]<stdout>:1\\timages/sec...``)."""


def split_lines(text: str) -> list[LogLine]:
    """Turn raw log text into logical lines, one per record of one rank."""
    lines: list[LogLine] = []
    for raw in text.splitlines():
        raw = _LAUNCHER_PREFIX_RE.sub("", raw, count=1)
        if "]<std" not in raw:
            lines.append(LogLine(None, raw.strip()))
            continue
        lines.extend(_split_ranks(raw))
    return lines


def _split_ranks(raw: str) -> list[LogLine]:
    matches = list(_RANK_PREFIX_RE.finditer(raw))
    if not matches:
        return [LogLine(None, raw.strip())]
    records = []
    head = raw[: matches[0].start()].strip()
    if head:
        records.append(LogLine(None, head))
    for match, following in zip(matches, matches[1:] + [None]):
        end = following.start() if following is not None else len(raw)
        rank = match.group(2) if match.group(2) is not None else match.group(1)
        records.append(LogLine(int(rank), raw[match.end() : end].strip()))
    return records


def primary_rank(lines: list[LogLine]) -> int | None:
    """The rank whose header and steps are reported: the lowest one seen (rank 0)."""
    ranks = {line.rank for line in lines if line.rank is not None}
    return min(ranks) if ranks else None


# --- format detection -------------------------------------------------------


def detect_format(text: str) -> str | None:
    """The format whose marker strings occur most often (distinct markers), or None.

    A tie between both formats goes to tf_cnn_benchmarks.
    """
    text = _as_text(text)
    scores = {
        name: sum(1 for marker in module.MARKERS if marker.search(text))
        for name, module in _FORMAT_MODULES.items()
    }
    best = max(scores.values())
    if best == 0:
        return None
    return FORMAT_TF_CNN if scores[FORMAT_TF_CNN] == best else FORMAT_HOROVOD


# --- failure classification -------------------------------------------------

_CUDA_DRIVER_RE = re.compile(
    r"CUDA driver version is insufficient|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
    r"|driver version is insufficient for CUDA runtime version"
    r"|NVIDIA driver on your system is too old"
)
"""Driver older than the CUDA runtime: TF's ``cudaGetDevice() failed. Status: CUDA
driver version is insufficient for CUDA runtime version``, cuInit's driver
mismatch, PyTorch's ``The NVIDIA driver on your system is too old``."""

_OOM_RE = re.compile(
    r"OOM when allocating tensor|Out of memory while trying to allocate"
    r"|ResourceExhaustedError|CUDA out of memory|OutOfMemoryError"
)
"""Fatal GPU out-of-memory: TF's ``Resource exhausted: OOM when allocating tensor``,
XLA's ``Out of memory while trying to allocate``, PyTorch's ``CUDA out of memory``.
TF's recoverable ``Allocator (GPU_0_bfc) ran out of memory trying to allocate ...
The caller indicates that this is not a failure`` does not match."""

_OOM_DRIVER_RE = re.compile(r"CUDA_ERROR_OUT_OF_MEMORY")
"""cuMemAlloc failing. TF logs it at INFO while it retries smaller chunks, so it is
only OOM evidence (and only a detail line) when no fatal OOM line exists."""

_NCCL_RE = re.compile(
    r"NCCL (?:error|Error|ERROR|failure)"
    r"|nccl(?:InternalError|SystemError|UnhandledCudaError|InvalidUsage|InvalidArgument|RemoteError)"
    r"|unhandled (?:cuda|system) error|[Nn]ccl\w* failed|OP_REQUIRES failed at nccl_ops"
)
"""NCCL failures. TF 1.15 only says ``OP_REQUIRES failed at nccl_ops.cc:104 :
Internal: unhandled system error`` (NCCL's text for ncclSystemError);
Horovod/PyTorch say ``NCCL error ...`` / ``ncclCommInitRank failed: ...``."""

_EXCEPTION_RE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::|$)")
"""Last line of a Python traceback: ``[package.module.]SomeError: message``."""

_IMPORT_EXCEPTIONS = frozenset({"ImportError", "ModuleNotFoundError"})

_SHARED_OBJECT_RE = re.compile(r"cannot open shared object file")
"""An exception before the header that failed to load a shared library (real log:
``NotFoundError: libforestprotos.so: cannot open shared object file``, raised while
importing tensorflow.contrib) is an import failure too."""

_TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\):")

_FATAL_START_RE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: F |F\d{4} \d\d:\d\d|Aborted\b|Killed\b")
"""Lines that start a non-Python death: glog FATAL (``... F tensorflow/...``,
``F0702 11:56:09``) and the shell's ``Aborted`` / ``Killed`` (e.g. the kernel OOM killer)."""

_FATAL_TEXT_RE = re.compile(
    r"Check failed:|Segmentation fault|core dumped|exited on signal \d+"
    r"|terminate called after|Fatal Python error"
)
"""Non-Python deaths reported inside a line: CHECK failures, signals seen by mpirun."""

_REPORTING_RE = re.compile(r"OP_REQUIRES failed|^\(\d+\) \w")
"""Lines where TF reports the failure itself (failed op, ``(0) Resource exhausted: ...``
root error); preferred as failure_detail over earlier informational mentions such
as XLA's autotuner running out of memory."""


def classify_failure(lines: list[LogLine], header_index: int | None) -> tuple[str | None, str | None]:
    """Return ``(failure_class, failure_detail)`` for a run without a result.

    Classes by priority: cuda_driver, import_error (only before the header),
    oom, nccl, other_error; ``(None, None)`` when no error text is found.
    Lines of every rank count: one rank's error kills the job.
    """
    evidence = _Evidence(header_index)
    for index, line in enumerate(lines):
        evidence.feed(index, line.text)
    return evidence.verdict()


class _FirstLine:
    """First line matching one failure kind, preferring a line that reports the failure."""

    __slots__ = ("line", "reporting")

    def __init__(self) -> None:
        self.line: str | None = None
        self.reporting = False

    def offer(self, text: str, reporting: bool) -> None:
        if self.line is None or (reporting and not self.reporting):
            self.line, self.reporting = text, reporting


class _Evidence:
    """Failure evidence collected in one pass over all lines."""

    def __init__(self, header_index: int | None) -> None:
        self.header_index = header_index
        self.cuda_driver = _FirstLine()
        self.oom = _FirstLine()
        self.oom_driver = _FirstLine()
        self.nccl = _FirstLine()
        self.import_error: str | None = None
        self.last_exception: str | None = None
        self.fatal: str | None = None
        self.traceback: str | None = None

    def feed(self, index: int, text: str) -> None:
        exception = _EXCEPTION_RE.match(text)
        reporting = None  # computed on first need
        for pattern, first in (
            (_CUDA_DRIVER_RE, self.cuda_driver),
            (_OOM_RE, self.oom),
            (_OOM_DRIVER_RE, self.oom_driver),
            (_NCCL_RE, self.nccl),
        ):
            if first.reporting or pattern.search(text) is None:
                continue
            if reporting is None:
                reporting = exception is not None or _REPORTING_RE.search(text) is not None
            first.offer(text, reporting)
        if self.fatal is None and (_FATAL_START_RE.match(text) or _FATAL_TEXT_RE.search(text)):
            self.fatal = text
        if self.traceback is None and _TRACEBACK_RE.match(text):
            self.traceback = text
        if exception is not None:
            self.last_exception = text
            if self.import_error is None and self._before_header(index) and self._is_import_failure(exception, text):
                self.import_error = text

    def _before_header(self, index: int) -> bool:
        return self.header_index is None or index < self.header_index

    @staticmethod
    def _is_import_failure(match: re.Match[str], text: str) -> bool:
        return match.group(1) in _IMPORT_EXCEPTIONS or _SHARED_OBJECT_RE.search(text) is not None

    def verdict(self) -> tuple[str | None, str | None]:
        ranked = (
            (FAILURE_CUDA_DRIVER, self.cuda_driver.line),
            (FAILURE_IMPORT, self.import_error),
            (FAILURE_OOM, self.oom.line or self.oom_driver.line),
            (FAILURE_NCCL, self.nccl.line),
            (FAILURE_OTHER, self.last_exception or self.fatal or self.traceback),
        )
        for failure_class, line in ranked:
            if line is not None:
                return failure_class, _detail(line)
        return None, None


def _detail(line: str) -> str:
    return line.strip()[:MAX_DETAIL_CHARS]


# --- entry point ------------------------------------------------------------


def parse_log(text: str, fmt: str = "auto") -> ParsedLog:
    """Parse one benchmark log.

    ``fmt`` is ``"auto"``, ``"tf_cnn_benchmarks"`` or ``"horovod_synthetic"``.
    Raises UnknownFormat when ``fmt`` is ``"auto"`` and no format fits (or when
    ``fmt`` names no known format); any other input, however broken, gives a
    ParsedLog. A run is "ok" exactly when its result line (``total images/sec``
    / ``Total img/sec``) was printed, whatever warnings or errors surround it.
    """
    text = _as_text(text)
    if fmt == "auto":
        detected = detect_format(text)
        if detected is None:
            raise UnknownFormat("no known benchmark log format")
        fmt = detected
    module = _FORMAT_MODULES.get(fmt) if isinstance(fmt, str) else None
    if module is None:
        raise UnknownFormat(f"unknown format {fmt!r}; expected auto, {FORMAT_TF_CNN} or {FORMAT_HOROVOD}")

    lines = split_lines(text)
    parsed, header_index = module.parse(lines, primary_rank(lines))
    _decide_status(parsed, lines, header_index, module.RESULT_LINE)
    return parsed


def _decide_status(parsed: ParsedLog, lines: list[LogLine], header_index: int | None, result_line: str) -> None:
    if parsed.total_images_per_sec is not None:
        parsed.status, parsed.failure_class, parsed.failure_detail = STATUS_OK, None, None
        return
    parsed.status = STATUS_FAILED
    failure_class, detail = classify_failure(lines, header_index)
    if failure_class is None:
        failure_class = FAILURE_NO_RESULT
        detail = f"no '{result_line}' line in log ({parsed.step_count} step lines parsed)"
    parsed.failure_class, parsed.failure_detail = failure_class, detail


def _as_text(text: object) -> str:
    """Accept bytes (decoded as UTF-8 with replacement) so callers cannot trip parse_log."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    return str(text)
