"""``LabelledShardDataModule``: image-level labelled batches for supervised pretraining (docs/pretraining.md).

The shard pipeline of :class:`~locatdino.data.ShardDataModule` (rank split, fixed batch count per
rank, skipped-sample counting, built-in scenes on first use), with timm's classification
augmentation instead of DINO's multi-crop and each sample's image-level label:

- ``labels: cls`` — one class index per image: the class folder of ``locatdino shards`` of an
  ImageFolder tree, the dominant object class of the built-in scenes;
- ``labels: classes.json`` — a multi-label set (the scenes: every class covering at least the
  share of the pixels the shards were written with), as a multi-hot target for a BCE loss.

Only the image and that label are read: a ``seg.png`` in the same shards never reaches training.
The number of classes comes from ``index.json`` (``classes``). Batches are ``{"image": [B, 3, H,
W], "target": [B] int64 or [B, C] float, "skipped", "skipped_keys"}``. ``val_urls`` adds a
held-out stream (one pass, un-augmented, split over ranks) for the top-1 the module logs.

YAML (LightningCLI)::

    data:
      class_path: locatdino.data.LabelledShardDataModule
      init_args:
        train_urls: data/imagenet/train
        val_urls: data/imagenet/val
        transform: {input_size: 224}        # ClassificationTransform fields
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import webdataset as wds

from locatdino.common.errors import UserError
from locatdino.data.datamodule import ShardDataModule
from locatdino.data.shards.sources import MULTILABEL_KEY
from locatdino.data.shards.stream import ShardLoader, ShardStream, expand_urls
from locatdino.data.shards.writer import INDEX_NAME
from locatdino.data.transforms.classification import ClassificationTransform


@dataclass(frozen=True)
class ImageLabel:
    """A sample's image-level label: ``cls`` → int64 index, ``classes.json`` → float multi-hot ``[C]``."""

    key: str
    num_classes: int

    def __call__(self, sample: dict[str, Any]) -> torch.Tensor:
        if self.key not in sample:
            raise ValueError(f"no '{self.key}' label")
        raw = sample[self.key].decode() if isinstance(sample[self.key], bytes) else sample[self.key]
        ids = json.loads(raw) if self.key == MULTILABEL_KEY else [int(raw)]
        if not all(0 <= i < self.num_classes for i in ids):
            raise ValueError(f"label {ids} outside the {self.num_classes} classes of index.json")
        if self.key != MULTILABEL_KEY:
            return torch.tensor(ids[0], dtype=torch.int64)
        target = torch.zeros(self.num_classes)
        target[ids] = 1.0
        return target


def collate_labelled(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``(image, target)`` pairs → ``{"image": [B, 3, H, W], "target": [B] or [B, C]}``."""
    images, targets = zip(*items)
    return {"image": torch.stack(images), "target": torch.stack(targets)}


class LabelledShardDataModule(ShardDataModule):
    """Streams ``{"image", "target"}`` batches from labelled shards (see the module docstring).

    Args:
        train_urls: shards: a directory (its ``*.tar``), a glob, a brace pattern, ``::``-joined
            parts or a list.
        val_urls: held-out shards for the validation top-1 (``None``: no validation).
        batch_size: samples per batch on each rank.
        num_workers: DataLoader worker processes per rank.
        transform: timm's augmentation (:class:`ClassificationTransform`; default: DeiT's at 224 px).
        labels: ``cls`` (single label) or ``classes.json`` (multi-label, multi-hot targets).
        resampled: draw shards with replacement in each worker (the multi-node recipe).
        batches_per_epoch: batches per rank per epoch (default: samples // (batch_size × world_size)).
        shuffle_buffer: per-worker sample shuffle buffer (1 disables).
        seed: base seed of shard/sample shuffles.
        pin_memory: pin batches for faster host→GPU copies (ignored without a GPU).
        synthetic: if > 0 and ``train_urls`` (a directory) holds no shards, write this many
            built-in scenes there in ``prepare_data``.
        synthetic_val: the same for ``val_urls`` (``val`` scenes, disjoint from the training ones).
        synthetic_size: side of the generated scenes in pixels.
        synthetic_seed: seed of the generated scenes.
    """

    def __init__(
        self,
        train_urls: str | list[str] = "shards/scenes",
        val_urls: str | list[str] | None = None,
        batch_size: int = 64,
        num_workers: int = 8,
        transform: ClassificationTransform | None = None,
        labels: Literal["cls", "classes.json"] = "cls",
        resampled: bool = False,
        batches_per_epoch: int | None = None,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        pin_memory: bool = True,
        synthetic: int = 0,
        synthetic_val: int = 0,
        synthetic_size: int = 224,
        synthetic_seed: int = 0,
    ) -> None:
        super().__init__(
            train_urls,
            batch_size,
            num_workers,
            None,
            resampled,
            batches_per_epoch,
            shuffle_buffer,
            seed,
            pin_memory,
            synthetic,
            synthetic_size,
            synthetic_seed,
        )
        self.val_urls, self.labels, self.synthetic_val = val_urls, labels, synthetic_val
        self.transform = transform or ClassificationTransform()
        self.class_names: list[str] | None = None

    @property
    def multilabel(self) -> bool:
        return self.labels == MULTILABEL_KEY

    @property
    def num_classes(self) -> int:
        if self.class_names is None:
            self.class_names = _class_names(self.train_urls, self.labels)
        return len(self.class_names)

    def prepare_data(self) -> None:
        super().prepare_data()
        if self.val_urls is not None:
            self.write_scenes(self.val_urls, self.synthetic_val, "val")

    def setup(self, stage: str | None = None) -> None:
        for key, urls in (("train_urls", self.train_urls), ("val_urls", self.val_urls)):
            if urls is not None:
                _check_labelled(key, urls, self.labels)
        super().setup(stage)

    def train_transform(self):
        return self.transform.train()

    def stream_options(self) -> dict[str, Any]:
        return {"target": ImageLabel(self.labels, self.num_classes), "collate": collate_labelled}

    def val_dataloader(self) -> ShardLoader | list:
        if self.val_urls is None:
            return []
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        stream = ShardStream(
            expand_urls(self.val_urls),
            self.transform.eval(),
            self.batch_size,
            rank=rank,
            world_size=world,
            shuffle_shards=False,
            shuffle_buffer=1,
            **self.stream_options(),
        )
        return ShardLoader(stream, num_workers=min(self.num_workers, 1))


def _class_names(urls: str | list[str], labels: str) -> list[str]:
    """The ``classes`` of the ``index.json`` beside the first shard."""
    first = expand_urls(urls)[0]
    index = Path(os.path.dirname(first) or ".") / INDEX_NAME
    names = json.loads(index.read_text()).get("classes") if index.is_file() else None
    if not names:
        raise UserError(
            f"data.init_args.train_urls: {index} lists no classes, so the {labels} labels cannot be "
            "sized (write the shards with `locatdino shards` from a class-folder tree or the scenes)"
        )
    return list(names)


def _check_labelled(key: str, urls: str | list[str], labels: str) -> None:
    """A one-line error when the first sample of the first (local) shard carries no ``labels``."""
    try:
        first = expand_urls(urls)[0]
    except FileNotFoundError as err:
        raise UserError(f"data.init_args.{key}: {err}") from None
    if not os.path.isfile(first):
        return  # remote: a sample without the label is skipped and counted
    sample = next(iter(wds.tarfile_to_samples()([{"url": first}])), {})
    if labels not in sample:
        found = ", ".join(k for k in sample if not k.startswith("__")) or "nothing"
        raise UserError(
            f"data.init_args.{key}: {first} holds no '{labels}' image-level label (found {found}); "
            "scenes written before labels existed need rewriting (delete the folder), image folders "
            "need one sub-folder per class"
        )
