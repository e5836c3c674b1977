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
   extraction shares the images among the ranks), then the rows the protocol adds without a model
   (:meth:`Protocol.rows_after`); after each, rank 0 rewrites ``OUT/results.json`` and
   ``OUT/report.md`` (:mod:`locatdino.evaluation.results`), so a stop or a failure in a later
   model keeps the earlier ones' results;
6. let the protocol read every row (:meth:`Protocol.finish`: cross-model figures) and write both
   files a last time.

A protocol that tolerates a model's failure (:attr:`Protocol.tolerated`) leaves that model out,
lists it under ``failed`` and ends with exit status 1; otherwise the first error ends the run.

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
from locatdino.common.errors import UserError, first_line
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
    # Errors one model may fail with, loading or scoring, while the others are still scored: compare's
    # report of many models must not be lost to one unreadable checkpoint. That model is left out, its
    # one-line reason printed and kept under the document's ``failed``, and the run's exit status is 1.
    # Empty (every other protocol): the first error ends the run, before the other models' hours of work.
    tolerated: ClassVar[tuple[type[Exception], ...]] = ()

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

    def record(self, scored: Scored, args: argparse.Namespace, run: ModelRun, model: nn.Module) -> dict[str, Any]:
        """The model's ``results.json`` record: the protocol's, with what was run added to its
        ``model``, ``config`` and ``provenance`` (:func:`record_run`). A protocol that records the
        dataset once for all its rows (compare: at the top, beside rows that have no model) keeps
        its own."""
        return record_run(scored.record, args, run, model)

    def rows_after(self, setup: Any, first: Scored | None) -> list[Scored]:
        """Rows scored without a model, after the models (compare's baselines, on the grid of the
        first model that ran; ``first`` is None when none did): each gets its Δ to the first row and
        is written as a model's row is."""
        return []

    def finish(self, setup: Any, records: list[dict[str, Any]], folder: OutputFolder | None) -> None:
        """What needs every row, after the last one and before the last write (compare's figures
        across the models); ``records`` may still be completed. ``folder`` is the output folder on
        the rank that writes, None on the others."""
        return None

    def document_keys(self, setup: Any) -> dict[str, Any]:
        """Top-level keys of ``results.json`` beside the schema's (compare's dataset, config, probes
        and figures), asked at every write: what :meth:`finish` adds reaches the last one."""
        return {}


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
    failed: dict[str, str] = {}  # {label: one-line reason} of the models a tolerant protocol left out
    loaded = _load(protocol, runs, args, setup, failed)
    for run_, model in loaded:
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
            rows = _Rows(protocol, argv, setup, folder, failed)
            rows.score_models(args, loaded, launch.device(device))
            document = rows.finish()
    if folder is not None:
        if document["models"]:
            print(results_table(document, protocol.layout))
        print(f"[{command}] results written to {folder.path}", file=sys.stderr)
    return 1 if failed else 0


def _load(
    protocol: Protocol, runs: list[ModelRun], args: argparse.Namespace, setup: Any, failed: dict[str, str]
) -> list[tuple[ModelRun, nn.Module]]:
    """Every model built before the first is scored (:func:`load_backbones`); one that a tolerant
    protocol cannot build is named in ``failed`` at once, not after the others' work."""
    options = protocol.load_options(args, setup)
    if not protocol.tolerated:
        return list(zip(runs, load_backbones(runs, args.seed, **options)))
    loaded = []
    for run_ in runs:
        try:
            loaded += [(run_, *load_backbones([run_], args.seed, **options))]
        except (UserError, *protocol.tolerated) as err:
            _note_failure(protocol.command, failed, run_, err)
    return loaded


def _note_failure(command: str, failed: dict[str, str], run: ModelRun, err: BaseException) -> None:
    """Keep and say in one line why ``run`` failed: its model, its weights and the error's first line."""
    failed[run.label] = f"{run.name}:{run.checkpoint or 'none'}: {first_line(err)[:300]}"
    print(f"locatdino {command}: model {run.label!r} failed: {failed[run.label]}", file=sys.stderr, flush=True)


class _Rows:
    """The rows of a run as they are scored, and its document rewritten after each (by the rank
    that writes: ``folder``)."""

    def __init__(
        self, protocol: Protocol, argv: list[str], setup: Any, folder: OutputFolder | None, failed: dict[str, str]
    ) -> None:
        self.protocol, self.setup, self.folder, self.failed = protocol, setup, folder, failed
        self.command_line = f"locatdino {protocol.command} " + shlex.join(argv)
        self.records: list[dict[str, Any]] = []
        self.first: Scored | None = None

    def score_models(
        self, args: argparse.Namespace, loaded: list[tuple[ModelRun, nn.Module]], device: torch.device
    ) -> None:
        """Every model in turn, then the protocol's rows without a model."""
        protocol = self.protocol
        for run_, model in loaded:
            if self.folder is not None:
                print(
                    f"[{protocol.command}] {run_.label}: {protocol.announce(run_, self.setup)}",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                scored = protocol.score(model.to(device), run_, self.setup, device)
            except protocol.tolerated as err:
                _note_failure(protocol.command, self.failed, run_, err)
                continue
            finally:
                model.cpu()
            self._add(scored, protocol.record(scored, args, run_, model), run_.label)
        for scored in protocol.rows_after(self.setup, self.first):
            self._add(scored, scored.record, scored.record["model"]["label"])

    def _add(self, scored: Scored, record: dict[str, Any], label: str) -> None:
        """One row: its Δ to the first row, then its artefacts and the document written."""
        first = self.first
        if first is not None and (differences := self.protocol.difference(scored, first, self.setup)) is not None:
            record["differences"] = differences
        self.first = self.first or scored
        self.records.append(record)
        self._write(label, scored.artefacts)

    def finish(self) -> dict[str, Any]:
        """The protocol's last word on every row, and the document as last written."""
        self.protocol.finish(self.setup, self.records, self.folder)
        return self._write()

    def _write(self, label: str = "", artefacts: dict[str, Callable[[Path], None]] | None = None) -> dict[str, Any]:
        """The document of the rows so far, written with ``label``'s ``artefacts`` by the writing rank."""
        document = {
            **results_document(self.command_line, self.protocol.command, self.records),
            **self.protocol.document_keys(self.setup),
        }
        if self.protocol.tolerated:
            document["failed"] = self.failed
        if self.folder is None:
            return document
        try:
            for name, write in (artefacts or {}).items():
                path = self.folder.path / label / name
                path.parent.mkdir(parents=True, exist_ok=True)
                write(path)
                self.folder.wrote(path)
            self.folder.write_text(RESULTS_FILE, json.dumps(document, indent=2) + "\n")
            self.folder.write_text(REPORT_FILE, report_markdown(document, self.protocol.layout))
        except DiskFullError as err:
            raise fail(self.protocol.command, err) from None
        return document
