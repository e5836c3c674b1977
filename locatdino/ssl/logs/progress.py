"""``LineProgressBar``: Lightning's progress as plain lines, for a ``fit`` whose output is a file.

Lightning's default bar (tqdm) redraws itself with carriage returns: in a cluster job's log that
is one endless line. ``locatdino fit`` uses this bar instead when stdout is not a terminal
(:func:`wants_line_progress`), the same rule as :mod:`locatdino.common.progress` for every other
command: a line when training starts, one at most every ``interval`` seconds (step, epoch, the
metrics the bar would show, elapsed time), one after each validation and one at the end. Only
global rank 0 prints (Lightning disables the bar elsewhere).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar

from locatdino.common.progress import LOG_INTERVAL_S, is_terminal


def wants_line_progress(trainer_config: dict[str, Any]) -> bool:
    """Whether a ``fit`` with this trainer config should get a :class:`LineProgressBar`: progress
    is on, stdout is not a terminal, and no progress bar is configured already."""
    callbacks = trainer_config.get("callbacks") or []
    if not isinstance(callbacks, list):
        callbacks = [callbacks]
    return (
        trainer_config.get("enable_progress_bar", True) is not False
        and not is_terminal(sys.stdout)
        and not any(isinstance(c, ProgressBar) for c in callbacks)
    )


class LineProgressBar(ProgressBar):
    """Progress of ``fit`` as whole lines on stdout (see the module docstring)."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        super().__init__()
        self.interval = interval
        self._enabled = True
        self._start = self._last = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str) -> None:
        if not self._enabled:
            return
        self._last = time.monotonic()
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        metrics = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in self.get_metrics(trainer, pl_module).items()
        )
        elapsed = time.strftime("%H:%M:%S", time.gmtime(self._last - self._start))
        print(
            f"[fit] {what}: step {trainer.global_step}/{total}, epoch {trainer.current_epoch}, {elapsed}"
            + (f", {metrics}" if metrics else ""),
            flush=True,
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()
        self._line(trainer, pl_module, "training")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if time.monotonic() - self._last >= self.interval:
            self._line(trainer, pl_module, "training")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._line(trainer, pl_module, "validated")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._line(trainer, pl_module, "done")
