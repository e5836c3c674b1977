"""benchmarks/results_io.py: every benchmark's results file starts with the command that made it,
the date and the machine, lands in benchmarks/results/ unless --results names another file, and
holds the script's numbers."""

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import results_io

ROOT = Path(__file__).resolve().parents[1]


def test_a_results_file_records_command_date_machine_then_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    path = results_io.write_results(None, "speed.json", {"rows": [{"case": "a", "ms": 1.5}]})
    assert path == tmp_path / "speed.json"
    record = json.loads(path.read_text())
    assert list(record) == ["command", "date", "machine", "rows"]
    assert record["rows"] == [{"case": "a", "ms": 1.5}]
    assert before <= datetime.datetime.fromisoformat(record["date"]) <= datetime.datetime.now(datetime.timezone.utc)
    assert record["machine"]["cpu"]["logical_cores"] == os.cpu_count()
    assert record["machine"]["software"]["torch"] == torch.__version__.split("+")[0]
    other = results_io.write_results(tmp_path / "elsewhere" / "x.json", "speed.json", {"rows": []})
    assert json.loads(other.read_text())["rows"] == [] and len(json.loads(path.read_text())["rows"]) == 1


def test_a_script_run_as_a_module_writes_its_rows_and_the_command_that_made_them(tmp_path):
    out = tmp_path / "knn.json"
    args = ["--memory", "300", "--dim", "8", "--queries", "4", "--k", "3", "--results", str(out)]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.speed.torch_knn_recall", *args], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["command"] == "python -m benchmarks.speed.torch_knn_recall " + " ".join(args)
    assert record["k"] == 3
    rows = record["rows"]  # 4 memories (isotropic, 3 cluster tightnesses) x 2 half-precision coarse passes
    assert [(r["memory"], r["coarse_dtype"]) for r in rows][:2] == [("isotropic", "float16"), ("isotropic", "bfloat16")]
    assert len(rows) == 8 and all(r["recall"] == 1.0 for r in rows)  # exact after the float32 re-rank
    assert f"results: {out}" in proc.stderr
