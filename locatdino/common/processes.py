"""Stop signals and child processes: one contract for every command.

**Stop signals.** A cluster scheduler stops a job with SIGTERM, and many warn before it with
SIGUSR1 (SLURM's ``--signal=USR1@90``, other schedulers' pre-emption notices). Python's default for
both kills the process on the spot: no ``finally`` block runs, so feature caches, temporary
folders and output locks stay behind, and child processes live on. The dispatcher runs every
command inside :func:`raising_stop_signals`: either signal raises :class:`Terminated` (a
``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` swallows it), the
command's cleanup runs, and the command ends with one line and status 128 + the signal
(:func:`stop_status`: 143 for SIGTERM, 138 for SIGUSR1). ``fit`` replaces the handlers while it
trains (:mod:`locatdino.ssl.run.stop_checkpoint`: save ``last.ckpt`` first).

**Child processes end with their parent.** A pool's workers are forked: they inherit the parent's
open files, the lock of its output folder included. A parent killed (SIGKILL, a crash) before it
could end them left them running, re-parented to init, holding that lock, so the next run into
the folder was refused as "in use" by a run that no longer existed. :func:`worker_pool` is the one
way a command starts worker processes: each worker asks the kernel to kill it when its parent
dies (``PR_SET_PDEATHSIG`` on Linux; elsewhere a thread that watches the parent), closes the
parent's output locks it inherited (:func:`locatdino.common.output_files.inherited_lock_fds`), and leaves
stop signals to the parent, which ends the pool when anything, a stop signal included, leaves
the ``with`` block early.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import Any

from locatdino.common.output_files import inherited_lock_fds

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_INTERVAL_S = 1.0


class Terminated(BaseException):
    """A stop signal as an exception; ``signum`` says which."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def stop_status(signum: int) -> int:
    """The exit status of a command stopped by ``signum``, as a shell reports a process killed by it."""
    return 128 + signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def raising_stop_signals() -> Iterator[None]:
    """Within the block every stop signal raises :class:`Terminated` (in the main thread only:
    Python takes signal handlers there); the handlers before it are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def die_with_parent(parent: int) -> None:
    """End this process (SIGKILL) when the process ``parent`` that started it ends: the kernel's
    parent-death signal on Linux, else a daemon thread polling the parent's pid. (The kernel
    signals when the parent's forking *thread* ends: a fork-context ``ProcessPoolExecutor`` forks
    all its workers in the thread that submits first, which :func:`worker_pool`'s block keeps
    alive for as long as the pool.)"""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None
    if libc is not None and libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        if os.getppid() != parent:  # it died before the request: no signal will come
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    die_with_parent(parent)
    for fd in inherited_lock_fds():
        with contextlib.suppress(OSError):
            os.close(fd)
    for signum in STOP_SIGNALS:  # the parent ends the pool; a worker signalled with it just ends
        signal.signal(signum, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(
    workers: int, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``workers`` forked processes that end with this one (see the
    module docstring). Leaving the block normally waits for the submitted work, as the executor
    does; leaving it by an exception (a failed task, :class:`Terminated`, Ctrl-C) kills the
    workers at once instead of waiting for their tasks."""
    pool = ProcessPoolExecutor(
        workers,
        mp_context=mp.get_context("fork"),
        initializer=_start_worker,
        initargs=(os.getpid(), initializer, initargs),
    )
    try:
        yield pool
    except BaseException:
        processes = list((getattr(pool, "_processes", None) or {}).values())  # the executor's own (kill_workers: 3.14)
        for process in processes:
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join()
        raise
    pool.shutdown(wait=True)
