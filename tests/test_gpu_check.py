"""benchmarks/gpu_check.py --dry-run: every case of the GPU check built and run at toy size on
the CPU, so the script is ready (and correct in its own checks) for the next GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_builds_and_passes_every_case():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ")]
    by_section = {}
    for section, case, value, target, status in rows:
        by_section.setdefault(section, []).append((case, status))
    # 2 prefixes x 3 resolutions x 2 paths x 2 dtypes; 3 cases x 3 models; 2 fits + 2 hbird runs
    assert {k: len(v) for k, v in by_section.items()} == {"equivalence": 24, "speed": 9, "e2e": 4}
    assert all(status == "PASS" for _, status in by_section["equivalence"] + by_section["e2e"])
    assert {case for case, _ in by_section["e2e"]} >= {
        "locatdino fit tiny_vit, 2 steps", "locatdino fit tiny_locatvit, 2 steps",
        "locatdino hbird locatvit_tiny 32 px", "locatdino hbird vit_tiny_patch16_224 32 px"}
