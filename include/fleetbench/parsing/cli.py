"""``fleetbench parse``: benchmark logs in, one JSON object per line out."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from fleetbench.failures import row_class

from .detect import parse_log_file
from .model import FORMATS, UnknownFormat
from .source import NotRegularFile

#: Accepted values of ``fmt``.
FORMAT_CHOICES = ("auto", *FORMATS)

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def cli_parse(files: list[str], fmt: str, out: TextIO) -> int:
    """Write one JSON Lines record per readable, recognised file to ``out``.

    Each record is ``{"file": <path as given>, **ParsedLog.to_dict()}``, its ``failure_class`` named
    as the warehouse names it (``gpu_oom`` where the parser says ``oom``).
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
        parsed = parse_log_file(path, fmt)
    except NotRegularFile as exc:
        _error(f"cannot read {path}: {exc.reason}")
        return None
    except OSError as exc:
        _error(f"cannot read {path}: {exc.strerror or exc}")
        return None
    except UnknownFormat:
        _error(f"{path}: no known benchmark log format")
        return None
    record = {"file": path, **parsed.to_dict()}
    record["failure_class"] = row_class(parsed.failure_class)  # the warehouse's name for it (fleetbench.failures)
    return record


def _error(message: str) -> None:
    print(f"fleetbench parse: {message}", file=sys.stderr)
