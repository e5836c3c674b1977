"""Writing output without losing work: the one atomic-write helper of the package, and the checks
that make a long command fail *before* its work instead of after it.

- :func:`atomic_write` writes through a temporary sibling, fsyncs, then ``os.replace``s: readers
  see the old file or the new one, never a partial one. Files and folders are created with
  ``0o666`` / ``0o777`` masked by the umask, as ``open()`` and ``mkdir`` do (``tempfile``'s 0600
  would hide reports from colleagues on a shared cluster).
- Temporaries are named ``.<target>.<pid>@<host>.<random>.tmp``, so a later start can tell a
  leftover of a killed writer (same host, process gone) from a write in progress:
  :func:`remove_stale_temporaries`.
- A full disk surfaces as :class:`DiskFullError`, one line naming the path (torch and numpy bury
  ``ENOSPC`` in chained tracebacks); :func:`reserve_space` claims the space of a memory-mapped file
  up front, where a sparse file would die of SIGBUS half-way.
- :func:`ensure_writable` probes an output folder before the work that will write into it.
- :func:`output_lock` holds an output folder for one run: a second run into it is refused at
  once instead of racing the first for the same files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import numpy as np

from locatdino.common.errors import UserError

log = logging.getLogger(__name__)

_HOST = socket.gethostname().split(".")[0] or "localhost"
_TEMP = re.compile(r"^\..+\.(?P<pid>\d+)@(?P<host>[^.@]+)\.[0-9a-f]{8}\.tmp$")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
LOCK_NAME = ".locatdino.lock"


class DiskFullError(OSError):
    """No space (or quota) left where a file is written; ``str()`` is one line naming it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.errno = code


def _one_line(exc: OSError, message: str) -> OSError:
    """``exc``'s class and errno with ``message`` as its whole text (no "[Errno N]" prefix)."""
    out = type(exc)(message)
    out.errno = exc.errno
    return out


def temporary_sibling(path: str | os.PathLike) -> Path:
    """A fresh name next to ``path`` in the temporary format :func:`remove_stale_temporaries` knows."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}@{_HOST}.{secrets.token_hex(4)}.tmp")


def _disk_full_cause(exc: BaseException) -> OSError | None:
    """The ``ENOSPC`` / ``EDQUOT`` error in ``exc``'s chain (torch wraps it in a RuntimeError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_message(exc: BaseException) -> str | None:
    """One line for an exception caused by a full disk anywhere in its chain, else ``None``."""
    cause = _disk_full_cause(exc)
    if cause is None or isinstance(cause, DiskFullError):
        return None if cause is None else str(cause)
    return f"{cause.filename}: {os.strerror(cause.errno)}" if cause.filename else os.strerror(cause.errno)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(file)`` on a temporary sibling of ``path``, fsync, then rename it to ``path``.

    On any failure the temporary is removed and a previous ``path`` is untouched; a full disk is
    raised as :class:`DiskFullError`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, like open()
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        cause = _disk_full_cause(exc)
        if cause is not None and not isinstance(exc, DiskFullError):
            raise DiskFullError(cause.errno, f"{path}: {os.strerror(cause.errno)} (nothing was replaced)") from None
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda f: f.write(text.encode()))


def make_temporary_dir(target: str | os.PathLike) -> Path:
    """A new empty folder next to ``target`` (mode ``0o777 & ~umask``), to be renamed onto it."""
    tmp = temporary_sibling(target)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(0o777)
    return tmp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporaries in ``folder`` left by killed writers on this host; returns them.

    Only names of :func:`temporary_sibling`'s format whose process is gone are removed: a write
    in progress (live pid) or one from another host (shared filesystem) is left alone.
    """
    folder = Path(folder)
    removed = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        m = _TEMP.match(entry.name)
        if m is None or m["host"] != _HOST or _alive(int(m["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    if removed:
        log.info(
            "removed %d stale temporar%s of killed writes in %s: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            folder,
            ", ".join(p.name for p in removed),
        )
    return removed


def ensure_writable(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and write-probe it; ``OSError`` with one line if it cannot be used.

    Called before long work, so a read-only, missing-parent or full output folder fails at the
    start instead of after the work it would have held.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{what} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = temporary_sibling(folder / "write-probe")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.write(fd, b"\0")
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise _one_line(exc, f"{what} {folder} is not writable: {reason}") from None
    return folder


def reserve_space(fd: int, nbytes: int, path: str | os.PathLike) -> None:
    """Allocate ``nbytes`` of disk to the open file ``fd`` now, or raise :class:`DiskFullError`.

    A memory-mapped file is sparse: its pages claim disk only when written, so a disk that fills
    kills the process with SIGBUS mid-way. ``posix_fallocate`` claims it up front; where the
    filesystem cannot (no ``posix_fallocate``, EOPNOTSUPP), the free space is compared instead.
    """
    if nbytes <= 0:
        return
    free = shutil.disk_usage(Path(path).parent).free  # before: a failed fallocate may keep a part
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return
    except AttributeError:  # not on this platform: compare with the free space below
        pass
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise _too_big(path, nbytes, free, exc.errno) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    if free < nbytes:
        raise _too_big(path, nbytes, free, errno.ENOSPC)
    os.ftruncate(fd, nbytes)


def reserved_memmap(path: str | os.PathLike, dtype: Any, shape: tuple[int, ...]) -> np.memmap:
    """A new writable ``np.memmap`` at ``path`` whose disk space is allocated now
    (:func:`reserve_space`): a disk too small fails here, in one line, not with SIGBUS later."""
    import numpy as np

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        reserve_space(fd, math.prod(shape) * np.dtype(dtype).itemsize, path)
    finally:
        os.close(fd)
    return np.memmap(path, dtype=dtype, mode="r+", shape=shape)


@contextlib.contextmanager
def feature_rows(
    count: int, dim: int, cache_dir: str | os.PathLike | None, max_ram_bytes: int, name: str
) -> Iterator[np.ndarray]:
    """A zeroed float32 ``[count, dim]`` array for the block: in RAM when it fits ``max_ram_bytes``,
    else a :func:`reserved_memmap` in a temporary folder ``name`` under ``cache_dir`` (the system's
    temporary folder when None), deleted when the block ends; a killed run's folder is removed by
    the next one made there. Features of a whole split (ImageNet's 1.28 M images) outgrow RAM."""
    import tempfile

    import numpy as np

    if count * dim * 4 <= max_ram_bytes:
        yield np.zeros((count, dim), np.float32)
        return
    parent = Path(cache_dir if cache_dir is not None else tempfile.gettempdir())
    remove_stale_temporaries(parent)
    folder = make_temporary_dir(parent / name)
    try:
        yield reserved_memmap(folder / "features.bin", np.float32, (count, dim))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _too_big(path: str | os.PathLike, nbytes: int, free: int, code: int) -> DiskFullError:
    return DiskFullError(code, f"{path}: {os.strerror(code)}: needs {nbytes / 1e9:.3g} GB, {free / 1e9:.3g} GB free")


_HELD_LOCKS: set[int] = set()  # fds of the output locks this process holds now


def inherited_lock_fds() -> list[int]:
    """The descriptors of the output locks held when this process was forked: a child closes them
    (:func:`locatdino.common.processes.worker_pool`), so that a child outliving its parent never holds the
    parent's output folder."""
    return sorted(_HELD_LOCKS)


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, what: str = "output folder") -> Iterator[Path]:
    """Hold ``folder/.locatdino.lock`` for the block; :class:`~locatdino.common.errors.UserError` at once
    when another run holds it (its pid and host are in the message).

    ``flock`` locks end with their process, so a killed run never leaves the folder locked; the
    file itself stays (removing it would let a third run lock a different file). A lock outlives
    its run only in a process that inherited it and outlived the run (the command's own workers
    close it and end with it: :mod:`locatdino.common.processes`); the message then says so.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            recorded = re.fullmatch(r"pid (\d+) on (\S+)", holder)
            if recorded and recorded[2] == _HOST and not _alive(int(recorded[1])):  # the run is gone, not its lock
                raise UserError(
                    f"{what} {folder} is locked by processes that the run with pid {recorded[1]} left "
                    f"behind though it has ended (lock {path}; `fuser {path}` lists them): end them or "
                    "choose another folder"
                ) from None
            raise UserError(
                f"{what} {folder} is in use by another run ({holder}; lock {path}): wait for it "
                "to end or choose another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {_HOST}\n".encode(), 0)
        _HELD_LOCKS.add(fd)
        yield folder
    finally:
        _HELD_LOCKS.discard(fd)
        os.close(fd)  # releases the lock
