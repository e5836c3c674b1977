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
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from locatdino.probes import KnnMonitor
from locatdino.probes.knn import knn_classify
from locatdino.ssl.logs import curves
from tests.retrieval.hbird_fixtures import TinyDINOLike

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


def test_settings_that_cannot_be_scored_are_refused_when_built(tmp_path):
    with pytest.raises(ValueError, match="k=20 neighbours asked for but the train set holds 8 images"):
        KnnMonitor(num_train=8)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        KnnMonitor(temperature=0)
    monitor = KnnMonitor(dataset="imagefolder", data_dir=str(tmp_path / "missing"), num_train=30)
    with pytest.raises(ValueError, match="is not a folder"):
        monitor.setup(None, None, "fit")  # before the first training step


DDP_SCRIPT = """
import json
import lightning.pytorch as pl
import torch
from locatdino.probes import KnnMonitor
from tests.retrieval.hbird_fixtures import TinyDINOLike, tiny_vit_model

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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s for s, _ in ranks[0]["history"]] == [2, 4] and ranks[0]["history"] == ranks[1]["history"]
    assert ranks[0]["logged"] == ranks[1]["logged"] == pytest.approx(ranks[0]["history"][-1][1])
    assert proc.stderr.count("[knn monitor] step") + proc.stdout.count("[knn monitor] step") == 2  # rank 0's lines
