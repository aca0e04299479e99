"""``fleetbench parse``: benchmark logs in, one JSON object per line out, with the harness's metric samples."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Callable, Iterable, Iterator, TextIO

from fleetbench.failures import row_class

from .detect import parse_log_file
from .model import FORMATS, UnknownFormat
from .source import NotRegularFile

#: Harnesses whose logs are read by their own harness module (fleetbench.harnesses), not by ``parse_log``.
HARNESS_FORMATS = ("torch_synthetic", "nccl_tests", "command")
#: Accepted values of ``fmt``.
FORMAT_CHOICES = ("auto", *FORMATS, *HARNESS_FORMATS)

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def cli_parse(files: list[str], fmt: str, out: TextIO) -> int:
    """Write one JSON Lines record per readable, recognised file to ``out``.

    Each record is ``{"file": <path as given>, **ParsedLog.to_dict()}`` for tf_cnn_benchmarks and Horovod
    logs, ``{"file", "format", "status", "failure_class", "failure_detail"}`` for the other harnesses
    (torch_synthetic, nccl_tests; command: JSON metric lines), and always ``primary`` (the primary metric's name) and
    ``metrics`` (the metric samples: metric, value, unit, better, labels). ``failure_class`` is named as the
    warehouse names it (``gpu_oom`` where the parser says ``oom``). ``auto`` tries tf_cnn_benchmarks and
    Horovod, then nccl-tests, torch_synthetic, then JSON metric lines.
    Returns 0 when every file was read and parsed, whatever each run's status;
    2 when the format name is unknown, a file cannot be read, or (with
    ``fmt="auto"``) no format fits a file. Problems go to stderr as
    ``fleetbench parse: ...`` and the remaining files are still processed.
    """
    if fmt not in FORMAT_CHOICES:
        _error(f"unknown format {fmt!r} (choose from {', '.join(FORMAT_CHOICES)})")
        return EXIT_BAD_INPUT
    exit_code = EXIT_OK
    for path in files:
        record = _parse_file(path, fmt)
        if record is None:
            exit_code = EXIT_BAD_INPUT
            continue
        out.write(json.dumps(record, allow_nan=False) + "\n")
    return exit_code


def _parse_file(path: str, fmt: str) -> dict[str, Any] | None:
    try:
        if fmt in HARNESS_FORMATS:
            return _harness_record(path, fmt)
        try:
            parsed = parse_log_file(path, fmt)
        except UnknownFormat:
            if fmt != "auto":
                raise
            return _harness_record(path, "auto")
    except NotRegularFile as exc:
        _error(f"cannot read {path}: {exc.reason}")
        return None
    except OSError as exc:
        _error(f"cannot read {path}: {exc.strerror or exc}")
        return None
    except UnknownFormat:
        _error(f"{path}: no known benchmark log format")
        return None
    from fleetbench.harnesses.tf_cnn import from_parsed

    record = {"file": path, **parsed.to_dict()}
    record["failure_class"] = row_class(parsed.failure_class)  # the warehouse's name for it (fleetbench.failures)
    measured = from_parsed(parsed)
    record["primary"] = measured.primary
    record["metrics"] = [s.to_dict() for s in measured.samples]
    return record


_TORCH_BANNER = re.compile(r"^(?:torch \S{1,100} torchvision \S{1,100} device |joined process group: rank 0 of )")
"""The first lines of torch_synthetic (include/images/torch-cpu/torch_synthetic.py), printed before its first
step: its versions and case, and under torchrun rank 0's joining the process group."""


class _Seen:
    """Passes ``(line, complete)`` lines through, noting whether one of them is a harness's own marker line."""

    def __init__(self, marker: Callable[[str], bool]) -> None:
        self.marker = marker
        self.seen = False

    def tap(self, lines: Iterable[tuple[str, bool]]) -> Iterator[tuple[str, bool]]:
        for line, complete in lines:
            if not self.seen and complete and self.marker(line):
                self.seen = True
            yield line, complete


def _harness_record(path: str, fmt: str) -> dict[str, Any]:
    """A log of a harness that `parse_log` does not read; with ``auto``: nccl-tests when its `# nThread` line,
    table header, table or summary is there, else torch_synthetic when its banner or step lines are, else JSON
    metric lines when there are any, else UnknownFormat. A failed run is known by its harness's own lines."""
    from fleetbench.harnesses import command, nccl_tests, torch_synthetic

    from .nccl import is_marker as nccl_marker
    from .source import file_lines, open_regular

    with open_regular(path) as handle:
        measured, found = None, None
        if fmt in ("auto", "nccl_tests"):
            seen = _Seen(nccl_marker)
            measured = nccl_tests.measure_lines(seen.tap(file_lines(handle)))
            if fmt == "nccl_tests" or seen.seen or measured.step_count or measured.primary_sample():
                found = "nccl_tests"
        if found is None and fmt in ("auto", "torch_synthetic"):
            handle.seek(0)
            seen = _Seen(lambda line: _TORCH_BANNER.match(line) is not None)
            measured = torch_synthetic.measure_lines(seen.tap(file_lines(handle)))
            found = "torch_synthetic" if fmt == "torch_synthetic" or seen.seen or measured.step_count else None
        if found is None and fmt in ("auto", "command"):
            handle.seek(0)
            measured = command.measure_lines(file_lines(handle), {"json_lines": True, "patterns": []})
            found = "command" if fmt == "command" or measured.samples or measured.dropped else None
    if found is None or measured is None:
        raise UnknownFormat(path)
    failure_class, detail = measured.failure_class, measured.failure_detail
    if failure_class is None and measured.primary_sample() is None:
        failure_class, detail = "no_result", detail or f"printed no {measured.primary or 'metric'}"
    dropped = measured.dropped_detail()
    return {"file": path, "format": found, "status": "failed" if failure_class else "ok",
            "failure_class": failure_class, "failure_detail": "; ".join(x for x in (detail, dropped) if x) or None,
            "primary": measured.primary, "metrics": [s.to_dict() for s in measured.samples]}


def _error(message: str) -> None:
    print(f"fleetbench parse: {message}", file=sys.stderr)
