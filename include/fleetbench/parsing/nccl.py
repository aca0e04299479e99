"""nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, ...).

Reads the results table by its header, so both layouts parse: today's (`root` column, `#wrong` counts)
and the older one (no `root`, a float `error` column). Lines may carry an MPI launcher's rank prefix
(`[1,0]<stdout>:`). What the log shows about correctness and errors:

- `# Out of bounds values : N FAILED`, or a non-zero `#wrong` cell: wrong results;
- `Test CUDA failure` / `NCCL WARN Cuda failure` / `CUDA error` / a `Test NCCL failure` of an
  `unhandled cuda error` (what the same fault prints without NCCL_DEBUG): a CUDA error;
- `Test NCCL failure`, a `Test failure`, `NCCL WARN` or an abort without the closing summary: an NCCL error.

`NCCL WARN` lines in a run that completed, validated and printed its summary (e.g. a topology search's
"falling back to simple order") are counted, not failures. A `#` line that the end of the log cut short
(see ``source``) is not read: its number may be cut too (`# Avg bus bandwidth : 1.1` of `1.15327`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_PREFIX = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+)")
# Bounded repeats only: a 64 KiB line of word characters must not make the search quadratic.
_BINARY = re.compile(r"(?:Collective test starting:\s{0,16}|/|^Running:.{0,512}?)(\w{1,64})_perf\b")
_NGPUS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_CUDA = re.compile(r"Test CUDA failure|NCCL WARN Cuda failure|CUDA error|cudaError", re.IGNORECASE)
_TEST_FAILURE = re.compile(r"Test (?:NCCL )?failure|Test CUDA failure")
_UNHANDLED_CUDA = "unhandled cuda error"
"""ncclUnhandledCudaError as nccl-tests prints it (`Test NCCL failure common.cu:392 'unhandled cuda error ...'`):
without NCCL_DEBUG, the only sign of the CUDA failure that NCCL_DEBUG=INFO shows as `NCCL WARN Cuda failure`."""
# NCCL WARN lines of a topology search that goes on (harmless, printed before a run that works): not a failure's cause
_BENIGN_WARN = re.compile(r"Could not find a path for pattern \d+, falling back to simple order")
_ABORT = re.compile(r"\bAbort(?:ed|ing)?\b|\babort\(\)|Segmentation fault")


@dataclass
class NcclRow:
    size: int
    count: int
    oop: dict[str, float | None]  # time, algbw, busbw, wrong
    ip: dict[str, float | None]


@dataclass
class NcclLog:
    collective: str | None = None
    n_gpus: int | None = None
    # Only the count of table rows and the largest size's row are kept: a run cycled with -N repeats its
    # table until its timeout, and a log of hundreds of MB must not become millions of objects.
    row_count: int = 0
    largest: NcclRow | None = None
    avg_busbw: float | None = None
    out_of_bounds: int | None = None
    oob_failed: bool = False
    wrong_cells: int = 0  # summed #wrong counts
    warnings: int = 0
    cuda_error: str | None = None
    nccl_error: str | None = None
    test_failure: str | None = None
    aborted: str | None = None
    layout: str | None = None  # "wrong" (root, #wrong) or "error" (older)
    cut_summary: str | None = None  # an `Avg bus bandwidth` line the end of the log cut short (no result)

    def failure(self) -> tuple[str | None, str | None]:
        """(row failure class, detail) of what the log shows, or (None, None); (None, detail) for a log that
        shows no failure but whose summary the end of the log cut short."""
        if self.oob_failed or self.wrong_cells:
            what = (f"Out of bounds values : {self.out_of_bounds} FAILED" if self.oob_failed
                    else f"{self.wrong_cells} wrong value(s) in the #wrong columns")
            return "wrong_results", what
        complete = self.avg_busbw is not None and not self.test_failure
        if complete:
            return None, None
        if self.cuda_error:
            return cuda_failure_class(self.cuda_error), self.cuda_error
        reason = self.nccl_error or self.test_failure or self.aborted
        if reason:
            return "nccl", reason
        if self.cut_summary and self.avg_busbw is None:  # no failure of its own: why there is no result
            return None, f"'Avg bus bandwidth' line cut off, the log ends mid-line: {self.cut_summary!r}"
        return None, None


_CUDA_OOM = re.compile(r"'out of memory'|\bout of memory\b", re.IGNORECASE)
_CUDA_DRIVER = re.compile(
    r"driver version is insufficient|no CUDA-capable device|system not yet initialized|initialization error"
    r"|forward compatibility was attempted|CUDA driver is a stub library", re.IGNORECASE)


def cuda_failure_class(line: str) -> str:
    """The class of the CUDA failure an nccl-tests line quotes: its buffers not fitting (`'out of memory'`, a
    `size_ranges` too large for the GPU or memory another process holds) is `gpu_oom`; CUDA that could not start
    (the driver older than the image's CUDA runtime, no device visible) `cuda_driver`; anything else, a GPU fault,
    `cuda_error`."""
    if _CUDA_OOM.search(line):
        return "gpu_oom"
    if _CUDA_DRIVER.search(line):
        return "cuda_driver"
    return "cuda_error"


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None  # N/A (an in-place column some collectives do not have)
    return value


def parse_nccl(lines: Iterable[tuple[str, bool]]) -> NcclLog:
    log = NcclLog()
    header: list[str] | None = None
    for raw, complete in lines:
        line = _PREFIX.sub("", raw, count=1).strip()
        if not line:
            continue
        if line.startswith("#"):
            if complete:
                _header_line(log, line)
            elif _AVG.match(line):
                log.cut_summary = line[:300]
            cols = line.lstrip("#").split()
            if "size" in cols and "busbw" in cols:
                header = cols
                log.layout = "wrong" if "#wrong" in cols else "error"
            continue
        if "NCCL WARN" in line:
            log.warnings += 1
            if _CUDA.search(line) and log.cuda_error is None:
                log.cuda_error = line[:300]
            elif log.nccl_error is None and not _BENIGN_WARN.search(line):
                log.nccl_error = line[:300]
            continue
        if _TEST_FAILURE.search(line):
            log.test_failure = log.test_failure or line[:300]
            if ("CUDA" in line or _UNHANDLED_CUDA in line.lower()) and log.cuda_error is None:
                log.cuda_error = line[:300]
            continue
        if _ABORT.search(line) and log.aborted is None:
            log.aborted = line[:300]
            continue
        if log.collective is None and "_perf" in line:
            found = _BINARY.search(line)
            if found:
                log.collective = found.group(1)
        if header is not None and complete and line[:1].isdigit():
            row = _row(header, line.split())
            if row is not None:
                log.row_count += 1
                if log.largest is None or row.size > log.largest.size:
                    log.largest = row
                log.wrong_cells += int((row.oop.get("wrong") or 0) + (row.ip.get("wrong") or 0))
    return log


def is_marker(raw: str) -> bool:
    """Whether a line is one that only nccl-tests prints: its `# nThread N nGpus M ...` line or its table header
    (also in a run that failed before its first row)."""
    line = _PREFIX.sub("", raw, count=1).strip()
    if not line.startswith("#"):
        return False
    return _NGPUS.match(line) is not None or {"size", "busbw"} <= set(line.lstrip("#").split())


def _header_line(log: NcclLog, line: str) -> None:
    if (found := _OOB.match(line)):
        log.out_of_bounds, log.oob_failed = int(found.group(1)), found.group(2) == "FAILED"
    elif (found := _AVG.match(line)):
        log.avg_busbw = _number(found.group(1))
    elif (found := _NGPUS.match(line)):
        log.n_gpus = int(found.group(2))
    elif log.collective is None and "Collective test starting" in line:
        found = _BINARY.search(line)
        log.collective = found.group(1) if found else None


def _row(header: list[str], cells: list[str]) -> NcclRow | None:
    """A table row read by the header's columns: the first time/algbw/busbw/check set is out-of-place,
    the second in-place."""
    if len(cells) != len(header):
        return None
    try:
        size, count = int(cells[0]), int(cells[1])
    except ValueError:
        return None
    halves: list[dict[str, float | None]] = [{}, {}]
    half = 0
    for name, cell in zip(header, cells):
        key = {"time": "time", "algbw": "algbw", "busbw": "busbw", "#wrong": "wrong", "error": "error"}.get(name)
        if key is None:
            continue
        if key in halves[half]:
            half = 1
        if key == "wrong":
            halves[half][key] = _number(cell) if cell != "N/A" else None
        else:
            halves[half][key] = _number(cell)
    return NcclRow(size, count, halves[0], halves[1])
