"""benchmarks/studies/gpu_study.py at toy size on the CPU: the whole study end to end (so the script is
ready for the next GPU), every run's random init is the network its module starts from, and an
existing results folder is never written into."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.studies import gpu_study
from tests.benchmarks.study_process import run_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("objective", list(gpu_study.OBJECTIVES))
@pytest.mark.parametrize("backbone", gpu_study.BACKBONES)
def test_every_run_starts_from_the_scored_random_init(objective, backbone):
    module = gpu_study.build_module(objective, backbone, gpu_study.TOY, seed=3)
    start = module.student["backbone"] if objective != "supervised" else module.classifier.backbone
    random = gpu_study.random_backbone(backbone, gpu_study.TOY, seed=3)
    state = random.state_dict()
    assert start.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in start.state_dict().items())


@pytest.mark.slow
def test_imports_without_jsonargparse():
    """A CUDA machine's preinstalled Python may lack jsonargparse: the study, and the Gram study built
    on it, must not need it (they build their modules and Trainers directly, not through ``locatdino fit``)."""
    blocker = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'jsonargparse': raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import benchmarks.studies.gpu_study, benchmarks.studies.gpu_gram_distill\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", blocker], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_existing_results_folder_is_refused(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("a user's file")
    assert gpu_study.main(["--toy", "--out", str(tmp_path)]) == 1
    assert "exists and is not an empty folder" in capsys.readouterr().out
    assert (tmp_path / "keep.txt").read_text() == "a user's file"


@pytest.mark.slow
def test_toy_study_end_to_end(tmp_path):
    out = tmp_path / "study"
    run_module("benchmarks.studies.gpu_study", "--toy", "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["backbone"], r["objective"]) for r in rows[:2]] == [("vit", "random init"), ("locatvit", "random init")]
    trained = rows[2:]
    assert {(r["backbone"], r["objective"]) for r in trained} == {
        (b, o) for b in gpu_study.BACKBONES for o in gpu_study.OBJECTIVES
    }
    assert set(results["measured"]) == {f"{r['backbone']}_{r['objective']}" for r in trained}
    for r in trained:  # steps from the measured speed (never below the floor), each run to its schedule's end
        assert r["steps"] >= gpu_study.TOY.min_steps
        assert r["hbird_delta"]["low"] <= r["hbird_delta"]["delta"] <= r["hbird_delta"]["high"]
        logged = (out / "logs" / f"{r['backbone']}_{r['objective']}" / "metrics.csv").read_text().splitlines()
        assert len([line for line in logged[1:] if line.split(",")[0]]) >= 1
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 2 + 8 and (out / "delta.png").read_bytes()[:4] == b"\x89PNG"
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".ckpt", ".pth")]
    assert sum(p.stat().st_size for p in files) < 2_000_000


def test_the_device_multicrop_gives_the_cpu_paths_batch_layout():
    from locatdino.data import MultiCropTransform, collate_multicrop

    multicrop = MultiCropTransform(**gpu_study.TOY.multicrop)
    images = torch.randint(0, 256, (3, 3, 48, 48), dtype=torch.uint8)
    device_batch = gpu_study.DeviceMultiCrop(None, multicrop, seed=0).on_after_batch_transfer(images, 0)
    cpu_batch = collate_multicrop([multicrop(image) for image in images])
    assert {k: v.shape for k, v in device_batch.items()} == {k: v.shape for k, v in cpu_batch.items()}


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--deadline", "-1", "must be a positive number, got -1"),
        ("--deadline", "nan", "must be a positive number, got nan"),
        ("--scenes", "0", "must be at least 1, got 0"),
        ("--batch", "-3", "must be at least 1, got -3"),
        ("--workers", "-1", "must be at least 0, got -1"),
    ],
)
def test_a_size_out_of_range_is_refused_before_any_work(tmp_path, capsys, option, value, message):
    with pytest.raises(SystemExit) as stop:
        gpu_study.main(["--toy", option, value, "--out", str(tmp_path / "out")])
    assert stop.value.code == 2 and f"argument {option}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
