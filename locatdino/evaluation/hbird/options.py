"""The command-line options of the Hummingbird protocol, shared by ``locatdino hbird`` and
``locatdino compare``: every :class:`~locatdino.evaluation.hbird.evaluate.HummingbirdConfig` setting a user
may change, with its default; the declared table of which option sets which field
(:data:`HBIRD_TABLE`, :data:`COMPARE_HBIRD_TABLE`); and ``--protocol``, the named settings
(:data:`PROTOCOLS`). The options of models, data and features that every evaluation command shares
are in :mod:`locatdino.evaluation.options`.
"""

from __future__ import annotations

import argparse
from typing import Any

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    OptionGroups,
    add_shared_option,
    at_least,
    option_dest,
    positive_float,
)
from locatdino.evaluation.augment import AUGMENT_MODES
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.metric import HUNGARIAN_CRITERIA
from locatdino.evaluation.options import add_feature_arguments, add_loader_arguments

# --protocol NAME: settings a protocol fixes, by HummingbirdConfig field; options given beside it win.
# reference: what open-hummingbird-eval does with a timm ViT (its crop sampler, the final norm of its
# default wrapper, masks resized to the input size, Hungarian on IoU, fp32, exact search), so its
# "mIoU (Hungarian)" is the quantity published tables report (docs/evaluation.md)
REFERENCE_SETTINGS: dict[str, Any] = {
    "augment": "reference",
    "norm": True,
    "eval_resolution": "input",
    "hungarian": "iou",
    "precision": "fp32",
    "index": "Flat",
}
PROTOCOLS: dict[str, dict[str, Any]] = {
    "locatdino": {name: getattr(HummingbirdConfig(), name) for name in REFERENCE_SETTINGS},  # the defaults
    "reference": REFERENCE_SETTINGS,
}

# which option sets which HummingbirdConfig field: the options both commands share, and the fields
# none of them sets
_OPTIONS = {
    "--input-size": "input_size",
    "--aug-epochs": "aug_epochs",
    "--memory-size": "memory_size",
    "--k": "k",
    "--beta": "beta",
    "--index": "index",
    "--nprobe": "nprobe",
    "--ef-search": "ef_search",
    "--index-device": "index_device",
    "--knn-backend": "knn_backend",
    "--layer": "layer",
    "--norm": "norm",
    "--prr": "prr",
    "--precision": "precision",
    "--batch-size": "batch_size",
    "--workers": "num_workers",
    "--eval-resolution": "eval_resolution",
    "--augment": "augment",
    "--hungarian": "hungarian",
    "--scale": "scale",
    "--seed": "seed",
    "--no-progress": "progress",
}
_FIXED = {
    "ratio": "the crop aspect-ratio range of both samplers (the reference's)",
    "jitter": "the colour-jitter strength of the memory views",
    "jitter_p": "its probability",
    "min_valid_fraction": "the share of image a zoomed-out patch needs to be stored",
}
HBIRD_TABLE = ConfigTable(
    HummingbirdConfig,
    options={**_OPTIONS, "--memory-dtype": "memory_dtype"},
    internal={**_FIXED, "memory_dir": "--memory-dir, one folder per model when several"},
    negated=frozenset({"--no-progress"}),
)
COMPARE_HBIRD_TABLE = ConfigTable(
    HummingbirdConfig,
    options=_OPTIONS,
    internal={
        **_FIXED,
        "memory_dtype": "float32: compare keeps its banks in RAM",
        "memory_dir": "none: compare keeps its banks in RAM",
    },
    negated=frozenset({"--no-progress"}),
)


def add_protocol_arguments(groups: OptionGroups) -> None:
    """``--protocol``, memory, search, features and scoring (protocol group), devices, batches and
    loaders (runtime group): every :class:`HummingbirdConfig` setting a user may change, with its
    default."""
    d = HummingbirdConfig()
    p, runtime = groups.protocol, groups.runtime
    p.add_argument(
        "--protocol",
        choices=tuple(PROTOCOLS),
        default="locatdino",
        help="named settings: locatdino (the defaults below) or reference (what open-hummingbird-eval "
        "does: " + " ".join(_flags(REFERENCE_SETTINGS)) + "); options given beside it win",
    )
    add_shared_option(
        p,
        "--input-size",
        d.input_size,
        note="224, the LocAtViT code's size for /16 models; the Hummingbird paper's 512 is (512/224)² ≈ 5x the tokens",
    )
    p.add_argument(
        "--memory-size",
        type=at_least(1),
        default=None,
        metavar="M",
        help="memory budget in patches (rare-class-first sampling); default: keep all",
    )
    p.add_argument(
        "--aug-epochs", type=at_least(1), default=d.aug_epochs, help="augmented passes over the memory images"
    )
    p.add_argument(
        "--augment",
        choices=AUGMENT_MODES,
        default=d.augment,
        help="memory views: zoom-out (crops of --scale, above 1 zooming out, + colour jitter), "
        "reference (the reference's sampler, torchvision's RandomResizedCrop: draws above 1 "
        "rejected, whole-image fallback, + colour jitter) or off (whole images, no jitter)",
    )
    p.add_argument(
        "--scale",
        type=positive_float,
        nargs=2,
        default=d.scale,
        metavar=("MIN", "MAX"),
        help="memory crop area / image area; above 1 zooms out (the reference's sampler "
        "rejects those draws: '--scale 0.5 1' matches its effective range)",
    )
    p.add_argument("--k", type=at_least(1), default=d.k, help="neighbours per query patch")
    p.add_argument("--beta", type=positive_float, default=d.beta, help="softmax temperature of the neighbour weights")
    p.add_argument(
        "--index",
        default=d.index,
        metavar="SPEC",
        help="auto (exact for small searches, else IVF with its recall reported) or a FAISS "
        "factory string: Flat (exact, the reference's), IVF1024,Flat, IVF1024,PQ48, HNSW32, ...",
    )
    p.add_argument("--nprobe", type=at_least(1), default=None, help="IVF cells visited per query (index auto: 64)")
    p.add_argument("--ef-search", type=at_least(1), default=None, help="HNSW search breadth")
    add_feature_arguments(groups, d)
    p.add_argument(
        "--hungarian",
        choices=HUNGARIAN_CRITERIA,
        default=d.hungarian,
        help="criterion of the Hungarian-matched mIoU: iou (summed IoU, the reference's) "
        "or pixels (summed matched pixels)",
    )
    p.add_argument(
        "--eval-resolution",
        choices=("original", "input"),
        default=d.eval_resolution,
        help="score at the masks' original resolution, or at the input size (reference)",
    )
    add_shared_option(p, "--seed", d.seed)
    runtime.add_argument(
        "--index-device",
        choices=("auto", "cpu", "gpu"),
        default=d.index_device,
        help="auto: a GPU index when faiss-gpu sees a GPU",
    )
    add_shared_option(
        runtime,
        "--knn-backend",
        d.knn_backend,
        use="auto: torch beside a GPU encoder when faiss has no GPU, faiss otherwise",
    )
    add_shared_option(runtime, "--batch-size", d.batch_size, use="the memory and query images")
    add_loader_arguments(runtime)


def _flags(settings: dict[str, Any]) -> list[str]:
    """The command-line spelling of protocol settings: ``--augment reference --norm ...``."""
    flags = []
    for name, value in settings.items():
        option = COMPARE_HBIRD_TABLE.option_of(name)
        flags += (
            [option if value is True else f"--no-{option[2:]}"] if isinstance(value, bool) else [option, str(value)]
        )
    return flags


def parse_protocol_args(parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with ``--protocol``'s settings as the defaults: an option given beside it wins."""
    args = parser.parse_args(argv)
    parser.set_defaults(
        **{option_dest(COMPARE_HBIRD_TABLE.option_of(name)): value for name, value in PROTOCOLS[args.protocol].items()}
    )
    return parser.parse_args(argv)


def protocol_record(args: argparse.Namespace) -> dict[str, Any]:
    """What ``results.json`` keeps of ``--protocol``: its name, the value of each setting it names
    in this run, and those an option given beside it changed."""
    values = COMPARE_HBIRD_TABLE.values(args)
    ran = {name: values[name] for name in PROTOCOLS[args.protocol]}
    return {
        "name": args.protocol,
        "settings": ran,
        "changed": sorted(name for name, value in ran.items() if value != PROTOCOLS[args.protocol][name]),
    }


def config_from_args(
    args: argparse.Namespace, table: ConfigTable = COMPARE_HBIRD_TABLE, **internal: Any
) -> HummingbirdConfig:
    """The :class:`HummingbirdConfig` of parsed options through ``table`` (``ValueError`` when
    they disagree); ``internal`` sets fields no option of the command sets (hbird's ``memory_dir``)."""
    return table.build(args, **internal)
