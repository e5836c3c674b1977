"""The one skeleton of every evaluation command: parse, load, check, score each model, write.

A command is a :class:`Protocol`: its options, its data and config (:meth:`Protocol.prepare`),
``score(model) -> record`` and its report's columns. :func:`run` does the rest, the same way for
all of them:

1. parse the command line (``--model`` and the data options are the floor's, the rest the
   protocol's; a protocol with its own sub-commands parses first);
2. open the data and build the config: bad settings fail here, before any model is built;
3. build every ``--model`` (a bad one creates no output folder) and let the protocol check each;
4. join the other ranks of a ``torchrun`` / ``srun`` launch, if any (:mod:`locatdino.evaluation.ranks`);
   rank 0 checks ``--out`` (an earlier run's output is kept unless ``--overwrite``: checked before
   hours of work; a refusal stops every rank) and holds it, so a second run into it is refused
   rather than raced;
5. score the models one after another, the first the reference of every Δ (a protocol's
   extraction shares the images among the ranks); after each, rank 0 rewrites ``OUT/results.json``
   and ``OUT/report.md`` (:mod:`locatdino.evaluation.results`), so a stop or a failure in a later
   model keeps the earlier ones' results.

Adding a protocol is one sub-package with a ``Protocol`` and a ``main`` calling :func:`run`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from locatdino.common.arguments import ArgumentParser, OptionGroups, add_shared_option, option_groups
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_files import DiskFullError
from locatdino.common.output_folder import OutputFolder, add_overwrite_option
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import check_outputs, encoder_device, record_run
from locatdino.evaluation.ranks import checked_by_writer, evaluation_ranks
from locatdino.evaluation.results import (
    OUTPUT_FILES,
    REPORT_FILE,
    RESULTS_FILE,
    ReportLayout,
    report_markdown,
    results_document,
    results_table,
)


@dataclass
class Scored:
    """One model's outcome: its ``results.json`` record (``scores``, ``config``, ``data``,
    ``timings``, ``provenance`` and what the protocol adds), what its Δ to another model is
    computed from (per-image hits or confusion matrices) and its per-image artefacts, each a
    file name in ``OUT/<label>/`` and the function writing it there."""

    record: dict[str, Any]
    paired: Any = None
    artefacts: dict[str, Callable[[Path], None]] = field(default_factory=dict)


def with_confusions(record: dict[str, Any], run: ModelRun, confusions: ImageConfusions | None) -> Scored:
    """A segmentation protocol's outcome: its per-image confusion matrices (the Δ mIoU intervals'
    input) written to ``OUT/<label>/`` and named in the record, relative to ``results.json``."""
    if confusions is None:
        return Scored(record)
    record["per_image_confusion"] = f"{run.label}/{CONFUSION_FILE}"
    return Scored(record, paired=confusions, artefacts={CONFUSION_FILE: confusions.save})


class Protocol(ABC):
    """An evaluation command: what it adds to the floor's skeleton (:func:`run`)."""

    command: ClassVar[str]  # the sub-command's name, its folder's
    description: ClassVar[str]  # the first paragraph of --help
    out_default: ClassVar[str]  # --out when not given
    artefact_files: ClassVar[tuple[str, ...]] = ()  # what score() may write into OUT/<label>/

    @property
    @abstractmethod
    def layout(self) -> ReportLayout:
        """The report's title, sentences and columns."""

    @abstractmethod
    def add_arguments(self, groups: OptionGroups) -> None:
        """The data options and the protocol's own (model and output options are the runner's)."""

    def parse(self, parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
        return parser.parse_args(argv)

    @abstractmethod
    def prepare(self, args: argparse.Namespace) -> Any:
        """The config and the data, checked (``ValueError`` / ``FileNotFoundError``: one line)."""

    def load_options(self, args: argparse.Namespace, setup: Any) -> dict[str, Any]:
        """``input_size`` (and ``layer``) the backbones are built for."""
        return {"input_size": args.input_size}

    def check_model(self, run: ModelRun, model: nn.Module, setup: Any) -> None:
        """Refuse a model the protocol cannot score (``ValueError``), before any work."""
        return None

    def check_outputs(self, args: argparse.Namespace, runs: list[ModelRun], folder: OutputFolder) -> None:
        """Check what the protocol writes outside ``--out`` (``ValueError``), before any work."""
        return None

    @abstractmethod
    def announce(self, run: ModelRun, setup: Any) -> str:
        """The line printed before a model is scored."""

    @abstractmethod
    def score(self, model: nn.Module, run: ModelRun, setup: Any, device: torch.device) -> Scored:
        """One model's outcome (the model is on ``device``)."""

    def difference(self, scored: Scored, first: Scored, setup: Any) -> dict[str, Any] | None:
        """``differences`` of ``scored`` to the first model (None: not comparable)."""
        return None


def build_parser(protocol: Protocol) -> ArgumentParser:
    """The command's parser: ``--model``, the protocol's options, ``--out`` and ``--overwrite``,
    in the groups every command shares."""
    parser = ArgumentParser(
        prog=f"locatdino {protocol.command}",
        description=protocol.description,
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(parser)
    add_model_arguments(groups.model)
    protocol.add_arguments(groups)
    add_shared_option(groups.output, "--out", protocol.out_default)
    add_overwrite_option(groups.output)
    return parser


def fail(command: str, err: BaseException | str) -> SystemExit:
    """The one-line end of ``locatdino <command>``."""
    return SystemExit(f"locatdino {command}: {err}")


def run(protocol: Protocol, argv: list[str] | None = None) -> int:
    """Run ``protocol`` as its command on ``argv`` (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = protocol.command
    parser = build_parser(protocol)
    args = protocol.parse(parser, argv)
    runs = model_runs(args, parser, OUTPUT_FILES)
    device = encoder_device(args.device, command)
    try:
        setup = protocol.prepare(args)
    except (ValueError, FileNotFoundError) as err:
        raise fail(command, err) from None
    models = load_backbones(runs, args.seed, **protocol.load_options(args, setup))
    for run_, model in zip(runs, models):
        try:
            protocol.check_model(run_, model, setup)
        except ValueError as err:
            raise fail(command, f"--model {run_.name}: {err}") from None
    planned = [*OUTPUT_FILES, *(f"{r.label}/{name}" for r in runs for name in protocol.artefact_files)]

    def checked() -> OutputFolder:
        folder = check_outputs(args.out, command, planned, getattr(args, "cache_dir", None), args.overwrite)
        try:
            protocol.check_outputs(args, runs, folder)
        except (OSError, ValueError) as err:
            raise fail(command, err) from None
        return folder

    with evaluation_ranks(device) as launch:  # one process, or each rank of a torchrun / srun launch
        folder = checked_by_writer(checked)  # None on the ranks that do not write
        with folder.writing(args.overwrite) if folder else contextlib.nullcontext():  # a second run: refused
            document = _score_all(protocol, argv, args, runs, models, setup, launch.device(device), folder)
    if folder is not None:
        print(results_table(document, protocol.layout))
        print(f"[{command}] results written to {folder.path}", file=sys.stderr)
    return 0


def _score_all(
    protocol: Protocol,
    argv: list[str],
    args: argparse.Namespace,
    runs: list[ModelRun],
    models: list[nn.Module],
    setup: Any,
    device: torch.device,
    folder: OutputFolder | None,
) -> dict[str, Any]:
    """Every model scored in turn, the results rewritten after each (by the writing rank: ``folder``)."""
    command, records, first = protocol.command, [], None
    for run_, model in zip(runs, models):
        if folder is not None:
            print(f"[{command}] {run_.label}: {protocol.announce(run_, setup)}", file=sys.stderr, flush=True)
        scored = protocol.score(model.to(device), run_, setup, device)
        model.cpu()
        record = record_run(scored.record, args, run_, model)
        if first is not None and (differences := protocol.difference(scored, first, setup)) is not None:
            record["differences"] = differences
        first = first or scored
        records.append(record)
        document = results_document(f"locatdino {command} " + shlex.join(argv), command, records)
        if folder is None:
            continue
        try:
            for name, write in scored.artefacts.items():
                path = folder.path / run_.label / name
                path.parent.mkdir(parents=True, exist_ok=True)
                write(path)
                folder.wrote(path)
            folder.write_text(RESULTS_FILE, json.dumps(document, indent=2) + "\n")
            folder.write_text(REPORT_FILE, report_markdown(document, protocol.layout))
        except DiskFullError as err:
            raise fail(command, err) from None
    return document
