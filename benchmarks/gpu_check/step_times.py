"""A Lightning callback for ``benchmarks/gpu_check/``: the wall-clock time of every training step.

Added to a ``locatdino fit`` by ``--trainer.callbacks+=benchmarks.gpu_check.step_times.StepTimes`` (with
the repository root on ``PYTHONPATH``); writes ``step_times.json`` (seconds since the first step
began, one entry per finished step) into ``trainer.default_root_dir`` at the end of training, so
throughput can be taken from the steps after the first few (compilation, loader start-up)
rather than from the command's wall time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


class StepTimes(Callback):
    """Records ``time.perf_counter()`` at the start of training and after each step (CUDA synced)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.ends: list[float] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.ends.append(time.perf_counter() - self.start)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / "step_times.json"
            path.write_text(json.dumps({"step_end_s": self.ends}))
