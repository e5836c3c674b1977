"""The command-line options of the Hummingbird protocol, shared by ``locatdino hbird`` and
``locatdino compare``: every :class:`~locatdino.retrieval.evaluate.HummingbirdConfig` setting a
user may change, with its default, and the config they make. The options of models, data and
features that every evaluation command shares are in :mod:`locatdino.evaluation.options`.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from locatdino.arguments import at_least, positive_float
from locatdino.evaluation.augment import AUGMENT_MODES
from locatdino.evaluation.metric import HUNGARIAN_CRITERIA
from locatdino.evaluation.options import add_feature_arguments, add_loader_arguments
from locatdino.retrieval.evaluate import HummingbirdConfig


def add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """Memory, search, features, scoring and devices: every :class:`HummingbirdConfig` setting
    a user may change, with its default."""
    d = HummingbirdConfig()
    p.add_argument("--memory-size", type=at_least(1), default=None, metavar="M",
                   help="memory budget in patches (rare-class-first sampling); default: keep all")
    p.add_argument("--aug-epochs", type=at_least(1), default=d.aug_epochs, help="augmented passes over the memory images")
    p.add_argument("--k", type=at_least(1), default=d.k, help="neighbours per query patch")
    p.add_argument("--beta", type=positive_float, default=d.beta, help="softmax temperature of the neighbour weights")
    p.add_argument("--index", default=d.index, metavar="SPEC",
                   help="auto (exact for small searches, else IVF with its recall reported) or a FAISS "
                   "factory string: Flat (exact, the reference's), IVF1024,Flat, IVF1024,PQ48, HNSW32, ...")
    p.add_argument("--nprobe", type=at_least(1), default=None, help="IVF cells visited per query (index auto: 64)")
    p.add_argument("--ef-search", type=at_least(1), default=None, help="HNSW search breadth")
    p.add_argument("--index-device", choices=("auto", "cpu", "gpu"), default=d.index_device,
                   help="auto: a GPU index when faiss-gpu sees a GPU")
    p.add_argument("--knn-backend", choices=("auto", "faiss", "torch"), default=d.knn_backend,
                   help="auto: exact search (Flat) with torch on the encoder's GPU when faiss-gpu is absent")
    p.add_argument("--input-size", type=at_least(1), default=d.input_size, metavar="S", help="eval resolution (paper: 512)")
    p.add_argument("--augment", choices=AUGMENT_MODES, default=d.augment,
                   help="memory views: zoom-out (crops of --scale, above 1 zooming out, + colour jitter), "
                   "reference (the reference's sampler, torchvision's RandomResizedCrop: draws above 1 "
                   "rejected, whole-image fallback, + colour jitter) or off (whole images, no jitter)")
    p.add_argument("--scale", type=positive_float, nargs=2, default=d.scale, metavar=("MIN", "MAX"),
                   help="memory crop area / image area; above 1 zooms out (the reference's sampler "
                   "rejects those draws: '--scale 0.5 1' matches its effective range)")
    add_feature_arguments(p, d)
    p.add_argument("--hungarian", choices=HUNGARIAN_CRITERIA, default=d.hungarian,
                   help="criterion of the Hungarian-matched mIoU: iou (summed IoU, the reference's) "
                   "or pixels (summed matched pixels)")
    p.add_argument("--eval-resolution", choices=("original", "input"), default=d.eval_resolution,
                   help="score at the masks' original resolution, or at the input size (reference)")
    p.add_argument("--batch-size", type=at_least(1), default=d.batch_size, help="images per forward")
    p.add_argument("--seed", type=at_least(0), default=d.seed, help="memory views, subsets, sampling, random init")
    add_loader_arguments(p)


def config_from_args(args: argparse.Namespace, memory_dir: str | None = None) -> HummingbirdConfig:
    """The :class:`HummingbirdConfig` of parsed options (``ValueError`` when they disagree)."""
    names = {f.name for f in fields(HummingbirdConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and k != "memory_dir"}
    return HummingbirdConfig(**values, num_workers=args.workers, memory_dir=memory_dir,
                             progress=not args.no_progress)
