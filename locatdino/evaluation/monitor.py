"""What the online monitors of a pretraining run share (Hummingbird's in ``retrieval.monitor``,
the k-NN one in ``probes.knn_monitor``): evaluate the run's evaluated backbone every N optimizer
steps, keep the history and log one number with its cost. Each monitor says only what it measures."""

from __future__ import annotations

import time

import lightning.pytorch as pl
from torch import nn


class PeriodicMonitor(pl.Callback):
    """Calls :meth:`evaluate` on ``pl_module.eval_backbone`` every ``every_n_steps`` optimizer steps
    (``trainer.global_step``; once per step under gradient accumulation) and logs the result as
    :attr:`metric`; :meth:`report` is told the step, value and seconds taken."""

    metric: str

    def __init__(self, every_n_steps: int):
        if every_n_steps < 1:
            raise ValueError(f"{type(self).__name__}: every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._last_step = -1
        self.history: list[tuple[int, float]] = []

    def evaluate(self, backbone: nn.Module) -> float:
        raise NotImplementedError

    def report(self, pl_module: pl.LightningModule, step: int, value: float, seconds: float) -> None:
        """What a monitor logs besides :attr:`metric` (nothing by default)."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps or step == self._last_step:
            return
        self._last_step = step
        backbone = getattr(pl_module, "eval_backbone", None)
        if backbone is None:
            raise AttributeError(
                f"{type(self).__name__} needs {type(pl_module).__name__}.eval_backbone (see PretrainingObjective)"
            )
        start = time.perf_counter()
        value = self.evaluate(backbone)
        seconds = time.perf_counter() - start
        self.history.append((step, value))
        pl_module.log(self.metric, value, on_step=True, on_epoch=False)
        self.report(pl_module, step, value, seconds)
