"""Several frozen models side by side on one dataset: what ``locatdino compare`` measures.

For each model (``--model [LABEL=]NAME[:CHECKPOINT]``) on the *same* memory views and queries:

- Hummingbird mIoU (identity and Hungarian) with per-class IoU — the unchanged engine
  (:func:`~locatdino.evaluation.hbird.evaluate.hummingbird`), once per memory size (fractions of the full
  memory; a :class:`CachedExtractor` computes each batch's features once for all sizes);
- what the figures need, read from the full-memory run's bank while it exists: predictions and
  PCA-to-RGB feature maps of a few query images (the same rows for every model), the class
  token's last-block attention and, for LocAtViT, the learned locality per block;
- the dense linear probe (docs/evaluation.md, :func:`~locatdino.evaluation.linprobe.protocol.linear_probe`) on the
  memory images, scored on the queries, with its predictions of the figure images and one
  confusion matrix per query image;
- class-token probes (k-NN and logistic regression) when the images have labels;
- the per-image hits and Hummingbird's per-image confusion matrices that the intervals of the
  comparison need (``intervals.py``);
- parameters, images/s and peak memory of the forward at the evaluation size.

The rows that need no network (``baselines.py``) are measured by the same Hummingbird and linear
probe (``measure.py``). The evaluation runner (:mod:`locatdino.evaluation.runner`) builds the models,
scores them in turn through ``cli.CompareProtocol`` and leaves out, in one line, a model that fails
(unreadable checkpoint, wrong input size); the others still run.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import torch

from locatdino.evaluation.class_token import class_embeddings, knn_hits, logistic_hits
from locatdino.evaluation.compare.attention_maps import class_token_attention, locality_per_block
from locatdino.evaluation.compare.forward_cost import count_parameters, forward_cost
from locatdino.evaluation.compare.intervals import probe_record
from locatdino.evaluation.compare.measure import (
    ModelOutcome,
    ModelSpec,
    ProbeSet,
    ShownImages,
    measure_hummingbird,
    measure_linear_probe,
    retrieval_visuals,
    say,
)
from locatdino.evaluation.feature_cache import CachedExtractor
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig
from locatdino.models import position_rule


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
    outcome = ModelOutcome(spec, parameters=count_parameters(backbone), pos_embed=position_rule(backbone))
    if train_set is not None:  # None: a dataset with image labels only (probes, no masks)
        measure_hummingbird(
            outcome,
            lambda c, look: hummingbird(extractor, train_set, val_set, c, inspect=look),
            len(train_set),
            cfg,
            fractions,
            retrieval_visuals(outcome, shown, cfg),
        )
        if linprobe is not None:
            measure_linear_probe(outcome, backbone, train_set, val_set, linprobe, shown)
    if hasattr(backbone, "blocks"):  # a ViT; a Swin has no class token to attend from, its GAug acts per window
        say(f"{spec.name}: attention maps and locality")
        outcome.visuals["attention"] = class_token_attention(backbone, shown.images[:1])[0].numpy()
        outcome.locality = locality_per_block(backbone, shown.images)
    else:
        outcome.not_applicable["locality"] = "windowed attention (Swin): no class token, no image-wide locality"
    if probes is not None:
        say(
            f"{spec.name}: class-token probes ({len(probes.train_labels)} train / "
            f"{len(probes.test_labels)} test images)"
        )
        n_train = len(probes.train_images)
        both = class_embeddings(
            backbone, torch.cat([probes.train_images, probes.test_images]), cfg.batch_size, cfg.precision
        )
        train, test = both[:n_train], both[n_train:]
        outcome.probes = {
            **probe_record("knn", knn_hits(train, probes.train_labels, test, probes.test_labels)),
            **probe_record("logistic", logistic_hits(train, probes.train_labels, test, probes.test_labels)),
            "majority_top1": 100 * float(np.mean(probes.test_labels == np.bincount(probes.train_labels).argmax())),
            "num_train": len(train),
            "num_test": len(test),
        }
    say(f"{spec.name}: forward speed and memory at {cfg.input_size} px")
    outcome.forward = forward_cost(base, cfg.input_size, cfg.batch_size)
    return outcome
