"""Where a log's lines come from: text in memory, or a file read as a stream.

A log can be hundreds of MB and a line can be a megabyte of garbage, so text is handled in blocks
of whole lines (``BLOCK_SIZE``), never all at once, and a line is cut at ``MAX_LINE_CHARS`` for
matching (the rest of it is skipped). A line cut that way, or a last line without a line break
(the log was truncated, perhaps while a number was being written), is marked incomplete: its
text may end mid-word.

Only regular files are opened. A FIFO would block forever and a device such as ``/dev/zero``
never ends, so both (also behind a symlink) are refused with a message naming the path.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Iterable, Iterator

from fleetbench.files import NotRegularFile, open_regular  # noqa: F401  (re-exported for the parsers)
from fleetbench.telemetry.wrapper import MARKER as TELEMETRY_MARKER

#: Longer lines are cut to this many characters before any pattern sees them.
MAX_LINE_CHARS = 64 * 1024

#: Text is split into lines a block at a time: characters of text, bytes of a file.
BLOCK_SIZE = 1024 * 1024

#: What ``str.splitlines`` breaks lines on; blocks are cut after ``\\n`` or ``\\r`` only.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK = re.compile(r"[\r\n]")
_BREAK_BYTES = re.compile(rb"[\r\n]")


def text_blocks(text: str, size: int = BLOCK_SIZE) -> Iterator[str]:
    """``text`` as blocks of whole lines (ended by ``\\n``, ``\\r`` or both) of about ``size`` characters.

    A line with no break within a whole block comes as a block of its own, holding only as much
    of the line as ``lines`` reads: a long one ends without a line break, so it reads as incomplete.
    """
    pos, end = 0, len(text)
    while pos < end:
        if end - pos <= size:
            yield text[pos:]
            return
        stop = max(text.rfind("\n", pos, pos + size), text.rfind("\r", pos, pos + size - 1)) + 1
        if stop:
            yield text[pos:stop]
        else:
            found = _BREAK.search(text, pos)
            stop = end if found is None else _after_break(text, found.start())
            yield text[pos : min(stop, pos + MAX_LINE_CHARS + 1)]
        pos = stop


def file_blocks(handle: BinaryIO, size: int = BLOCK_SIZE) -> Iterator[str]:
    """A binary file as blocks of whole lines, decoded as UTF-8 (bad bytes replaced); see ``text_blocks``.

    At most ``size`` bytes plus the start of one line are held at a time: the start of a line is
    kept only while the line may still be short enough to read whole (a character is at most 4 bytes).
    """
    carry, skip = b"", None
    while data := handle.read(size):
        if skip == "lf":
            data, skip = data.removeprefix(b"\n"), None
        elif skip == "line":
            data, skip = _rest_after_break(data)
        data = carry + data
        stop = max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
        if stop:
            yield data[:stop].decode("utf-8", errors="replace")
            carry = data[stop:]
        elif len(data) > 4 * (MAX_LINE_CHARS + 1):
            yield data[: 4 * (MAX_LINE_CHARS + 1)].decode("utf-8", errors="replace")[: MAX_LINE_CHARS + 1]
            carry, skip = b"", "lf" if data.endswith(b"\r") else "line"
        else:
            carry = data
    if carry:
        yield carry.decode("utf-8", errors="replace")


def _rest_after_break(data: bytes) -> tuple[bytes, str | None]:
    """What follows the first line break in ``data``, and what is still to skip: more of the
    line ("line") or, after a ``\\r`` that ends ``data``, the ``\\n`` that may complete it ("lf")."""
    found = _BREAK_BYTES.search(data)
    if found is None:
        return b"", "line"
    if found.start() == len(data) - 1 and data.endswith(b"\r"):
        return b"", "lf"
    return data[_after_break(data, found.start()) :], None


def _after_break(text, at: int) -> int:
    """Where the line break at ``at`` ends: ``\\r\\n`` is one break."""
    return at + 2 if text[at : at + 2] in ("\r\n", b"\r\n") else at + 1


def lines(blocks: Iterable[str]) -> Iterator[tuple[str, bool]]:
    """``(line, complete)`` per line of the blocks, without its line break, cut at ``MAX_LINE_CHARS``.

    A line is complete when a line break ended it and it was not cut. The telemetry wrapper's report line
    (``FLEETBENCH_TELEMETRY {...}``, printed after the benchmark ended) is a line of its own: found glued to the end of
    the benchmark's last line, that line had no line break (its output was cut, e.g. a process aborted with text still
    in its stdio buffer), so it is incomplete, as it would read without the wrapper (``1.1`` of a cut ``1.15327`` is
    not a number the parsers take).
    """
    limit = MAX_LINE_CHARS
    for block in blocks:
        glued = TELEMETRY_MARKER in block  # looked for per line only in the block that has it (the log's last)
        for piece in block.splitlines(keepends=True):
            line = piece.rstrip(_LINE_BREAKS)
            ended = len(line) != len(piece)
            if glued and (at := line.find(TELEMETRY_MARKER)) > 0:
                yield line[:min(at, limit)], False
                line = line[at:]
            if len(line) > limit:
                yield line[:limit], False
            else:
                yield line, ended


def text_lines(text: str) -> Iterator[tuple[str, bool]]:
    """``lines`` of text in memory."""
    return lines(text_blocks(text))


def file_lines(handle: BinaryIO) -> Iterator[tuple[str, bool]]:
    """``lines`` of a binary file, read from where it stands."""
    return lines(file_blocks(handle))
