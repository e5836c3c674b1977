"""A benchmark study run as a user runs it: ``python -m MODULE ARGS`` in a new process with the
checkout on its path and one thread per op, so that its clock starts with its imports and nothing
it sets (GAug's path, torch's threads) reaches the other tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc
