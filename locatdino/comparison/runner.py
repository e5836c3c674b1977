"""Several frozen models side by side on one dataset: what ``locatdino compare`` measures.

For each named model (``NAME=MODEL[:CHECKPOINT]``) on the *same* memory views and queries:

- Hummingbird mIoU (identity and Hungarian) with per-class IoU — the unchanged engine
  (:func:`~locatdino.retrieval.evaluate.hummingbird`), once per memory size (fractions of the full
  memory; a :class:`CachedExtractor` computes each batch's features once for all sizes);
- what the figures need, read from the full-memory run's bank while it exists: predictions and
  PCA-to-RGB feature maps of a few query images (the same rows for every model), the class
  token's last-block attention and, for LocAtViT, the learned locality per block;
- the dense linear probe (docs/evaluation.md, :func:`~locatdino.probes.dense_probe.linear_probe`) on the
  memory images, scored on the queries, with its predictions of the figure images and one
  confusion matrix per query image;
- class-token probes (k-NN and logistic regression) when the images have labels;
- the per-image hits and Hummingbird's per-image confusion matrices that the intervals of the
  comparison need (``intervals.py``);
- parameters, images/s and peak memory of the forward at the evaluation size.

A model that fails (unreadable checkpoint, wrong input size) is reported in one line and left
out; the others still run.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

from locatdino.comparison.attention_maps import class_token_attention, locality_per_block
from locatdino.comparison.forward_cost import count_parameters, forward_cost
from locatdino.comparison.intervals import probe_record
from locatdino.comparison.pca_maps import PCAColours
from locatdino.errors import first_line
from locatdino.evaluation.augment import NEAREST_EXACT, resize_image
from locatdino.evaluation.feature_cache import CachedExtractor
from locatdino.evaluation.features import FeatureExtractor, load_backbone
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.views import load_pair
from locatdino.probes.class_token import class_embeddings, knn_hits, logistic_hits
from locatdino.probes.dense_probe import LinearProbeConfig, linear_probe, predict_images
from locatdino.retrieval.evaluate import HummingbirdConfig, hummingbird, patch_scores
from locatdino.retrieval.transfer import predict


@dataclass(frozen=True)
class ModelSpec:
    """One model of a comparison: a display name, a timm model name and its weights (None: random)."""

    name: str
    model: str
    checkpoint: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``NAME=MODEL[:CHECKPOINT]``; a missing, empty or ``none`` checkpoint is random init."""
        name, sep, rest = text.partition("=")
        model, _, checkpoint = rest.partition(":")
        if not sep or not name or not model:
            raise ValueError(f"model {text!r}: expected NAME=MODEL[:CHECKPOINT], e.g. vanilla=vit_small_patch16_224:dino.pth")
        return cls(name, model, None if checkpoint in ("", "none") else checkpoint)


@dataclass
class ShownImages:
    """The query images every figure shows (same rows for every model): resized uint8 images
    ``[n, 3, S, S]`` and their masks resized (nearest) to ``S × S`` (None without masks)."""

    images: torch.Tensor
    masks: np.ndarray | None

    @classmethod
    def from_split(cls, dataset: Any, count: int, size: int) -> ShownImages:
        pairs = [p for p in (load_pair(dataset, i) for i in range(min(count, len(dataset)))) if p is not None]
        images = torch.stack([resize_image(image, size) for image, _ in pairs])
        masks = [TF.resize(tv_tensors.Mask(m[None]), [size, size], interpolation=NEAREST_EXACT)[0] for _, m in pairs]
        return cls(images, torch.stack(masks).numpy())

    @classmethod
    def from_probes(cls, probes: ProbeSet, count: int) -> ShownImages:
        """The first test images of a probe set (no masks)."""
        return cls(probes.test_images[:count], None)


@dataclass
class ProbeSet:
    """Image-level labelled train / test images (uint8 ``[N, 3, S, S]``) for the class-token probes."""

    train_images: torch.Tensor
    train_labels: np.ndarray
    test_images: torch.Tensor
    test_labels: np.ndarray
    label_rule: str = ""

    @classmethod
    def from_splits(cls, train: Any, test: Any, label: Callable[[Any], int], size: int, rule: str) -> ProbeSet:
        """Images and labels of two datasets of ``(PIL image, target)``; the label of a sample is
        ``label(target)`` (e.g. ``scene_class`` of its mask, or the class index itself)."""
        def read(dataset: Any) -> tuple[torch.Tensor, np.ndarray]:
            images, labels = [], []
            for i in range(len(dataset)):
                image, target = dataset[i]
                images.append(resize_image(TF.pil_to_tensor(image.convert("RGB")), size))
                labels.append(label(np.asarray(target)))
            return torch.stack(images), np.array(labels)

        return cls(*read(train), *read(test), label_rule=rule)


@dataclass
class ModelOutcome:
    """Everything measured for one model; ``visuals`` feed the figures (arrays, not in the JSON)."""

    spec: ModelSpec
    parameters: int = 0
    forward: dict[str, Any] = field(default_factory=dict)
    hbird: dict[str, Any] | None = None  # None: no segmentation masks (probes only)
    memory_curve: list[dict[str, Any]] = field(default_factory=list)
    linprobe: dict[str, Any] | None = None  # None: not run (--no-linprobe, or no masks)
    probes: dict[str, Any] | None = None
    locality: list[dict[str, float]] | None = None
    visuals: dict[str, np.ndarray] = field(default_factory=dict)
    image_confusions: ImageConfusions | None = None  # full-memory Hummingbird, one matrix per query image
    # the linear probe's confusion matrix of each query image (for paired intervals)
    linprobe_confusion: ImageConfusions | None = None

    def to_dict(self) -> dict[str, Any]:
        kept = replace(self, visuals={}, image_confusions=None, linprobe_confusion=None)
        return {k: v for k, v in asdict(kept).items() if k not in ("visuals", "image_confusions", "linprobe_confusion")}


def memory_sizes(fractions: list[Fraction], full: int, num_views: int, k: int) -> list[tuple[Fraction, int]]:
    """``(fraction, memory budget in patches)`` for each fraction below 1 of a full memory of
    ``full`` patches, ascending; fractions that leave less than one patch per memory view, or
    fewer than ``k`` patches, are dropped."""
    return [(f, int(f * full)) for f in sorted(set(fractions)) if f < 1 and int(f * full) >= max(num_views, k)]


def _say(message: str) -> None:
    print(f"[compare] {message}", file=sys.stderr, flush=True)


def load_model(spec: ModelSpec, cfg: HummingbirdConfig, pos_embed: str = "auto") -> torch.nn.Module:
    """The frozen backbone of ``spec`` (raises on a checkpoint or model that cannot be used, or an
    evaluation size its patch does not divide); random init is reproducible from ``cfg.seed``."""
    if spec.checkpoint is None:
        torch.manual_seed(cfg.seed)
    _say(f"{spec.name}: loading {spec.model} ({spec.checkpoint or 'random init'})")
    backbone = load_backbone(spec.model, spec.checkpoint, pos_embed=pos_embed)
    patch = backbone.patch_embed.patch_size[0]
    if cfg.input_size % patch:
        raise ValueError(f"--input-size {cfg.input_size} is not a multiple of its patch size {patch}")
    return backbone


def evaluate_model(
    spec: ModelSpec,
    backbone: torch.nn.Module,
    train_set: Any | None,
    val_set: Any | None,
    cfg: HummingbirdConfig,
    fractions: list[Fraction],
    shown: ShownImages,
    probes: ProbeSet | None,
    linprobe: LinearProbeConfig | None = None,
) -> ModelOutcome:
    """Measure one loaded model. Without segmentation splits (``train_set`` None) only the probes,
    attention and cost are measured; the linear probe runs when ``linprobe`` is given."""
    base = FeatureExtractor(backbone, layer=cfg.layer, norm=cfg.norm, prr=cfg.prr, precision=cfg.precision)
    extractor = CachedExtractor(base)
    outcome = ModelOutcome(spec, parameters=count_parameters(backbone))

    def inspect(ext: Any, bank: Any, index: Any) -> None:
        scores = patch_scores(ext, bank, index, shown.images, cfg)
        outcome.visuals["prediction"] = predict(scores, tuple(shown.images.shape[-2:])).numpy()
        colours = PCAColours(seed=cfg.seed).fit(bank.features)
        outcome.visuals["pca"] = colours.rgb(ext(shown.images).numpy())

    if train_set is not None:  # None: a dataset with image labels only (probes, no masks)
        # the full memory first: it fills the feature cache and sets the size the fractions refer to
        _say(f"{spec.name}: Hummingbird, full memory")
        full = hummingbird(extractor, train_set, val_set, cfg, inspect=inspect)
        outcome.hbird, outcome.image_confusions = full.to_dict(), full.image_confusions
        curve = [{"fraction": "1", "memory_patches": outcome.hbird["memory_patches"], "miou": outcome.hbird["miou"]}]
        for fraction, size in reversed(memory_sizes(fractions, outcome.hbird["memory_patches"],
                                                    len(train_set) * cfg.aug_epochs, cfg.k)):
            _say(f"{spec.name}: Hummingbird, memory {fraction} ({size:,} patches)")
            result = hummingbird(extractor, train_set, val_set, replace(cfg, memory_size=size))
            curve.insert(0, {"fraction": str(fraction), "memory_patches": result.memory_patches, "miou": result.miou})
        outcome.memory_curve = curve
        if linprobe is not None:
            _say(f"{spec.name}: linear probe ({linprobe.total_iterations(len(train_set))} iterations x "
                 f"{linprobe.batch_size}, augmentation {linprobe.augment})")

            def show(ext: Any, head: Any) -> None:
                outcome.visuals["probe_prediction"] = predict_images(ext, head, shown.images,
                                                                     val_set.ignore_index).numpy()

            result = linear_probe(backbone, train_set, val_set, linprobe, inspect=show)
            outcome.linprobe, outcome.linprobe_confusion = result.to_dict(), result.image_confusions
    _say(f"{spec.name}: attention maps and locality")
    outcome.visuals["attention"] = class_token_attention(backbone, shown.images[:1])[0].numpy()
    outcome.locality = locality_per_block(backbone, shown.images)
    if probes is not None:
        _say(f"{spec.name}: class-token probes ({len(probes.train_labels)} train / {len(probes.test_labels)} test images)")
        n_train = len(probes.train_images)
        both = class_embeddings(backbone, torch.cat([probes.train_images, probes.test_images]), cfg.batch_size,
                                cfg.precision)
        train, test = both[:n_train], both[n_train:]
        outcome.probes = {
            **probe_record("knn", knn_hits(train, probes.train_labels, test, probes.test_labels)),
            **probe_record("logistic", logistic_hits(train, probes.train_labels, test, probes.test_labels)),
            "majority_top1": 100 * float(np.mean(probes.test_labels == np.bincount(probes.train_labels).argmax())),
            "num_train": len(train), "num_test": len(test),
        }
    _say(f"{spec.name}: forward speed and memory at {cfg.input_size} px")
    outcome.forward = forward_cost(base, cfg.input_size, cfg.batch_size)
    return outcome


def compare(
    specs: list[ModelSpec],
    train_set: Any | None,
    val_set: Any | None,
    cfg: HummingbirdConfig,
    fractions: list[Fraction],
    shown: ShownImages,
    probes: ProbeSet | None = None,
    pos_embed: str = "auto",
    device: torch.device | str = "cpu",
    linprobe: LinearProbeConfig | None = None,
) -> tuple[list[ModelOutcome], dict[str, str]]:
    """Every model's :class:`ModelOutcome`, and ``{name: one-line error}`` of the models that failed.

    Every model is loaded and checked first, so a bad checkpoint is reported at once rather than
    after the others' evaluations; the models that load are then evaluated one after another."""
    failed: dict[str, str] = {}

    def attempt(spec: ModelSpec, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError) as err:
            failed[spec.name] = f"{spec.model}:{spec.checkpoint or 'none'}: {first_line(err)[:300]}"
            print(f"locatdino compare: model {spec.name!r} failed: {failed[spec.name]}", file=sys.stderr, flush=True)
            return None

    loaded = [(spec, attempt(spec, lambda spec=spec: load_model(spec, cfg, pos_embed).to(device))) for spec in specs]
    outcomes = []
    for spec, backbone in loaded:
        if backbone is not None:
            outcome = attempt(spec, lambda: evaluate_model(spec, backbone, train_set, val_set, cfg, fractions,
                                                           shown, probes, linprobe))
            if outcome is not None:
                outcomes.append(outcome)
    return outcomes, failed
