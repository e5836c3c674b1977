"""``ShardDataModule``: DINO multi-crop batches streamed from WebDataset shards (Lightning).

Lightning adds no DistributedSampler to an IterableDataset, so this module owns the split: it
reads the rank and world size from the trainer in ``setup`` and builds a fixed-length
``ShardStream`` (``locatdino.data.shards.stream``) per rank: every rank yields exactly
``batches_per_epoch`` batches per epoch, whatever the shard count, so DDP never hangs.

YAML (LightningCLI)::

    data:
      class_path: locatdino.data.ShardDataModule
      init_args:
        train_urls: /data/in1k/shard-{000000..001281}.tar   # or a directory, a glob, "a::b"
        batch_size: 64                                         # per rank
        num_workers: 8
        resampled: true                                        # multi-node recipe
        multicrop: {num_local_crops: 8, local_crop_size: 96}   # MultiCropTransform fields
        augment_on: gpu                                        # multi-crop on the training device

``augment_on: gpu``: the workers only decode (a uint8 ``[3, S, S]`` image and its decoded size per
sample, ``locatdino.data.transforms.decoded_images``) and ``on_after_batch_transfer`` — run by Lightning on
every rank, after the batch reached the device — applies the multi-crop to the whole batch
(:class:`~locatdino.data.transforms.gpu_multicrop.GPUMultiCrop`, kornia). Its random draws are seeded by
``(seed, rank, augmented batches so far)``; the count is part of ``state_dict``, so a resumed run
draws what the uninterrupted one would have. On a CPU-only machine the same path runs on CPU
tensors in the training process, which is slower than the default ``cpu`` (augmentation in the
workers; benchmarks/RESULTS.md, "How fast is data loading?").

A tiny CPU recipe needs no prior step: ``synthetic: 512`` writes 512 built-in scenes as shards
into ``train_urls`` (a directory) in ``prepare_data`` when it holds no shards yet.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from webdataset.utils import make_seed

from locatdino.data.shards.sources import ScenesSource
from locatdino.data.shards.stream import ShardLoader, ShardStream, expand_urls, shard_sizes
from locatdino.data.shards.writer import write_shards
from locatdino.data.transforms.decoded_images import (
    DecodedImage,
    check_decoded_size,
    collate_decoded,
    default_image_size,
)
from locatdino.data.transforms.gpu_multicrop import GPUMultiCrop
from locatdino.data.transforms.multicrop import MultiCropTransform

log = logging.getLogger(__name__)
# Lightning warns that an IterableDataset's __len__ may be wrong when workers duplicate data; each
# ShardStream worker yields its own share of exactly len() batches, so the warning does not apply.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


class ShardDataModule(L.LightningDataModule):
    """Streams DINO multi-crop batches (``{"global", "local", "skipped", "skipped_keys"}``).

    Args:
        train_urls: shards: a directory (its ``*.tar``), a glob, a brace pattern, ``::``-joined
            parts or a list.
        batch_size: samples per batch on each rank.
        num_workers: DataLoader worker processes per rank.
        multicrop: the DINO augmentation (default: docs/pretraining.md, 2 × 224 px + 8 × 96 px).
        resampled: draw shards with replacement in each worker (recommended for multi-node:
            no rank waits for a slow shard assignment and any shard count works).
        batches_per_epoch: batches per rank per epoch; default: samples in the shards (from
            ``index.json`` or the tar headers) // (batch_size × world_size), at least 1.
        shuffle_buffer: per-worker sample shuffle buffer (1 disables).
        seed: base seed of shard/sample shuffles (an epoch/rank/worker offset is added).
        pin_memory: pin batches for faster host→GPU copies (ignored without a GPU).
        synthetic: if > 0 and ``train_urls`` (a directory) holds no shards, write this many
            built-in scenes there in ``prepare_data``.
        synthetic_size: side of the generated scenes in pixels.
        synthetic_seed: seed of the generated scenes.
        augment_on: ``cpu``: the multi-crop runs in the DataLoader workers; ``gpu``: they only
            decode and the multi-crop runs batched on the training device (see the module docstring).
        decoded_size: with ``augment_on: gpu``, the side the workers resize every image to
            (default: ``decoded_images.default_image_size``, 368 px for 224 px global crops; at
            least the largest crop).
    """

    def __init__(
        self,
        train_urls: str | list[str] = "shards/scenes",
        batch_size: int = 64,
        num_workers: int = 8,
        multicrop: MultiCropTransform | None = None,
        resampled: bool = False,
        batches_per_epoch: int | None = None,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        pin_memory: bool = True,
        synthetic: int = 0,
        synthetic_size: int = 224,
        synthetic_seed: int = 0,
        augment_on: Literal["cpu", "gpu"] = "cpu",
        decoded_size: int | None = None,
    ) -> None:
        super().__init__()
        if augment_on not in ("cpu", "gpu"):
            raise ValueError(f"augment_on must be 'cpu' or 'gpu', got {augment_on!r}")
        self.train_urls, self.batch_size, self.num_workers = train_urls, batch_size, num_workers
        self.multicrop = multicrop or MultiCropTransform()
        self.resampled, self.batches_per_epoch = resampled, batches_per_epoch
        self.shuffle_buffer, self.seed, self.pin_memory = shuffle_buffer, seed, pin_memory
        self.synthetic, self.synthetic_size, self.synthetic_seed = synthetic, synthetic_size, synthetic_seed
        self.augment_on = augment_on
        self.decoded_size = (
            default_image_size(self.multicrop)
            if decoded_size is None
            else check_decoded_size(decoded_size, self.multicrop)
        )
        self.gpu_multicrop: GPUMultiCrop | None = None
        self.stream: ShardStream | None = None
        self._epoch = 0
        self._augmented = 0  # batches augmented on the device: the seed of the next one

    def prepare_data(self) -> None:
        """Write built-in scene shards into ``train_urls`` when asked and none are there yet."""
        self.write_scenes(self.train_urls, self.synthetic, "train")

    def write_scenes(self, urls: str | list[str], num_images: int, split: str) -> None:
        """``num_images`` built-in scenes of ``split`` as shards in the directory ``urls``, unless it
        already holds shards (or ``num_images`` is 0)."""
        if num_images <= 0 or _has_shards(urls):
            return
        if not isinstance(urls, str) or set("*?{[:") & set(urls):
            raise ValueError(f"synthetic={num_images} needs a directory to write {split} scenes to, got {urls!r}")
        shards = max(8, 2 * (os.cpu_count() or 1))  # enough shards for every rank and worker to start
        log.info("writing %d built-in %s scenes to %s", num_images, split, urls)
        write_shards(
            ScenesSource(num_images, self.synthetic_seed, self.synthetic_size, split),
            urls,
            maxcount=max(1, math.ceil(num_images / shards)),
            progress=False,
        )

    def setup(self, stage: str | None = None) -> None:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        self.stream = self.build_stream(rank, world)
        self.stream.check_usable()  # shards of nothing but bad samples would stream forever, silently

    def build_stream(self, rank: int = 0, world_size: int = 1) -> ShardStream:
        """The fixed-length stream of one rank (also usable without a Trainer)."""
        urls = expand_urls(self.train_urls)
        n, sizes = self.batches_per_epoch, shard_sizes(urls)
        if n is None:
            if sizes is None:
                raise ValueError("cannot count the samples of remote shards without index.json: set batches_per_epoch")
            n = sum(sizes) // (self.batch_size * world_size)
            if n == 0:
                log.warning(
                    "%d samples < batch_size %d x world_size %d: using 1 batch per epoch (samples repeat)",
                    sum(sizes),
                    self.batch_size,
                    world_size,
                )
                n = 1
        stream = ShardStream(
            urls,
            self.train_transform(),
            self.batch_size,
            num_batches=n,
            rank=rank,
            world_size=world_size,
            resampled=self.resampled,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            shard_sizes=sizes,
            **self.stream_options(),
        )
        stream.epoch = self._epoch
        return stream

    def train_transform(self) -> Callable[[Any], Any]:
        """Image → what a batch is made of: the multi-crop views, or (``augment_on: gpu``) the
        decoded image at its fixed size."""
        return self.multicrop if self.augment_on == "cpu" else DecodedImage(self.decoded_size)

    def stream_options(self) -> dict[str, Any]:
        """More ``ShardStream`` arguments (a subclass: labels, collate)."""
        if self.augment_on == "cpu":
            return {}
        return {"collate": collate_decoded, "decode": DecodedImage(self.decoded_size).decode}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """``augment_on: gpu``: the decoded images → the multi-crop batch, on the batch's device."""
        if self.augment_on != "gpu" or not isinstance(batch, dict) or "images" not in batch:
            return batch
        images, sizes = batch.pop("images"), batch.pop("sizes")
        if self.gpu_multicrop is None:
            self.gpu_multicrop = GPUMultiCrop(self.multicrop)
        rank = self.trainer.global_rank if self.trainer is not None else 0
        seed = make_seed(self.seed, rank, self._augmented)
        self._augmented += 1
        return {**batch, **self.gpu_multicrop.to(images.device)(images, sizes, seed=seed)}

    def train_dataloader(self) -> ShardLoader:
        if self.stream is None:
            self.setup("fit")
        pin = self.pin_memory and torch.cuda.is_available()
        return ShardLoader(self.stream, num_workers=self.num_workers, pin_memory=pin)

    def state_dict(self) -> dict[str, Any]:
        """The epoch counter of the stream, so a resumed run continues the shuffle sequence, and
        (``augment_on: gpu``) the augmented-batch counter, so it continues the crops' draws."""
        state = {"epoch": self.stream.epoch if self.stream is not None else self._epoch}
        if self.augment_on == "gpu":
            state["augmented_batches"] = self._augmented
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._epoch = int(state_dict.get("epoch", 0))
        self._augmented = int(state_dict.get("augmented_batches", 0))
        if self.stream is not None:
            self.stream.epoch = self._epoch


def _has_shards(urls: str | list[str]) -> bool:
    try:
        return bool(expand_urls(urls))
    except FileNotFoundError:
        return False
