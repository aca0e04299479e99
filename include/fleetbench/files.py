"""Opening files fleetbench did not write itself (case logs, probe outputs): regular files only.

A FIFO would block forever and a device such as /dev/zero never ends, so both (also behind a
symlink) are refused with a message naming the path.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder: reading it could block or never end.

    The message names the path; ``reason`` is the rest, for callers that name the file themselves.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.reason = reason


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for binary reading, refusing anything but a regular file (symlinks followed).

    The type is checked before opening, so a FIFO or a device is never opened at all, and again
    on the open descriptor, in case the path was swapped in between. O_NONBLOCK makes even that
    second case return at once instead of waiting for a FIFO's writer.
    """
    _require_regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _require_regular(path, os.fstat(fd).st_mode)
    except NotRegularFile:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _require_regular(path: str | os.PathLike, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    via = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    raise NotRegularFile(path, f"{_kind(mode)}{via}, not a regular file")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "a special file"
