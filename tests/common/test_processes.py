"""The one contract for stop signals and child processes (locatdino.common.processes): a stop signal is an
exception carrying it; pool workers end with the block that started them when it fails, end
with their parent when it is killed, and never hold their parent's output lock."""

import os
import signal
import subprocess
import sys
import time

import pytest

from locatdino.common.output_files import inherited_lock_fds, output_lock
from locatdino.common.processes import (
    STOP_SIGNALS,
    Terminated,
    raising_stop_signals,
    stop_status,
    worker_pool,
)


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it runs nothing and holds no file)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def still_our_child(pid: int) -> bool:
    """``pid`` runs and is this process's child: not gone, and not a new process that reused the
    number of a worker already reaped (the suite starts many processes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, parent = f.read().rsplit(")", 1)[1].split()[:2]
    except FileNotFoundError:
        return False
    return state != "Z" and int(parent) == os.getpid()


def wait_until_gone(pids: list[int], limit: float = 30) -> list[int]:
    """Those of ``pids`` still running after at most ``limit`` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not all(map(gone, pids)):
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_stop_signal_raises_terminated_with_its_status_and_the_handler_is_restored(signum):
    before = signal.getsignal(signum)
    with pytest.raises(Terminated) as stopped, raising_stop_signals():
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs at the next bytecode; never reached
    assert stopped.value.signum == signum and stop_status(signum) == {signal.SIGTERM: 143, signal.SIGUSR1: 138}[signum]
    assert signal.getsignal(signum) is before


def _pid_and_open(fds: list[int]) -> tuple[int, list[bool]]:
    def is_open(fd: int) -> bool:
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True

    return os.getpid(), [is_open(fd) for fd in fds]


def test_a_failing_block_kills_its_workers_which_never_hold_the_output_lock(tmp_path):
    with output_lock(tmp_path):
        fds = inherited_lock_fds()
        assert len(fds) == 1
        with pytest.raises(RuntimeError, match="stop"), worker_pool(2) as pool:
            seen = [pool.submit(_pid_and_open, fds).result() for _ in range(4)]
            pool.submit(time.sleep, 60)  # a task still running when the block fails
            raise RuntimeError("stop")
    pids = sorted({pid for pid, _ in seen})
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert [held for _, held in seen] == [[False]] * 4
    assert [pid for pid in pids if still_our_child(pid)] == []  # killed and joined before the block's error went on


KILLED_PARENT = """
import os, signal, sys, time
from locatdino.common.processes import worker_pool
with worker_pool(2) as pool:
    pids = {pool.submit(os.getpid).result() for _ in range(8)}
    pool.submit(time.sleep, 60)
    print(*sorted(pids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_workers_end_when_their_parent_is_killed():
    parent = subprocess.run(
        [sys.executable, "-c", KILLED_PARENT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert parent.returncode == -signal.SIGKILL
    pids = [int(p) for p in parent.stdout.split()]
    assert 1 <= len(pids) <= 2
    assert wait_until_gone(pids) == []
