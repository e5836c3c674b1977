"""The command-line options every frozen-backbone evaluation shares: models, labelled data, the
encoder's features, its device, loaders; and what follows from them (the runs, the backbones
built before any work, what a ``results.json`` records of the run).

``locatdino hbird``, ``locatdino linprobe`` and ``locatdino compare`` evaluate the same frozen
encoders on the same datasets, so a user who learns ``--layer 10 --norm`` on one must find it,
with the same meaning and default, on the others; defining the options once keeps them from
drifting apart. Each command adds only what is its own (Hummingbird's protocol:
``locatdino.retrieval.options``; the probe's budget, outputs, figures).
Every number is range-checked as it is parsed (``locatdino.arguments``), before any work.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from locatdino.arguments import at_least, integer
from locatdino.data.datasets.segmentation import DATASETS
from locatdino.errors import UserError
from locatdino.evaluation.features import check_layer, load_backbone
from locatdino.evaluation.precision import PRECISIONS
from locatdino.evaluation.provenance import checkpoint_record
from locatdino.evaluation.splits import open_split
from locatdino.evaluation.views import check_usable
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES

POS_EMBED_CHOICES = ("auto", *POS_EMBED_RULES)
POS_EMBED_HELP = ("position-embedding resampling at other grids: dino (the reference ViT's), timm, or auto "
                  "(dino for DINO-format files: full DINO checkpoints and plain state dicts of vanilla ViTs; "
                  "timm otherwise)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--model`` / ``--checkpoint`` / ``--pos-embed``, repeatable: one run per model."""
    p.add_argument("--model", action="append", required=True, metavar="NAME",
                   help="timm / LocAtViT model name; repeat to compare several models")
    p.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                   help="weights for the matching --model ('none': random init); any format of "
                   "locatdino.models.create_backbone")
    p.add_argument("--pos-embed", action="append", choices=POS_EMBED_CHOICES, default=[], metavar="RULE",
                   help=POS_EMBED_HELP + "; once for all models or once per --model")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The labelled dataset and its memory (training) / query splits."""
    p.add_argument("--dataset", choices=DATASETS, default="scenes", help="labelled dataset")
    p.add_argument("--data-dir", default=None, help="dataset root (shard URL pattern for 'shards'); "
                   "not needed for the built-in scenes")
    p.add_argument("--train-split", default="train", help="memory split (VOC: trainaug as in the paper)")
    p.add_argument("--val-split", default="val", help="query split")
    p.add_argument("--num-train", type=at_least(1), default=None,
                   help="memory images: a seeded random subset (scenes: how many to render, default 300)")
    p.add_argument("--num-val", type=at_least(1), default=None, help="query images (scenes default 100)")
    p.add_argument("--scene-size", type=at_least(1), default=224, help="side of the built-in scenes in px")


def add_feature_arguments(p: argparse.ArgumentParser, d: Any) -> None:
    """Which frozen tokens, computed where and in which arithmetic (Hummingbird and the linear
    probe); ``d`` is the command's default config, whose ``layer``, ``norm`` and ``precision`` the
    options default to (``HummingbirdConfig()``, ``LinearProbeConfig()``)."""
    p.add_argument("--layer", type=integer, default=d.layer,
                   help="block whose patch tokens are used (negative: from the end, -1 the last)")
    p.add_argument("--norm", action=argparse.BooleanOptionalAction, default=d.norm,
                   help="apply the final norm to the features (the Hummingbird reference's default wrapper "
                   "does for timm models: it takes forward_features)")
    p.add_argument("--prr", action="store_true", help="apply PRR to the features")
    p.add_argument("--device", default="auto", help="encoder device: auto (CUDA when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="encoder precision: auto (bf16 on GPUs and on CPUs with native bf16, AVX512-BF16 "
                   "or AMX; int8 Linear layers on other x86 CPUs; fp32 elsewhere), fp32 (the reference's), "
                   "bf16 (autocast; several times slower where bf16 is emulated, AVX2-only CPUs), int8 "
                   "(CPU only)")


def add_loader_arguments(p: argparse.ArgumentParser) -> None:
    """DataLoader workers and progress bars."""
    p.add_argument("--workers", type=at_least(0), default=None,
                   help="DataLoader workers (default: 1 for a CPU encoder, min(8, cores) on GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def open_splits(args: argparse.Namespace) -> tuple[Any, Any]:
    """The memory (``--train-split``) and query (``--val-split``) splits of the data options,
    each refused (one line) when it has fewer images than asked for or none that can be used
    (:func:`~locatdino.evaluation.views.check_usable`): before any model is loaded."""
    common = dict(seed=args.seed, scene_size=args.scene_size)
    train = open_split(args.dataset, args.data_dir, args.train_split, args.num_train, default_scenes=300,
                       option="--num-train", **common)
    val = open_split(args.dataset, args.data_dir, args.val_split, args.num_val, default_scenes=100,
                     option="--num-val", **common)
    check_usable(train, f"--train-split {args.train_split}")
    check_usable(val, f"--val-split {args.val_split}")
    return train, val


def encoder_device(name: str, command: str) -> torch.device:
    """The encoder's torch device from ``--device``; one line naming ``command`` when unusable."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"locatdino {command}: invalid --device {name!r} (auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"locatdino {command}: --device {name} but torch sees no CUDA GPU")
    return device


def model_runs(args: argparse.Namespace, command: str) -> list[tuple[str, str | None, str, str]]:
    """(model, checkpoint, position-embedding rule, label) per ``--model``, labels unique and
    usable as directory names; a count mismatch exits naming ``command``."""
    ckpts = args.checkpoint or [None] * len(args.model)
    if len(ckpts) != len(args.model):
        raise SystemExit(
            f"locatdino {command}: {len(args.model)} --model but {len(args.checkpoint)} --checkpoint "
            "(give one per model, 'none' for random init)"
        )
    rules = args.pos_embed * len(args.model) if len(args.pos_embed) == 1 else args.pos_embed or ["auto"] * len(args.model)
    if len(rules) != len(args.model):
        raise SystemExit(f"locatdino {command}: {len(args.model)} --model but {len(args.pos_embed)} --pos-embed "
                         "(give one for all models or one per model)")
    runs, seen = [], set()
    for name, ckpt, rule in zip(args.model, ckpts, rules):
        ckpt = None if ckpt in (None, "", "none") else ckpt
        label = name if ckpt is None else f"{name}-{Path(ckpt).stem}"
        label = re.sub(r"[^\w.+-]+", "_", label)
        base, i = label, 1
        while label in seen:
            i += 1
            label = f"{base}-{i}"
        seen.add(label)
        runs.append((name, ckpt, rule, label))
    return runs


def load_backbones(runs: list[tuple[str, str | None, str, str]], seed: int, input_size: int,
                   layer: int = -1) -> list[nn.Module]:
    """Every backbone, built and checked before the first evaluation starts: a wrong second
    checkpoint, an input size the patch does not divide or a ``--layer`` the model does not have
    must not cost the first model's run."""
    models = []
    for name, ckpt, rule, _ in runs:
        if ckpt is None:
            torch.manual_seed(seed)  # a random-init run is reproducible from --seed
        try:
            model = load_backbone(name, ckpt, pos_embed=rule)
        except ValueError as err:
            named = name in str(err) or (ckpt is not None and ckpt in str(err))
            raise UserError(str(err) if named else f"--model {name}: {err}") from err
        patch = model.patch_embed.patch_size[0]
        if input_size % patch:
            below = input_size // patch * patch
            raise UserError(f"--input-size {input_size} is not a multiple of the patch size {patch} of {name}: "
                            f"use {below or patch} or {below + patch}")
        check_layer(len(model.blocks), layer, name)
        models.append(model)
    return models


def record_run(result: dict, args: argparse.Namespace, name: str, checkpoint: str | None, label: str,
               model: nn.Module) -> dict:
    """Add to a run's ``results.json`` dict what was run: the model, the dataset (in its config)
    and the checkpoint file's record (in its provenance). Returns ``result``."""
    result["model"] = {"name": name, "checkpoint": checkpoint, "label": label, "pos_embed": model.pos_embed_rule}
    result["config"].update(dataset=args.dataset, data_dir=args.data_dir, train_split=args.train_split,
                            val_split=args.val_split, scene_size=args.scene_size if args.dataset == "scenes" else None)
    result["provenance"]["checkpoint"] = checkpoint_record(checkpoint)
    return result
