"""Markdown cells and tables that every evaluation command's ``report.md`` shares: one way to
write a missing number and to name a run, so the reports read alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def number_cell(value: float | None, digits: int = 2) -> str:
    """A table cell: ``value`` with ``digits`` decimals, ``–`` when there is none (None or NaN)."""
    return "–" if value is None or value != value else f"{value:.{digits}f}"


NOT_APPLICABLE = "n/a"  # a score that says nothing, such as top-5 of at most 5 classes


def score_cell(scores: dict[str, Any], name: str) -> str:
    """``74.52 [74.14, 74.90]``: ``scores[name]`` with its interval ``scores[name + "_interval"]``;
    :data:`NOT_APPLICABLE` where the score is None."""
    if scores[name] is None:
        return NOT_APPLICABLE
    low, high = scores[f"{name}_interval"]
    return f"{number_cell(scores[name])} [{low:.2f}, {high:.2f}]"


def run_label(result: dict[str, Any]) -> str:
    """Short name of a run, as a table cell: its report label (run folder or ``--label``), else
    the model name plus the checkpoint's file stem when there is one; a ``|`` (a run folder's name
    may hold one, a LABEL may not) escaped so that it shifts no column."""
    model = result.get("model", {})
    name = model.get("label") or model.get("name") or "model"
    ckpt = model.get("checkpoint")
    label = result.get("label") or (f"{name} ({Path(ckpt).stem})" if ckpt and not model.get("label") else name)
    return label.replace("|", "\\|")


def per_class_table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown per-class IoU, one column per run (plus Δ = last − first for two or more)."""
    labels = [run_label(r) for r in results]
    delta = len(results) > 1
    head = "| class | " + " | ".join(labels) + (" | Δ |" if delta else " |")
    rows = [head, "|" + "---|" * (len(labels) + 1 + delta)]
    for name in results[0]["per_class_iou"]:
        values = [r["per_class_iou"].get(name) for r in results]
        cells = [number_cell(v) for v in values]
        if delta:
            first, last = values[0], values[-1]
            cells.append("–" if first is None or last is None else f"{last - first:+.2f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
