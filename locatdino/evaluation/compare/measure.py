"""One row of ``locatdino compare`` and the dense protocols that fill it.

A row is a :class:`ModelOutcome` — a network's (``runner.py``) or a network-free baseline's
(``baselines.py``): both are measured here the same way, Hummingbird at every memory size
(:func:`measure_hummingbird`) and the dense linear probe (:func:`measure_linear_probe`), on the
same memory and query images (:class:`ShownImages` are the few the figures show).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

from locatdino.evaluation.augment import NEAREST_EXACT, resize_image
from locatdino.evaluation.compare.pca_maps import PCAColours
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, patch_scores
from locatdino.evaluation.hbird.transfer import predict
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, linear_probe, predict_images
from locatdino.evaluation.results import score
from locatdino.evaluation.views import load_pair


@dataclass(frozen=True)
class ModelSpec:
    """One model of a comparison: a display name (the ``--model`` label), a timm model name and
    its weights (None: random)."""

    name: str
    model: str
    checkpoint: str | None = None


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
    parameters: int | None = 0  # None: no network (a baseline)
    forward: dict[str, Any] | None = field(default_factory=dict)
    hbird: dict[str, Any] | None = None  # None: no segmentation masks (probes only)
    memory_curve: list[dict[str, Any]] = field(default_factory=list)
    linprobe: dict[str, Any] | None = None  # None: not run (--no-linprobe, or no masks)
    probes: dict[str, Any] | None = None
    locality: list[dict[str, float]] | None = None
    visuals: dict[str, np.ndarray] = field(default_factory=dict)
    image_confusions: ImageConfusions | None = None  # full-memory Hummingbird, one matrix per query image
    # the linear probe's confusion matrix of each query image (for paired intervals)
    linprobe_confusion: ImageConfusions | None = None
    baseline: str | None = None  # a network-free row (compare/baselines.py): what its feature is
    not_applicable: dict[str, str] = field(default_factory=dict)  # {field left None: why it does not apply}
    pos_embed: str | None = None  # the network's position-embedding rule at other grids (None: no network)

    def to_dict(self) -> dict[str, Any]:
        """The model's record in ``results.json``: the model and the headline scores in the schema every
        command shares (:mod:`locatdino.evaluation.results`), then every measurement."""
        kept = replace(self, visuals={}, image_confusions=None, linprobe_confusion=None)
        fields_ = {
            k: v for k, v in asdict(kept).items() if k not in ("visuals", "image_confusions", "linprobe_confusion")
        }
        spec = self.spec
        model = {"label": spec.name, "name": spec.model, "checkpoint": spec.checkpoint, "pos_embed": self.pos_embed}
        return {"model": model, "scores": {"": self._scores()}, **fields_}

    def _scores(self) -> dict[str, Any]:
        """The report's headline numbers: Hummingbird's mIoU (identity and Hungarian-matched), the linear
        probe's, and each class-token probe's top-1 with its Wilson interval (None: not measured)."""
        hbird, linear, probes = self.hbird or {}, self.linprobe or {}, self.probes or {}
        return {
            "miou": score(hbird.get("miou")),
            "miou_matched": score(hbird.get("miou_matched")),
            "linprobe": score(linear.get("miou")),
            **{
                f"{p}_top1": score(probes.get(f"{p}_top1"), probes.get(f"{p}_top1_interval"))
                for p in ("knn", "logistic")
            },
        }


def memory_sizes(fractions: list[Fraction], full: int, num_views: int, k: int) -> list[tuple[Fraction, int]]:
    """``(fraction, memory budget in patches)`` for each fraction below 1 of a full memory of
    ``full`` patches, ascending; fractions that leave less than one patch per memory view, or
    fewer than ``k`` patches, are dropped."""
    return [(f, int(f * full)) for f in sorted(set(fractions)) if f < 1 and int(f * full) >= max(num_views, k)]


def say(message: str) -> None:
    print(f"[compare] {message}", file=sys.stderr, flush=True)


def retrieval_visuals(outcome: ModelOutcome, shown: ShownImages, cfg: HummingbirdConfig) -> Callable[..., None]:
    """The ``inspect`` of a full-memory Hummingbird run: the figures' predictions of the shown
    images and their PCA-to-RGB feature maps, read from the bank while it exists."""

    def inspect(ext: Any, bank: Any, index: Any) -> None:
        scores = patch_scores(ext, bank, index, shown.images, cfg)
        outcome.visuals["prediction"] = predict(scores, tuple(shown.images.shape[-2:])).numpy()
        colours = PCAColours(seed=cfg.seed).fit(bank.features)
        outcome.visuals["pca"] = colours.rgb(ext(shown.images).numpy())

    return inspect


def measure_hummingbird(
    outcome: ModelOutcome,
    run: Callable[[HummingbirdConfig, Any], Any],
    num_train: int,
    cfg: HummingbirdConfig,
    fractions: list[Fraction],
    inspect: Any = None,
) -> None:
    """Fill ``outcome.hbird`` (and its per-image matrices) and ``memory_curve``: ``run(cfg, inspect)``
    (a Hummingbird result) with the full memory first — it fills the feature cache and sets the size
    the fractions refer to — then with each smaller memory (``inspect`` only at the full one)."""
    name = outcome.spec.name
    say(f"{name}: Hummingbird, full memory")
    full = run(cfg, inspect)
    outcome.hbird, outcome.image_confusions = full.to_dict(), full.image_confusions
    curve = [{"fraction": "1", "memory_patches": outcome.hbird["memory_patches"], "miou": outcome.hbird["miou"]}]
    sizes = memory_sizes(fractions, outcome.hbird["memory_patches"], num_train * cfg.aug_epochs, cfg.k)
    # compare refuses up front a fraction that no memory of the input size can score; one that the
    # patches actually stored (fewer, e.g. zoomed-out views) cannot is said here, not dropped silently
    for fraction in sorted({f for f in fractions if f < 1} - {f for f, _ in sizes}):
        say(
            f"{name}: memory {fraction} not scored: {int(fraction * outcome.hbird['memory_patches']):,} patches, "
            f"fewer than k {cfg.k} or than one per memory view"
        )
    for fraction, size in reversed(sizes):
        say(f"{name}: Hummingbird, memory {fraction} ({size:,} patches)")
        result = run(replace(cfg, memory_size=size), None)
        curve.insert(0, {"fraction": str(fraction), "memory_patches": result.memory_patches, "miou": result.miou})
    outcome.memory_curve = curve


def measure_linear_probe(
    outcome: ModelOutcome,
    backbone: torch.nn.Module,
    train_set: Any,
    val_set: Any,
    linprobe: LinearProbeConfig,
    shown: ShownImages,
) -> None:
    """Fill ``outcome.linprobe`` (and its per-image matrices) and the probe's figure predictions."""
    say(
        f"{outcome.spec.name}: linear probe ({linprobe.total_iterations(len(train_set))} iterations x "
        f"{linprobe.batch_size}, augmentation {linprobe.augment})"
    )

    def show(ext: Any, head: Any) -> None:
        outcome.visuals["probe_prediction"] = predict_images(ext, head, shown.images, val_set.ignore_index).numpy()

    result = linear_probe(backbone, train_set, val_set, linprobe, inspect=show)
    outcome.linprobe, outcome.linprobe_confusion = result.to_dict(), result.image_confusions
