"""Run a command with a tiny, full-able filesystem: a tmpfs mounted in a private user and mount
namespace (``unshare -rm``), so no root and no loop device are needed. Tests using it skip where
the kernel or the sandbox forbids unprivileged namespaces."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_on_tiny_disk(
    mount: Path, size: str, argv: list[str], timeout: int = 300, read_only: bool = False
) -> subprocess.CompletedProcess:
    """``argv`` with a ``size`` tmpfs (e.g. ``"256k"``; ``read_only``: mounted read-only) mounted at
    ``mount``; skips the test if the namespace cannot be made. One thread, this checkout first on
    ``PYTHONPATH``."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare not available")
    mount.mkdir(parents=True, exist_ok=True)
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 97; shift 2; exec "$@"'
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    options = size + (",ro" if read_only else "")
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", options, str(mount), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode == 97 or "unshare:" in proc.stderr:
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()[:200]}")
    return proc


def python(*code_or_args: str) -> list[str]:
    """``[python, ...]`` with this interpreter."""
    return [sys.executable, *code_or_args]
