"""``--threads``: how many CPU threads a command's tensor maths may use.

Why a flag: on a shared machine, torch's and FAISS's OpenMP pools size themselves from the
cores they can see, not from the cores nobody else is using; oversubscribed, every command ran
3–16× slower than with one thread per core actually free. The dispatcher takes ``--threads N``
anywhere on the command line (like ``--debug``), for every sub-command, before any of torch or
FAISS is imported: it sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (read by both OpenMP runtimes
when they load, and inherited by DDP ranks and pool processes) and ``torch.set_num_threads``.
DataLoader worker processes already run with one thread each (torch sets it in every worker).
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


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when the user set it, else every core this process may use."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else available_cores()


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
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{FLAG} must be a positive whole number of threads, not {value!r}")
    return rest, int(value)


def set_threads(threads: int) -> None:
    """Size torch's (and, through the environment, FAISS's and child processes') thread pools."""
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)
    import torch  # after the environment is set: its OpenMP runtime reads it on load

    torch.set_num_threads(threads)
