"""``locatdino compare``: several models side by side — one report with figures and probes.

    locatdino compare --model vanilla=vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --model locat=locatvit_small_patch16_224:runs/x/checkpoints/last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012

Writes into ``--out``: ``results.json`` (the schema of every evaluation command,
:mod:`locatdino.evaluation.results`, with the comparison's dataset, config, probes, failures and
figures beside the models), ``report.md``, ``figures/*.png`` (per-class IoU, mIoU vs
memory size, predictions, PCA feature maps, class-token attention, LocAtViT locality) and
``per_image_confusion/`` (each model's per-image confusion matrices, for intervals between any two
models). The first model is the reference of every Δ, each with its 95 % interval. ``--baselines``
adds two rows that need no network, ``pixels`` and ``position-prior`` (``baselines.py``): the floors
the models' scores are read against. Exit status 1 when a model failed (its one-line error is on
stderr and in the report; the others are still evaluated and written).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locatdino.common.arguments import ArgumentParser, ConfigTable, add_shared_option, at_least, option_groups
from locatdino.common.errors import UserError
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_folder import OutputFolder, add_overwrite_option
from locatdino.evaluation.compare.baselines import NAMES as BASELINE_NAMES
from locatdino.evaluation.compare.intervals import attach_differences, confusion_file
from locatdino.evaluation.compare.measure import memory_sizes
from locatdino.evaluation.compare.report import headline_table, report_markdown
from locatdino.evaluation.compare.runner import ModelSpec, ProbeSet, ShownImages, compare
from locatdino.evaluation.features import check_layer
from locatdino.evaluation.hbird.index import check_index_device
from locatdino.evaluation.hbird.options import (
    add_protocol_arguments,
    config_from_args,
    parse_protocol_args,
    protocol_record,
)
from locatdino.evaluation.linprobe.one_cycle import MIN_STEPS
from locatdino.evaluation.linprobe.protocol import PROBE_AUGMENT, LinearProbeConfig
from locatdino.evaluation.model_runs import add_model_arguments, model_runs
from locatdino.evaluation.options import add_data_arguments, encoder_device, open_splits
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.results import REPORT_FILE, RESULTS_FILE, results_document
from locatdino.evaluation.splits import CachedSplit, SubsetSplit
from locatdino.evaluation.train_lists import add_train_list_arguments, listed_ids, train_list_record
from locatdino.evaluation.views import BadSample
from locatdino.models import create_backbone
from locatdino.models.dense_features import feature_layers
from locatdino.models.token_grid import patch_size

# compare's linear probe: cheap enough for the built-in scenes (the demo runs it for four models);
# at equal cost, more updates of a smaller batch train the head further than fewer of batch 32
LINPROBE_DEFAULTS = {"iterations": 320, "batch_size": 8, "augment": "off"}
# which option sets which field of compare's LinearProbeConfig (its Hummingbird config: the table
# of locatdino.evaluation.hbird.options)
PROBE_TABLE = ConfigTable(
    LinearProbeConfig,
    options={
        "--input-size": "input_size",
        "--linprobe-iters": "iterations",
        "--linprobe-batch-size": "batch_size",
        "--linprobe-augment": "augment",
        "--layer": "layer",
        "--norm": "norm",
        "--prr": "prr",
        "--precision": "precision",
        "--workers": "num_workers",
        "--seed": "seed",
        "--no-progress": "progress",
    },
    internal={
        "epochs": "none: the budget is --linprobe-iters",
        "lr": "the paper's",
        "weight_decay": "the paper's",
        "cache": "on: features computed once with --linprobe-augment off",
        "cache_dir": "the system's temporary folder",
        "max_cache_ram_mb": "the probe's default",
        "eval_batch_size": "the probe's default",
        "variant": "the paper's: compare reports the paper's protocol",
    },
    negated=frozenset({"--no-progress"}),
)
# what a report consists of: every file under its two folders is the report's (locatdino.common.output_folder)
REPORT_FILES = (RESULTS_FILE, REPORT_FILE, "figures/", "per_image_confusion/")
DEFAULT_FRACTIONS = (Fraction(1, 16), Fraction(1, 4), Fraction(1))
SHARD_LABEL_RULE = "shards: image label = the samples' cls (class folder)"
SCENE_LABEL_RULE = (
    "scenes: image label = dominant object class (most pixels among tree, bush, building, "
    "rock, animal; locatdino.data.scenes.scene_class)"
)


def _fraction(text: str) -> Fraction:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"memory fraction {text!r} is not a number like 1/16 or 0.25") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"memory fraction {text} must lie in (0, 1]")
    return value


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="locatdino compare",
        description="Compare frozen models on one dataset: Hummingbird mIoU (several memory sizes), "
        "per-class IoU, class-token probes, speed, and figures, in one report.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model, positional_hint=True)
    groups.model.add_argument(
        "--baselines",
        action="store_true",
        help="add the rows that need no network: pixels (each patch's input values as its feature) and "
        "position-prior (the memory's class frequencies at each patch's place), on the first model's token "
        "grid, through the same Hummingbird and linear probe (docs/evaluation.md)",
    )
    add_data_arguments(groups.data, command="compare")
    add_train_list_arguments(groups.data)
    add_protocol_arguments(groups)
    protocol = groups.protocol
    protocol.add_argument(
        "--memory-fractions",
        type=_fraction,
        nargs="+",
        default=None,
        metavar="F",
        help="memory sizes to score, as fractions of the full memory; one that cannot keep --k "
        "patches is refused (default: 1/16 1/4 1, those that can)",
    )
    protocol.add_argument("--no-linprobe", action="store_true", help="skip the dense linear probe")
    protocol.add_argument(
        "--linprobe-iters",
        type=at_least(MIN_STEPS),
        default=LINPROBE_DEFAULTS["iterations"],
        help="linear-probe training iterations (a cheap budget for the scenes; the paper's "
        "protocol: locatdino linprobe)",
    )
    protocol.add_argument(
        "--linprobe-batch-size",
        type=at_least(1),
        default=LINPROBE_DEFAULTS["batch_size"],
        help="linear-probe training batch (the paper's: 32)",
    )
    protocol.add_argument(
        "--linprobe-augment",
        choices=PROBE_AUGMENT,
        default=LINPROBE_DEFAULTS["augment"],
        help="linear-probe training views: off (whole images, features cached once) or "
        "reference (the paper's augmentation, backbone every iteration)",
    )
    add_shared_option(groups.output, "--out", "compare_results")
    add_overwrite_option(groups.output)
    groups.output.add_argument("--figure-images", type=at_least(1), default=4, help="query images shown in the figures")
    return p


def _linprobe_config(args: argparse.Namespace) -> LinearProbeConfig | None:
    """The linear probe's settings: compare's budget options, Hummingbird's features and seed."""
    return None if args.no_linprobe else PROBE_TABLE.build(args)


def _open_splits(args: argparse.Namespace) -> tuple[Any, Any]:
    """The memory and query segmentation splits, or ``(None, None)`` for shards without masks."""
    listed_ids(args)  # a list that cannot be used is its own error, never "shards without masks"
    try:
        train, val = open_splits(args)
    except BadSample:  # masks there, none of them usable
        raise
    except ValueError:
        if args.dataset != "shards":
            raise
        return None, None  # e.g. ImageFolder shards: image labels only
    if args.dataset == "scenes":  # rendered once, read by every model and memory size
        train, val = CachedSplit(train), CachedSplit(val)
    return train, val


def _labelled_shards(args: argparse.Namespace, split: str, count: int | None) -> Any:
    from locatdino.data.shards.labels import ShardImageLabels

    folder = Path(args.data_dir) / split
    if not folder.is_dir():
        raise ValueError(f"class-token probes on shards need a folder per split: {folder} does not exist")
    labelled = ShardImageLabels(str(folder))
    if count is not None and count < len(labelled):
        rng = np.random.default_rng(args.seed)
        labelled = SubsetSplit(labelled, np.sort(rng.choice(len(labelled), size=count, replace=False)))
    return labelled


def _probe_set(args: argparse.Namespace, train: Any, val: Any) -> tuple[ProbeSet | None, dict[str, Any]]:
    """Image-labelled train / test images: scenes (dominant object of the mask) or shards with ``cls``."""
    if args.dataset == "scenes":
        from locatdino.data.scenes import scene_class

        probes = ProbeSet.from_splits(train, val, scene_class, args.input_size, SCENE_LABEL_RULE)
    elif args.dataset == "shards":
        try:
            train_labels = _labelled_shards(args, args.train_split, args.num_train)
            val_labels = _labelled_shards(args, args.val_split, args.num_val)
        except ValueError as err:
            if train is None:  # neither masks nor labels: nothing to measure
                raise
            return None, {"note": f"not run: {err}"}
        probes = ProbeSet.from_splits(train_labels, val_labels, int, args.input_size, SHARD_LABEL_RULE)
    else:
        return None, {"note": f"not run: {args.dataset} has no image-level labels"}
    return probes, {
        "label_rule": probes.label_rule,
        "num_train": len(probes.train_labels),
        "num_test": len(probes.test_labels),
        "note": probes.label_rule,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parse_protocol_args(parser, argv)
    runs = model_runs(args, parser, [name.rstrip("/") for name in REPORT_FILES])
    specs = [ModelSpec(run.label, run.name, run.checkpoint) for run in runs]
    names = [s.name for s in specs]
    if args.baselines and set(names) & set(BASELINE_NAMES):
        raise SystemExit(
            f"locatdino compare: with --baselines the names {' and '.join(BASELINE_NAMES)} are the "
            "baselines' rows: rename the model"
        )
    folder = OutputFolder(args.out, "compare")
    out = folder.path
    try:
        folder.check(REPORT_FILES, args.overwrite)
    except UserError as err:
        raise SystemExit(f"locatdino compare: {err}") from None
    device = encoder_device(args.device, "compare")
    try:
        cfg = config_from_args(args)  # inconsistent settings fail before any data is read
        check_index_device(cfg.index_device, cfg.index, cfg.knn_backend)
        patches = _check_models(specs, cfg.layer)
        linprobe = _linprobe_config(args)
        train, val = _open_splits(args)
        if train is not None:
            args.memory_fractions = _memory_fractions(args.memory_fractions, patches, len(train), cfg)
        if linprobe is not None and train is not None:
            linprobe.check_train_size(len(train), "--linprobe-batch-size")
        probes, probe_info = _probe_set(args, train, val)
        if args.baselines and train is None:
            raise ValueError(f"--baselines needs segmentation masks: these {args.dataset} have image labels only")
    except (ValueError, FileNotFoundError, OSError) as err:
        raise SystemExit(f"locatdino compare: {err}") from None
    with folder.writing(args.overwrite):  # a second compare into --out is refused, not raced
        if train is None:
            print(
                f"[compare] {len(specs)} models on {args.dataset} (no masks: class-token probes only): "
                f"{len(probes.train_labels)} train / {len(probes.test_labels)} test images",
                file=sys.stderr,
                flush=True,
            )
            shown = ShownImages.from_probes(probes, args.figure_images)
        else:
            print(
                f"[compare] {len(specs)} models on {args.dataset}: {len(train)} memory / {len(val)} query images, "
                f"{args.input_size} px",
                file=sys.stderr,
                flush=True,
            )
            shown = ShownImages.from_split(val, args.figure_images, args.input_size)
        outcomes, failed = compare(
            specs,
            train,
            val,
            cfg,
            args.memory_fractions,
            shown,
            probes,
            pos_embeds=[run.pos_embed for run in runs],
            device=device,
            linprobe=linprobe if train is not None else None,
            baselines=args.baselines,
        )
        classes = report_classes(val) if val is not None else []
        models = [o.to_dict() for o in outcomes]
        for i, (outcome, model) in enumerate(zip(outcomes, models)):
            if outcome.image_confusions is not None:
                folder.wrote(outcome.image_confusions.save(out / confusion_file(i)))
                model["hbird"]["per_image_confusion"] = confusion_file(i)
                if outcome.linprobe_confusion is not None:  # the same query images, the same classes of the mean
                    folder.wrote(outcome.linprobe_confusion.save(out / confusion_file(i, "linprobe")))
                    model["linprobe"]["per_image_confusion"] = confusion_file(i, "linprobe")
        attach_differences(models, out, cfg.hungarian)
        run_config = {
            **{k: v for k, v in vars(cfg).items() if k != "progress"},
            "protocol": protocol_record(args),
            "memory_fractions": [str(f) for f in args.memory_fractions or []],  # none without masks
            "linprobe": asdict(linprobe) if linprobe is not None and train is not None else None,
        }
        provenance = run_provenance()
        for model in models:  # what every results.json model record holds
            model.update(config=run_config, provenance=provenance)
        report = {
            **results_document("locatdino compare " + shlex.join(argv), "compare", models),
            "dataset": {
                "name": args.dataset,
                "data_dir": args.data_dir,
                "train_split": args.train_split,
                "val_split": args.val_split,
                "train_list": train_list_record(args),
                "num_train": len(train) if train is not None else len(probes.train_labels),
                "num_val": len(val) if val is not None else len(probes.test_labels),
                "class_names": classes,
            },
            "config": run_config,
            "probes": probe_info,
            "failed": failed,
            "figures": _figures(outcomes, shown, classes, out) if outcomes else {},
        }
        folder.wrote(*(out / path for path in report["figures"].values()))
        folder.write_text(RESULTS_FILE, json.dumps(report, indent=2, default=str) + "\n")
        folder.write_text(REPORT_FILE, report_markdown(report))
        if outcomes:
            print(headline_table(report["models"]))
        print(f"[compare] report: {out / 'report.md'}", file=sys.stderr)
        return 1 if failed else 0


def _check_models(specs: list[ModelSpec], layer: int) -> list[int]:
    """``--layer`` against every model's depth (built on the meta device: no memory, no weights)
    before the first model runs; returns the patch sizes of the models that can be built (one that
    cannot is left to its own load, which reports it as that model's failure)."""
    patches = []
    for spec in specs:
        try:
            with torch.device("meta"):
                model = create_backbone(spec.model)
        except Exception:  # noqa: BLE001 - reported by load_model, per model
            continue
        check_layer(feature_layers(model), layer, spec.model)
        patches.append(patch_size(model)[0])
    return patches


def _memory_fractions(given: list[Fraction] | None, patches: list[int], num_train: int, cfg: Any) -> list[Fraction]:
    """The memory fractions to score. One that some model cannot be scored at would be missing
    from the report: given, it is refused; of the defaults, it is left out with a note."""
    fractions = given or list(DEFAULT_FRACTIONS)
    unscorable = _unscorable(fractions, patches, num_train, cfg)
    if unscorable and given:
        fraction, why = next(iter(unscorable.items()))
        raise ValueError(f"--memory-fractions {fraction}: {why}: use a larger fraction, or a smaller --k")
    for fraction, why in unscorable.items():
        print(f"[compare] note: default memory fraction {fraction} left out: {why}", file=sys.stderr)
    return [f for f in fractions if f not in unscorable]


def _unscorable(fractions: list[Fraction], patches: list[int], num_train: int, cfg: Any) -> dict[Fraction, str]:
    """``{fraction: why}``, ascending, of the fractions below 1 whose memory cannot keep ``--k``
    patches and one per view (:func:`memory_sizes`) for some model: at most ``num_train`` views of
    ``(input size / patch)²`` patches each (``--memory-size`` at most)."""
    views, found = num_train * cfg.aug_epochs, {}
    for patch in sorted(set(patches)):
        most = views * (cfg.input_size // patch) ** 2
        most = most if cfg.memory_size is None else min(most, cfg.memory_size)
        scored = {f for f, _ in memory_sizes(fractions, most, views, cfg.k)}
        for fraction in sorted(f for f in set(fractions) if f < 1 and f not in scored and f not in found):
            found[fraction] = (
                f"at most {int(fraction * most):,} memory patches (of {most:,} at patch {patch}), "
                f"fewer than --k {cfg.k} or than one per memory view ({views:,})"
            )
    return dict(sorted(found.items()))


def report_classes(dataset: Any) -> list[str]:
    return [str(c) for c in (getattr(dataset, "class_names", None) or range(dataset.num_classes))]


def _figures(outcomes: list, shown: ShownImages, class_names: list[str], out: Path) -> dict[str, str]:
    """Draw every figure into ``out/figures``; ``{title: path relative to out}``."""
    from locatdino.evaluation.compare import figures

    print("[compare] figures", file=sys.stderr, flush=True)
    models = [o.to_dict() for o in outcomes]
    images = shown.images.numpy()
    folder = out / "figures"
    with_masks = [o for o in outcomes if o.hbird is not None]
    drawn = {
        "class-token attention": figures.attention_grid(
            images[0],
            {o.spec.name: o.visuals["attention"] for o in outcomes if "attention" in o.visuals},
            folder / "attention.png",
        )
    }
    if with_masks:
        dense = [o.to_dict() for o in with_masks]
        drawn |= {
            "per-class IoU": figures.per_class_bars(dense, folder / "per_class_iou.png"),
            "mIoU vs memory size": figures.miou_vs_memory(dense, folder / "miou_vs_memory.png"),
            "predictions": figures.qualitative_grid(
                images, shown.masks, _predictions(with_masks), class_names, folder / "predictions.png"
            ),
            "PCA of patch features": figures.pca_grid(
                images, {o.spec.name: o.visuals["pca"] for o in with_masks if "pca" in o.visuals}, folder / "pca.png"
            ),
        }
    drawn["LocAtViT locality"] = figures.locality_curves(models, folder / "locality.png")
    return {title: str(path.relative_to(out)) for title, path in drawn.items() if path is not None}


def _predictions(outcomes: list) -> dict[str, Any]:
    """The figure's prediction columns: each model's Hummingbird labels, then its linear probe's."""
    columns = {}
    for o in outcomes:
        columns[o.spec.name] = o.visuals["prediction"]
        if "probe_prediction" in o.visuals:
            columns[f"{o.spec.name} (probe)"] = o.visuals["probe_prediction"]
    return columns
