"""The dense linear probe, end to end (docs/evaluation.md): the paper's segmentation metric.

    train split ─ TrainViews ─ frozen backbone ─ [FeatureStore] ─ LinearSegHead ─ cross-entropy
    val split ─── EvalViews ─── frozen backbone ─ LinearSegHead ─ upsample ─ ConfusionMatrix

The backbone is frozen (eval mode, ``requires_grad=False``, inference mode) and gives the last
block's patch tokens without final norm or PRR (:class:`~locatdino.evaluation.features.
FeatureExtractor` with ``l2_normalize=False``); only the head trains, with the paper's AdamW and
OneCycle schedule (:mod:`~locatdino.evaluation.linprobe.one_cycle`), batch 32, for ``iterations`` steps (or
``epochs`` passes over the training set). ``augment="reference"`` is the paper's augmentation
(:mod:`~locatdino.evaluation.linprobe.transforms`), recomputing the backbone every iteration;
``augment="off"`` trains on whole images resized to ``S × S`` and, with ``cache`` (default),
computes each image's tokens once (:class:`~locatdino.evaluation.linprobe.feature_store.FeatureStore`) — the
cheap, deterministic variant; both paths feed the head the same batches in the same order.
``variant="dinov2" | "dinov2-ms"`` swaps in DINOv2's tokens, head, schedule, crop range and
multi-scale evaluation (:mod:`~locatdino.evaluation.linprobe.dinov2_protocol`); the loop and the data stay these.

On many ranks (``shared``, ``locatdino.evaluation.ranks``) each rank encodes its contiguous share of the
training images into the feature store (the cached path) and the stores are gathered, so every rank
trains the same head on the same batches; the uncached path trains on every rank as in one process.
Rank 0's head (:func:`~locatdino.evaluation.ranks.broadcast_module`) then scores each rank's share of the
query images and the confusion matrices are gathered in image order: one process's numbers.

The score is the mIoU of the identity mapping from :class:`~locatdino.evaluation.metric.
ConfusionMatrix` (Hummingbird's metric) over every original pixel of the query images; one
confusion matrix per query image is kept (``image_confusions``) for paired bootstraps.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from locatdino.common.progress import progress
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.linprobe import dinov2_protocol as dinov2
from locatdino.evaluation.linprobe.dinov2_head import BatchNormLinearHead
from locatdino.evaluation.linprobe.dinov2_protocol import PAPER
from locatdino.evaluation.linprobe.feature_store import FeatureStore
from locatdino.evaluation.linprobe.head import LinearSegHead
from locatdino.evaluation.linprobe.one_cycle import LR, MIN_STEPS, WEIGHT_DECAY, one_cycle, probe_optimizer
from locatdino.evaluation.linprobe.transforms import IGNORE
from locatdino.evaluation.linprobe.views import EvalViews, TrainViews, collate_items, draw_order, stack_pairs
from locatdino.evaluation.metric import ConfusionMatrix, gather_confusions
from locatdino.evaluation.phase_clock import PhaseClock
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.ranks import Ranks, broadcast_module, current_ranks, gather_objects, gather_rows
from locatdino.evaluation.results import score
from locatdino.evaluation.splits import split_share

PROBE_AUGMENT = ("reference", "off")
_LOSS_POINTS = 50  # entries of the recorded loss curve


@dataclass
class LinearProbeConfig:
    """Every setting of one probe (defaults: the paper's protocol)."""

    input_size: int = 512  # training crop side; evaluation short side
    iterations: int = 20_000
    epochs: float | None = None  # when set: iterations = ceil(epochs × train images / batch)
    batch_size: int = 32
    lr: float = LR
    weight_decay: float = WEIGHT_DECAY
    augment: str = "reference"  # reference (the paper's) | off (whole images, cacheable)
    cache: bool = True  # with augment off: each image's features computed once
    cache_dir: str | None = None  # where a feature store too large for RAM is memory-mapped
    max_cache_ram_mb: int = 4096
    layer: int = -1
    norm: bool = False
    prr: bool = False
    precision: str = "auto"  # encoder arithmetic (locatdino.evaluation.precision)
    eval_batch_size: int = 16
    num_workers: int | None = None  # None: 1 for a CPU encoder, else min(8, cores)
    seed: int = 0
    progress: bool = True
    variant: str = PAPER  # paper | dinov2 | dinov2-ms: DINOv2's head, schedule and evaluation (dinov2_protocol)

    def __post_init__(self) -> None:
        if self.variant not in dinov2.VARIANTS:
            raise ValueError(f"variant must be one of {dinov2.VARIANTS}, got {self.variant!r}")
        if self.variant != PAPER and self.prr:
            raise ValueError(f"--prr is not part of --variant {self.variant} (DINOv2 takes the blocks' tokens)")
        if self.augment not in PROBE_AUGMENT:
            raise ValueError(f"augment must be one of {PROBE_AUGMENT}, got {self.augment!r}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("batch sizes must be >= 1")
        if self.epochs is None and self.iterations < MIN_STEPS:
            raise ValueError(
                f"iterations (--iters) must be >= {MIN_STEPS} (the OneCycle schedule), got {self.iterations}"
            )
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr (--lr) must be a positive number, got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight decay (--weight-decay) must be a number >= 0, got {self.weight_decay}")

    def epoch_iterations(self, num_train: int) -> int | None:
        """Iterations ``epochs`` passes over ``num_train`` images ask for, before the schedule's
        minimum is applied (None without ``epochs``)."""
        return None if self.epochs is None else math.ceil(self.epochs * num_train / self.batch_size)

    def total_iterations(self, num_train: int) -> int:
        if self.epochs is None:
            return self.iterations
        return max(MIN_STEPS, self.epoch_iterations(num_train))

    def check_train_size(self, num_train: int, flag: str = "--train-batch-size") -> None:
        """``ValueError`` when a training batch would exceed the training set (each image drawn
        several times per batch; a huge batch once allocated its whole draw order and was
        killed for memory)."""
        if self.batch_size > num_train:
            raise ValueError(
                f"batch size ({flag}) {self.batch_size} is more than the {num_train} training "
                f"images: use at most {num_train}"
            )

    @property
    def cached(self) -> bool:
        return self.cache and self.augment == "off"


@dataclass
class LinearProbeResult:
    """Scores in percent, timings in seconds; ``image_confusions`` (one confusion matrix per scored
    query image, for paired intervals) is left out of :meth:`to_dict`."""

    miou: float
    pixel_accuracy: float
    per_class_iou: dict[str, float | None]
    num_train: int
    num_val: int
    skipped: int
    iterations: int
    loss_curve: list[tuple[int, float]]
    timings: dict[str, float]
    peak_rss_mb: float
    features: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    single_scale_miou: float | None = None  # DINOv2 variants: the first scale alone, unflipped
    image_confusions: ImageConfusions | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The model's record in ``results.json``: the scores in the schema every command shares
        (:mod:`locatdino.evaluation.results`; no single-run interval), then every field."""
        scores = {"miou": score(self.miou), "pixel_accuracy": score(self.pixel_accuracy)}
        return {"scores": {"": scores}, **{k: v for k, v in vars(self).items() if k != "image_confusions"}}


def _workers(cfg: LinearProbeConfig, device: torch.device) -> int:
    """DataLoader workers: one beside a CPU encoder (more steal its cores), up to 8 beside a GPU."""
    if cfg.num_workers is not None:
        return cfg.num_workers
    return 1 if device.type == "cpu" else min(8, os.cpu_count() or 1)


def _seeded_head(dim: int, num_classes: int, seed: int, device: torch.device, variant: str = PAPER) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = LinearSegHead(dim, num_classes) if variant == PAPER else BatchNormLinearHead(dim, num_classes)
        return head.to(device)


def _loss(head: nn.Module, feats: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy averaged over *every* pixel of the batch, ignored ones counting 0: the
    official decoder's (MMSegmentation's ``CrossEntropyLoss`` with its default
    ``avg_non_ignore=False``), where PyTorch's ``reduction='mean'`` would average over the labelled
    pixels only (and give NaN for a batch without any)."""
    logits = head(feats, tuple(targets.shape[-2:]))
    return F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum") / targets.numel()


def _store_features(
    extractor: FeatureExtractor, dataset: Any, cfg: LinearProbeConfig, workers: int, clock: PhaseClock, share: range
) -> tuple[FeatureStore, int]:
    """Every training image's tokens and targets, computed once (augmentation off); this rank
    encodes images ``share`` and the ranks' shares are gathered (all of them in one process)."""
    grid = extractor.grid(cfg.input_size)
    store = FeatureStore(len(dataset), extractor.dim, grid, cfg.input_size, cfg.cache_dir, cfg.max_cache_ram_mb << 20)
    try:
        views = Subset(_Indexed(TrainViews(dataset, np.arange(len(dataset)), cfg.input_size)), share)
        loader = DataLoader(views, batch_size=cfg.batch_size, num_workers=workers, collate_fn=collate_items)
        skipped = 0
        batches = progress(loader, desc="features", disable=not cfg.progress, leave=False)
        for items, n_bad in clock.iterate(batches, "data"):
            skipped += n_bad
            if items:
                indices, pairs = zip(*items)
                images, targets = stack_pairs(list(pairs))
                with clock("features"):
                    store.put(indices, _tokens(extractor, images), targets)
        if len(share) < len(dataset):  # the other ranks' images
            with clock("data"):
                for array in (store.features, store.targets, store.filled):
                    gather_rows(array[share.start : share.stop], out=array)
                skipped = sum(gather_objects([skipped]))
    except BaseException:
        store.close()
        raise
    return store, skipped


class _Indexed(torch.utils.data.Dataset):
    """``(k, views[k])`` items (None stays None), so a batch knows which images it holds."""

    def __init__(self, views: TrainViews):
        self.views = views

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, k: int) -> tuple[int, Any] | None:
        item = self.views[k]
        return None if item is None else (k, item)


def _tokens(extractor: FeatureExtractor, images: Tensor) -> Tensor:
    """``[B, D, h, w]`` frozen tokens, a normal tensor (inference tensors cannot enter autograd)."""
    return extractor(images).permute(0, 3, 1, 2).clone()


def _batches(
    extractor: FeatureExtractor,
    train_set: Any,
    order: np.ndarray,
    cfg: LinearProbeConfig,
    workers: int,
    clock: PhaseClock,
    skipped: list[int],
    share: range,
) -> Iterator[tuple[Tensor, Tensor]]:
    """``(features, targets)`` of each iteration, from the feature store (whose images ``share`` this
    rank encodes) or from the backbone."""
    device = extractor.device
    if cfg.cached:
        store, bad = _store_features(extractor, train_set, cfg, workers, clock, share)
        skipped[0] += bad
        try:
            for row in order:
                with clock("data"):
                    row = row[store.filled[row]]  # images that failed to decode are left out, as below
                    batch = store.batch(row, device) if len(row) else _empty_batch(extractor, cfg.input_size)
                yield batch
        finally:
            store.close()
        return
    augmentation = dinov2.probe_augmentation(cfg.variant, cfg.input_size) if cfg.augment == "reference" else None
    views = TrainViews(train_set, order, cfg.input_size, augmentation, cfg.seed)
    loader = DataLoader(views, batch_size=cfg.batch_size, num_workers=workers, collate_fn=collate_items)
    for items, n_bad in clock.iterate(loader, "data"):
        skipped[0] += n_bad
        if not items:
            yield _empty_batch(extractor, cfg.input_size)
            continue
        images, targets = stack_pairs(items)
        with clock("features"):
            feats = _tokens(extractor, images)
        yield feats, targets.to(device)


def _empty_batch(extractor: FeatureExtractor, size: int) -> tuple[Tensor, Tensor]:
    """A batch without a labelled pixel (every sample failed to decode): the iteration still
    counts, so the schedule stays the same, but nothing is learned from it."""
    grid = extractor.grid(size)
    return (
        torch.zeros(1, extractor.dim, grid, grid, device=extractor.device),
        torch.full((1, size, size), IGNORE, device=extractor.device),
    )


def train_head(
    extractor: FeatureExtractor,
    train_set: Any,
    cfg: LinearProbeConfig,
    clock: PhaseClock | None = None,
    shared: bool = False,
) -> tuple[LinearSegHead, list[tuple[int, float]], int]:
    """Train the head on the frozen tokens of ``train_set``; returns it, the loss curve
    ``[(iteration, mean loss since the previous point)]`` and the number of skipped samples
    (corrupt images: once on the cached path, at every draw on the uncached one). ``shared``: the
    ranks of the process group share the cached path's encoding and every rank returns rank 0's head."""
    clock = clock or PhaseClock()
    share = (current_ranks() if shared else Ranks()).share(len(train_set))
    iterations = cfg.total_iterations(len(train_set))
    order = draw_order(len(train_set), iterations, cfg.batch_size, cfg.seed)
    head = _seeded_head(extractor.dim, train_set.num_classes, cfg.seed, extractor.device, cfg.variant)
    optimizer = probe_optimizer(head.parameters(), cfg.lr, cfg.weight_decay)
    schedule = (
        one_cycle(optimizer, cfg.lr, iterations) if cfg.variant == PAPER else dinov2.poly_warmup(optimizer, iterations)
    )
    every = max(1, iterations // _LOSS_POINTS)
    curve, running, skipped = [], [], [0]
    head.train()
    batches = _batches(extractor, train_set, order, cfg, _workers(cfg, extractor.device), clock, skipped, share)
    progress_bar = progress(total=iterations, desc="linear probe", disable=not cfg.progress, leave=False)
    with contextlib.closing(batches), progress_bar:
        for it, (feats, targets) in enumerate(batches, start=1):
            with clock("head"):
                loss = _loss(head, feats, targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
            running.append(loss.item())
            if it % every == 0 or it == iterations:
                curve.append((it, round(float(np.mean(running)), 5)))
                running.clear()
                progress_bar.set_postfix(loss=curve[-1][1])
            progress_bar.update()
    return broadcast_module(head.eval()) if shared else head.eval(), curve, skipped[0]


def predict_labels(logits: Tensor, ignore_index: int | None) -> Tensor:
    """Class ids ``[B, H, W]`` of logits ``[B, C, H, W]``; an ignore value that is a label (ADE20K's
    and Pascal Context's 0) is never predicted: it is not a class."""
    if ignore_index is not None and 0 <= ignore_index < logits.shape[1]:
        logits = logits.clone()
        logits[:, ignore_index] = -torch.inf
    return logits.argmax(1)


@torch.no_grad()
def predict_images(extractor: FeatureExtractor, head: nn.Module, images: Tensor, ignore_index: int | None) -> Tensor:
    """Labels ``[B, S, S]`` of uint8 images ``[B, 3, S, S]`` (the figures' query images)."""
    logits = head(_tokens(extractor, images), tuple(images.shape[-2:]))
    return predict_labels(logits, ignore_index).cpu()


@torch.no_grad()
def evaluate_head(
    extractor: FeatureExtractor, head: nn.Module, dataset: Any, cfg: LinearProbeConfig, clock: PhaseClock | None = None
) -> tuple[ConfusionMatrix, int]:
    """Score ``head`` on every image of ``dataset`` at its original resolution: the confusion matrix,
    with one matrix per scored image (``.images``), and the number of skipped samples."""
    clock = clock or PhaseClock()
    ignore = dataset.ignore_index
    cm, skipped = ConfusionMatrix(dataset.num_classes, ignore, keep_images=True), 0
    views = EvalViews(dataset, cfg.input_size, extractor.patch_size)
    loader = DataLoader(
        views, batch_size=cfg.eval_batch_size, num_workers=_workers(cfg, extractor.device), collate_fn=collate_items
    )
    for items, n_bad in clock.iterate(progress(loader, desc="evaluate", disable=not cfg.progress, leave=False), "data"):
        skipped += n_bad
        groups: dict[tuple[int, ...], list[tuple[Tensor, tuple[int, int], Tensor]]] = {}
        for item in items:  # images of one padded size go through the backbone together
            groups.setdefault(tuple(item[0].shape), []).append(item)
        for group in groups.values():
            images = torch.stack([g[0] for g in group])
            with clock("features"):
                feats = _tokens(extractor, images)
            with clock("head"):
                logits = head(feats, tuple(images.shape[-2:]))
            for (_, (h, w), mask), one in zip(group, logits):
                with clock("head"):
                    one = F.interpolate(
                        one[None, :, :h, :w], size=tuple(mask.shape), mode="bilinear", align_corners=False
                    )
                    pred = predict_labels(one, ignore)[0].cpu()
                cm.update(pred, mask)
    return cm, skipped


def linear_probe(
    model: nn.Module,
    train_set: Any,
    val_set: Any,
    cfg: LinearProbeConfig | None = None,
    inspect: Callable[[FeatureExtractor, LinearSegHead], None] | None = None,
    shared: bool = False,
) -> LinearProbeResult:
    """Train the paper's head on the frozen tokens of ``model`` over ``train_set``, score it on
    ``val_set``. ``inspect(extractor, head)``, when given, is called with the trained head (not
    timed; ``locatdino compare`` draws its predictions). ``shared``: the ranks of the process group
    share the encoding of the cached training features and of the query images (module docstring),
    every rank gets the result."""
    cfg = cfg or LinearProbeConfig()
    if train_set.num_classes != val_set.num_classes:
        raise ValueError(f"train split has {train_set.num_classes} classes, val split {val_set.num_classes}")
    if len(train_set) == 0 or len(val_set) == 0:
        raise ValueError(f"empty split: {len(train_set)} train / {len(val_set)} val images")
    cfg.check_train_size(len(train_set))
    model.eval().requires_grad_(False)
    extractor = dinov2.frozen_tokens(model, cfg)  # the paper's block --layer, or the variant's blocks
    extractor.grid(cfg.input_size)  # an input size the patch does not divide fails before any work
    clock, provenance, start = PhaseClock(), run_provenance(), time.perf_counter()
    head, curve, skipped_train = train_head(extractor, train_set, cfg, clock, shared)
    single = None
    queries = split_share(val_set, (current_ranks() if shared else Ranks()).share(len(val_set)))
    if cfg.variant == PAPER:
        cm, skipped_val = evaluate_head(extractor, head, queries, cfg, clock)
    else:
        workers = _workers(cfg, extractor.device)
        cm, single, skipped_val = dinov2.evaluate_variant(extractor, head, queries, cfg.variant, cfg, workers, clock)
    if shared:
        cm, skipped_val = gather_confusions(cm), sum(gather_objects([skipped_val]))
        single = None if single is None else gather_confusions(single)
    timings = {k: round(v, 3) for k, v in clock.totals.items()}
    timings["total"] = round(time.perf_counter() - start, 3)
    if inspect is not None:
        inspect(extractor, head)
    scores = cm.compute("identity")
    names = list(getattr(val_set, "class_names", None) or range(cm.num_classes))
    return LinearProbeResult(
        miou=100 * scores.miou,
        pixel_accuracy=100 * scores.pixel_accuracy,
        per_class_iou={str(n): None if np.isnan(v) else round(100 * float(v), 4) for n, v in zip(names, scores.iou)},
        num_train=len(train_set),
        num_val=len(val_set),
        skipped=skipped_train + skipped_val,
        iterations=cfg.total_iterations(len(train_set)),
        loss_curve=curve,
        timings=timings,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        features={
            "precision": extractor.precision,
            "dim": extractor.dim,
            "patch_size": extractor.patch_size,
            "cached": cfg.cached,
        },
        config=asdict(cfg),
        provenance=provenance,
        single_scale_miou=None if single is None else 100 * single.compute("identity").miou,
        image_confusions=cm.images,
    )
