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
import pickle
import sys
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from locatdino.common.arguments import ArgumentParser, ConfigTable, OptionGroups, at_least
from locatdino.common.output_folder import OutputFolder
from locatdino.evaluation.compare.baselines import NAMES as BASELINE_NAMES
from locatdino.evaluation.compare.baselines import evaluate_baselines
from locatdino.evaluation.compare.intervals import confusion_file, paired_differences
from locatdino.evaluation.compare.measure import ModelOutcome, ModelSpec, memory_sizes
from locatdino.evaluation.compare.report import COMPARE_LAYOUT
from locatdino.evaluation.compare.runner import ProbeSet, ShownImages, evaluate_model
from locatdino.evaluation.features import check_layer
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.hbird.index import check_index_device
from locatdino.evaluation.hbird.options import (
    add_protocol_arguments,
    config_from_args,
    parse_protocol_args,
    protocol_record,
)
from locatdino.evaluation.linprobe.one_cycle import MIN_STEPS
from locatdino.evaluation.linprobe.protocol import PROBE_AUGMENT, LinearProbeConfig
from locatdino.evaluation.model_runs import ModelRun, add_retired_models, model_runs
from locatdino.evaluation.options import add_data_arguments, check_outputs, open_splits
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.results import REPORT_FILE, RESULTS_FILE, ReportLayout
from locatdino.evaluation.runner import Protocol, Scored, build_parser, fail, run
from locatdino.evaluation.splits import CachedSplit, SubsetSplit
from locatdino.evaluation.train_lists import add_train_list_arguments, listed_ids, train_list_record
from locatdino.evaluation.views import BadSample
from locatdino.models import create_backbone
from locatdino.models.dense_features import feature_layers
from locatdino.models.model_spec import parse_model
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


def _add_arguments(groups: OptionGroups) -> None:
    """compare's options beside the runner's ``--model``, ``--out`` and ``--overwrite``."""
    add_retired_models(groups.model)
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
    groups.output.add_argument("--figure-images", type=at_least(1), default=4, help="query images shown in the figures")


def _parser() -> ArgumentParser:
    return build_parser(CompareProtocol())


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


@dataclass
class CompareSetup:
    """What every row of a comparison is measured on, and the rows measured so far (the figures
    and the per-image files read them after the last)."""

    args: argparse.Namespace
    cfg: HummingbirdConfig
    train: Any  # None: no segmentation masks (class-token probes only)
    val: Any
    linprobe: LinearProbeConfig | None  # None: --no-linprobe, or no masks
    probes: ProbeSet | None
    probe_info: dict[str, Any]
    shown: ShownImages
    run_config: dict[str, Any]  # every row's config, and the document's
    provenance: dict[str, Any]
    outcomes: list[ModelOutcome] = field(default_factory=list)  # the rows, in order
    first_patch: int | None = None  # the first model's patch: the baselines' grid
    figures: dict[str, str] = field(default_factory=dict)  # {title: path relative to --out}


class CompareProtocol(Protocol):
    """Several models side by side: every model through Hummingbird, the linear probe and the class-token
    probes (``runner.evaluate_model``), then the baselines and the figures across them."""

    command = "compare"
    description = (
        "Compare frozen models on one dataset: Hummingbird mIoU (several memory sizes), "
        "per-class IoU, class-token probes, speed, and figures, in one report."
    )
    out_default = "compare_results"
    # a model that cannot be read or scored is reported and left out; the others are still compared
    tolerated = (OSError, ValueError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError)

    @property
    def layout(self) -> ReportLayout:
        return COMPARE_LAYOUT

    def add_arguments(self, groups: OptionGroups) -> None:
        _add_arguments(groups)

    def parse(self, parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
        """``--protocol``'s settings as defaults; the baselines' names refused as a model's label."""
        args = parse_protocol_args(parser, argv)
        labels = [run.label for run in model_runs(args, parser, [name.rstrip("/") for name in REPORT_FILES])]
        if args.baselines and set(labels) & set(BASELINE_NAMES):
            raise fail(
                self.command,
                f"with --baselines the names {' and '.join(BASELINE_NAMES)} are the baselines' rows: rename the model",
            )
        return args

    def prepare(self, args: argparse.Namespace) -> CompareSetup:
        # figures/ and per_image_confusion/ too, and before the data are read (the runner checks --out after)
        check_outputs(args.out, self.command, REPORT_FILES, None, args.overwrite)
        try:
            return _prepare(args)
        except OSError as err:
            raise fail(self.command, err) from None

    def load_options(self, args: argparse.Namespace, setup: CompareSetup) -> dict[str, Any]:
        return {"input_size": setup.cfg.input_size}

    def announce(self, run: ModelRun, setup: CompareSetup) -> str:
        return f"{run.name} ({run.checkpoint or 'random init'})"

    def score(self, model: nn.Module, run: ModelRun, setup: CompareSetup, device: torch.device) -> Scored:
        spec = ModelSpec(run.label, run.name, run.checkpoint)
        outcome = evaluate_model(
            spec,
            model,
            setup.train,
            setup.val,
            setup.cfg,
            setup.args.memory_fractions,
            setup.shown,
            setup.probes,
            setup.linprobe,
        )
        setup.first_patch = setup.first_patch or patch_size(model)[0]
        return _row(outcome, setup)

    def record(self, scored: Scored, args: argparse.Namespace, run: ModelRun, model: nn.Module) -> dict[str, Any]:
        return scored.record  # the dataset is the document's, once (document_keys)

    def difference(self, scored: Scored, first: Scored, setup: CompareSetup) -> dict[str, Any]:
        a, b = scored.paired, first.paired
        intervals = paired_differences(_confusions(a), _confusions(b), a.probes, b.probes, setup.cfg.hungarian)
        return {"": {metric: interval.to_dict() for metric, interval in intervals.items()}}

    def rows_after(self, setup: CompareSetup, first: Scored | None) -> list[Scored]:
        if not setup.args.baselines or setup.first_patch is None or setup.train is None:
            return []
        outcomes = evaluate_baselines(
            setup.first_patch,
            setup.train,
            setup.val,
            setup.cfg,
            setup.args.memory_fractions,
            setup.shown,
            setup.linprobe,
        )
        return [_row(outcome, setup) for outcome in outcomes]

    def finish(self, setup: CompareSetup, records: list[dict[str, Any]], folder: OutputFolder | None) -> None:
        """Each row's per-image matrices (intervals between any two models) and the figures."""
        if folder is None:
            return
        out = folder.path
        for i, (outcome, record) in enumerate(zip(setup.outcomes, records)):
            if outcome.image_confusions is not None:
                folder.wrote(outcome.image_confusions.save(out / confusion_file(i)))
                record["hbird"]["per_image_confusion"] = confusion_file(i)
                if outcome.linprobe_confusion is not None:  # the same query images, the same classes of the mean
                    folder.wrote(outcome.linprobe_confusion.save(out / confusion_file(i, "linprobe")))
                    record["linprobe"]["per_image_confusion"] = confusion_file(i, "linprobe")
        if setup.outcomes:
            setup.figures = _figures(setup.outcomes, setup.shown, _classes(setup.val), out)
            folder.wrote(*(out / path for path in setup.figures.values()))

    def document_keys(self, setup: CompareSetup) -> dict[str, Any]:
        args, train, val, probes = setup.args, setup.train, setup.val, setup.probes
        dataset = {
            "name": args.dataset,
            "data_dir": args.data_dir,
            "train_split": args.train_split,
            "val_split": args.val_split,
            "train_list": train_list_record(args),
            "num_train": len(train) if train is not None else len(probes.train_labels),
            "num_val": len(val) if val is not None else len(probes.test_labels),
            "class_names": _classes(val),
        }
        return {"dataset": dataset, "config": setup.run_config, "probes": setup.probe_info, "figures": setup.figures}


def main(argv: list[str] | None = None) -> int:
    return run(CompareProtocol(), argv)


def _prepare(args: argparse.Namespace) -> CompareSetup:
    """The config, the data, the probes' images and the figures' (``ValueError``: one line), checked
    before any model is built."""
    cfg = config_from_args(args)  # inconsistent settings fail before any data is read
    check_index_device(cfg.index_device, cfg.index, cfg.knn_backend)
    patches = _check_models(args, cfg.layer)
    linprobe = _linprobe_config(args)
    train, val = _open_splits(args)
    if train is not None:
        args.memory_fractions = _memory_fractions(args.memory_fractions, patches, len(train), cfg)
    if linprobe is not None and train is not None:
        linprobe.check_train_size(len(train), "--linprobe-batch-size")
    probes, probe_info = _probe_set(args, train, val)
    if args.baselines and train is None:
        raise ValueError(f"--baselines needs segmentation masks: these {args.dataset} have image labels only")
    linprobe = linprobe if train is not None else None
    if train is None:
        print(
            f"[compare] {len(args.model)} models on {args.dataset} (no masks: class-token probes only): "
            f"{len(probes.train_labels)} train / {len(probes.test_labels)} test images",
            file=sys.stderr,
            flush=True,
        )
        shown = ShownImages.from_probes(probes, args.figure_images)
    else:
        print(
            f"[compare] {len(args.model)} models on {args.dataset}: {len(train)} memory / {len(val)} query images, "
            f"{args.input_size} px",
            file=sys.stderr,
            flush=True,
        )
        shown = ShownImages.from_split(val, args.figure_images, args.input_size)
    run_config = {
        **{k: v for k, v in vars(cfg).items() if k != "progress"},
        "protocol": protocol_record(args),
        "memory_fractions": [str(f) for f in args.memory_fractions or []],  # none without masks
        "linprobe": asdict(linprobe) if linprobe is not None else None,
    }
    return CompareSetup(args, cfg, train, val, linprobe, probes, probe_info, shown, run_config, run_provenance())


def _row(outcome: ModelOutcome, setup: CompareSetup) -> Scored:
    """A row of the report: its record, and the outcome its Δ and the figures are computed from."""
    setup.outcomes.append(outcome)
    record = outcome.to_dict()
    record.update(config=setup.run_config, provenance=setup.provenance)
    return Scored(record, paired=outcome)


def _confusions(outcome: ModelOutcome) -> dict[str, Any]:
    return {"hbird": outcome.image_confusions, "linprobe": outcome.linprobe_confusion}


def _check_models(args: argparse.Namespace, layer: int) -> list[int]:
    """``--layer`` against every model's depth (built on the meta device: no memory, no weights)
    before any data is read; returns the patch sizes of the models that can be built (one that
    cannot is left to its own load, which reports it as that model's failure)."""
    patches = []
    for text in args.model:
        name = parse_model(text)[1]
        try:
            with torch.device("meta"):
                model = create_backbone(name)
        except Exception:  # noqa: BLE001 - reported by the runner's load, per model
            continue
        check_layer(feature_layers(model), layer, name)
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


def _classes(dataset: Any | None) -> list[str]:
    """The query split's class names (none without masks)."""
    if dataset is None:
        return []
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
