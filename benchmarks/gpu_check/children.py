"""Child processes of ``benchmarks/gpu_check/``: each in its own session (a deadline kills its
whole group, loader workers included), never outliving the check, read line by line against the
section's deadline."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.gpu_check.common import ROOT, Row, case_title


def child_env(dry: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    if dry:
        env["OMP_NUM_THREADS"] = "1"
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a child started with ``start_new_session`` and everything it started (loader workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextlib.contextmanager
def child(cmd: list[str], **popen) -> Iterator[subprocess.Popen]:
    """A child in its own session (a deadline kills its whole group) that never outlives the
    check: also killed when the check stops early (Ctrl-C, an error)."""
    proc = subprocess.Popen(cmd, start_new_session=True, cwd=ROOT, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_cases(
    command: list[str],
    cases: list[str],
    log: Path,
    until: float,
    section: str,
    title: Callable[[str], str] = case_title,
    env: dict[str, str] | None = None,
) -> Iterator[Row]:
    """Rows of ``cases`` run by ``command + cases`` (the ``@@`` protocol of ``cases.py``),
    its output appended to ``log``. A child that dies inside a case fails that case and a fresh
    one takes the rest; at ``until`` (``time.monotonic()``) the child is killed, the running case
    is a TIMEOUT row and the others are listed as not run."""
    remaining = list(cases)
    with log.open("a") as log_file:
        while remaining:
            if time.monotonic() >= until:
                yield from timed_out(section, remaining, None, title)
                return
            with child(
                [*command, *remaining], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            ) as proc:
                lines: queue.Queue = queue.Queue()
                threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
                current = None
                while True:
                    try:
                        line = lines.get(timeout=max(0.0, until - time.monotonic()))
                    except queue.Empty:
                        kill_group(proc)
                        log_file.write(f"gpu_check: killed at the section's deadline, in case {current}\n")
                        yield from timed_out(section, remaining, current, title)
                        return
                    if line is None:
                        break
                    log_file.write(line)
                    log_file.flush()
                    kind, _, payload = line.rstrip("\n").partition(" ")
                    if kind == "@@start":
                        current = payload
                    elif kind == "@@row":
                        yield Row(**json.loads(payload))
                    elif kind == "@@done":
                        remaining.remove(payload)
                        current = None
                code = proc.wait()
            if current is not None:  # died inside a case: that case fails, a fresh process goes on
                yield Row(
                    section,
                    title(current),
                    f"child process died in this case (exit {code}); see {log.name}",
                    "no error",
                    "FAIL",
                    log_tail(log),
                )
                remaining.remove(current)
            elif remaining and code != 3:  # died before its first case (3: asked for a fresh process)
                for case in remaining:
                    yield Row(
                        section,
                        title(case),
                        f"not run: child process exited {code}; see {log.name}",
                        "no error",
                        "FAIL",
                        log_tail(log),
                    )
                return


def log_tail(log: Path, lines: int = 80) -> str:
    """The last ``lines`` lines of a log: what a dead or failed process said last (its error)."""
    try:
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def timed_out(section: str, remaining: list[str], current: str | None, title: Callable[[str], str]) -> Iterator[Row]:
    for case in remaining:
        value = "stopped at the section's deadline" if case == current else "not run: section deadline reached"
        yield Row(section, title(case), value, "within budget", "TIMEOUT")


def run_logged(cmd: list[str], log: Path, until: float, env: dict[str, str]) -> int | None:
    """Run ``cmd``, all its output into ``log``; its exit status, or None when killed at ``until``."""
    with log.open("w") as log_file:
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        if time.monotonic() >= until:
            log_file.write("gpu_check: not run, the section's deadline was reached\n")
            return None
        with child(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env) as proc:
            try:
                return proc.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                return None
