"""``locatdino shards``: write WebDataset shards from a folder, VOC, ADE20K or the built-in scenes.

Examples::

    locatdino shards ~/data/imagenet/train shards/in1k --maxcount 5000 --workers 16
    locatdino shards ~/data/VOCdevkit shards/voc-trainaug --split trainaug
    locatdino shards ~/data/ADEChallengeData2016 shards/ade-val --split validation
    locatdino shards --synthetic 5000 --seed 0 shards/scenes
"""

from __future__ import annotations

import argparse
import sys

from locatdino.common.arguments import ArgumentParser, add_shared_option, at_least, option_groups
from locatdino.common.output_files import DiskFullError
from locatdino.data.shards.sources import build_source
from locatdino.data.shards.writer import check_prefix, write_shards

_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _bytes(text: str) -> float:
    """``1e9``, ``500M``, ``2G``, ``2GB`` → bytes (more than 0)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        size = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1e9, 500M, 2G)") from None
    if not size > 0:  # 0 or less: every shard would be started empty
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, got {text!r}")
    return size


def _prefix(text: str) -> str:
    try:
        return check_prefix(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--prefix ")) from None


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="locatdino shards",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="locatdino shards [options] SOURCE OUT_DIR\n       locatdino shards [options] --synthetic N OUT_DIR",
        description="Write WebDataset tar shards (+ index.json) from an image folder tree (optionally one "
        "sub-folder per class -> 'cls'), a Pascal VOC 2012 tree, an ADE20K tree (masks -> "
        "'seg.png') or the built-in synthetic scenes.",
        epilog=__doc__.split("Examples::")[1],
    )
    groups = option_groups(p)
    data, output = groups.data, groups.output
    data.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="source directory (or 'scenes') and output directory; with --synthetic only OUT_DIR",
    )
    data.add_argument(
        "--kind",
        default="auto",
        choices=["auto", "folder", "voc", "ade20k", "cityscapes", "scenes"],
        help="source layout (default: detected from the tree)",
    )
    data.add_argument(
        "--split",
        default=None,
        help="voc: train/val/trainval/trainaug (train); ade20k: training/validation (training); "
        "cityscapes: train/val (train); scenes: train/val (train)",
    )
    data.add_argument("--synthetic", type=at_least(0), default=0, metavar="N", help="write N built-in scenes")
    add_shared_option(data, "--seed", 0)
    data.add_argument("--size", type=at_least(1), default=224, help="side of the built-in scenes in pixels")
    output.add_argument("--maxcount", type=at_least(1), default=10_000, help="samples per shard (default 10000)")
    output.add_argument("--maxsize", type=_bytes, default=1e9, help="bytes per shard before starting a new one (1G)")
    output.add_argument(
        "--prefix",
        type=_prefix,
        default="shard",
        help="shard file-name stem (default 'shard': OUT_DIR/shard-000000.tar, ...)",
    )
    output.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the shard set already in OUT_DIR: its index.json and the shards it lists, removed once the "
        "new set is complete (a .tar it does not list, or .tar files without an index.json: refused, never removed)",
    )
    add_shared_option(groups.runtime, "--workers", note="the cores this process may use")
    groups.runtime.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.synthetic and len(args.paths) == 1:
        args.paths = ["scenes", *args.paths]
    if len(args.paths) != 2:
        parser.error("expected SOURCE OUT_DIR (or --synthetic N OUT_DIR)")
    source, out_dir = args.paths
    try:
        src = build_source(source, args.kind, args.split, args.synthetic, args.seed, args.size)
        index = write_shards(
            src,
            out_dir,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            workers=args.workers,
            prefix=args.prefix,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    except (FileNotFoundError, FileExistsError, ValueError, DiskFullError) as exc:
        print(f"locatdino shards: {exc}", file=sys.stderr)
        return 1
    _notes(index)
    print(
        f"wrote {index['num_samples']} samples in {index['num_shards']} shards "
        f"({index['total_bytes'] / 1e6:.1f} MB, {index['seconds']:.1f} s) to {out_dir}\n"
        f"urls: {out_dir.rstrip('/')}/{index['urls']}"
    )
    return 0


def _notes(index: dict) -> None:
    """One stderr line each for skipped files and renamed sample keys (the index lists them)."""
    skipped, renamed = index.get("skipped_files") or {"count": 0}, index.get("renamed_keys")
    if skipped["count"]:
        named = "; ".join(skipped["first"][:3]) + ("; ..." if skipped["count"] > 3 else "")
        print(
            f"locatdino shards: skipped {skipped['count']} file(s) that do not decode, not stored (index.json "
            f"skipped_files): {named}",
            file=sys.stderr,
        )
    if renamed:
        a, b = next(iter(renamed["first"].items()))
        print(
            f"locatdino shards: note: {renamed['count']} file(s) share their sample key with an earlier file and "
            f"were stored under their own (index.json renamed_keys), e.g. {a} as {b!r}",
            file=sys.stderr,
        )
