"""Linear classification on a frozen backbone: DINO's ``eval_linear`` and DINOv2's fast variant.

``full`` (DINO's protocol): every epoch runs the frozen backbone on ``RandomResizedCrop`` +
flip views of the training images and trains one linear layer (weights N(0, 0.01), bias 0) on
their :class:`~locatdino.evaluation.lincls.features.LinearInput` with cross-entropy, SGD momentum
0.9, no weight decay, lr ``lr × batch / 256``, cosine-annealed to 0 over the epochs (stepped once
per epoch, as the reference's ``CosineAnnealingLR``); the validation images are scored once, at
the end, from their centre crops.

``fast`` (DINOv2's linear evaluation on cached features): every image's input computed once from
its centre crop, no augmentation; one linear layer per learning rate of a grid, all trained at
once in one pass per epoch over the same batches (one SGD parameter group each, cosine to 0 per
iteration), on the training images minus a seeded held-out share; the layer with the best
held-out top-1 is picked and scored on the validation images.

A learning rate whose scaled value is not a positive finite float32 is refused with the options; a
layer whose loss or weights stop being finite (too high a rate) ends a ``full`` run in one line
naming the rate, and drops out of the ``fast`` grid (``lr_table`` marks it), which ends only when
every rate diverged. Top-5 is reported only above 5 classes (below, every image is in it: None).

Reproducible from ``seed``: it draws the heads' initialisation (global RNG, seeded here), the
batch order (``full``: a permutation seeded by ``seed + epoch``, as DINO's ``DistributedSampler``)
and each training view (seeded by ``(seed, epoch, image)``: the same crops with any number of
workers or ranks; :mod:`locatdino.evaluation.lincls.views`).

Under a launch of many ranks (``shared``) ``full`` trains as DINO's ``eval_linear`` under DDP, each
rank on its share of every batch (:func:`train_full`), and both variants share the encoding of
the cached features; the numbers are one process's, to float error. ``--train-batch-size`` is the
global batch, cut among the ranks, so the learning rate ``lr × batch / 256`` is DINO's ``lr ×
batch_size_per_gpu × world_size / 256`` with ``batch_size_per_gpu = batch / ranks``, and does not
change with the number of ranks.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset

from locatdino.common.progress import progress
from locatdino.evaluation.class_features import eval_transform
from locatdino.evaluation.features import eval_mode
from locatdino.evaluation.lincls.cache import ClassFeatures
from locatdino.evaluation.lincls.features import LinearInput
from locatdino.evaluation.lincls.views import ClassViews, RankBatches, SeededViews, collate_views, train_transform
from locatdino.evaluation.precision import autocast, encoder_for
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.ranks import Ranks, current_ranks, gather_objects
from locatdino.evaluation.results import score
from locatdino.evaluation.views import sample_name
from locatdino.evaluation.wilson import wilson_interval

PROTOCOLS = ("full", "fast")
# DINOv2's grid of base learning rates (each × batch / 256)
LR_GRID = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)
EPOCHS = {"full": 100, "fast": 10}  # the reference's budget of each protocol
TOP5_CLASSES = 5  # top-5 says something only above this many classes
_FLOAT32 = torch.finfo(torch.float32)  # the head's arithmetic: its learning rate must be a float32


@dataclass(frozen=True)
class LinclsConfig:
    """Every setting of one linear evaluation (defaults: the references')."""

    protocol: str = "full"
    input_size: int = 224
    epochs: float | None = None  # whole passes (the shared --epochs type is a float); None: EPOCHS[protocol]
    batch_size: int = 1024  # the reference's global batch (8 GPUs × 128), cut among the ranks of a launch
    lr: float = 1e-3  # full: base lr, × batch / 256
    lr_grid: tuple[float, ...] = LR_GRID  # fast: base lrs, each × batch / 256
    holdout: float = 0.1  # fast: share of the training images that picks the lr
    last_blocks: int | None = None  # None: DINO's choice for the width (LinearInput.reference)
    avgpool: bool | None = None
    prr: bool = False
    precision: str = "fp32"
    eval_batch_size: int = 64
    cache_dir: str | None = None
    max_cache_ram_mb: int = 4096
    num_workers: int | None = None  # None: 1 beside a CPU encoder, min(8, cores) beside a GPU
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--variant must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.epochs is not None and self.epochs != int(self.epochs):
            raise ValueError(
                f"--epochs {self.epochs:g}: lincls trains whole passes (the reference's cosine steps once per epoch)"
            )
        if not self.lr_grid:
            raise ValueError("--lr-grid needs at least one learning rate")
        if not 0 < self.holdout < 1:
            raise ValueError(f"--holdout must lie in (0, 1), got {self.holdout}")
        option, rates = ("--lr", (self.lr,)) if self.protocol == "full" else ("--lr-grid", self.lr_grid)
        for lr in rates:
            scaled = self.scaled(lr)
            if not _FLOAT32.tiny <= scaled <= _FLOAT32.max:
                raise ValueError(
                    f"{option} {lr:g}: the head trains at {lr:g} x {self.batch_size} / 256 = {scaled:.3g}, which is "
                    f"no positive finite float32 (from {_FLOAT32.tiny:.3g} to {_FLOAT32.max:.3g}): pass a rate in range"
                )

    @property
    def total_epochs(self) -> int:
        return EPOCHS[self.protocol] if self.epochs is None else int(self.epochs)

    def scaled(self, lr: float) -> float:
        """The reference's linear scaling rule: ``lr × batch / 256``."""
        return lr * self.batch_size / 256

    def check_train_size(self, num_train: int) -> None:
        """``ValueError`` when a batch would exceed the images it is drawn from (the lr scales with
        the batch the user asked for, not the one the data allows)."""
        usable = num_train - self.holdout_count(num_train) if self.protocol == "fast" else num_train
        if usable < 1:
            raise ValueError(
                f"--holdout {self.holdout:g} holds out all {num_train} training images: nothing is left to train "
                "on; pass a smaller --holdout"
            )
        if self.batch_size > usable:
            raise ValueError(
                f"--train-batch-size {self.batch_size} is more than the {usable} training images"
                f"{' left after --holdout' if self.protocol == 'fast' else ''}: pass --train-batch-size "
                f"{usable} or less (the lr is scaled by batch / 256)"
            )

    def holdout_count(self, num_train: int) -> int:
        return max(1, round(self.holdout * num_train))


@dataclass
class LinclsResult:
    """One model's linear evaluation: top-1 / top-5 (%) on the validation images with 95 % Wilson
    intervals, the per-image top-1 hits (for paired Δ), and what ran."""

    top1: float
    top5: float | None  # None with at most 5 classes
    top1_interval: tuple[float, float]
    top5_interval: tuple[float, float] | None
    num_train: int
    num_val: int
    skipped: dict[str, list[str]]  # per split: the samples that did not decode
    lr: float  # the effective (scaled) lr of the scored layer
    linear_input: dict[str, Any]
    config: dict[str, Any]
    lr_table: list[dict[str, Any]] = field(default_factory=list)  # fast: every lr's held-out / val top-1
    timings: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    hits: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """The model's record in ``results.json`` (:mod:`locatdino.evaluation.results`)."""
        kept = {
            k: v for k, v in asdict(self).items() if k not in ("hits", "top1", "top5", "top1_interval", "top5_interval")
        }
        scores = {"top1": score(self.top1, self.top1_interval), "top5": score(self.top5, self.top5_interval)}
        return {"scores": {"": scores}, **kept}


def linear_layer(dim: int, num_classes: int) -> nn.Linear:
    """The reference's classifier: one linear layer, weights N(0, 0.01), bias 0."""
    layer = nn.Linear(dim, num_classes)
    nn.init.normal_(layer.weight, mean=0.0, std=0.01)
    nn.init.zeros_(layer.bias)
    return layer


def ranked_classes(logits: Tensor) -> Tensor:
    """``[M, min(5, C)]`` class ids, best first."""
    return logits.topk(min(5, logits.shape[-1]), dim=-1).indices


def finite(head: nn.Module) -> bool:
    """Whether every weight of ``head`` is finite (a rate too high overflows them to inf / NaN)."""
    return all(bool(torch.isfinite(p).all()) for p in head.parameters())


def _diverged(cfg: LinclsConfig, base_lr: float, epoch: int) -> ValueError:
    option = "--lr" if cfg.protocol == "full" else "--lr-grid"
    return ValueError(
        f"the linear layer's loss or weights are no longer finite after epoch {epoch} at lr {cfg.scaled(base_lr):.3g} "
        f"({option} {base_lr:g} x {cfg.batch_size} / 256): pass a smaller {option}"
    )


def _workers(cfg: LinclsConfig, device: torch.device) -> int:
    if cfg.num_workers is not None:
        return cfg.num_workers
    return 1 if device.type == "cpu" else min(8, os.cpu_count() or 1)


def _accuracy(ranked: Tensor, labels: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per image: top-1 and top-5 hits."""
    hit = ranked == labels[:, None]
    return hit[:, 0].numpy(), hit.any(1).numpy()


def encode(
    model: nn.Module,
    inputs: LinearInput,
    dataset: Any,
    cfg: LinclsConfig,
    device: torch.device,
    what: str,
    shared: bool = False,
) -> tuple[ClassFeatures, list[int]]:
    """Every image's classifier input from its centre crop, and the indices of those that did not
    decode; ``shared``: each rank of the process group encodes its share, every rank gets all."""
    model, precision = encoder_for(model, cfg.precision, device)
    dim = inputs.dim(int(model.num_features))
    store = ClassFeatures(len(dataset), dim, cfg.cache_dir, cfg.max_cache_ram_mb << 20)
    share = (current_ranks() if shared else Ranks()).share(len(dataset))
    loader = DataLoader(
        Subset(ClassViews(dataset, eval_transform(cfg.input_size)), share),
        batch_size=cfg.eval_batch_size,
        num_workers=_workers(cfg, device),
        collate_fn=collate_views,
    )
    skipped = []
    try:
        with eval_mode(model), torch.inference_mode(), autocast(precision, device):
            for images, labels, indices, bad in progress(loader, desc=what, disable=not cfg.progress, leave=False):
                skipped += bad
                if len(images):
                    store.put(indices, inputs(model, images.to(device)), labels)
        store.share_rows(share)
    except BaseException:
        store.close()
        raise
    return store, sorted(gather_objects(skipped))


def _sum_over_ranks(value: int, ranks: Ranks, device: torch.device) -> int:
    """``value`` summed over the ranks of the process group (itself in one process)."""
    if not ranks.many:
        return value
    total = torch.tensor(value, device=device)  # NCCL's collectives take GPU tensors
    dist.all_reduce(total)
    return int(total)


def train_full(
    model: nn.Module,
    inputs: LinearInput,
    train_set: Any,
    num_classes: int,
    cfg: LinclsConfig,
    device: torch.device,
    shared: bool = False,
) -> tuple[nn.Linear, list[int]]:
    """DINO's protocol: the trained linear layer and the training samples that did not decode.

    ``shared``: the ranks of the process group train it together, as DINO's ``eval_linear`` under
    DDP: each rank runs the backbone on its share of every global batch of ``cfg.batch_size``
    (:class:`~locatdino.evaluation.lincls.views.RankBatches`) and the layer is wrapped in
    ``DistributedDataParallel``, which averages the ranks' gradients. Each rank's mean loss is
    weighted by its share of the batch's decoded images, so the average is the mean over the whole
    batch however unevenly it is cut: every step is one process's step, to float error."""
    ranks = current_ranks() if shared else Ranks()
    encoder, precision = encoder_for(model, cfg.precision, device)
    torch.manual_seed(cfg.seed)
    dim = inputs.dim(int(model.num_features))
    head = linear_layer(dim, num_classes).to(device)
    trained = head
    if ranks.many:  # the process group's backend: gloo on the CPU, NCCL on a GPU
        trained = DistributedDataParallel(head, device_ids=[device] if device.type == "cuda" else None)
    batches = RankBatches(len(train_set), cfg.batch_size, cfg.seed, ranks)
    loader = DataLoader(
        SeededViews(train_set, train_transform(cfg.input_size), cfg.seed),
        batch_sampler=batches,
        num_workers=_workers(cfg, device),
        collate_fn=collate_views,
    )
    optimizer = torch.optim.SGD(head.parameters(), lr=cfg.scaled(cfg.lr), momentum=0.9, weight_decay=0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, cfg.total_epochs, eta_min=0)
    skipped, finite_loss = [], torch.ones((), dtype=torch.bool, device=device)
    with eval_mode(encoder):
        for epoch in progress(range(cfg.total_epochs), desc="epochs", disable=not cfg.progress, leave=False):
            batches.set_epoch(epoch)
            for images, labels, _, bad in loader:
                skipped += bad if epoch == 0 else []  # the same samples fail every epoch
                count = len(images)
                total = _sum_over_ranks(count, ranks, device)
                if not total:  # no image of the global batch decodes: no step, on any rank
                    continue
                feats = torch.zeros(0, dim, device=device)
                if count:
                    with torch.no_grad(), autocast(precision, device):
                        feats = inputs(encoder, images.to(device))
                logits = trained(feats.float())
                if count:  # this rank's mean x its share of the batch x the ranks, which DDP's average divides by
                    loss = F.cross_entropy(logits, labels.to(device)) * (count * ranks.world_size / total)
                else:  # nothing here: a zero gradient, still averaged with the others'
                    loss = logits.sum() * 0
                finite_loss &= torch.isfinite(loss)  # no sync per step: read once an epoch
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if epoch == 0:
                skipped = sorted(gather_objects(skipped))
            if len(skipped) == len(train_set):  # nothing decodes: no use running the other epochs
                break
            if _sum_over_ranks(int(not (bool(finite_loss) and finite(head))), ranks, device):  # all stop together
                raise _diverged(cfg, cfg.lr, epoch + 1)
            schedule.step()
    return head.cpu(), skipped


def train_fast(
    features: ClassFeatures, rows: np.ndarray, num_classes: int, cfg: LinclsConfig, device: torch.device
) -> list[nn.Linear]:
    """DINOv2's variant: one linear layer per lr of ``cfg.lr_grid``, trained at once on the
    cached features of images ``rows`` (same batches for all; a layer that diverges harms no
    other: each has its own parameters, and the summed loss gives each its own gradient)."""
    torch.manual_seed(cfg.seed)
    heads = nn.ModuleList(linear_layer(features.features.shape[1], num_classes) for _ in cfg.lr_grid).to(device)
    groups = [{"params": head.parameters(), "lr": cfg.scaled(lr)} for head, lr in zip(heads, cfg.lr_grid)]
    optimizer = torch.optim.SGD(groups, momentum=0.9, weight_decay=0)
    steps_per_epoch = math.ceil(len(rows) / cfg.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, cfg.total_epochs * steps_per_epoch, eta_min=0)
    generator = torch.Generator().manual_seed(cfg.seed)
    for _ in progress(range(cfg.total_epochs), desc="epochs", disable=not cfg.progress, leave=False):
        order = rows[torch.randperm(len(rows), generator=generator).numpy()]
        for start in range(0, len(order), cfg.batch_size):
            feats, labels = features.rows(order[start : start + cfg.batch_size], device)
            loss = sum(F.cross_entropy(head(feats), labels) for head in heads)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return [head.cpu() for head in heads]


def holdout_split(rows: np.ndarray, cfg: LinclsConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(training rows, held-out rows)``: a seeded random share ``cfg.holdout`` of ``rows`` held out."""
    shuffled = np.random.default_rng(cfg.seed).permutation(rows)
    count = cfg.holdout_count(len(rows))
    return np.sort(shuffled[count:]), np.sort(shuffled[:count])


def _check_finite_grid(heads: list[nn.Linear], cfg: LinclsConfig) -> list[bool]:
    """Which layers of the grid stayed finite; ``ValueError`` naming the rates when none did."""
    kept = [finite(head) for head in heads]
    if not any(kept):
        rates = ", ".join(f"{lr:g}" for lr in cfg.lr_grid)
        raise ValueError(
            f"the linear layer's weights are no longer finite after {cfg.total_epochs} epochs at every rate of "
            f"--lr-grid ({rates}, each x {cfg.batch_size} / 256): pass smaller rates"
        )
    return kept


def _ranked(head: nn.Linear, features: ClassFeatures, rows: np.ndarray, batch: int = 4096) -> tuple[Tensor, Tensor]:
    ranked, labels = [], []
    with torch.no_grad():
        for start in range(0, len(rows), batch):
            feats, y = features.rows(rows[start : start + batch])
            ranked.append(ranked_classes(head(feats)))
            labels.append(y)
    return torch.cat(ranked), torch.cat(labels)


def top1_of(head: nn.Linear, features: ClassFeatures, rows: np.ndarray) -> float:
    """Top-1 (%) of ``head`` on the cached images ``rows``."""
    ranked, labels = _ranked(head, features, rows)
    return 100 * float(_accuracy(ranked, labels)[0].mean())


def _names(dataset: Any, indices: list[int]) -> list[str]:
    """Where the samples ``indices`` come from (a path, ``shard:key``), for the report."""
    name = getattr(dataset, "name", None)
    return [name(i) if callable(name) else sample_name(dataset, i) for i in indices]


def _check_decoded(train_set: Any, skipped: list[int]) -> None:
    if len(skipped) == len(train_set):
        raise ValueError(
            f"none of the {len(train_set)} training images decodes (first: "
            f"{_names(train_set, skipped[:1])[0]}): nothing to train on"
        )


def linear_classification(
    model: nn.Module,
    train_set: Any,
    val_set: Any,
    num_classes: int,
    cfg: LinclsConfig,
    device: torch.device,
    shared: bool = False,
) -> LinclsResult:
    """One frozen model's linear evaluation by ``cfg.protocol`` (see the module docstring);
    ``shared``: the ranks of the process group share the encoding of cached features (:func:`encode`)."""
    inputs = LinearInput.reference(model, cfg.last_blocks, cfg.avgpool, cfg.prr)
    model = model.to(device)
    provenance = run_provenance()
    clock, timings, lr_table = time.perf_counter(), {}, []
    if cfg.protocol == "full":
        head, train_skipped = train_full(model, inputs, train_set, num_classes, cfg, device, shared)
        _check_decoded(train_set, train_skipped)
        lr = cfg.scaled(cfg.lr)
    else:
        train_store, train_skipped = encode(model, inputs, train_set, cfg, device, "train features", shared)
        try:
            _check_decoded(train_set, train_skipped)
            timings["train_features"] = time.perf_counter() - clock
            fit_rows, held_rows = holdout_split(train_store.usable(), cfg)
            if not len(fit_rows):
                raise ValueError(
                    f"{len(held_rows)} of the {len(train_set)} training images decode and --holdout takes them "
                    "all: nothing is left to train on"
                )
            heads = train_fast(train_store, fit_rows, num_classes, cfg, device)
            kept = _check_finite_grid(heads, cfg)
            held = [top1_of(head, train_store, held_rows) if ok else None for head, ok in zip(heads, kept)]
        finally:
            train_store.close()
        best = int(np.argmax([-1.0 if score is None else score for score in held]))  # ties: the smallest lr
        head, lr = heads[best], cfg.scaled(cfg.lr_grid[best])
    timings["train"] = time.perf_counter() - clock - timings.get("train_features", 0.0)
    mark = time.perf_counter()
    val_store, val_skipped = encode(model, inputs, val_set, cfg, device, "val features", shared)
    try:
        rows = val_store.usable()
        if not len(rows):
            raise ValueError(f"none of the {len(val_set)} validation images decodes: nothing to score")
        ranked, labels = _ranked(head, val_store, rows)
        if cfg.protocol == "fast":
            lr_table = [
                {
                    "base_lr": base,
                    "lr": cfg.scaled(base),
                    "holdout_top1": None if score is None else round(score, 4),  # None: diverged
                    "val_top1": None if score is None else round(top1_of(layer, val_store, rows), 4),
                }
                for base, score, layer in zip(cfg.lr_grid, held, heads)
            ]
    finally:
        val_store.close()
    timings["evaluate"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - clock
    top1, top5 = _accuracy(ranked, labels)
    top5 = top5 if num_classes > TOP5_CLASSES else None  # with at most 5 classes every image is in its top 5

    def interval(hits: np.ndarray | None) -> tuple[float, ...] | None:
        return None if hits is None else tuple(round(100 * v, 4) for v in wilson_interval(int(hits.sum()), len(hits)))

    return LinclsResult(
        top1=round(100 * float(top1.mean()), 4),
        top5=None if top5 is None else round(100 * float(top5.mean()), 4),
        top1_interval=interval(top1),
        top5_interval=interval(top5),
        num_train=len(train_set) - len(train_skipped),
        num_val=len(top1),
        skipped={"train": _names(train_set, train_skipped), "val": _names(val_set, val_skipped)},
        lr=lr,
        linear_input=inputs.to_dict(),
        config={**asdict(cfg), "epochs": cfg.total_epochs, "lr_grid": list(cfg.lr_grid)},
        lr_table=lr_table,
        timings={k: round(v, 3) for k, v in timings.items()},
        provenance=provenance,
        hits=top1,
    )
