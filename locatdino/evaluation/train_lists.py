"""The memory (training) images named by id: ``--train-list FILE`` or a published subset,
``--fraction 1/8|1/64|1/128 --fraction-seed S`` (open-hummingbird-eval's lists, shipped with the
package), for ``locatdino hbird``, ``linprobe`` and ``compare``.

``--num-train`` draws its own seeded subset; a number on it and a published "1/128" number are
computed on different images. With a list the same images are read, in the reference's order
(sorted ids). Every listed id must name an image of the split: a missing one is refused in one
line before any model is loaded, with the first missing ids, how many, and whether they belong
to the query split (a list of the other split is the usual mistake).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from locatdino.common.arguments import integer
from locatdino.data.datasets.published_lists import (
    FRACTION_SEEDS,
    FRACTIONS,
    PUBLISHED_SPLITS,
    published_ids,
    published_list_path,
    read_id_list,
)
from locatdino.evaluation.splits import SubsetSplit

SHOWN_MISSING = 3  # ids a refusal names


def add_train_list_arguments(g: Any) -> None:
    """``--train-list``, ``--fraction`` and ``--fraction-seed`` (``g``: the data group)."""
    g.add_argument(
        "--train-list",
        default=None,
        metavar="FILE",
        help="memory (training) images by id, one per line (open-hummingbird-eval's file_sets format; "
        "VOC 2007_000032, ADE20K ADE_train_00000001, Cityscapes aachen_000000_000019, scenes train_00003); "
        "instead of --num-train",
    )
    g.add_argument(
        "--fraction",
        choices=FRACTIONS,
        default=None,
        help="the published memory subset of open-hummingbird-eval (VOC --train-split trainaug, ADE20K "
        "training), shipped with locatdino; instead of --num-train",
    )
    g.add_argument(
        "--fraction-seed",
        type=integer,
        choices=FRACTION_SEEDS,
        default=None,
        help="which published list of --fraction (default 42)",
    )


def listed_ids(args: argparse.Namespace) -> tuple[list[str], str] | None:
    """The ids ``--train-list`` or ``--fraction`` name and how a message names their source;
    None when neither is given. ``ValueError`` in one line for a combination that cannot hold."""
    train_list, fraction = getattr(args, "train_list", None), getattr(args, "fraction", None)
    seed = getattr(args, "fraction_seed", None)
    if seed is not None and fraction is None:
        raise ValueError(f"--fraction-seed {seed} picks a list of --fraction: give --fraction too")
    if train_list is None and fraction is None:
        return None
    if train_list is not None and fraction is not None:
        raise ValueError("give --train-list or --fraction, not both")
    given = "--train-list" if fraction is None else "--fraction"
    if args.num_train is not None:
        raise ValueError(f"give --num-train or {given}, not both ({given} names the memory images)")
    if args.dataset == "shards":
        raise ValueError(f"{given}: shards carry no image ids; use it with a dataset folder or the scenes")
    if fraction is None:
        try:
            return read_id_list(train_list), f"--train-list {train_list}"
        except OSError as err:
            raise ValueError(f"--train-list {train_list}: {err.strerror or err}") from None
    seed = FRACTION_SEEDS[0] if seed is None else seed
    published_list_path(args.dataset, fraction, seed)  # no such list: refused before the split is checked
    split, spellings = PUBLISHED_SPLITS[args.dataset]
    if args.train_split not in spellings:
        raise ValueError(
            f"--fraction {fraction}: the published {args.dataset} lists are subsets of split {split!r}, "
            f"not --train-split {args.train_split} (add --train-split {split})"
        )
    return published_ids(args.dataset, fraction, seed), f"--fraction {fraction} --fraction-seed {seed}"


def select_listed(train: Any, ids: list[str], source: str, split: str, val: Any = None) -> SubsetSplit:
    """The images of ``train`` (split ``split``) that ``ids`` name, in sorted id order (as
    open-hummingbird-eval walks a list). ``ValueError`` in one line when an id is not in ``train``:
    how many, the first :data:`SHOWN_MISSING`, and how many of them name images of ``val``."""
    have = train.sample_ids()
    where = {name: i for i, name in enumerate(have)}
    missing = [i for i in ids if i not in where]
    if missing:
        first = ", ".join(missing[:SHOWN_MISSING]) + (", ..." if len(missing) > SHOWN_MISSING else "")
        elsewhere = set(missing) & set(val.sample_ids()) if val is not None else set()
        hint = f"; {len(elsewhere)} of them are images of the query split" if elsewhere else ""
        raise ValueError(
            f"{source}: {len(missing)} of its {len(ids)} ids are not images of split {split!r} "
            f"({len(have)} images): {first}{hint}"
        )
    return SubsetSplit(train, np.array([where[i] for i in sorted(ids)], dtype=np.int64))


def train_list_record(args: argparse.Namespace) -> dict[str, Any] | None:
    """What ``results.json`` keeps of the memory's list: the file, or the published fraction,
    seed and shipped file; None when the memory was not given by ids."""
    if getattr(args, "train_list", None) is not None:
        return {"file": args.train_list}
    if getattr(args, "fraction", None) is None:
        return None
    seed = FRACTION_SEEDS[0] if args.fraction_seed is None else args.fraction_seed
    path = published_list_path(args.dataset, args.fraction, seed)
    return {
        "fraction": args.fraction,
        "seed": seed,
        "file": f"{args.dataset}/{path.parent.name}/{path.name}",
        "source": "open-hummingbird-eval file_sets",
    }
