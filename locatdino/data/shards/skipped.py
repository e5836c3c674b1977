"""``SkippedSamplesLogger``: make corrupt-sample skips visible during training.

The shard stream never stops on a bad sample; it drops it and records it in the batch
(``batch["skipped"]``, ``batch["skipped_keys"]``, see ``locatdino.data.shards.stream``). This
callback turns that into a metric and one log line per skip naming the shard and key, so a
silently rotting data set shows up in the logs instead of as a mysteriously smaller epoch.

Lines go through :mod:`logging` (logger ``locatdino.data.shards.skipped``), not :mod:`warnings`: Python
shows only the first of identical warnings, so a cap counted in warnings would count lines
nobody saw.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L

log = logging.getLogger(__name__)


class SkippedSamplesLogger(L.Callback):
    """Logs ``data/skipped`` (samples skipped so far on this rank) and names each skip.

    Args:
        max_warnings: skips named per rank (later ones are only counted; 0 = unlimited); past
            the cap one line says so, and the end of training gives the rank's total.
    """

    def __init__(self, max_warnings: int = 20) -> None:
        super().__init__()
        self.max_warnings = max_warnings
        self.total = 0
        self.named = 0
        self._notes = 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, dict) or "skipped" not in batch:
            return
        notes = batch.get("skipped_keys")
        # the count is read from the device only for a batch whose notes (a CPU-side list) say
        # something was dropped: reading it every step would sync the GPU every step
        if notes is None or notes:
            self.total += int(batch["skipped"])
        for note in notes or []:
            self._notes += 1
            if not self.max_warnings or self._notes <= self.max_warnings:
                self.named += 1
                log.warning("rank %d: skipped %s", trainer.global_rank, note)
            elif self._notes == self.max_warnings + 1:
                log.warning(
                    "rank %d: more than %d skips, from now on only counted (data/skipped)",
                    trainer.global_rank,
                    self.max_warnings,
                )
        pl_module.log("data/skipped", float(self.total), on_step=True, on_epoch=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._notes > self.named:
            log.warning(
                "rank %d: %d sample(s) skipped in this run, %d named above", trainer.global_rank, self.total, self.named
            )
