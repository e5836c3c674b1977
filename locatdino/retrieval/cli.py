"""``locatdino hbird``: the Hummingbird benchmark from the command line.

    locatdino hbird --model vit_small_patch16_224 --checkpoint dino_vits16.pth \\
        --model locatvit_small --checkpoint last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012
    locatdino hbird report runs/a runs/b --out comparison.md

Several ``--model`` (each with its ``--checkpoint``, ``none`` for random init) are evaluated on
the same memory views and compared in one report. One model writes ``OUT/results.json``,
``OUT/summary.md`` and ``OUT/per_image_confusion.npz``; several write ``OUT/<model>/...`` per run
plus ``OUT/summary.md`` comparing them, every Δ mIoU with its paired-bootstrap interval.
``report`` rebuilds a comparison, intervals included, from existing ``results.json`` files.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
from torch import nn

from locatdino.arguments import ArgumentParser
from locatdino.errors import UserError
from locatdino.help_format import DefaultsOnceHelpFormatter
from locatdino.output_files import (DiskFullError, atomic_write_text, ensure_writable, output_lock,
                                    remove_stale_temporaries)
from locatdino.retrieval.evaluate import HummingbirdConfig, hummingbird
from locatdino.retrieval.features import load_backbone
from locatdino.retrieval.memory import check_bank_folder
from locatdino.retrieval.protocol_options import (POS_EMBED_CHOICES, POS_EMBED_HELP, add_data_arguments,
                                                  add_protocol_arguments, config_from_args, encoder_device)
from locatdino.retrieval.provenance import checkpoint_record
from locatdino.retrieval.report import (differing_settings, incompatibilities, label_by_folder, load_results,
                                        miou_deltas, results_table, run_confusions, summary_markdown, write_run)
from locatdino.retrieval.splits import SubsetSplit, open_split


def _parser() -> argparse.ArgumentParser:
    d = HummingbirdConfig()
    p = ArgumentParser(
        prog="locatdino hbird",
        description="Hummingbird in-context segmentation: label each query patch from its k nearest "
        "labelled memory patches (frozen encoder, FAISS k-NN), report mIoU. "
        "`locatdino hbird report RESULTS...` compares finished runs.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    p.add_argument("--model", action="append", required=True, metavar="NAME",
                   help="timm / LocAtViT model name; repeat to compare several models")
    p.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                   help="weights for the matching --model ('none': random init); any format of "
                   "locatdino.models.create_backbone")
    p.add_argument("--pos-embed", action="append", choices=POS_EMBED_CHOICES, default=[], metavar="RULE",
                   help=POS_EMBED_HELP + "; once for all models or once per --model")
    add_data_arguments(p)
    add_protocol_arguments(p)
    p.add_argument("--memory-dtype", choices=("float32", "float16"), default=d.memory_dtype,
                   help="stored features (memory-dir banks, non-Flat indices)")
    p.add_argument("--memory-dir", default=None, help="memory-map the memory bank into this directory")
    p.add_argument("--out", default="hbird_results", metavar="DIR", help="results.json + summary.md")
    return p


def _report_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="locatdino hbird report",
                                description="Compare finished Hummingbird runs (refused when they scored "
                                "different query images; differing settings are marked).")
    p.add_argument("results", nargs="+", help="results.json files or directories holding them")
    p.add_argument("--out", default=None, help="also write the markdown comparison here")
    p.add_argument("--label", action="append", default=[],
                   help="name of each run, in the order found (default: its run folder); one per run")
    p.add_argument("--allow-mixed", action="store_true",
                   help="compare runs of different datasets, splits or query counts anyway (marked)")
    return p


def _runs(args: argparse.Namespace) -> list[tuple[str, str | None, str, str]]:
    """(model, checkpoint, position-embedding rule, label) per run, labels unique and usable as
    directory names."""
    ckpts = args.checkpoint or [None] * len(args.model)
    if len(ckpts) != len(args.model):
        raise SystemExit(
            f"locatdino hbird: {len(args.model)} --model but {len(args.checkpoint)} --checkpoint "
            "(give one per model, 'none' for random init)"
        )
    rules = args.pos_embed * len(args.model) if len(args.pos_embed) == 1 else args.pos_embed or ["auto"] * len(args.model)
    if len(rules) != len(args.model):
        raise SystemExit(f"locatdino hbird: {len(args.model)} --model but {len(args.pos_embed)} --pos-embed "
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


def _load_all(runs: list[tuple[str, str | None, str, str]], seed: int, input_size: int) -> list[nn.Module]:
    """Every backbone, built and checked before the first evaluation starts: a wrong second
    checkpoint or an input size the patch does not divide must not cost the first model's run."""
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
        models.append(model)
    return models


def _memory_dir(args: argparse.Namespace, label: str, single: bool) -> str | None:
    """The bank folder of one run: ``--memory-dir`` itself, or one sub-folder per model."""
    return None if args.memory_dir is None else str(Path(args.memory_dir) / ("" if single else label))


def _check_outputs(args: argparse.Namespace, runs: list[tuple[str, str | None, str]]) -> None:
    """Fail before any work when an output cannot be written or holds something hbird did not
    write (a bank replaces its folder whole; reports replace ``results.json`` / ``summary.md``).
    The results come last, and a memory bank is staged next to its folder; stale temporaries of
    killed runs go first."""
    single = len(runs) == 1
    out = Path(args.out)
    folders = [(out if single else out / label, "--out") for *_, label in runs]
    banks = [] if args.memory_dir is None else [Path(_memory_dir(args, label, single)) for *_, label in runs]
    folders += [(bank.parent, "--memory-dir") for bank in banks]
    try:
        for bank in banks:
            check_bank_folder(bank)
            if bank.resolve() == out.resolve() or bank.resolve() in out.resolve().parents:
                raise ValueError(f"--memory-dir {bank} would replace --out {out}: give them different folders")
        for report in {out / "summary.md", *(folder / name for folder, flag in folders if flag == "--out"
                                             for name in ("results.json", "summary.md"))}:
            _check_own_report(report)
        for folder, flag in folders:
            ensure_writable(folder, flag)
            remove_stale_temporaries(folder)
    except (OSError, ValueError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None


def _is_summary(path: Path) -> bool:
    return path.is_file() and path.read_text(errors="replace").startswith("# Hummingbird")


def _is_results(path: Path) -> bool:
    try:
        return path.is_file() and bool(load_results([path]))
    except ValueError:
        return False


def _check_own_report(path: Path, flag: str = "--out") -> None:
    """``ValueError`` when ``path`` exists and is not a report hbird wrote (it would be replaced)."""
    ours = _is_results(path) if path.suffix == ".json" else _is_summary(path)
    if path.exists() and not ours:
        raise ValueError(f"{flag}: {path} exists and is not a Hummingbird {path.name}: choose another {flag} "
                         "(a run replaces the reports it wrote, nothing else)")


def report_main(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    try:
        results = load_results(args.results)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    labels = args.label or label_by_folder(results)
    if len(labels) != len(results):
        raise SystemExit(f"locatdino hbird report: {len(labels)} --label for {len(results)} runs "
                         f"({', '.join(r['source'] for r in results)})")
    mixed = incompatibilities(results)
    if mixed and not args.allow_mixed:
        raise SystemExit(f"locatdino hbird report: the runs scored different query images ({'; '.join(mixed)}); "
                         "compare like with like, or pass --allow-mixed")
    for r, label in zip(results, labels):
        r["label"] = label
    for line in differing_settings(results):
        print(f"locatdino hbird report: warning: {line}", file=sys.stderr)
    if args.out and Path(args.out).exists() and not _is_summary(Path(args.out)):  # never over an input
        raise SystemExit(f"locatdino hbird report: --out {args.out} exists and is not a Hummingbird summary: "
                         "choose another file")
    deltas = None
    if len(results) > 1 and not mixed:  # intervals pair the same query images
        try:
            confusions = [run_confusions(r) for r in results]
        except ValueError as err:
            raise SystemExit(f"locatdino hbird report: {err}") from None
        without = [r["label"] for r, c in zip(results, confusions) if c is None]
        if without:
            print(f"locatdino hbird report: warning: no Δ mIoU interval for {', '.join(without)}: no per-image "
                  f"confusion matrices (written before they were kept)", file=sys.stderr)
        deltas = miou_deltas(confusions)
    print(results_table(results, deltas))
    if args.out:
        atomic_write_text(args.out, summary_markdown(results, deltas=deltas))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    args = _parser().parse_args(argv)
    runs = _runs(args)
    device = encoder_device(args.device, "hbird")
    try:
        config_from_args(args, None)  # inconsistent settings fail before any data is read
        common = dict(seed=args.seed, scene_size=args.scene_size)
        train_set = open_split(args.dataset, args.data_dir, args.train_split, args.num_train,
                               default_scenes=300, **common)
        val_set = open_split(args.dataset, args.data_dir, args.val_split, args.num_val,
                             default_scenes=100, **common)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None
    models = _load_all(runs, args.seed, args.input_size)  # a bad model creates no output folder
    _check_outputs(args, runs)
    with output_lock(args.out, "--out"):  # a second run into --out is refused, not raced
        return _evaluate(args, runs, models, train_set, val_set, device)


def _evaluate(args: argparse.Namespace, runs: list[tuple[str, str | None, str, str]], models: list[nn.Module],
              train_set, val_set, device: torch.device) -> int:
    """Every model's run, each written as it finishes, then the comparison of them all."""
    out = Path(args.out)
    picks_queries = args.dataset == "scenes" or isinstance(val_set, SubsetSplit)  # the seed chose the queries
    results, confusions = [], []
    for (name, ckpt, _, label), model in zip(runs, models):
        single = len(runs) == 1
        cfg = config_from_args(args, _memory_dir(args, label, single))
        print(f"[hbird] {label}: memory {len(train_set)} images x {cfg.aug_epochs} views, "
              f"{len(val_set)} queries, {cfg.input_size} px, index {cfg.index}", file=sys.stderr)
        try:  # a bank too large for --memory-dir fails before encoding, reserving its disk space
            run = hummingbird(model.to(device), train_set, val_set, cfg)
            result = run.to_dict()
            result["model"] = {"name": name, "checkpoint": ckpt, "label": label, "pos_embed": model.pos_embed_rule}
            result["config"].update(dataset=args.dataset, data_dir=args.data_dir, train_split=args.train_split,
                                    val_split=args.val_split,
                                    scene_size=args.scene_size if args.dataset == "scenes" else None,
                                    query_seed=args.seed if picks_queries else None)
            result["provenance"]["checkpoint"] = checkpoint_record(ckpt)
            write_run(result, out if single else out / label, run.image_confusions)
        except DiskFullError as err:
            raise SystemExit(f"locatdino hbird: {err}") from None
        results.append(result)
        confusions.append(run.image_confusions)
    deltas = miou_deltas(confusions) if len(results) > 1 else None
    if len(results) > 1:
        atomic_write_text(out / "summary.md", summary_markdown(results, "Hummingbird comparison", deltas))
    print(results_table(results, deltas))
    print(f"[hbird] results written to {out}", file=sys.stderr)
    return 0
