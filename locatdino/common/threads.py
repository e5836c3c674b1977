"""``--threads``: how many CPU threads a command's tensor maths may use.

Why a flag: on a shared machine, torch's and FAISS's OpenMP pools size themselves from the
cores they can see, not from the cores nobody else is using; oversubscribed, every command ran
3–16× slower than with one thread per core actually free. The dispatcher takes ``--threads N``
anywhere on the command line (like ``--debug``), for every sub-command, before any of torch or
FAISS is imported: it sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (read by both OpenMP runtimes
when they load, and inherited by DDP ranks and pool processes) and ``torch.set_num_threads``.
DataLoader worker processes already run with one thread each (torch sets it in every worker).

What counts (:func:`choose_threads`): ``--threads N``, else ``OMP_NUM_THREADS`` (the first entry of
an OpenMP list such as ``4,2``), else every core this process may use; more than those cores is
capped to them (oversubscription only slows the maths; 100000 threads would start 100000
threads). An ``OMP_NUM_THREADS`` that is not a positive whole number (``0``, ``-2``, ``abc``) is
ignored with one line, and removed before torch loads (:func:`drop_invalid_thread_env`, run on
``import locatdino``): OpenMP would ignore it too, after a two-line complaint of its own.
"""

from __future__ import annotations

import os

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
FLAG = "--threads"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a cluster scheduler narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_DROPPED: dict[str, str] = {}  # invalid thread variables removed at import, for the warning


def _positive(value: str) -> int | None:
    """A thread count written as a positive whole number (the first of an OpenMP list), else None."""
    first = value.split(",")[0].strip()
    return int(first) if first.isdecimal() and int(first) > 0 else None


def drop_invalid_thread_env() -> None:
    """Remove ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` values that are not thread counts, before
    torch's OpenMP runtime reads them (it would ignore them after printing a warning)."""
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name)
        if value is not None and _positive(value) is None:
            _DROPPED[name] = os.environ.pop(name)


def choose_threads(requested: int | None) -> tuple[int, str | None]:
    """The thread count of a command (see the module docstring) and a one-line note when it is
    not what the command line or the environment asked for."""
    cores = available_cores()
    if requested is None:
        value = os.environ.get("OMP_NUM_THREADS", _DROPPED.get("OMP_NUM_THREADS"))
        if value is not None and _positive(value) is None:
            return cores, (
                f"ignoring OMP_NUM_THREADS={value!r} (not a positive whole number of threads): using "
                f"{cores}, the cores this process may use (--threads N sets the number)"
            )
        requested, asked = (cores, "") if value is None else (_positive(value), f"OMP_NUM_THREADS={value!r}")
    else:
        asked = f"--threads {requested}"
    if requested > cores:
        return cores, f"{asked} is more than the {cores} cores this process may use: using {cores}"
    return requested, None


def pop_threads(argv: list[str]) -> tuple[list[str], int | None]:
    """``argv`` without ``--threads N`` / ``--threads=N``, and N (None when absent).

    Raises ``ValueError`` with a one-line message when N is missing or not a positive integer.
    """
    rest: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == FLAG:
            if i + 1 >= len(argv):
                raise ValueError(f"{FLAG} needs a number of threads")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(FLAG + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    if value is None:
        return rest, None
    if not value.isdecimal() or int(value) < 1:
        raise ValueError(f"{FLAG} must be a positive whole number of threads, not {value!r}")
    return rest, int(value)


def set_threads(threads: int) -> None:
    """Size torch's (and, through the environment, FAISS's and child processes') thread pools."""
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)
    import torch  # after the environment is set: its OpenMP runtime reads it on load

    torch.set_num_threads(threads)
