"""Which models an evaluation runs: the one ``--model`` grammar of ``hbird``, ``linprobe`` and
``compare``, the label of each run, and every backbone built before any work.

``--model [LABEL=]NAME[:CHECKPOINT]``, repeatable: NAME is a timm / LocAtViT model, CHECKPOINT its
weights (any format of ``locatdino.models.create_backbone``; ``none`` or nothing: random init,
drawn from ``--seed``), LABEL the run's name in tables, reports and folders (default: NAME, or
NAME-<checkpoint file stem>). The text is split at its first ``:``, so a checkpoint path may hold
``:`` itself; a LABEL holds no ``:``. The forms of earlier versions (``--checkpoint PATH`` beside
``--model``; ``compare``'s positional ``LABEL=NAME:PATH``) are refused with the line to write.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import ArgumentParser
from locatdino.common.errors import UserError
from locatdino.evaluation.features import check_layer, load_backbone
from locatdino.evaluation.labels import check_labels
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES
from locatdino.models.dense_features import feature_layers
from locatdino.models.model_spec import MODEL_METAVAR, parse_model
from locatdino.models.token_grid import fitting_sizes, patch_size

POS_EMBED_CHOICES = ("auto", *POS_EMBED_RULES)
POS_EMBED_HELP = (
    "position-embedding resampling at other grids: dino (the reference ViT's), timm, or auto "
    "(each release's own: dino for full DINO checkpoints and plain state dicts of vanilla ViTs, "
    "timm for DINOv2 with registers; timm otherwise)"
)


@dataclass(frozen=True)
class ModelRun:
    """One ``--model``: its run's label, the model name, its weights (None: random init) and the
    position-embedding rule it is loaded with."""

    label: str
    name: str
    checkpoint: str | None
    pos_embed: str = "auto"


def add_model_arguments(group: Any) -> None:
    """``--model`` and ``--pos-embed``, repeatable: one run per model; and the retired
    ``--checkpoint``, hidden, caught to say what to write instead (:func:`model_runs`)."""
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar=MODEL_METAVAR,
        help="required, repeatable: a timm / LocAtViT model NAME, its CHECKPOINT (a file in any "
        "format of locatdino.models.create_backbone; none or nothing: random init from --seed) and "
        "the run's LABEL (default: NAME, or NAME-<checkpoint file stem>); the first model is the "
        "reference of every Δ",
    )
    group.add_argument(
        "--pos-embed",
        action="append",
        choices=POS_EMBED_CHOICES,
        default=[],
        metavar="RULE",
        help=POS_EMBED_HELP + "; once for all models or once per --model",
    )
    group.add_argument("--checkpoint", action="append", default=[], help=argparse.SUPPRESS)


def add_retired_models(group: Any) -> None:
    """``compare``'s positional models of earlier versions, hidden, caught to say what to write
    instead (:func:`model_runs`); compare adds them beside the runner's ``--model``."""
    group.add_argument("retired_models", nargs="*", default=[], help=argparse.SUPPRESS)


def _retired_forms(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Refuse, in one line with the new form, what earlier versions took for ``--model``."""
    if args.checkpoint:
        written = "--model NAME:CHECKPOINT (e.g. --model locatvit_tiny_patch16_224:path/to.pth)"
        if len(args.checkpoint) == len(args.model):
            written = " ".join(f"--model {name}:{path}" for name, path in zip(args.model, args.checkpoint))
        parser.refuse(f"--checkpoint is gone: write {written}")
    retired = getattr(args, "retired_models", [])
    if retired and all("=" in text for text in retired):
        parser.refuse(f"models are given with --model: write {' '.join(f'--model {t}' for t in retired)}")
    if retired:
        parser.error(f"unrecognized arguments: {' '.join(retired)}")


def model_runs(args: argparse.Namespace, parser: ArgumentParser, reserved: Iterable[str] = ()) -> list[ModelRun]:
    """A :class:`ModelRun` per ``--model``, in order, with unique labels usable as folder names
    (a derived label that repeats, case ignored, gets ``-2``, ``-3``, …; a LABEL is checked by
    :func:`~locatdino.evaluation.labels.check_labels`, ``reserved`` the names the command writes
    into its output folder); every problem exits in one line naming ``parser``'s command, status 2."""
    _retired_forms(args, parser)
    if not args.model:
        parser.error("the following arguments are required: --model")
    rules = (
        args.pos_embed * len(args.model) if len(args.pos_embed) == 1 else args.pos_embed or ["auto"] * len(args.model)
    )
    if len(rules) != len(args.model):
        parser.refuse(
            f"{len(args.model)} --model but {len(args.pos_embed)} --pos-embed "
            "(give one for all models or one per model)"
        )
    try:
        parsed = [parse_model(text) for text in args.model]
    except ValueError as err:
        parser.refuse(str(err))
    given = [label for label, _, _ in parsed if label is not None]
    runs, seen = [], {label.casefold() for label in given}
    for (label, name, checkpoint), rule in zip(parsed, rules):
        if label is None:
            label = re.sub(r"[^\w.+-]+", "_", name if checkpoint is None else f"{name}-{Path(checkpoint).stem}")
            base, i = label, 1
            while label.casefold() in seen:
                i += 1
                label = f"{base}-{i}"
            seen.add(label.casefold())
        runs.append(ModelRun(label, name, checkpoint, rule))
    try:  # derived labels too: a checkpoint stem may be a reserved name
        check_labels([run.label for run in runs], "--model", reserved)
    except ValueError as err:
        parser.refuse(str(err))
    return runs


def load_backbones(runs: list[ModelRun], seed: int, input_size: int, layer: int = -1) -> list[nn.Module]:
    """Every backbone, built and checked before the first evaluation starts: a wrong second
    checkpoint, an input size the patch does not divide or a ``--layer`` the model does not have
    must not cost the first model's run."""
    models = []
    for run in runs:
        name, ckpt = run.name, run.checkpoint
        if ckpt is None:
            torch.manual_seed(seed)  # a random-init run is reproducible from --seed
        try:
            model = load_backbone(name, ckpt, pos_embed=run.pos_embed)
        except ValueError as err:
            named = name in str(err) or (ckpt is not None and ckpt in str(err))
            raise UserError(str(err) if named else f"--model {name}: {err}") from err
        patch = patch_size(model)[0]
        if input_size % patch:
            raise UserError(
                f"--input-size {input_size} is not a multiple of the patch size {patch} of {name}: "
                f"use {fitting_sizes(input_size, patch)}"
            )
        check_layer(feature_layers(model), layer, name)
        models.append(model)
    return models
