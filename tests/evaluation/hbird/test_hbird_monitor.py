import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from locatdino.evaluation.hbird import HummingbirdMonitor
from tests.evaluation.hbird.hbird_fixtures import TinyDINOLike


@pytest.mark.slow
def test_logs_hbird_miou_every_n_steps(tiny_vit, tmp_path):
    monitor = HummingbirdMonitor(every_n_steps=2, num_train=4, num_val=2, input_size=32, k=10, batch_size=4)
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
    assert [step for step, _ in monitor.history] == [2, 4]
    assert all(0 <= miou <= 100 for _, miou in monitor.history)
    assert trainer.callback_metrics["hbird/mIoU"].item() == pytest.approx(monitor.history[-1][1])
    assert module.teacher_modes == [True] * 5  # evaluated in eval mode, train mode restored after


def test_evaluation_leaves_the_global_rng_alone(tiny_vit):
    monitor = HummingbirdMonitor(num_train=4, num_val=2, input_size=32, k=10)
    monitor.splits()
    state = torch.random.get_rng_state()
    first = monitor.evaluate(tiny_vit)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert monitor.evaluate(tiny_vit) == first  # and it is deterministic


def test_needs_an_eval_backbone():
    class NoBackbone(pl.LightningModule):
        pass

    monitor = HummingbirdMonitor(every_n_steps=1)
    trainer = type("T", (), {"global_step": 1})()
    with pytest.raises(AttributeError, match="NoBackbone.eval_backbone"):
        monitor.on_train_batch_end(trainer, NoBackbone(), None, None, 0)


DDP_SCRIPT = """
import json
import lightning.pytorch as pl
import torch
from locatdino.evaluation.hbird import HummingbirdMonitor
from tests.evaluation.hbird.hbird_fixtures import TinyDINOLike, tiny_vit_model

vit = tiny_vit_model()
monitor = HummingbirdMonitor(every_n_steps=2, num_train=4, num_val=2, input_size=32, k=10, batch_size=4)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 3)), batch_size=2)
trainer = pl.Trainer(max_steps=4, callbacks=[monitor], accelerator="cpu", devices=2, strategy="ddp",
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(TinyDINOLike(vit), data)
with open({out!r} + f"/rank{{trainer.global_rank}}.json", "w") as f:
    json.dump({{"history": monitor.history, "logged": trainer.callback_metrics["hbird/mIoU"].item()}}, f)
"""


@pytest.mark.slow
def test_every_ddp_rank_evaluates_and_logs_the_same_miou(tmp_path):
    # Lightning's ddp re-executes the command line per rank: run it as a script in a subprocess
    script = tmp_path / "ddp_monitor.py"
    script.write_text(DDP_SCRIPT.format(out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s for s, _ in ranks[0]["history"]] == [2, 4]
    assert ranks[0]["history"] == ranks[1]["history"]  # deterministic: the ranks agree
    assert ranks[0]["logged"] == ranks[1]["logged"] == pytest.approx(ranks[0]["history"][-1][1])  # float32
