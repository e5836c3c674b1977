"""``locatdino hbird``: the Hummingbird benchmark from the command line.

    locatdino hbird --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --model locatvit_small_patch16_224:last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012
    locatdino hbird --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth --protocol reference ...
    locatdino hbird report runs/a runs/b --summary comparison.md

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are evaluated on the same
memory views and compared in one report; ``--protocol reference`` runs open-hummingbird-eval's
settings (``locatdino.evaluation.hbird.options``). The evaluation runner
(:mod:`locatdino.evaluation.runner`) writes ``OUT/results.json`` and ``OUT/report.md`` for all the
models, every Δ mIoU with its paired-bootstrap interval, and each model's per-image confusion
matrices to ``OUT/<label>/per_image_confusion.npz``. ``report`` rebuilds a comparison, intervals
included, from the ``results.json`` of finished runs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import ArgumentParser, OptionGroups, option_groups
from locatdino.common.errors import UserError
from locatdino.common.output_files import ensure_writable, remove_stale_temporaries
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
    HBIRD_LAYOUT,
    differing_settings,
    incompatibilities,
    label_by_folder,
    load_results,
    miou_differences,
    run_confusions,
)
from locatdino.evaluation.image_confusions import CONFUSION_FILE
from locatdino.evaluation.labels import check_labels
from locatdino.evaluation.model_runs import ModelRun
from locatdino.evaluation.options import add_data_arguments, open_splits
from locatdino.evaluation.results import ReportLayout, report_markdown, results_document, results_table
from locatdino.evaluation.runner import Protocol, Scored, build_parser, run, with_confusions
from locatdino.evaluation.splits import SubsetSplit
from locatdino.evaluation.train_lists import add_train_list_arguments


@dataclass(frozen=True)
class HbirdSetup:
    """What every model of a run is evaluated with."""

    args: argparse.Namespace
    train: Any
    val: Any


class HbirdProtocol(Protocol):
    command = "hbird"
    description = (
        "Hummingbird in-context segmentation: label each query patch from its k nearest labelled memory patches "
        "(frozen encoder, FAISS k-NN), report mIoU. `locatdino hbird report RESULTS...` compares finished runs."
    )
    out_default = "hbird_results"
    artefact_files = (CONFUSION_FILE,)
    single = True  # one model: its bank is --memory-dir itself, else a sub-folder per model

    @property
    def layout(self) -> ReportLayout:
        return HBIRD_LAYOUT

    def add_arguments(self, groups: OptionGroups) -> None:
        d = HummingbirdConfig()
        add_data_arguments(groups.data, command=self.command)
        add_train_list_arguments(groups.data)
        add_protocol_arguments(groups)
        groups.runtime.add_argument(
            "--memory-dtype",
            choices=("float32", "float16"),
            default=d.memory_dtype,
            help="stored features (memory-dir banks, non-Flat indices)",
        )
        groups.runtime.add_argument("--memory-dir", default=None, help="memory-map the memory bank into this directory")

    def parse(self, parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
        return parse_protocol_args(parser, argv)

    def prepare(self, args: argparse.Namespace) -> HbirdSetup:
        cfg = config_from_args(args, HBIRD_TABLE)  # inconsistent settings fail before any data is read
        check_index_device(cfg.index_device, cfg.index, cfg.knn_backend)
        train, val = open_splits(args)
        return HbirdSetup(args, train, val)

    def load_options(self, args: argparse.Namespace, setup: HbirdSetup) -> dict[str, Any]:
        return {"input_size": args.input_size, "layer": args.layer}

    def _memory_dir(self, args: argparse.Namespace, label: str) -> str | None:
        """The bank folder of one run: ``--memory-dir`` itself, or one sub-folder per model."""
        return None if args.memory_dir is None else str(Path(args.memory_dir) / ("" if self.single else label))

    def check_outputs(self, args: argparse.Namespace, runs: list[ModelRun], folder: OutputFolder) -> None:
        """A memory bank replaces its folder whole, and is staged next to it: each must be free
        (:func:`~locatdino.evaluation.hbird.memory.check_bank_folder`), writable, outside ``--out``."""
        self.single = len(runs) == 1
        if args.memory_dir is None:
            return
        banks = [Path(self._memory_dir(args, r.label)) for r in runs]
        try:
            for bank in banks:
                check_bank_folder(bank)
                if bank.resolve() == folder.path.resolve() or bank.resolve() in folder.path.resolve().parents:
                    raise ValueError(
                        f"--memory-dir {bank} would replace --out {folder.path}: give them different folders"
                    )
            for bank in banks:
                ensure_writable(bank.parent, "--memory-dir")
                remove_stale_temporaries(bank.parent)
        except UserError as err:
            raise ValueError(str(err)) from None

    def announce(self, run: ModelRun, setup: HbirdSetup) -> str:
        cfg = config_from_args(setup.args, HBIRD_TABLE)
        return (
            f"memory {len(setup.train)} images x {cfg.aug_epochs} views, {len(setup.val)} queries, "
            f"{cfg.input_size} px, index {cfg.index}"
        )

    def score(self, model: nn.Module, run: ModelRun, setup: HbirdSetup, device: torch.device) -> Scored:
        args = setup.args
        cfg = config_from_args(args, HBIRD_TABLE, memory_dir=self._memory_dir(args, run.label))
        # a bank too large for --memory-dir fails before encoding, reserving its disk space
        scored = hummingbird(model, setup.train, setup.val, cfg, shared=True)  # each rank its share of the images
        record = scored.to_dict()
        picks_queries = args.dataset == "scenes" or isinstance(setup.val, SubsetSplit)  # the seed chose them
        record["config"]["query_seed"] = args.seed if picks_queries else None
        record["config"]["protocol"] = protocol_record(args)
        return with_confusions(record, run, scored.image_confusions)

    def difference(self, scored: Scored, first: Scored, setup: HbirdSetup) -> dict[str, Any] | None:
        return miou_differences(scored.paired, first.paired, setup.args.hungarian)


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
    for r in results:  # recomputed against this report's first run
        r.pop("differences", None)
    if len(results) > 1 and not mixed:  # intervals pair the same query images
        without = [r["label"] for r, c in zip(results, confusions) if c is None]
        if without:
            print(
                f"locatdino hbird report: warning: no Δ mIoU interval for {', '.join(without)}: no per-image "
                f"confusion matrices",
                file=sys.stderr,
            )
        hungarian = results[0].get("config", {}).get("hungarian", "iou")
        for r, c in zip(results[1:], confusions[1:]):
            if (differences := miou_differences(c, confusions[0], hungarian)) is not None:
                r["differences"] = differences
    for r in results:
        r["model"] = {**r["model"], "label": r.pop("label")}
    document = results_document("locatdino hbird report " + shlex.join(argv), "hbird", results)
    print(results_table(document, HBIRD_LAYOUT))
    if args.summary:
        write_output_file(args.summary, "hbird report", report_markdown(document, HBIRD_LAYOUT))
    return 0


def _parser() -> ArgumentParser:
    return build_parser(HbirdProtocol())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    return run(HbirdProtocol(), argv)
