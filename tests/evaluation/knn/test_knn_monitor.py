"""The online k-NN monitor: logged during a tiny fit (CSV, curves.png), the same number as
``knn_classify`` on independently computed class tokens, the same on every DDP rank."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from locatdino.evaluation.knn import KnnMonitor
from locatdino.evaluation.knn_classifier import knn_classify
from locatdino.ssl.logs import curves
from tests.evaluation.hbird.hbird_fixtures import TinyDINOLike

SETS = dict(num_train=12, num_val=6, input_size=32, k=5, batch_size=8)


def test_a_tiny_fit_logs_knn_top1_into_metrics_csv_and_curves(tiny_vit, tmp_path, monkeypatch):
    monitor = KnnMonitor(every_n_steps=2, **SETS)
    module = TinyDINOLike(copy.deepcopy(tiny_vit)).train()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(10, 3)), batch_size=2)
    trainer = pl.Trainer(
        max_steps=5,
        callbacks=[monitor],
        accelerator="cpu",
        logger=pl.loggers.CSVLogger(tmp_path),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)
    assert [step for step, _ in monitor.history] == [2, 4] and module.teacher_modes == [True] * 5
    logged = curves.stitched_metrics(tmp_path / "lightning_logs")
    rows = dict(logged["monitor/knn_top1"])  # Lightning's row of optimizer step s is s - 1
    assert [rows[step - 1] for step, _ in monitor.history] == pytest.approx([top1 for _, top1 in monitor.history])
    assert all(seconds > 0 for _, seconds in logged["monitor/knn_seconds"])
    drawn = []
    real_draw = curves._draw
    monkeypatch.setattr(
        curves,
        "_draw",
        lambda ax, metrics, keys, *a, **kw: (
            drawn.extend(k for k in keys if k in metrics) or real_draw(ax, metrics, keys, *a, **kw)
        ),
    )
    assert curves.write_curves(tmp_path / "lightning_logs", tmp_path / "curves.png") is not None
    assert "monitor/knn_top1" in drawn


def test_the_monitor_s_top1_is_knn_classify_on_the_same_class_tokens(tiny_vit):
    monitor = KnnMonitor(**SETS, temperature=0.1)
    train, val = monitor.splits()
    view = T.Compose(
        [
            T.Resize(36, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(32),
            T.ToTensor(),
            T.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
        ]
    )  # floor(32 * 256 / 224) = 36

    def tokens(images):
        with torch.no_grad():
            return F.normalize(tiny_vit(torch.stack([view(images[i][0]) for i in range(len(images))])), dim=1)

    rankings = knn_classify(
        tokens(train),
        torch.from_numpy(train.labels),
        tokens(val),
        ks=(5,),
        temperature=0.1,
        num_classes=len(train.class_names),
    )
    expected = 100 * float(np.mean(rankings[5][:, 0].numpy() == val.labels))
    state = torch.random.get_rng_state()
    assert monitor.evaluate(tiny_vit) == pytest.approx(expected)
    assert torch.equal(torch.random.get_rng_state(), state)  # the training run's random stream is untouched
    assert len(set(train.labels.tolist())) > 1  # a real vote: more than one class among the neighbours


BUILT = {
    "more neighbours than train images": (
        {"num_train": 8},
        r"^KnnMonitor init_args.k: 20 neighbours, must lie in \[1, KnnMonitor init_args.num_train = 8\]$",
    ),
    "a temperature of 0": ({"temperature": 0}, r"^KnnMonitor init_args.temperature must be > 0 "),
    "no image per forward": (
        {"batch_size": 0},
        r"^KnnMonitor init_args.batch_size: images per forward, must be at least 1, got 0$",
    ),
    "an unknown precision": (
        {"precision": "fp16"},
        r"^KnnMonitor init_args.precision: must be one of auto, fp32, bf16, int8, got 'fp16'$",
    ),
    "an unknown dataset": (
        {"dataset": "imagenet"},
        r"^KnnMonitor init_args.dataset: must be one of imagefolder, shard-splits, scenes, got 'imagenet'$",
    ),
    "no validation image": ({"num_val": 0}, r"^KnnMonitor init_args.num_val: must be at least 1, got 0$"),
}


@pytest.mark.parametrize("case", BUILT)
def test_settings_that_cannot_be_scored_are_refused_when_built(case):
    """In fit's names (the callback's init_args), when the config is instantiated: before any step."""
    kwargs, message = BUILT[case]
    with pytest.raises(ValueError, match=message):
        KnnMonitor(**kwargs)


def _one_class_folder(root):
    for split, count in (("train", 3), ("val", 1)):
        (root / split / "cat").mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (40, 40), (i * 60, 0, 0)).save(root / split / "cat" / f"{i}.png")
    return str(root)


AT_FIT_START = {
    "an input size the patch does not divide": (
        {"input_size": 30},
        r"^KnnMonitor init_args.input_size: 30 px is not a multiple of the patch size 8 of the evaluated "
        r"backbone \(use 24 or 32\)$",
    ),
    "the validation split is the train split": (
        {"val_split": "train"},
        r"^KnnMonitor init_args.val_split train is the train split \(KnnMonitor init_args.train_split train\)",
    ),
    "a missing folder": (
        {"dataset": "imagefolder", "data_dir": "/nonexistent/data"},
        r"^KnnMonitor init_args.data_dir: /nonexistent/data/train is not a folder",
    ),
    "one train class": (
        {"dataset": "imagefolder", "num_train": 3, "num_val": 1, "k": 1},
        r"^KnnMonitor init_args.train_split train: its 3 images hold 1 class \('cat'\): classification needs at "
        r"least 2",
    ),
}


@pytest.mark.parametrize("case", AT_FIT_START)
def test_what_the_first_evaluation_would_stumble_on_stops_fit_before_step_0(tiny_vit, tmp_path, case):
    kwargs, message = AT_FIT_START[case]
    if case == "one train class":
        kwargs = {**kwargs, "data_dir": _one_class_folder(tmp_path / "data")}
    module = TinyDINOLike(copy.deepcopy(tiny_vit))
    trainer = pl.Trainer(
        max_steps=3,
        callbacks=[KnnMonitor(every_n_steps=1, **{**SETS, **kwargs})],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 3)), batch_size=2)
    with pytest.raises(ValueError, match=message):
        trainer.fit(module, data)
    assert module.teacher_modes == []  # no training step ran


DDP_SCRIPT = """
import json
import lightning.pytorch as pl
import torch
from locatdino.evaluation.knn import KnnMonitor
from tests.evaluation.hbird.hbird_fixtures import TinyDINOLike, tiny_vit_model

monitor = KnnMonitor(every_n_steps=2, num_train=12, num_val=6, input_size=32, k=5, batch_size=8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 3)), batch_size=2)
trainer = pl.Trainer(max_steps=4, callbacks=[monitor], accelerator="cpu", devices=2, strategy="ddp",
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(TinyDINOLike(tiny_vit_model()), data)
with open({out!r} + f"/rank{{trainer.global_rank}}.json", "w") as f:
    json.dump({{"history": monitor.history, "logged": trainer.callback_metrics["monitor/knn_top1"].item()}}, f)
"""


@pytest.mark.slow
def test_every_ddp_rank_evaluates_and_logs_the_same_top1(tmp_path):
    script = tmp_path / "ddp_knn_monitor.py"
    script.write_text(DDP_SCRIPT.format(out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s for s, _ in ranks[0]["history"]] == [2, 4] and ranks[0]["history"] == ranks[1]["history"]
    assert ranks[0]["logged"] == ranks[1]["logged"] == pytest.approx(ranks[0]["history"][-1][1])
    assert proc.stderr.count("[knn monitor] step") + proc.stdout.count("[knn monitor] step") == 2  # rank 0's lines
