"""Reading a report file a user names without hanging or filling the memory.

A path a command reads an earlier result from (``results.json``, ``per_image_confusion.npz``)
may be a FIFO (``open`` waits for a writer forever), a link to ``/dev/zero`` (``read`` never
ends) or a multi-gigabyte file (``json.loads`` needs several times its size in RAM).
:func:`read_bounded` opens without blocking, reads regular files only and at most ``limit``
bytes, and says in one line what the path is instead.
"""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bounded(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (links followed); ``ValueError`` naming it and
    ``what`` it should be when it is anything else or holds more than ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise ValueError(f"{path} is {kind}, not a {what}")
        # a file that grows after fstat is still read no further than the limit
        data = f.read(limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        raise ValueError(f"{path} holds more than {limit / 2**20:.0f} MiB, more than a {what} ever does")
    return data
