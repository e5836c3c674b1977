"""The rows of ``locatdino compare --baselines`` that need no network (docs/evaluation.md, "Baselines").

A model's score means something only beside what needs no training: a random ViT's patch tokens
are little more than its input pixels with some context, and on images with a layout the place of
a patch alone predicts some of its class (sky at the top). Two rows, on the token grid of the first model that ran
(its patch size at ``--input-size``), through the same protocols as every model:

- ``pixels``: each patch's input values (after the models' normalisation) as its feature —
  Hummingbird (the same memory views, k-NN, label transfer) and the same linear probe;
- ``position-prior``: each query patch predicts the memory's class frequencies at its place
  (:mod:`~locatdino.evaluation.hbird.position_prior`), and the linear probe on a one-hot of the place.

Their rows have a model's fields; what needs a network (parameters, forward cost, class token,
attention, locality) is None, with the reason in ``not_applicable``. Neither has weights, so both
run in fp32 whatever ``--precision`` says, on the CPU.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

from locatdino.evaluation.compare.measure import (
    ModelOutcome,
    ModelSpec,
    ShownImages,
    measure_hummingbird,
    measure_linear_probe,
    retrieval_visuals,
)
from locatdino.evaluation.feature_cache import CachedExtractor
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.hbird.position_prior import position_prior
from locatdino.evaluation.hbird.transfer import predict
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig
from locatdino.models.baselines import PatchPosition, PixelPatches

NAMES = ("pixels", "position-prior")
NO_NETWORK = {
    "parameters": "no network",
    "forward": "no network",
    "probes": "no class token (the report's most-frequent-label top-1 is the class-token probes' floor)",
    "locality": "no attention",
}


def _outcome(name: str, described: str) -> ModelOutcome:
    return ModelOutcome(
        ModelSpec(name, name, None), parameters=None, forward=None, baseline=described, not_applicable=dict(NO_NETWORK)
    )


def evaluate_baselines(
    patch_size: int,
    train_set: Any,
    val_set: Any,
    cfg: HummingbirdConfig,
    fractions: list[Fraction],
    shown: ShownImages,
    linprobe: LinearProbeConfig | None = None,
) -> list[ModelOutcome]:
    """The ``pixels`` and ``position-prior`` rows on a grid of ``patch_size`` px patches."""
    cfg = replace(cfg, precision="fp32")
    linprobe = linprobe and replace(linprobe, precision="fp32")
    grid = cfg.input_size // patch_size
    pixels = _outcome(
        "pixels",
        f"each patch's {patch_size} × {patch_size} × 3 normalised input values "
        f"({3 * patch_size * patch_size} numbers, a {grid} × {grid} grid)",
    )
    extractor = CachedExtractor(FeatureExtractor(PixelPatches(patch_size)))
    measure_hummingbird(
        pixels,
        lambda c, look: hummingbird(extractor, train_set, val_set, c, inspect=look),
        len(train_set),
        cfg,
        fractions,
        retrieval_visuals(pixels, shown, cfg),
    )
    prior = _outcome(
        "position-prior",
        f"the memory's class frequencies at each place of a {grid} × {grid} grid "
        "(Hummingbird column); the linear probe on a one-hot of the place",
    )

    def show(scores_of: Any) -> None:
        prior.visuals["prediction"] = predict(scores_of(shown.images), tuple(shown.images.shape[-2:])).numpy()

    measure_hummingbird(
        prior,
        lambda c, look: position_prior(patch_size, train_set, val_set, c, inspect=look),
        len(train_set),
        cfg,
        fractions,
        show,
    )
    if linprobe is not None:
        measure_linear_probe(pixels, PixelPatches(patch_size), train_set, val_set, linprobe, shown)
        measure_linear_probe(prior, PatchPosition(patch_size, grid), train_set, val_set, linprobe, shown)
    return [pixels, prior]
