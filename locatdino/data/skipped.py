"""``SkippedSamplesLogger``: make corrupt-sample skips visible during training.

The shard stream never stops on a bad sample; it drops it and records it in the batch
(``batch["skipped"]``, ``batch["skipped_keys"]``, see ``locatdino.data.shard_stream``). This
callback turns that into a metric and a warning naming the shard and key, so a silently rotting
data set shows up in the logs instead of as a mysteriously smaller epoch.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L


class SkippedSampleWarning(UserWarning):
    """A corrupt sample or shard was skipped by the data stream."""


class SkippedSamplesLogger(L.Callback):
    """Logs ``data/skipped`` (samples skipped so far on this rank) and warns for each skip.

    Args:
        max_warnings: warnings to print per rank (later skips are only counted; 0 = unlimited).
    """

    def __init__(self, max_warnings: int = 20) -> None:
        super().__init__()
        self.max_warnings = max_warnings
        self.total = 0
        self._warned = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not isinstance(batch, dict) or "skipped" not in batch:
            return
        if "skipped_keys" in batch:  # CPU-side list: reading the device tensor would sync the GPU
            notes = batch["skipped_keys"]
            self.total += sum(not n.startswith("shard error") for n in notes)
        else:
            notes = []
            self.total += int(batch["skipped"])
        for note in notes:
            self._warned += 1
            if not self.max_warnings or self._warned <= self.max_warnings:
                warnings.warn(f"rank {trainer.global_rank}: skipped {note}", SkippedSampleWarning, stacklevel=2)
            elif self._warned == self.max_warnings + 1:
                warnings.warn(f"rank {trainer.global_rank}: more skipped samples, from now on only counted in "
                              "data/skipped", SkippedSampleWarning, stacklevel=2)
        pl_module.log("data/skipped", float(self.total), on_step=True, on_epoch=False)
