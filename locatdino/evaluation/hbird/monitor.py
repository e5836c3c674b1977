"""Live dense-feature quality during pretraining: a small Hummingbird run every N steps.

Add to a Lightning ``Trainer`` (or a LightningCLI config)::

    trainer:
      callbacks:
        - class_path: locatdino.evaluation.hbird.HummingbirdMonitor
          init_args: {every_n_steps: 500, num_train: 64, num_val: 16}

Evaluates ``pl_module.eval_backbone`` (the EMA teacher of ``DINOModule``, the classifier's backbone
of ``SupervisedModule``; ``locatdino.ssl.PretrainingObjective``) frozen and logs
``hbird/mIoU`` (percent). Distributed runs: **every rank runs the same small evaluation** and logs
the same value (no sync needed). It costs no more wall time than rank 0 alone — the other ranks
would wait for it at the next collective anyway — it works with sharded (FSDP) teachers, whose
forward needs every rank for its all-gathers, and ``hbird/mIoU`` exists on every rank, so it can
drive ``ModelCheckpoint(monitor="hbird/mIoU")``. Everything is deterministic (seeded views,
exact search), so the ranks agree. The model's train/eval mode and the global RNG state are left
untouched (memory views draw from their own generators; the DataLoader's seed draw runs under
``torch.random.fork_rng``), so adding the monitor does not change the training run. (FSDP: not
tested here, no multi-GPU machine; DDP is, with 2 CPU ranks.)
"""

from __future__ import annotations

import torch

from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.monitor import PeriodicMonitor
from locatdino.evaluation.splits import CachedSplit, open_split


class HummingbirdMonitor(PeriodicMonitor):
    """Hummingbird mIoU of the evaluated backbone every ``every_n_steps`` optimizer steps.

    Args:
        every_n_steps: evaluation period in optimizer steps (``trainer.global_step``).
        dataset: ``"scenes"`` (built-in, default) or a labelled set of
            ``build_segmentation_dataset`` (``"voc"``, ``"ade20k"``, ``"shards"``) with ``data_dir``.
        num_train, num_val: memory and query images (a seeded subset of real datasets).
        input_size: eval resolution; scenes are rendered at this size.
        memory_size, aug_epochs, k: as in :class:`HummingbirdConfig`.
        precision: encoder precision (``FeatureExtractor``'s); fp32 by default, so the curve does
            not depend on the CPU it was measured on.
        batch_size: images per forward.
    """

    metric = "hbird/mIoU"

    def __init__(
        self,
        every_n_steps: int = 1000,
        dataset: str = "scenes",
        data_dir: str | None = None,
        train_split: str = "train",
        val_split: str = "val",
        num_train: int = 32,
        num_val: int = 8,
        input_size: int = 224,
        memory_size: int | None = None,
        aug_epochs: int = 1,
        k: int = 30,
        precision: str = "fp32",
        batch_size: int = 16,
        seed: int = 0,
    ):
        super().__init__(every_n_steps)
        self.source = (dataset, data_dir, train_split, val_split, num_train, num_val, seed)
        self.config = HummingbirdConfig(
            input_size=input_size,
            memory_size=memory_size,
            aug_epochs=aug_epochs,
            k=k,
            precision=precision,
            batch_size=batch_size,
            seed=seed,
            progress=False,
            num_workers=0,  # the sets are small and decoded once (CachedSplit): no worker processes
        )
        self._splits = None

    def splits(self) -> tuple[CachedSplit, CachedSplit]:
        """The memory and query sets, decoded once and kept in RAM."""
        if self._splits is None:
            name, data_dir, train_split, val_split, n_train, n_val, seed = self.source
            size = self.config.input_size
            self._splits = (
                CachedSplit(open_split(name, data_dir, train_split, n_train, seed, size, n_train)),
                CachedSplit(open_split(name, data_dir, val_split, n_val, seed, size, n_val)),
            )
        return self._splits

    def evaluate(self, backbone) -> float:
        """Hummingbird mIoU (percent) of a backbone on the monitor's sets."""
        train_set, val_set = self.splits()
        with torch.random.fork_rng(devices=[]):  # DataLoader draws a base seed from the global RNG
            return hummingbird(backbone, train_set, val_set, self.config).miou
