"""Format detection, line normalisation, failure classification and ``parse_log``.

Pipeline: split the text into logical lines (dropping launcher prefixes and
splitting on MPI rank prefixes), pick the primary rank, let the format module
read its fields, then decide ``status`` / ``failure_class`` / ``failure_detail``.

Lines are streamed (see ``source``), never held all at once: a first pass
over whole blocks finds the format and the primary rank, a second one reads
the fields line by line, and only a log without a result gets a third, for
its failure evidence. Every pattern here is bounded, and lines are cut at
``source.MAX_LINE_CHARS``, so the time taken grows with the log's size only.
"""

from __future__ import annotations

import io
import os
import re
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator

from . import horovod, tf_cnn
from .model import (
    FAILURE_CUDA_DRIVER,
    FAILURE_CUDA_ERROR,
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
from .source import file_blocks, open_regular, text_blocks
from .source import lines as physical_lines

_FORMAT_MODULES = {FORMAT_TF_CNN: tf_cnn, FORMAT_HOROVOD: horovod}

# --- line normalisation -----------------------------------------------------

_LAUNCHER_PREFIX_RE = re.compile(
    r"^(?:"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\|[^|]{0,120}\|(?:[^|\t]{0,120}\|){0,4}"
    r"|\[\d{4}-\d\d-\d\d[^\]]{0,40}\]\s{1,16}\{[^}]{0,200}\}\s{1,16}[A-Z]{1,16}\s{1,16}-\s"
    r")"
)
"""Prefixes a launcher puts before the benchmark's own text:
``INFO|2020-01-01 00:00:00|host|stdout|`` (level|time|fields...|) and
Airflow task logs ``[2024-05-01T12:00:00.123+0000] {subprocess.py:93} INFO - ``."""

_RANK_PREFIX_RE = re.compile(r"\[(\d{1,9})(?:,(\d{1,9}))?\]<(?:stdout|stderr)>:")
"""``mpirun --tag-output`` prefix ``[jobid,rank]<stdout>:`` or horovodrun's
``[rank]<stderr>:``. Searched anywhere in a line: output of two ranks can be
glued onto one physical line (``...7.912[1,1]<stdout>:1\\timages/sec...``)."""

# A log larger than twice this has its failure evidence looked for in its first and last this-many bytes: a
# run that died says why at its start (imports, drivers) or at its end, and a 200 MB log parses in seconds.
FAILURE_WINDOW = 16 * 1024 * 1024
TAIL_INDEX = 10**12  # the tail's lines count as after the header (when there is one), wherever it was

_LAUNCHER_FIRST_CHARS = frozenset("DIWEC[")
"""First characters of a launcher prefix: lines starting otherwise skip the pattern."""


def split_lines(text: str) -> list[LogLine]:
    """Turn raw log text into logical lines, one per record of one rank."""
    return list(logical_lines(physical_lines(text_blocks(text))))


def logical_lines(physical: Iterable[tuple[str, bool]]) -> Iterator[LogLine]:
    """Logical lines of ``(line, complete)`` physical lines (see ``source.lines``)."""
    for raw, complete in physical:
        if raw[:1] in _LAUNCHER_FIRST_CHARS:
            raw = _LAUNCHER_PREFIX_RE.sub("", raw, count=1)
        if "]<std" in raw:
            yield from _ranked_records(raw, complete)
        else:
            yield LogLine(None, raw.strip(), complete)


def _ranked_records(raw: str, complete: bool) -> list[LogLine]:
    """The records of a line with rank prefixes; of an incomplete line only the last
    record is incomplete, as the records before it were followed by more text."""
    records = _split_ranks(raw)
    if not complete:
        tail = records[-1]
        records[-1] = LogLine(tail.rank, tail.text, False)
    return records


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
    scan = _Scan(want_format=True)
    scan.feed(text_blocks(_as_text(text)))
    return scan.format()


class _Scan:
    """First pass over a log, a block at a time: which format markers occur, and which ranks print.

    Markers match within a line, so a block boundary (always at a line break)
    never splits one. Only blocks that hold a rank prefix are split into lines.
    """

    def __init__(self, want_format: bool) -> None:
        markers = [(name, marker) for name, module in _FORMAT_MODULES.items() for marker in module.MARKERS]
        self.pending = markers if want_format else []
        self.scores = dict.fromkeys(_FORMAT_MODULES, 0)
        self.lowest_rank: int | None = None

    def feed(self, blocks: Iterable[str]) -> None:
        for block in blocks:
            if self.pending:
                self._markers(block)
            if "]<std" in block:
                self._ranks(block)

    def _markers(self, block: str) -> None:
        """Look only for markers not seen yet: once all are found, this costs nothing."""
        found = [entry for entry in self.pending if entry[1].search(block)]
        for entry in found:
            self.scores[entry[0]] += 1
            self.pending.remove(entry)

    def _ranks(self, block: str) -> None:
        ranked = ((raw, complete) for raw, complete in physical_lines((block,)) if "]<std" in raw)
        for line in logical_lines(ranked):
            if line.rank is not None and (self.lowest_rank is None or line.rank < self.lowest_rank):
                self.lowest_rank = line.rank

    def format(self) -> str | None:
        best = max(self.scores.values())
        if best == 0:
            return None
        return FORMAT_TF_CNN if self.scores[FORMAT_TF_CNN] == best else FORMAT_HOROVOD


# --- failure classification -------------------------------------------------

_CUDA_DRIVER_RE = re.compile(
    r"CUDA driver version is insufficient|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
    r"|driver version is insufficient for CUDA runtime version"
    r"|NVIDIA driver on your system is too old"
)
"""Driver older than the CUDA runtime: TF's ``cudaGetDevice() failed. Status: CUDA
driver version is insufficient for CUDA runtime version``, cuInit's driver
mismatch, PyTorch's ``The NVIDIA driver on your system is too old``."""

_CUDA_INIT_RE = re.compile(
    r"CUDA_ERROR_(?:NO_DEVICE|SYSTEM_NOT_READY|COMPAT_NOT_SUPPORTED_ON_DEVICE|NOT_INITIALIZED)"
    r"|no CUDA-capable device is detected|system not yet initialized"
    r"|forward compatibility was attempted on non supported HW|Found no NVIDIA driver|No CUDA GPUs are available"
)
"""CUDA could not initialise (no device visible, Fabric Manager not running on an NVSwitch host, cuda-compat on a
GPU that does not take it): TF's ``failed call to cuInit: CUDA_ERROR_NO_DEVICE`` (logged; then the op placed on
``/device:GPU:0`` fails), PyTorch's raised ``Found no NVIDIA driver on your system``, ``No CUDA GPUs are available``,
``CUDA error: system not yet initialized``. TF logs the same cuInit line on every CPU-only run, so a logged one is the
cause only when the error that ended the run names a GPU; a raised one always is."""

_OOM_RE = re.compile(
    r"OOM when allocating tensor|Out of memory while trying to allocate"
    r"|ResourceExhaustedError|CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
)
"""Fatal GPU out-of-memory: TF's ``Resource exhausted: OOM when allocating tensor``,
XLA's ``Out of memory while trying to allocate``, PyTorch's ``CUDA out of memory`` (its caching
allocator) and ``CUDA error: out of memory`` / ``CUBLAS_STATUS_ALLOC_FAILED`` (a context, cuBLAS or
cuDNN allocation outside it); TF's ``Could not create cudnn handle: CUDNN_STATUS_ALLOC_FAILED`` (logged at E, then
raised as ``UnknownError: Failed to get convolution algorithm``: cuDNN's workspace found the GPU's memory full).
TF's recoverable ``Allocator (GPU_0_bfc) ran out of memory trying to allocate ...
The caller indicates that this is not a failure`` does not match."""

_OOM_DRIVER_RE = re.compile(r"CUDA_ERROR_OUT_OF_MEMORY")
"""cuMemAlloc failing. TF logs it at INFO while it retries smaller chunks, so it is
only OOM evidence when no other line explains the end (unless an exception or failed
op reports it: TF 2's ``failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY``)."""

_NCCL_RE = re.compile(
    r"NCCL (?:error|Error|ERROR|failure)"
    r"|nccl(?:InternalError|SystemError|UnhandledCudaError|InvalidUsage|InvalidArgument|RemoteError)"
    r"|unhandled (?:cuda|system) error|[Nn]ccl\w{0,64} failed|OP_REQUIRES failed at nccl_ops"
    r"|Watchdog caught collective operation timeout"
)
"""NCCL failures. TF 1.15 only says ``OP_REQUIRES failed at nccl_ops.cc:104 :
Internal: unhandled system error`` (NCCL's text for ncclSystemError);
Horovod/PyTorch say ``NCCL error ...`` / ``ncclCommInitRank failed: ...``; PyTorch's NCCL watchdog, on a
collective that hung, ``[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..., ...)``."""

_CUDA_ERROR_RE = re.compile(
    r"CUDA_ERROR_(?:ILLEGAL_ADDRESS|LAUNCH_FAILED|ECC_UNCORRECTABLE|ILLEGAL_INSTRUCTION|MISALIGNED_ADDRESS"
    r"|HARDWARE_STACK_ERROR|LAUNCH_TIMEOUT)"
    r"|an illegal memory access was encountered|unspecified launch failure|uncorrectable ECC error encountered"
    r"|an illegal instruction was encountered|misaligned address"
)
"""A GPU fault under the framework, the device's or the kernel's rather than the benchmark's settings: TF's
``CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered`` (then a glog FATAL and an abort),
PyTorch's ``CUDA error: unspecified launch failure`` / ``uncorrectable ECC error encountered`` (the runtime's texts
of the same driver errors; an Xid or a dying board). ``CUDA_ERROR_OUT_OF_MEMORY`` is an OOM, ``CUDA_ERROR_NO_DEVICE``
and a too-old driver are cuda_driver."""

_EXCEPTION_RE = re.compile(
    r"^(?:[A-Za-z_]\w{0,100}\.){0,20}([A-Z]\w{0,100}(?:Error|Exception|Exit|Interrupt))(?::|$)"
)
"""Last line of a Python traceback: ``[package.module.]SomeError: message``."""

_IMPORT_EXCEPTIONS = frozenset({"ImportError", "ModuleNotFoundError"})

_SHARED_OBJECT_RE = re.compile(r"cannot open shared object file")
"""An exception before the header that failed to load a shared library (real log:
``NotFoundError: libforestprotos.so: cannot open shared object file``, raised while
importing tensorflow.contrib) is an import failure too."""

_TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\):")

_FATAL_START_RE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9}: F |F\d{4} \d\d:\d\d|Aborted\b|Killed\b")
"""Lines that start a non-Python death: glog FATAL (``... F tensorflow/...``,
``F0702 11:56:09``) and the shell's ``Aborted`` / ``Killed`` (e.g. the kernel OOM killer)."""

_FATAL_START_FIRST_CHARS = frozenset("FAK")
"""How those lines start, but for the glog time stamp: that one holds ``: F `` instead."""

_FATAL_TEXT_RE = re.compile(
    r"Check failed:|Segmentation fault|core dumped|exited on signal \d+"
    r"|terminate called after|Fatal Python error"
)
"""Non-Python deaths reported inside a line: CHECK failures, signals seen by mpirun."""

_REPORTING_RE = re.compile(r"OP_REQUIRES failed|^\(\d{1,9}\) \w")
"""Lines where TF reports the failure itself (failed op, ``(0) Resource exhausted: ...``
root error); preferred as failure_detail over earlier informational mentions such
as XLA's autotuner running out of memory."""

# Lowercase words that each failure pattern's every alternative contains: a pattern
# is only tried on a line that mentions one of them, which most lines do not.
_CUDA_DRIVER_HINTS = ("driver",)
_CUDA_INIT_HINTS = ("cuda_error_", "cuda-capable", "not yet initialized", "forward compatibility", "nvidia driver",
                    "cuda gpus")
_OOM_HINTS = ("oom", "memory", "exhausted", "alloc_failed")
_OOM_DRIVER_HINTS = ("out_of_memory",)
_NCCL_HINTS = ("nccl", "unhandled")
_CUDA_ERROR_HINTS = ("cuda_error_", "illegal", "launch", "ecc error", "misaligned")


def _may_name_a_failure(lowered: str) -> bool:
    """Whether a lowercased line holds any hint above (a chain of ``in``: the cheapest test per line)."""
    return ("driver" in lowered or "memory" in lowered or "oom" in lowered or "exhausted" in lowered
            or "nccl" in lowered or "unhandled" in lowered or "alloc_failed" in lowered or "cuda_error_" in lowered
            or "illegal" in lowered or "launch" in lowered or "ecc error" in lowered or "misaligned" in lowered
            or "cuda-capable" in lowered or "not yet initialized" in lowered or "forward compatibility" in lowered
            or "cuda gpus" in lowered)


def _may_name_a_death(lowered: str) -> bool:
    """Whether a lowercased line holds a word that every alternative of ``_FATAL_TEXT_RE`` contains."""
    return ("check failed" in lowered or "segmentation" in lowered or "core dumped" in lowered
            or "exited on signal" in lowered or "terminate called" in lowered or "fatal python" in lowered)


def classify_failure(lines: Iterable[LogLine], header_index: int | None) -> tuple[str | None, str | None]:
    """Return ``(failure_class, failure_detail)`` for a run without a result.

    Classes by priority: cuda_driver, import_error (only before the header),
    oom, cuda_error, nccl, other_error, then oom of a bare ``CUDA_ERROR_OUT_OF_MEMORY`` line
    (see ``oom_is_fatal``); ``(None, None)`` when no error text is found.
    Lines of every rank count: one rank's error kills the job.
    """
    evidence = _Evidence(header_index)
    for index, line in enumerate(lines):
        evidence.feed(index, line.text)
    return evidence.verdict()


def failure_scanner(header_index: int | None = None) -> "_Evidence":
    """``classify_failure`` one line at a time: ``.feed(index, text)`` each line, then ``.verdict()``."""
    return _Evidence(header_index)


def _classify_stream(parts: Iterable[tuple[int, Iterable[tuple[str, bool]]]],
                     header_index: int | None) -> tuple[str | None, str | None]:
    """``classify_failure`` over parts of a log, each ``(index of its first line, physical lines)``, numbered as
    ``logical_lines`` numbers them: a plain line (no launcher or rank prefix, the most common kind) goes straight
    to the evidence, without a LogLine."""
    evidence = _Evidence(header_index)
    for start, physical in parts:
        _feed_evidence(evidence, physical, start)
    return evidence.verdict()


def _feed_evidence(evidence: "_Evidence", physical: Iterable[tuple[str, bool]], index: int) -> None:
    for raw, complete in physical:
        if raw[:1] in _LAUNCHER_FIRST_CHARS or "]<std" in raw:
            for line in logical_lines(((raw, complete),)):
                evidence.feed(index, line.text)
                index += 1
        else:
            evidence.feed(index, raw.strip())
            index += 1


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
        self.cuda_error = _FirstLine()
        self.cuda_init = _FirstLine()
        self.cuda_init_raised: str | None = None
        self.import_error: str | None = None
        self.last_exception: str | None = None
        self.fatal: str | None = None
        self.traceback: str | None = None
        self.kinds = (
            (_CUDA_DRIVER_RE, _CUDA_DRIVER_HINTS, self.cuda_driver),
            (_OOM_RE, _OOM_HINTS, self.oom),
            (_OOM_DRIVER_RE, _OOM_DRIVER_HINTS, self.oom_driver),
            (_NCCL_RE, _NCCL_HINTS, self.nccl),
            (_CUDA_ERROR_RE, _CUDA_ERROR_HINTS, self.cuda_error),
            (_CUDA_INIT_RE, _CUDA_INIT_HINTS, self.cuda_init),
        )

    def feed(self, index: int, text: str) -> None:
        exception = _EXCEPTION_RE.match(text)
        lowered = text.lower()
        if _may_name_a_failure(lowered):
            self._kinds(text, lowered, exception is not None)
        if self.fatal is None and self._fatal(text, lowered):
            self.fatal = text
        if self.traceback is None and _TRACEBACK_RE.match(text):
            self.traceback = text
        if exception is not None:
            self.last_exception = text
            if self.cuda_init_raised is None and self.cuda_init.line == text:
                self.cuda_init_raised = text
            if self.import_error is None and self._before_header(index) and self._is_import_failure(exception, text):
                self.import_error = text

    def _kinds(self, text: str, lowered: str, is_exception: bool) -> None:
        reporting = None  # computed on first need
        for pattern, hints, first in self.kinds:
            if first.reporting or not _mentions(lowered, hints) or pattern.search(text) is None:
                continue
            if reporting is None:
                reporting = is_exception or _REPORTING_RE.search(text) is not None
            first.offer(text, reporting)

    def _before_header(self, index: int) -> bool:
        return self.header_index is None or index < self.header_index

    @staticmethod
    def _fatal(text: str, lowered: str) -> bool:
        if (text[:1] in _FATAL_START_FIRST_CHARS or ": F " in text) and _FATAL_START_RE.match(text):
            return True
        return _may_name_a_death(lowered) and _FATAL_TEXT_RE.search(text) is not None

    @staticmethod
    def _is_import_failure(match: re.Match[str], text: str) -> bool:
        return match.group(1) in _IMPORT_EXCEPTIONS or _SHARED_OBJECT_RE.search(text) is not None

    def verdict(self) -> tuple[str | None, str | None]:
        ranked = (
            (FAILURE_CUDA_DRIVER, self.cuda_driver.line),
            (FAILURE_IMPORT, self.import_error),
            (FAILURE_CUDA_DRIVER, self._cuda_init()),
            (FAILURE_OOM, self.oom.line),
            (FAILURE_OOM, self.oom_driver.line if self.oom_driver.reporting else None),  # raised, not logged
            # cuMemAlloc's line, which TF logs while it retries smaller chunks, is the evidence only when nothing
            # else explains the end: a CUDA fault, an NCCL error, another exception or a fatal line (a crash)
            # outranks it. A CUDA fault outranks NCCL's error about it (its `unhandled cuda error`), as in nccl-tests.
            (FAILURE_CUDA_ERROR, self.cuda_error.line),
            (FAILURE_NCCL, self.nccl.line),
            (FAILURE_OTHER, self.last_exception or self.fatal or self.traceback),
            (FAILURE_OOM, self.oom_driver.line),
        )
        for failure_class, line in ranked:
            if line is not None:
                return failure_class, _detail(line)
        return None, None


    def _cuda_init(self) -> str | None:
        """CUDA's failed start as the run's end: raised, or logged (TF's cuInit line) and followed by an error that
        names a GPU (the op TF could not place on one)."""
        if self.cuda_init_raised is not None:
            return self.cuda_init_raised
        if self.cuda_init.line is not None and self.last_exception is not None and "GPU" in self.last_exception:
            return self.cuda_init.line
        return None


def oom_is_fatal(detail: str | None) -> bool:
    """Whether the detail of an ``oom`` verdict shows a fatal OOM: a line of ``_OOM_RE``, or one that reports
    the failure (an exception, a failed op). False for a bare ``CUDA_ERROR_OUT_OF_MEMORY`` line, which TF logs
    while it retries smaller chunks and survives: it names the failure only when nothing else does, and how the
    process ended (a crash, a SIGKILL) outranks it."""
    if not detail or _OOM_RE.search(detail) or not _OOM_DRIVER_RE.search(detail):
        return True
    return _EXCEPTION_RE.match(detail) is not None or _REPORTING_RE.search(detail) is not None


def _mentions(lowered: str, hints: tuple[str, ...]) -> bool:
    """Whether a lowercased line holds one of ``hints``."""
    return any(map(lowered.__contains__, hints))


def _detail(line: str) -> str:
    return line.strip()[:MAX_DETAIL_CHARS]


# --- entry point ------------------------------------------------------------


def parse_log(text: str, fmt: str = "auto") -> ParsedLog:
    """Parse one benchmark log.

    ``fmt`` is ``"auto"``, ``"tf_cnn_benchmarks"`` or ``"horovod_synthetic"``.
    Raises UnknownFormat when ``fmt`` is ``"auto"`` and no format fits (or when
    ``fmt`` names no known format); any other input, however broken, gives a
    ParsedLog. A run is "ok" exactly when its result line (``total images/sec``
    / ``Total img/sec``) was printed in full with a positive number, whatever
    warnings or errors surround it.
    """
    text = _as_text(text)
    return _parse(lambda: text_blocks(text), fmt)


def parse_log_file(path: str | os.PathLike, fmt: str = "auto") -> ParsedLog:
    """``parse_log`` of a file, read as a stream: a log of any size takes memory for one line.

    Raises OSError when the file cannot be read; ``source.NotRegularFile`` (an
    OSError whose message names the path) for a FIFO, a device or a folder.
    """
    with open_regular(path) as handle:

        def blocks() -> Iterator[str]:
            handle.seek(0)
            return file_blocks(handle)

        def evidence_parts() -> Iterator[tuple[int, Iterable[tuple[str, bool]]]]:
            """A huge log's failure evidence is looked for in its first and last FAILURE_WINDOW bytes only."""
            size = os.fstat(handle.fileno()).st_size
            if size <= 2 * FAILURE_WINDOW:
                yield 0, physical_lines(blocks())
                return
            handle.seek(0)
            yield 0, physical_lines(file_blocks(io.BytesIO(handle.read(FAILURE_WINDOW))))
            handle.seek(size - FAILURE_WINDOW)
            tail = handle.read()
            tail = tail[tail.find(b"\n") + 1:]  # from the first whole line on
            yield TAIL_INDEX, physical_lines(file_blocks(io.BytesIO(tail)))

        return _parse(blocks, fmt, evidence_parts)


def _parse(blocks: Callable[[], Iterable[str]], fmt: str,
           evidence_parts: Callable[[], Iterable[tuple[int, Iterable[tuple[str, bool]]]]] | None = None) -> ParsedLog:
    """Passes over ``blocks()``: format and primary rank, the fields, and failure evidence when needed (over
    ``evidence_parts()`` when given: a huge file's head and tail)."""
    module = None if fmt == "auto" else _module(fmt)
    scan = _Scan(want_format=module is None)
    scan.feed(blocks())
    if module is None:
        detected = scan.format()
        if detected is None:
            raise UnknownFormat("no known benchmark log format")
        module = _FORMAT_MODULES[detected]
    reader, cut_result = _read(physical_lines(blocks()), module, scan.lowest_rank)
    parsed = reader.result()
    if parsed.total_images_per_sec is not None:
        parsed.status, parsed.failure_class, parsed.failure_detail = STATUS_OK, None, None
        return parsed
    parsed.status = STATUS_FAILED
    parts = evidence_parts() if evidence_parts else [(0, physical_lines(blocks()))]
    failure_class, detail = _classify_stream(parts, reader.header_index)
    if failure_class is None:
        failure_class = FAILURE_NO_RESULT
        detail = _no_result_detail(module.RESULT_LINE, parsed.step_count, reader.rejected_total, cut_result)
    parsed.failure_class, parsed.failure_detail = failure_class, detail
    return parsed


def _module(fmt: object) -> ModuleType:
    module = _FORMAT_MODULES.get(fmt) if isinstance(fmt, str) else None
    if module is None:
        raise UnknownFormat(f"unknown format {fmt!r}; expected auto, {FORMAT_TF_CNN} or {FORMAT_HOROVOD}")
    return module


def _read(physical: Iterable[tuple[str, bool]], module: ModuleType, primary: int | None) -> tuple[Any, str | None]:
    """The format's reader fed with every complete line, and the last cut-off line that held the result line.

    A line cut short (see ``source``) may end mid-number, so no field is read from it.
    """
    reader = module.Reader(primary)
    cut_result: str | None = None
    index = 0
    for raw, complete in physical:
        if raw[:1] in _LAUNCHER_FIRST_CHARS or "]<std" in raw:
            records = logical_lines(((raw, complete),))
        else:  # a plain line (most of them): one record, built here rather than through the generator
            records = (LogLine(None, raw.strip(), complete),)
        for line in records:
            if line.complete:
                reader.feed(index, line)
            elif module.RESULT_LINE in line.text:
                cut_result = line.text
            index += 1
    return reader, cut_result


def _no_result_detail(result_line: str, step_count: int, rejected: str | None, cut: str | None) -> str:
    """Why a log without a failure message has no result: none printed, a value that is no
    measurement, or a result line cut off by the end of the log."""
    steps = f"({step_count} step lines parsed)"
    if rejected is not None:
        detail = f"'{result_line}' value {rejected!r} is not a positive number {steps}"
    elif cut is not None:
        detail = f"'{result_line}' line cut off, the log ends mid-line: {cut!r} {steps}"
    else:
        detail = f"no '{result_line}' line in log {steps}"
    return detail[:MAX_DETAIL_CHARS]


def _as_text(text: object) -> str:
    """Accept bytes (decoded as UTF-8 with replacement) so callers cannot trip parse_log."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    return str(text)
