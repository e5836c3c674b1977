"""The command-line options of the Hummingbird protocol, shared by ``locatdino hbird`` and
``locatdino compare``.

Both commands run the same engine, so a user who learns ``--augment reference --norm`` on one
must find it, with the same meaning and default, on the other; defining the options once keeps
them from drifting apart. Each command adds only what is its own (models, outputs, figures).
Every number is range-checked as it is parsed (``locatdino.arguments``), before any work.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

import torch

from locatdino.arguments import at_least, positive_float
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES
from locatdino.retrieval.augment import AUGMENT_MODES
from locatdino.retrieval.evaluate import HummingbirdConfig
from locatdino.retrieval.metric import HUNGARIAN_CRITERIA
from locatdino.retrieval.precision import PRECISIONS

DATASETS = ("scenes", "voc", "ade20k", "shards")
POS_EMBED_CHOICES = ("auto", *POS_EMBED_RULES)
POS_EMBED_HELP = ("position-embedding resampling at other grids: dino (the reference ViT's), timm, or auto "
                  "(dino for DINO-format files: full DINO checkpoints and plain state dicts of vanilla ViTs; "
                  "timm otherwise)")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The labelled dataset and its memory / query splits."""
    p.add_argument("--dataset", choices=DATASETS, default="scenes", help="labelled dataset")
    p.add_argument("--data-dir", default=None, help="dataset root (shard URL pattern for 'shards'); "
                   "not needed for the built-in scenes")
    p.add_argument("--train-split", default="train", help="memory split (VOC: trainaug as in the paper)")
    p.add_argument("--val-split", default="val", help="query split")
    p.add_argument("--num-train", type=at_least(1), default=None,
                   help="memory images: a seeded random subset (scenes: how many to render, default 300)")
    p.add_argument("--num-val", type=at_least(1), default=None, help="query images (scenes default 100)")
    p.add_argument("--scene-size", type=at_least(1), default=224, help="side of the built-in scenes in px")


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
    p.add_argument("--layer", type=int, default=d.layer, help="block whose patch tokens are used")
    p.add_argument("--norm", action=argparse.BooleanOptionalAction, default=d.norm,
                   help="apply the final norm to the features (the reference's default wrapper does "
                   "for timm models: it takes forward_features)")
    p.add_argument("--prr", action="store_true", help="apply PRR to the features")
    p.add_argument("--device", default="auto", help="encoder device: auto (CUDA when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="encoder precision: auto (bf16 on GPUs and on CPUs with native bf16, AVX512-BF16 "
                   "or AMX; int8 Linear layers on other x86 CPUs; fp32 elsewhere), fp32 (the reference's), "
                   "bf16 (autocast; several times slower where bf16 is emulated, AVX2-only CPUs), int8 "
                   "(CPU only)")
    p.add_argument("--hungarian", choices=HUNGARIAN_CRITERIA, default=d.hungarian,
                   help="criterion of the Hungarian-matched mIoU: iou (summed IoU, the reference's) "
                   "or pixels (summed matched pixels)")
    p.add_argument("--eval-resolution", choices=("original", "input"), default=d.eval_resolution,
                   help="score at the masks' original resolution, or at the input size (reference)")
    p.add_argument("--batch-size", type=at_least(1), default=d.batch_size, help="images per forward")
    p.add_argument("--workers", type=at_least(0), default=None,
                   help="DataLoader workers (default: 1 for a CPU encoder, min(8, cores) on GPU)")
    p.add_argument("--seed", type=at_least(0), default=d.seed, help="memory views, subsets, sampling, random init")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace, memory_dir: str | None = None) -> HummingbirdConfig:
    """The :class:`HummingbirdConfig` of parsed options (``ValueError`` when they disagree)."""
    names = {f.name for f in fields(HummingbirdConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and k != "memory_dir"}
    return HummingbirdConfig(**values, num_workers=args.workers, memory_dir=memory_dir,
                             progress=not args.no_progress)


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
