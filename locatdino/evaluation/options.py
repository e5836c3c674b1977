"""The command-line options every frozen-backbone evaluation shares: labelled data, the
encoder's features, its device, loaders; and what follows from them (the splits, the device,
what a ``results.json`` records of the run). The models are named by ``--model``
(:mod:`locatdino.evaluation.model_runs`).

``locatdino hbird``, ``locatdino linprobe`` and ``locatdino compare`` evaluate the same frozen
encoders on the same datasets, so a user who learns ``--layer 10 --norm`` on one must find it,
with the same meaning, default and ``--help`` group, on the others; defining the options once
keeps them from drifting apart. Each command adds only what is its own (Hummingbird's protocol:
``locatdino.evaluation.hbird.options``; the probe's budget, outputs, figures).
Every number is range-checked as it is parsed, before any work, and an option several commands
take is defined once, with one type, range and help (``locatdino.common.arguments.SHARED_OPTIONS``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import OptionGroups, add_shared_option, at_least, integer
from locatdino.common.errors import UserError
from locatdino.common.output_files import ensure_writable, remove_stale_temporaries
from locatdino.common.output_folder import OutputFolder
from locatdino.data.datasets.segmentation import DATASETS
from locatdino.evaluation.model_runs import ModelRun
from locatdino.evaluation.precision import PRECISIONS
from locatdino.evaluation.provenance import checkpoint_record
from locatdino.evaluation.splits import open_split
from locatdino.evaluation.train_lists import listed_ids, select_listed, train_list_record
from locatdino.evaluation.views import check_usable
from locatdino.models import position_rule

# what each command's memory (training) split is for, in its --help
TRAIN_SPLIT_USE = {
    "hbird": "the memory split: the images Hummingbird retrieves labelled patches from (VOC: trainaug, as the paper)",
    "linprobe": "the training split: the images the linear head is trained on (VOC: trainaug, as the paper)",
    "compare": "the memory / training split of Hummingbird and the probes (VOC: trainaug, as the paper)",
    "knn": "the train split: the images whose class tokens vote",
    "lincls": "the train split: the images the linear classifier is trained on",
}


def _dataset(choices: tuple[str, ...]) -> Any:
    """argparse ``type`` of ``--dataset``: ``shards`` is a shard URL pattern of segmentation samples;
    the classification commands name their folder of shards per split ``shard-splits``."""

    def parse(text: str) -> str:
        if text == "shards" and "shards" not in choices:
            raise argparse.ArgumentTypeError(
                "'shards' is a URL pattern of segmentation shards (hbird, linprobe, compare); class-labelled "
                "shards in ROOT/<split>/*.tar are --dataset shard-splits"
            )
        return text

    return parse


def add_data_arguments(g: Any, datasets: tuple[str, ...] = DATASETS, command: str = "hbird") -> None:
    """The labelled dataset (one of ``datasets``: the segmentation sets by default, the
    class-labelled sources for ``knn`` and ``lincls``) and its memory (training) / query splits
    (``g``: the data group), each help saying what ``command`` does with it."""
    if "imagefolder" in datasets:
        what = (
            "class-labelled images: imagefolder (ROOT/<split>/<class>/<image>), shard-splits (ROOT/<split>/*.tar, "
            "`locatdino shards` of such a tree) or the built-in scenes (one class per scene)"
        )
        where = "ROOT of the splits; not needed for the built-in scenes"
    else:
        what = "a segmentation dataset, segmentation shards or the built-in scenes"
        where = (
            "dataset root (shards: a shard URL pattern, e.g. data/voc-{000000..000009}.tar); not needed for the "
            "built-in scenes"
        )
    g.add_argument("--dataset", type=_dataset(datasets), choices=datasets, default="scenes", help=what)
    g.add_argument("--data-dir", default=None, help=where)
    g.add_argument("--train-split", default="train", help=TRAIN_SPLIT_USE[command])
    g.add_argument("--val-split", default="val", help="the query split: the images that are scored")
    add_shared_option(g, "--num-train", note="the whole split; the built-in scenes: 300")
    add_shared_option(g, "--num-val", note="the whole split; the built-in scenes: 100")
    g.add_argument("--scene-size", type=at_least(1), default=224, help="side of the built-in scenes in px")


def add_feature_arguments(groups: OptionGroups, d: Any) -> None:
    """Which frozen tokens (protocol group), computed where and in which arithmetic (runtime
    group), for Hummingbird and the linear probe; ``d`` is the command's default config, whose
    ``layer``, ``norm`` and ``precision`` the options default to (``HummingbirdConfig()``,
    ``LinearProbeConfig()``)."""
    protocol, runtime = groups.protocol, groups.runtime
    protocol.add_argument(
        "--layer",
        type=integer,
        default=d.layer,
        help="block whose patch tokens are used (negative: from the end, -1 the last)",
    )
    protocol.add_argument(
        "--norm",
        action=argparse.BooleanOptionalAction,
        default=d.norm,
        help="apply the final norm to the features (the Hummingbird reference's default "
        "wrapper does for timm models: it takes forward_features)",
    )
    add_prr_argument(protocol)
    add_encoder_arguments(runtime, d.precision)


def add_prr_argument(g: Any) -> None:
    """``--prr``, one help for every command (``g``: the protocol group)."""
    g.add_argument("--prr", action="store_true", help="apply PRR to the features")


def add_encoder_arguments(g: Any, precision: str) -> None:
    """The encoder's ``--device`` and ``--precision`` (default ``precision``; ``g``: the runtime group)."""
    g.add_argument(
        "--device", default="auto", help="encoder device: auto (CUDA when available), cpu, cuda, cuda:1, ..."
    )
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=precision,
        help="encoder precision: auto (bf16 on GPUs and on CPUs with native bf16, AVX512-BF16 or AMX; "
        "int8 Linear layers on other x86 CPUs; fp32 elsewhere), fp32 (the reference's), bf16 (autocast; "
        "several times slower where bf16 is emulated, AVX2-only CPUs), int8 (CPU only)",
    )


def add_loader_arguments(g: Any) -> None:
    """DataLoader workers and progress bars (``g``: the runtime group)."""
    add_shared_option(g, "--workers", note="1 for a CPU encoder, min(8, cores) on GPU")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def open_splits(args: argparse.Namespace) -> tuple[Any, Any]:
    """The memory (``--train-split``, the images ``--train-list`` / ``--fraction`` name when given:
    :mod:`locatdino.evaluation.train_lists`) and query (``--val-split``) splits of the data options,
    each refused (one line) when it has fewer images than asked for or none that can be used
    (:func:`~locatdino.evaluation.views.check_usable`): before any model is loaded."""
    common = dict(seed=args.seed, scene_size=args.scene_size)
    listed = listed_ids(args)  # a list that cannot be used is refused before any folder is read
    train = open_split(
        args.dataset,
        args.data_dir,
        args.train_split,
        args.num_train,
        default_scenes=300,
        option="--num-train",
        **common,
    )
    val = open_split(
        args.dataset, args.data_dir, args.val_split, args.num_val, default_scenes=100, option="--num-val", **common
    )
    if listed is not None:
        train = select_listed(train, *listed, args.train_split, val)
    check_usable(train, f"--train-split {args.train_split}")
    check_usable(val, f"--val-split {args.val_split}")
    return train, val


def check_outputs(
    out: str, command: str, planned: Iterable[str], cache_dir: str | None, overwrite: bool
) -> OutputFolder:
    """``command``'s output folder ``--out``, checked before any work (it holds no earlier run's
    output but with ``overwrite``, no file the command did not write among ``planned``, and can be
    written: :meth:`~locatdino.common.output_folder.OutputFolder.check`), and ``--cache-dir``, when
    given, writable and rid of killed runs' temporaries; each problem one line naming ``command``."""
    folder = OutputFolder(out, command)
    try:
        folder.check(planned, overwrite)
        if cache_dir is not None:
            ensure_writable(cache_dir, "--cache-dir")
            remove_stale_temporaries(cache_dir)
    except (OSError, UserError) as err:
        raise SystemExit(f"locatdino {command}: {err}") from None
    return folder


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


def record_run(result: dict, args: argparse.Namespace, run: ModelRun, model: nn.Module) -> dict:
    """Add to a run's ``results.json`` dict what was run: the model, the dataset (in its config)
    and the checkpoint file's record (in its provenance). Returns ``result``."""
    result["model"] = {
        "name": run.name,
        "checkpoint": run.checkpoint,
        "label": run.label,
        "pos_embed": position_rule(model),
    }
    result["config"].update(
        dataset=args.dataset,
        data_dir=args.data_dir,
        train_split=args.train_split,
        val_split=args.val_split,
        scene_size=args.scene_size if args.dataset == "scenes" else None,
        train_list=train_list_record(args),
    )
    result["provenance"]["checkpoint"] = checkpoint_record(run.checkpoint)
    return result
