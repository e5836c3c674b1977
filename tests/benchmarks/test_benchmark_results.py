"""benchmarks/results_io.py: every benchmark's results file starts with the command that made it,
the date and the machine, lands in benchmarks/results/ unless --results names another file, and
holds the script's numbers."""

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import results_io

ROOT = Path(__file__).resolve().parents[2]


def test_a_results_file_records_command_date_machine_then_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    with pytest.raises(RuntimeError, match="not checked before the measuring"):
        results_io.write_results(None, "speed.json", {"rows": []})
    results_io.results_file(argparse.Namespace(results=None, overwrite=False), "speed.json")
    path = results_io.write_results(None, "speed.json", {"rows": [{"case": "a", "ms": 1.5}]})
    assert path == tmp_path / "speed.json"
    record = json.loads(path.read_text())
    assert list(record) == ["command", "date", "machine", "rows"]
    assert record["rows"] == [{"case": "a", "ms": 1.5}]
    assert before <= datetime.datetime.fromisoformat(record["date"]) <= datetime.datetime.now(datetime.UTC)
    assert record["machine"]["cpu"]["logical_cores"] == os.cpu_count()
    assert record["machine"]["software"]["torch"] == torch.__version__.split("+")[0]
    elsewhere = results_io.results_file(
        argparse.Namespace(results=tmp_path / "elsewhere" / "x.json", overwrite=False), "speed.json"
    )
    other = results_io.write_results(elsewhere, "speed.json", {"rows": []})
    assert json.loads(other.read_text())["rows"] == [] and len(json.loads(path.read_text())["rows"]) == 1


@pytest.mark.slow
def test_a_script_run_as_a_module_writes_its_rows_and_the_command_that_made_them(tmp_path):
    out = tmp_path / "knn.json"
    args = ["--memory", "300", "--dim", "8", "--queries", "4", "--k", "3", "--results", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.torch_knn_recall", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["command"] == "python -m benchmarks.speed.torch_knn_recall " + " ".join(args)
    assert record["k"] == 3
    rows = record["rows"]  # 4 memories (isotropic, 3 cluster tightnesses) x 2 half-precision coarse passes
    assert [(r["memory"], r["coarse_dtype"]) for r in rows][:2] == [("isotropic", "float16"), ("isotropic", "bfloat16")]
    assert len(rows) == 8 and all(r["recall"] == 1.0 for r in rows)  # exact after the float32 re-rank
    assert f"results: {out}" in proc.stderr


@pytest.mark.slow
def test_a_run_without_results_keeps_the_committed_file_and_bad_paths_are_refused_before_measuring(tmp_path):
    """``python -m benchmarks.speed.linprobe`` from the repository root replaced the committed
    results with a toy run's rows; a --results that was a folder failed after the measuring."""
    committed = ROOT / "benchmarks" / "results" / "linprobe.json"
    before = committed.read_bytes()

    def run(*args):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.speed.linprobe",
                "--num-train",
                "2",
                "--num-val",
                "1",
                "--iters",
                "5",
                "--no-ranking",
                *args,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
        assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
        return proc.stderr.rstrip("\n")

    assert run() == (
        f"benchmarks.speed.linprobe: {committed} exists (results RESULTS.md cites are kept there): "
        "pass --results FILE for this run's numbers, or --overwrite to replace it"
    )
    assert committed.read_bytes() == before
    check = results_io.results_file
    with pytest.raises(
        SystemExit,
        match=f": --results {tmp_path} is a folder: name the file to write, e.g. {tmp_path / 'linprobe.json'}$",
    ):
        check(argparse.Namespace(results=tmp_path, overwrite=True), "linprobe.json")
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        SystemExit, match=f": --results {tmp_path / 'file' / 'x.json'}: {tmp_path / 'file'} is a file, not a folder$"
    ):
        check(argparse.Namespace(results=tmp_path / "file" / "x.json", overwrite=True), "linprobe.json")
    assert check(argparse.Namespace(results=tmp_path / "file", overwrite=True), "x.json") == tmp_path / "file"


def test_every_script_that_writes_results_checks_its_file_first():
    """write_results refuses a path results_file did not check; every script calls both."""
    writers = [
        p
        for p in (ROOT / "benchmarks").rglob("*.py")
        if "write_results(" in p.read_text() and p.name != "results_io.py"
    ]
    assert len(writers) >= 15
    assert [str(p.relative_to(ROOT)) for p in writers if "results_file(args" not in p.read_text()] == []
