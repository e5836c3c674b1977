"""The one output of every evaluation command: ``OUT/results.json`` in one schema, and ``OUT/report.md``
written from it by one writer.

``results.json`` (:data:`RESULTS_SCHEMA`, a JSON Schema)::

    {"schema": "locatdino-evaluation/1", "command": "locatdino knn --model ...", "protocol": "knn",
     "models": [{"model": {"label", "name", "checkpoint", "pos_embed"},
                 "scores": {SETTING: {METRIC: {"value": 74.5, "interval": [74.1, 74.9]}}},
                 "differences": {SETTING: {METRIC: {"delta", "low", "high", ...}}},  # Δ to the first model
                 "config": {...}, "data": {...}, "timings": {...}, "provenance": {...},
                 ...what the protocol records besides (per-class IoU, the lr grid...)}]}

A SETTING is what one protocol scores several of per model (k-NN's ``k=20``; ``""`` when there
is one), a METRIC a number in the report's table (``miou``, ``top1``), with its 95 % interval
over the scored images (None where the protocol has none); ``differences`` hold the paired
intervals of each model's Δ to the first model, on the same images. Per-image artefacts
(confusion matrices, memory banks, figures) go to ``OUT/<label>/``.

The report's table has one row per model and setting; its columns are the protocol's
(:class:`Column`): the writer knows no protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locatdino.evaluation.bootstrap import RESAMPLES, SEED, PairedInterval
from locatdino.evaluation.tables import NOT_APPLICABLE, number_cell, per_class_table

SCHEMA_ID = "locatdino-evaluation/1"
RESULTS_FILE, REPORT_FILE = "results.json", "report.md"
OUTPUT_FILES = (RESULTS_FILE, REPORT_FILE)

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_INTERVAL = {"oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}]}
RESULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "results.json of a locatdino evaluation command",
    "type": "object",
    "required": ["schema", "command", "protocol", "models"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "command": {"type": "string"},
        "protocol": {"enum": ["hbird", "linprobe", "knn", "lincls", "compare"]},
        "models": {
            "type": "array",  # empty only where compare's every model failed
            "items": {
                "type": "object",
                "required": ["model", "scores", "config", "provenance"],
                "properties": {
                    "model": {
                        "type": "object",
                        "required": ["label", "name", "checkpoint"],
                        "properties": {
                            "label": {"type": "string"},
                            "name": {"type": "string"},
                            "checkpoint": {"type": ["string", "null"]},
                        },
                    },
                    "scores": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["value", "interval"],
                                "properties": {"value": _NUMBER_OR_NULL, "interval": _INTERVAL},
                            },
                        },
                    },
                    "differences": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["delta", "low", "high"],
                                "properties": {"delta": {"type": "number"}, "low": {"type": "number"}},
                            },
                        },
                    },
                    "config": {"type": "object"},
                    "data": {"type": "object"},
                    "timings": {"type": "object"},
                    "provenance": {"type": "object"},
                },
            },
        },
    },
}


def score(value: float | None, interval: Sequence[float] | None = None) -> dict[str, Any]:
    """One METRIC of ``scores``: ``value`` with its interval (None: not applicable / none)."""
    return {"value": value, "interval": None if interval is None else [float(interval[0]), float(interval[1])]}


def results_document(command: str, protocol: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``results.json`` of a run: the command line, the protocol and one record per model."""
    return {"schema": SCHEMA_ID, "command": command, "protocol": protocol, "models": models}


def check_document(document: Any, path: str | Path, protocol: str | None = None) -> None:
    """``ValueError`` (one line naming ``path``) unless ``document`` is a ``results.json`` of this
    schema (of ``protocol`` when given); the layout of earlier versions is named as such."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA_ID:
        raise ValueError(
            f"{path}: not a {RESULTS_FILE} of {SCHEMA_ID}; one written by an earlier version (one model per "
            f"folder, or compare's report.json) is not read: rerun the command, which writes one {RESULTS_FILE} "
            "for all its models"
        )
    if protocol is not None and document.get("protocol") != protocol:
        raise ValueError(f"{path}: results of `locatdino {document.get('protocol')}`, not of `locatdino {protocol}`")
    models = document.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
        raise ValueError(f"{path}: no model record in it")
    required = RESULTS_SCHEMA["properties"]["models"]["items"]["required"]
    for i, record in enumerate(models):  # an edited or truncated record: named, not a KeyError later
        missing = [key for key in required if not isinstance(record.get(key), dict)]
        if missing:
            raise ValueError(f"{path}: model record {i} has no {', '.join(missing)}")


@dataclass(frozen=True)
class Column:
    """A column of the report's table: its header and its cell for one model's SETTING row,
    ``cell(record, setting, first)`` (``first``: the first model's record, the reference of a Δ)."""

    header: str
    cell: Callable[[dict[str, Any], str, dict[str, Any]], str]


def score_column(metric: str, header: str, interval: bool = True) -> Column:
    """``74.52 [74.14, 74.90]``: METRIC with its interval (``n/a`` when it has no value; the
    number alone for a protocol without intervals of single runs, ``interval=False``)."""

    def cell(record: dict[str, Any], setting: str, first: dict[str, Any]) -> str:
        found = record["scores"][setting].get(metric)
        if found is None or found["value"] is None:
            return NOT_APPLICABLE
        if found["interval"] is None:
            return number_cell(found["value"])
        low, high = found["interval"]
        return f"{number_cell(found['value'])} [{low:.2f}, {high:.2f}]"

    return Column(f"{header} [95 %]" if interval else header, cell)


def delta_column(metric: str, header: str) -> Column:
    """``+1.20 [0.40, 2.10]``: the Δ of METRIC to the first model with its paired interval
    (``—`` for the first model and where the images differ; ``n/a`` where METRIC has no value)."""

    def cell(record: dict[str, Any], setting: str, first: dict[str, Any]) -> str:
        found = record["scores"][setting].get(metric)
        if found is None or found["value"] is None:
            return NOT_APPLICABLE
        interval = (record.get("differences") or {}).get(setting, {}).get(metric)
        return "—" if interval is None else PairedInterval.from_dict(interval).text()

    return Column(f"Δ {header} [95 %]", cell)


def value_column(header: str, value: Callable[[dict[str, Any]], Any]) -> Column:
    """A column of what the model's record holds besides its scores (a setting, the lr used)."""
    return Column(header, lambda record, setting, first: str(value(record)).replace("|", "\\|"))


def seconds_column(phase: str) -> Column:
    """The wall time of one phase of a model's run (its record's ``timings``), in seconds."""
    return value_column(f"{phase} s", lambda record: number_cell(record.get("timings", {}).get(phase), 1))


def per_class_notes(document: dict[str, Any]) -> list[str]:
    """The per-class IoU section of a segmentation protocol's report."""
    return ["## Per-class IoU", "", per_class_table(document["models"]), ""]


@dataclass(frozen=True)
class ReportLayout:
    """What a protocol puts in ``report.md`` around the one table: its title, the sentence saying
    what was measured (from the document), its columns, and sections after the table."""

    title: str
    about: Callable[[dict[str, Any]], list[str]]
    columns: tuple[Column, ...]
    notes: Callable[[dict[str, Any]], list[str]] = field(default=lambda document: [])
    setting_header: str = ""  # the header of the SETTING column ("k"), none when one setting


def results_table(document: dict[str, Any], layout: ReportLayout) -> str:
    """The markdown table: one row per model and SETTING, the protocol's columns."""
    setting = [layout.setting_header] if layout.setting_header else []
    headers = ["model", *setting, *(column.header for column in layout.columns)]
    rows = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    first = document["models"][0] if document["models"] else {}
    for record in document["models"]:
        label = record["model"]["label"].replace("|", "\\|")
        for name in record["scores"]:
            cells = [label, *([name] if setting else [])]
            cells += [column.cell(record, name, first) for column in layout.columns]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report_markdown(document: dict[str, Any], layout: ReportLayout) -> str:
    """``report.md``: the title, the command, what was measured, the table (none without a model), how
    the intervals are computed, then the protocol's own sections."""
    paired = len(document["models"]) > 1
    lines = [f"# {layout.title}", "", f"Command: `{document['command']}`", "", *layout.about(document), ""]
    if document["models"]:  # none where compare's every model failed: no table of nothing
        lines += [results_table(document, layout), ""]
    if paired:
        lines += [
            f"Δ = model − first model with its 95 % paired-bootstrap interval ({RESAMPLES:,} resamples of the "
            f"scored images, the same draws for both models, seed {SEED}); an interval that holds 0 means no "
            "measurable difference.",
            "",
        ]
    return "\n".join(lines + layout.notes(document))
