"""Hummingbird in-context segmentation, end to end (docs/evaluation.md).

    train split ─ MemoryViews ─ encoder ─ soft labels (+ budget) ─ MemoryBank ─ PatchIndex
    val split ─── QueryViews ─── encoder ─ k-NN search ─ label transfer ─ upsample ─ ConfusionMatrix

Everything streams batch by batch: memory is bounded by the batch and the bank, never by the
number of evaluated pixels.

On many ranks (``shared``, ``locatdino.evaluation.ranks``) each rank encodes its contiguous share of
the memory views and of the query images: the ranks' memory rows are gathered in view order into a
bank on every rank equal to one process's (the budget's sampling noise is drawn per view,
:class:`~locatdino.evaluation.hbird.sampling.ViewNoise`), every rank builds the same index from it and
scores its queries, and the confusion matrices are gathered in image order
(:func:`~locatdino.evaluation.metric.gather_confusions`): one process's numbers.

Where predictions are compared with the ground truth. Query images are resized (squashed) to
the input size for the encoder, but their masks stay at original resolution: the patch-grid
class scores are upsampled bilinearly straight to the mask's size and every original pixel is
scored once (``eval_resolution="original"``, default; the usual semantic-segmentation protocol).
The reference instead resizes the *masks* to the square input size with nearest neighbour,
which drops or duplicates ground-truth pixels unevenly (thin structures, aspect change);
``eval_resolution="input"`` reproduces it for comparison with published tables.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import DataLoader, Subset
from torchvision import tv_tensors

from locatdino.common.progress import progress
from locatdino.evaluation.augment import AUGMENT_MODES, NEAREST_EXACT, PairedAugmentation
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.index import PatchIndex, check_index_device, faiss_gpu_available
from locatdino.evaluation.hbird.index_choice import (
    AUTO,
    RECALL_SAMPLE,
    IndexChoice,
    auto_index,
    recall_at_k,
    sample_rows,
)
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.evaluation.hbird.patch_labels import patch_class_counts, soft_labels
from locatdino.evaluation.hbird.sampling import ViewNoise, patches_per_image, rare_class_first
from locatdino.evaluation.hbird.transfer import predict, transfer_labels
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.metric import HUNGARIAN_CRITERIA, ConfusionMatrix, gather_confusions
from locatdino.evaluation.phase_clock import PhaseClock
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.ranks import Ranks, current_ranks, gather_objects, gather_rows
from locatdino.evaluation.results import score
from locatdino.evaluation.splits import split_share
from locatdino.evaluation.torch_knn import TorchExactSearch
from locatdino.evaluation.views import MemoryViews, QueryViews, collate_views

_TRANSFER_CHUNK_BYTES = 64 << 20  # bound on the gathered [n, k, C] labels / [n, k, D] features


@dataclass
class HummingbirdConfig:
    """Every setting of one evaluation (defaults: locatdino's protocol at 224 px; the settings where
    open-hummingbird-eval differs are ``locatdino.evaluation.hbird.options.REFERENCE_SETTINGS``)."""

    input_size: int = 224
    aug_epochs: int = 1
    memory_size: int | None = None  # budget M in patches; None keeps every patch
    k: int = 30
    beta: float = 0.02
    index: str = "auto"  # FAISS factory string, or auto: Flat for small searches, else IVF (index_choice)
    nprobe: int | None = None
    ef_search: int | None = None
    index_device: str = "auto"
    knn_backend: str = "auto"  # auto | faiss | torch (exact search on the encoder's GPU without faiss-gpu)
    layer: int = -1
    norm: bool = False
    prr: bool = False
    precision: str = "auto"  # encoder arithmetic: auto | fp32 | bf16 | int8 (precision.py)
    memory_dtype: str = "float32"  # float32 | float16 (memory_dir banks, non-Flat indices)
    memory_dir: str | None = None  # memory-map the bank into this directory
    batch_size: int = 16
    num_workers: int | None = None  # DataLoader workers; None: 1 for a CPU encoder, else min(8, cores)
    eval_resolution: str = "original"  # original | input (reference)
    augment: str = "zoom-out"  # memory views: zoom-out | reference (torchvision's sampler) | off
    hungarian: str = "iou"  # matched-mIoU criterion: iou (reference) | pixels
    scale: tuple[float, float] = (0.5, 2.0)  # crop area / image area; > 1 zooms out
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio range
    jitter: float = 0.1
    jitter_p: float = 0.5
    min_valid_fraction: float = 0.5  # store a patch only if this much of it is image (zoom-out)
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.eval_resolution not in ("original", "input"):
            raise ValueError(f"eval_resolution must be 'original' or 'input', got {self.eval_resolution!r}")
        for name in ("input_size", "aug_epochs", "k", "batch_size", "memory_size", "nprobe", "ef_search"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.memory_size is not None and self.memory_size < self.k:  # no k neighbours to weigh
            raise ValueError(
                f"memory_size (--memory-size) {self.memory_size} keeps fewer patches than k (--k) "
                f"{self.k} neighbours per query: give at least {self.k}"
            )
        if not self.beta > 0 or not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"beta must be > 0 and scale (min, max) 0 < min <= max, got {self.beta} and {self.scale}")
        if self.augment not in AUGMENT_MODES:
            raise ValueError(f"augment must be one of {AUGMENT_MODES}, got {self.augment!r}")
        if self.augment == "off" and self.aug_epochs > 1:
            raise ValueError(
                f"augment 'off' makes all {self.aug_epochs} augmentation epochs identical: use aug_epochs 1"
            )
        if self.hungarian not in HUNGARIAN_CRITERIA:
            raise ValueError(f"hungarian must be one of {HUNGARIAN_CRITERIA}, got {self.hungarian!r}")


@dataclass
class HummingbirdResult:
    """Scores in percent (as published tables), timings in seconds, sizes in patches / bytes."""

    miou: float
    miou_matched: float
    pixel_accuracy: float
    per_class_iou: dict[str, float | None]
    memory_patches: int
    memory_bytes: int
    num_train: int
    num_val: int
    skipped: int
    timings: dict[str, float]
    peak_rss_mb: float
    config: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)  # see provenance.run_provenance
    # what ran: the resolved encoder precision, index and nprobe, and for an approximate index
    # its recall@k against exact search on a sample of query patches
    search: dict[str, Any] = field(default_factory=dict)
    # one confusion matrix per scored query image, for paired intervals (docs/evaluation.md); written beside
    # results.json (report.write_run), not into it
    image_confusions: ImageConfusions | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The model's record in ``results.json`` (without the per-image matrices): the scores in the
        schema every command shares (:mod:`locatdino.evaluation.results`; no single-run interval),
        then every field."""
        scores = {name: score(getattr(self, name)) for name in ("miou", "miou_matched", "pixel_accuracy")}
        fields_ = {k: v for k, v in asdict(replace(self, image_confusions=None)).items() if k != "image_confusions"}
        return {"scores": {"": scores}, **fields_}


def _loader(dataset, cfg: HummingbirdConfig, extractor: Any, collate: Callable = collate_views) -> DataLoader:
    """Batches of views. A CPU encoder gets one worker by default: decoding and augmenting beside
    the forward is enough to keep it fed, and every further worker steals a core from the
    compute-bound forward."""
    workers = cfg.num_workers
    if workers is None:
        on_cpu = getattr(extractor, "device", torch.device("cpu")).type == "cpu"
        workers = 1 if on_cpu else min(8, os.cpu_count() or 1)
    return DataLoader(dataset, batch_size=cfg.batch_size, num_workers=workers, collate_fn=collate)


def build_memory(
    extractor: FeatureExtractor,
    dataset: Any,
    cfg: HummingbirdConfig,
    clock: PhaseClock | None = None,
    shared: bool = False,
) -> tuple[MemoryBank, int]:
    """The labelled patch memory of ``dataset`` (``aug_epochs`` augmented passes). Returns the
    bank and the number of skipped (corrupt) samples. ``shared``: each rank of the process group
    encodes its contiguous share of the views and every rank gets the whole bank, one process's
    (rank 0 alone writes ``cfg.memory_dir``; the other ranks hold theirs in RAM)."""
    clock = clock or PhaseClock()
    n_patches = extractor.grid(cfg.input_size) ** 2
    per_image = n_patches
    if cfg.memory_size is not None:
        per_image = min(n_patches, patches_per_image(cfg.memory_size, len(dataset), cfg.aug_epochs))
    meta = {"input_size": cfg.input_size, "aug_epochs": cfg.aug_epochs, "per_image": per_image}
    views = memory_views(dataset, cfg)
    ranks = current_ranks() if shared else Ranks()
    share = ranks.share(len(views))

    def allocate(views: int, directory: str | None) -> MemoryBank:
        return MemoryBank.allocate(
            views * per_image, extractor.dim, dataset.num_classes, cfg.memory_dtype, directory, meta
        )

    # a bank too large for --memory-dir fails here, before any image is encoded, its disk space reserved
    bank = allocate(len(views), cfg.memory_dir if ranks.rank == 0 else None)
    rows = allocate(len(share), None) if ranks.many else bank
    skipped = memory_rows(rows, extractor, views, share, per_image, cfg, clock)
    if ranks.many:
        with clock("memory"):
            features, labels = bank.reserve(sum(gather_objects([len(rows)])))
            gather_rows(rows.features, out=features)
            gather_rows(rows.labels, out=labels)
            skipped = sum(gather_objects([skipped]))
    with clock("memory"):
        bank.finish()
    return bank, skipped


def memory_views(dataset: Any, cfg: HummingbirdConfig) -> MemoryViews:
    """The ``aug_epochs`` augmented views of ``dataset`` the memory is built from."""
    augmentation = PairedAugmentation(
        cfg.input_size, tuple(cfg.scale), tuple(cfg.ratio), cfg.jitter, cfg.jitter_p, cfg.augment
    )
    return MemoryViews(dataset, augmentation, cfg.aug_epochs, cfg.seed)


def memory_rows(
    bank: MemoryBank,
    extractor: FeatureExtractor,
    views: MemoryViews,
    share: range,
    per_image: int,
    cfg: HummingbirdConfig,
    clock: PhaseClock | None = None,
) -> int:
    """Append to ``bank`` the patches that memory views ``share`` contribute (``per_image`` of each
    with a budget, else every patch with enough labelled pixels), in view order: the rows that one
    process's bank holds for those views. Returns the number of skipped (corrupt) views."""
    clock = clock or PhaseClock()
    p, c = extractor.patch_size, views.dataset.num_classes
    noise = ViewNoise(cfg.seed, extractor.grid(cfg.input_size) ** 2, start=share.start)
    min_valid = math.ceil(cfg.min_valid_fraction * p * p)
    skipped = 0
    loader = _loader(Subset(views, share), cfg, extractor, collate=_collate_present)
    batches = progress(loader, desc="memory", disable=not cfg.progress, leave=False)
    for images, masks, present in clock.iterate(batches, "data"):
        skipped += int((~present).sum())
        view_noise = noise.next(present)  # spent for every view, so that later views draw the same
        if not masks:
            continue
        with clock("features"):
            feats = extractor(images).flatten(1, 2)  # [B, P, D]
        with clock("memory"):
            counts, valid = patch_class_counts(torch.stack(masks), p, c)
            keep = valid >= min_valid
            if cfg.memory_size is not None:
                keep = rare_class_first(counts, keep, per_image, noise=view_noise)
            bank.append(feats[keep], soft_labels(counts, valid)[keep])
    return skipped


def _collate_present(batch: list[tuple[torch.Tensor, torch.Tensor] | None]) -> tuple[Any, ...]:
    """:func:`~locatdino.evaluation.views.collate_views` with which views decoded (bool ``[B]``) in place of
    their count."""
    images, masks, _ = collate_views(batch)
    return images, masks, torch.tensor([view is not None for view in batch], dtype=torch.bool)


def _rescored(bank: MemoryBank, queries: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
    """Exact cosine similarities of queries ``[n, D]`` to their neighbours ``ids [n, k]`` from the
    stored features (for PQ/SQ indices, whose search scores are approximate)."""
    sims = torch.einsum("nd,nkd->nk", queries, bank.gather_features(ids))
    return sims.masked_fill(torch.from_numpy(ids < 0), -torch.inf)


def patch_scores(
    extractor: FeatureExtractor,
    bank: MemoryBank,
    index: PatchIndex,
    images: torch.Tensor,
    cfg: HummingbirdConfig,
    clock: PhaseClock | None = None,
) -> torch.Tensor:
    """Class scores ``[B, C, h, w]`` of the patches of ``images`` (uint8 ``[B, 3, S, S]``) by
    label transfer from ``bank``: the per-batch step of :func:`evaluate_queries`, public so
    that reports can draw the predictions of a few chosen images."""
    clock = clock or PhaseClock()
    c = bank.num_classes
    chunk = max(1, _TRANSFER_CHUNK_BYTES // (4 * cfg.k * max(c, bank.dim)))
    with clock("features"):
        feats = extractor(images)
    b, h, w, d = feats.shape
    queries = feats.reshape(-1, d)
    with clock("search"):
        sims, ids = index.search(queries.numpy(), cfg.k)
    with clock("transfer"):
        scores = torch.empty(queries.shape[0], c)
        for s in range(0, queries.shape[0], chunk):
            e = s + chunk
            if index.exact_scores:
                chunk_sims = torch.from_numpy(sims[s:e])
            else:
                chunk_sims = _rescored(bank, queries[s:e], ids[s:e])
            scores[s:e] = transfer_labels(chunk_sims, bank.gather_labels(ids[s:e]), cfg.beta)
        return scores.view(b, h, w, c).permute(0, 3, 1, 2)


def evaluate_queries(
    extractor: FeatureExtractor,
    bank: MemoryBank,
    index: PatchIndex,
    dataset: Any,
    cfg: HummingbirdConfig,
    clock: PhaseClock | None = None,
) -> tuple[ConfusionMatrix, int]:
    """Segment every image of ``dataset`` by label transfer from ``bank``; returns the confusion
    matrix (with one matrix per scored image, for intervals) and the number of skipped (corrupt)
    samples."""
    clock = clock or PhaseClock()
    return score_queries(
        lambda images: patch_scores(extractor, bank, index, images, cfg, clock),
        dataset,
        bank.num_classes,
        cfg,
        extractor,
        clock,
    )


def score_queries(
    scores_of: Callable[[torch.Tensor], torch.Tensor],
    dataset: Any,
    num_classes: int,
    cfg: HummingbirdConfig,
    extractor: Any,
    clock: PhaseClock | None = None,
) -> tuple[ConfusionMatrix, int]:
    """Segment every image of ``dataset`` from its patch-grid class scores ``scores_of(uint8 images
    [B, 3, S, S]) -> [B, C, h, w]``: upsampling, argmax and scoring as Hummingbird's (the module
    docstring); :func:`evaluate_queries` with label transfer, the position prior with the
    memory's class frequencies. ``extractor`` only sets the loader's workers (its device)."""
    clock = clock or PhaseClock()
    size = cfg.input_size
    cm = ConfusionMatrix(num_classes, dataset.ignore_index, keep_images=True)
    skipped = 0
    loader = _loader(QueryViews(dataset, size), cfg, extractor)
    batches = progress(loader, desc="query", disable=not cfg.progress, leave=False)
    for images, masks, n_skipped in clock.iterate(batches, "data"):
        skipped += n_skipped
        if not masks:
            continue
        scores = scores_of(images)
        with clock("transfer"):
            if cfg.eval_resolution == "input":  # the reference: masks resized to the input
                resized = [TF.resize(tv_tensors.Mask(m), [size, size], interpolation=NEAREST_EXACT) for m in masks]
                cm.update(predict(scores, (size, size)), torch.stack(resized))
            else:  # every original pixel, one image at a time (masks differ in size)
                for i, mask in enumerate(masks):
                    cm.update(predict(scores[i : i + 1], tuple(mask.shape))[0], mask)
    return cm, skipped


def check_splits(train_set: Any, val_set: Any) -> None:
    """``ValueError`` unless the memory and query splits agree on the classes and neither is empty."""
    if train_set.num_classes != val_set.num_classes:
        raise ValueError(f"train split has {train_set.num_classes} classes, val split {val_set.num_classes}")
    if len(train_set) == 0 or len(val_set) == 0:
        raise ValueError(f"empty split: {len(train_set)} train / {len(val_set)} val images")


def hummingbird(
    model: torch.nn.Module | FeatureExtractor | Any,
    train_set: Any,
    val_set: Any,
    cfg: HummingbirdConfig | None = None,
    inspect: Callable[[Any, MemoryBank, PatchIndex], None] | None = None,
    shared: bool = False,
) -> HummingbirdResult:
    """Run the whole benchmark: memory from ``train_set``, label transfer on ``val_set``.

    ``model`` is a timm ViT (wrapped in a :class:`FeatureExtractor` with ``cfg``'s layer, norm,
    PRR and precision) or any object with the extractor's interface — ``patch_size``, ``dim``,
    ``grid(size)`` and ``__call__(uint8 images) -> [B, h, w, D]`` L2-normalised features.
    ``inspect(extractor, bank, index)``, when given, is called once the queries are scored, while
    the memory still exists (``locatdino compare`` draws its figures from it). ``shared``: the ranks of
    the process group share the memory views and the query images (module docstring), every rank
    gets the result.
    """
    cfg = cfg or HummingbirdConfig()
    check_splits(train_set, val_set)
    extractor = model
    if isinstance(model, torch.nn.Module):
        extractor = FeatureExtractor(model, layer=cfg.layer, norm=cfg.norm, prr=cfg.prr, precision=cfg.precision)
    clock = PhaseClock()
    provenance = run_provenance()
    start = time.perf_counter()
    check_index_device(cfg.index_device, cfg.index, cfg.knn_backend)
    if cfg.index == AUTO and cfg.index_device == "gpu" and not faiss_gpu_available():
        cfg = replace(cfg, index="Flat")  # the one search a GPU runs without faiss-gpu (torch, exact)
    choice = None if cfg.index == AUTO else IndexChoice(cfg.index, cfg.nprobe)
    index = None if choice is None else _patch_index(extractor, cfg, choice)  # a bad spec fails before encoding
    bank, skipped_train = build_memory(extractor, train_set, cfg, clock, shared)
    if index is None:  # auto: chosen by the memory's size
        choice = auto_index(len(bank), len(val_set) * extractor.grid(cfg.input_size) ** 2, cfg.nprobe)
        index = _patch_index(extractor, cfg, choice)
    with clock("index"):
        index.build(bank.features)
    search = {"precision": getattr(extractor, "precision", None), "index": choice.spec, "nprobe": choice.nprobe}
    if choice.spec != "Flat":
        with clock("recall"):
            search.update(_sampled_recall(extractor, bank, index, val_set, cfg))
    queries = split_share(val_set, (current_ranks() if shared else Ranks()).share(len(val_set)))
    cm, skipped_val = evaluate_queries(extractor, bank, index, queries, cfg, clock)
    if shared:
        with clock("transfer"):
            cm, skipped_val = gather_confusions(cm), sum(gather_objects([skipped_val]))
    result = result_of(
        cm, cfg, val_set, bank, len(train_set), skipped_train + skipped_val, clock, start, provenance, search
    )
    if inspect is not None:  # not timed: not part of the benchmark
        inspect(extractor, bank, index)
    return result


def result_of(
    cm: ConfusionMatrix,
    cfg: HummingbirdConfig,
    val_set: Any,
    bank: MemoryBank,
    num_train: int,
    skipped: int,
    clock: PhaseClock,
    start: float,
    provenance: dict[str, Any],
    search: dict[str, Any],
) -> HummingbirdResult:
    """The record of one finished evaluation (scores from ``cm``; the timings of ``clock`` and
    the total since ``start``)."""
    timings = {k: round(v, 3) for k, v in clock.totals.items()}
    timings["total"] = round(time.perf_counter() - start, 3)
    identity, matched = cm.compute("identity"), cm.compute("hungarian", cfg.hungarian)
    names = list(getattr(val_set, "class_names", None) or range(cm.num_classes))
    return HummingbirdResult(
        miou=100 * identity.miou,
        miou_matched=100 * matched.miou,
        pixel_accuracy=100 * identity.pixel_accuracy,
        per_class_iou={str(n): None if np.isnan(v) else round(100 * float(v), 4) for n, v in zip(names, identity.iou)},
        memory_patches=len(bank),
        memory_bytes=int(bank.nbytes),
        num_train=num_train,
        num_val=len(val_set),
        skipped=skipped,
        timings=timings,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        config=asdict(cfg),
        provenance=provenance,
        search=search,
        image_confusions=cm.images,
    )


def _patch_index(extractor: Any, cfg: HummingbirdConfig, choice: IndexChoice) -> PatchIndex:
    return PatchIndex(
        extractor.dim,
        choice.spec,
        choice.nprobe,
        cfg.ef_search,
        cfg.index_device,
        seed=cfg.seed,
        backend=cfg.knn_backend,
        torch_device=getattr(extractor, "device", None),
    )


def _sampled_recall(
    extractor: Any, bank: MemoryBank, index: PatchIndex, dataset: Any, cfg: HummingbirdConfig
) -> dict[str, Any]:
    """Recall@k of ``index`` against exact search, on a fixed sample of the patches of query
    images spread over ``dataset`` (an extra forward of about ``RECALL_SAMPLE`` patches)."""
    views = QueryViews(dataset, cfg.input_size)
    n_images = min(len(views), -(-RECALL_SAMPLE // extractor.grid(cfg.input_size) ** 2))
    images, _, _ = collate_views([views[int(i)] for i in np.linspace(0, len(views) - 1, n_images)])
    if len(images) == 0:
        return {"recall_at_k": None, "recall_queries": 0}
    queries = extractor(images).flatten(0, 2).numpy()
    queries = queries[sample_rows(len(queries), RECALL_SAMPLE, cfg.seed)]
    found = index.search(queries, cfg.k)[1]
    recall = recall_at_k(found, TorchExactSearch(bank.features, "cpu").search(queries, cfg.k)[1])
    return {"recall_at_k": round(recall, 4), "recall_queries": len(queries)}
