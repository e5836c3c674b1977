"""``locatdino hbird``: the Hummingbird benchmark from the command line.

    locatdino hbird --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --model locatvit_small_patch16_224:last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012
    locatdino hbird --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth --protocol reference ...
    locatdino hbird report runs/a runs/b --summary comparison.md

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are evaluated on the same
memory views and compared in one report; ``--protocol reference`` runs open-hummingbird-eval's
settings (``locatdino.evaluation.hbird.options``). One model writes ``OUT/results.json``,
``OUT/summary.md`` and ``OUT/per_image_confusion.npz``; several write ``OUT/<model>/...`` per run
plus ``OUT/summary.md`` comparing them, every Δ mIoU with its paired-bootstrap interval. An
``--out`` holding an earlier run's output is refused unless ``--overwrite``, which removes all of
it first (``locatdino.common.output_folder``).
``report`` rebuilds a comparison, intervals included, from existing ``results.json`` files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from locatdino.common.arguments import ArgumentParser, add_shared_option, option_groups
from locatdino.common.errors import UserError
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_files import DiskFullError, ensure_writable, remove_stale_temporaries
from locatdino.common.output_folder import OutputFolder, add_overwrite_option, check_output_file, write_output_file
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.hbird.index import check_index_device
from locatdino.evaluation.hbird.memory import check_bank_folder
from locatdino.evaluation.hbird.options import (
    HBIRD_TABLE,
    add_protocol_arguments,
    config_from_args,
    parse_protocol_args,
    protocol_record,
)
from locatdino.evaluation.hbird.report import (
    differing_settings,
    incompatibilities,
    label_by_folder,
    load_results,
    miou_deltas,
    results_table,
    run_confusions,
    summary_markdown,
    write_run,
)
from locatdino.evaluation.image_confusions import CONFUSION_FILE
from locatdino.evaluation.labels import check_labels
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import add_data_arguments, encoder_device, open_splits, record_run
from locatdino.evaluation.splits import SubsetSplit
from locatdino.evaluation.train_lists import add_train_list_arguments

RUN_FILES = ("results.json", "summary.md", CONFUSION_FILE)  # what write_run writes into a run's folder


def _parser() -> ArgumentParser:
    d = HummingbirdConfig()
    p = ArgumentParser(
        prog="locatdino hbird",
        description="Hummingbird in-context segmentation: label each query patch from its k nearest "
        "labelled memory patches (frozen encoder, FAISS k-NN), report mIoU. "
        "`locatdino hbird report RESULTS...` compares finished runs.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model)
    add_data_arguments(groups.data)
    add_train_list_arguments(groups.data)
    add_protocol_arguments(groups)
    groups.runtime.add_argument(
        "--memory-dtype",
        choices=("float32", "float16"),
        default=d.memory_dtype,
        help="stored features (memory-dir banks, non-Flat indices)",
    )
    groups.runtime.add_argument("--memory-dir", default=None, help="memory-map the memory bank into this directory")
    add_shared_option(groups.output, "--out", "hbird_results")
    add_overwrite_option(groups.output)
    return p


def _report_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="locatdino hbird report",
        description="Compare finished Hummingbird runs (refused when they scored "
        "different query images; differing settings are marked).",
    )
    groups = option_groups(p)
    groups.data.add_argument("results", nargs="+", help="results.json files or directories holding them")
    groups.data.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare runs of different datasets, splits or query counts anyway (marked)",
    )
    groups.output.add_argument(
        "--summary", default=None, metavar="FILE", help="also write the markdown comparison to this file"
    )
    groups.output.add_argument(
        "--label",
        action="append",
        default=[],
        help="name of each run, in the order found (default: its run folder); one per run",
    )
    add_overwrite_option(groups.output)
    return p


def _memory_dir(args: argparse.Namespace, label: str, single: bool) -> str | None:
    """The bank folder of one run: ``--memory-dir`` itself, or one sub-folder per model."""
    return None if args.memory_dir is None else str(Path(args.memory_dir) / ("" if single else label))


def _check_outputs(args: argparse.Namespace, runs: list[ModelRun]) -> OutputFolder:
    """Fail before any work when an output cannot be written, or holds an earlier run's output
    (without ``--overwrite``) or files hbird did not write (:mod:`locatdino.common.output_folder`); a
    memory bank replaces its folder whole, and is staged next to it."""
    single = len(runs) == 1
    out = OutputFolder(args.out, "hbird")
    banks = [] if args.memory_dir is None else [Path(_memory_dir(args, run.label, single)) for run in runs]
    try:
        for bank in banks:
            check_bank_folder(bank)
            if bank.resolve() == out.path.resolve() or bank.resolve() in out.path.resolve().parents:
                raise ValueError(f"--memory-dir {bank} would replace --out {out.path}: give them different folders")
        out.check(
            RUN_FILES if single else ["summary.md", *(f"{run.label}/{name}" for run in runs for name in RUN_FILES)],
            args.overwrite,
        )
        for bank in banks:
            ensure_writable(bank.parent, "--memory-dir")
            remove_stale_temporaries(bank.parent)
    except (OSError, ValueError, UserError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None
    return out


def report_main(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    try:
        results = load_results(args.results)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    try:
        check_labels(args.label, "--label")
    except ValueError as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    labels = args.label or label_by_folder(results)
    if len(labels) != len(results):
        raise SystemExit(
            f"locatdino hbird report: {len(labels)} --label for {len(results)} runs "
            f"({', '.join(r['source'] for r in results)})"
        )
    mixed = incompatibilities(results)
    if mixed and not args.allow_mixed:
        raise SystemExit(
            f"locatdino hbird report: the runs scored different query images ({'; '.join(mixed)}); "
            "compare like with like, or pass --allow-mixed"
        )
    for r, label in zip(results, labels):
        r["label"] = label
    for line in differing_settings(results):
        print(f"locatdino hbird report: warning: {line}", file=sys.stderr)
    try:  # never over an input run's summary, nor any file hbird report did not write
        if args.summary:
            check_output_file(args.summary, "hbird report", args.overwrite, "--summary")
    except UserError as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    try:  # every run's stored figure checked against its own per-image matrices
        confusions = [run_confusions(r) for r in results]
    except ValueError as err:
        raise SystemExit(f"locatdino hbird report: {err}") from None
    deltas = None
    if len(results) > 1 and not mixed:  # intervals pair the same query images
        without = [r["label"] for r, c in zip(results, confusions) if c is None]
        if without:
            print(
                f"locatdino hbird report: warning: no Δ mIoU interval for {', '.join(without)}: no per-image "
                f"confusion matrices (written before they were kept)",
                file=sys.stderr,
            )
        deltas = miou_deltas(confusions, results[0].get("config", {}).get("hungarian", "iou"))
    print(results_table(results, deltas))
    if args.summary:
        write_output_file(args.summary, "hbird report", summary_markdown(results, deltas=deltas))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    parser = _parser()
    args = parse_protocol_args(parser, argv)
    runs = model_runs(args, parser, RUN_FILES)
    device = encoder_device(args.device, "hbird")
    try:
        cfg = config_from_args(args, HBIRD_TABLE)  # inconsistent settings fail before any data is read
        check_index_device(cfg.index_device, cfg.index, cfg.knn_backend)
        train_set, val_set = open_splits(args)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None
    models = load_backbones(runs, args.seed, args.input_size, args.layer)  # a bad model creates no output folder
    out = _check_outputs(args, runs)
    with out.writing(args.overwrite):  # a second run into --out is refused, not raced
        return _evaluate(args, runs, models, train_set, val_set, device, out)


def _evaluate(
    args: argparse.Namespace,
    runs: list[ModelRun],
    models: list[nn.Module],
    train_set,
    val_set,
    device: torch.device,
    folder: OutputFolder,
) -> int:
    """Every model's run, each written (and recorded) as it finishes, then the comparison of them all."""
    out = folder.path
    picks_queries = args.dataset == "scenes" or isinstance(val_set, SubsetSplit)  # the seed chose the queries
    results, confusions = [], []
    for run, model in zip(runs, models):
        single, label = len(runs) == 1, run.label
        cfg = config_from_args(args, HBIRD_TABLE, memory_dir=_memory_dir(args, label, single))
        print(
            f"[hbird] {label}: memory {len(train_set)} images x {cfg.aug_epochs} views, "
            f"{len(val_set)} queries, {cfg.input_size} px, index {cfg.index}",
            file=sys.stderr,
        )
        try:  # a bank too large for --memory-dir fails before encoding, reserving its disk space
            scored = hummingbird(model.to(device), train_set, val_set, cfg)
            result = record_run(scored.to_dict(), args, run, model)
            result["config"]["query_seed"] = args.seed if picks_queries else None
            result["config"]["protocol"] = protocol_record(args)
            run_dir = out if single else out / label
            write_run(result, run_dir, scored.image_confusions)
            folder.wrote(*(run_dir / name for name in RUN_FILES))
        except DiskFullError as err:
            raise SystemExit(f"locatdino hbird: {err}") from None
        results.append(result)
        confusions.append(scored.image_confusions)
    deltas = miou_deltas(confusions, args.hungarian) if len(results) > 1 else None
    if len(results) > 1:
        folder.write_text("summary.md", summary_markdown(results, "Hummingbird comparison", deltas))
    print(results_table(results, deltas))
    print(f"[hbird] results written to {out}", file=sys.stderr)
    return 0
