"""Live classification quality during pretraining: DINO's k-NN top-1 every N steps.

Beside :class:`~locatdino.evaluation.hbird.HummingbirdMonitor` (dense features), add to a Lightning
``Trainer`` (or a LightningCLI config)::

    trainer:
      callbacks:
        - class_path: locatdino.evaluation.knn.KnnMonitor
          init_args: {every_n_steps: 500, dataset: imagefolder, data_dir: data/imagenet-100,
                      num_train: 2000, num_val: 500}

Every ``every_n_steps`` optimizer steps it embeds a small labelled train and validation set with
``pl_module.eval_backbone`` (DINO's EMA teacher; the class token after the final norm, as
``locatdino knn``: :func:`~locatdino.evaluation.class_features.class_token_embeddings`), labels the
validation images by DINO's weighted k-NN (:func:`~locatdino.evaluation.knn_classifier.knn_classify`) and logs
``monitor/knn_top1`` (percent) to the run's loggers (CSV, TensorBoard; ``curves.png``'s held-out
panel) and ``monitor/knn_seconds``, what it cost, with one line in the run's log (rank 0).

Distributed runs: as the Hummingbird monitor, **every rank runs the same evaluation** at once and
logs the same value (deterministic: centre crops, exact search), so it costs no more wall time
than rank 0 alone — the others would wait for it at the next collective — and a sharded
teacher's forward gets every rank it needs. The sets are opened when training starts (a wrong
folder or a class missing from the train split fails then, not after the first N steps) and
kept in RAM; the global RNG and the model's train/eval mode are left as they were.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from locatdino.evaluation.class_features import class_token_embeddings
from locatdino.evaluation.class_splits import CLASS_DATASETS, LabelledImages, SplitOptions, open_labelled_splits
from locatdino.evaluation.knn_classifier import check_temperature, knn_classify, topk_hits
from locatdino.evaluation.monitor import PeriodicMonitor
from locatdino.evaluation.precision import PRECISIONS, resolve_precision
from locatdino.models.token_grid import fitting_sizes, pads_images, patch_size

_ARGS = "KnnMonitor init_args"  # how fit's config names the monitor's arguments, in its errors


def _in_ram(images: LabelledImages) -> LabelledImages:
    """``images`` decoded once (the monitor reads them at every evaluation); ``ValueError`` naming
    the first that does not decode (the monitor's few images are all meant to be scored)."""
    decoded = []
    for i in range(len(images)):
        try:
            decoded.append(images.load(i))
        except (OSError, ValueError) as err:
            raise ValueError(f"KnnMonitor: {images.name(i)} does not decode: {err}") from None
    return LabelledImages(images.labels, images.class_names, decoded.__getitem__, images.name)


class KnnMonitor(PeriodicMonitor):
    """DINO's k-NN top-1 of the evaluated backbone's class token every ``every_n_steps`` steps.

    Args:
        every_n_steps: evaluation period in optimizer steps (``trainer.global_step``).
        dataset: ``"scenes"`` (built-in, default), ``"imagefolder"`` or ``"shard-splits"`` with
            ``data_dir`` (``locatdino knn``'s datasets and splits).
        num_train, num_val: train (neighbour) and validation images: a seeded subset of a real
            dataset, or how many scenes to render.
        input_size: centre-crop side (scenes are rendered at it).
        k, temperature: the vote of :func:`~locatdino.evaluation.knn_classifier.knn_classify` (DINO's headline
            k = 20, T = 0.07).
        precision: encoder precision; fp32 by default, so the curve does not depend on the CPU.
        batch_size: images per forward.
    """

    metric = "monitor/knn_top1"

    def __init__(
        self,
        every_n_steps: int = 1000,
        dataset: str = "scenes",
        data_dir: str | None = None,
        train_split: str = "train",
        val_split: str = "val",
        num_train: int = 64,
        num_val: int = 32,
        input_size: int = 224,
        k: int = 20,
        temperature: float = 0.07,
        precision: str = "fp32",
        batch_size: int = 32,
        seed: int = 0,
    ):
        super().__init__(every_n_steps)
        for name, value in (("num_train", num_train), ("num_val", num_val), ("input_size", input_size)):
            if value < 1:
                raise ValueError(f"{_ARGS}.{name}: must be at least 1, got {value}")
        if batch_size < 1:
            raise ValueError(f"{_ARGS}.batch_size: images per forward, must be at least 1, got {batch_size}")
        if not 1 <= k <= num_train:
            raise ValueError(f"{_ARGS}.k: {k} neighbours, must lie in [1, {_ARGS}.num_train = {num_train}]")
        try:
            check_temperature(temperature)
        except ValueError as err:
            raise ValueError(f"{_ARGS}.{err}") from None
        if precision not in PRECISIONS:
            raise ValueError(f"{_ARGS}.precision: must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if dataset not in CLASS_DATASETS:
            raise ValueError(f"{_ARGS}.dataset: must be one of {', '.join(CLASS_DATASETS)}, got {dataset!r}")
        self.k, self.temperature = k, temperature
        self.source = (dataset, data_dir, train_split, val_split, num_train, num_val, seed)
        self.input_size, self.precision, self.batch_size = input_size, precision, batch_size
        self._splits: tuple[LabelledImages, LabelledImages] | None = None

    def splits(self) -> tuple[LabelledImages, LabelledImages]:
        """The train and validation sets (labels of the train split's classes), decoded once."""
        if self._splits is None:
            dataset, data_dir, train_split, val_split, num_train, num_val, seed = self.source
            train, val = open_labelled_splits(
                dataset,
                data_dir,
                (train_split, val_split),
                (num_train, num_val),
                seed,
                self.input_size,
                (num_train, num_val),
                SplitOptions.init_args("KnnMonitor"),
            )
            self._splits = _in_ram(train), _in_ram(val)
        return self._splits

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """What the first evaluation would stumble on, checked before training starts: the input size
        against the backbone's patch, the precision on the run's device, the data."""
        backbone = getattr(pl_module, "eval_backbone", None)
        if backbone is not None and not pads_images(backbone):
            patch = patch_size(backbone)[0]
            if self.input_size % patch:
                raise ValueError(
                    f"{_ARGS}.input_size: {self.input_size} px is not a multiple of the patch size {patch} of the "
                    f"evaluated backbone (use {fitting_sizes(self.input_size, patch)})"
                )
        try:
            resolve_precision(self.precision, trainer.strategy.root_device)
        except ValueError as err:
            raise ValueError(f"{_ARGS}.precision: {err}") from None
        self.splits()  # bad data fails before training starts

    def evaluate(self, backbone: nn.Module) -> float:
        """k-NN top-1 (percent) of ``backbone``'s class tokens on the monitor's sets."""
        train, val = self.splits()
        embed = dict(precision=self.precision, batch_size=self.batch_size, workers=0, show_progress=False)
        with (
            torch.random.fork_rng(devices=[]),
            class_token_embeddings(backbone, train, self.input_size, **embed) as memory,
            class_token_embeddings(backbone, val, self.input_size, **embed) as queries,
        ):
            rankings = knn_classify(
                torch.from_numpy(np.asarray(memory.features)),
                torch.from_numpy(memory.labels),
                torch.from_numpy(np.asarray(queries.features)),
                (self.k,),
                self.temperature,
                num_classes=len(train.class_names),
            )
            hits = topk_hits(rankings[self.k], torch.from_numpy(queries.labels), 1)
        return 100 * float(hits.float().mean())

    def report(self, pl_module: pl.LightningModule, step: int, value: float, seconds: float) -> None:
        pl_module.log("monitor/knn_seconds", seconds, on_step=True, on_epoch=False)
        train, val = self.splits()
        rank_zero_info(
            f"[knn monitor] step {step}: top-1 {value:.2f} % (k {self.k}, {len(train)} train / {len(val)} "
            f"validation images, {self.input_size} px) in {seconds:.1f} s"
        )
