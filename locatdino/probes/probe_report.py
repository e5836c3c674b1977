"""``results.json``, ``per_image_confusion.npz`` and markdown of ``locatdino linprobe`` runs.

A run's ``results.json`` is :meth:`LinearProbeResult.to_dict` plus the model and the dataset; the
per-image confusion matrices (one per scored query image, for paired bootstrap intervals) go beside
it in Hummingbird's file format (:class:`~locatdino.evaluation.image_confusions.ImageConfusions`).
Written atomically (``locatdino.common.output_files``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from locatdino.common.output_files import atomic_write_text
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions
from locatdino.evaluation.tables import number_cell, per_class_table

PROBE_FILES = ("results.json", CONFUSION_FILE, "summary.md")  # what write_probe_run writes


def probe_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per run: protocol, mIoU (and a DINOv2 variant's one-scale mIoU), pixel accuracy, budget,
    time split and precision."""
    rows = [
        "| model | protocol | mIoU | one-scale mIoU | pixel acc. | iterations | final loss | features s | head s | "
        "data s | total s | encoder | cached |",
        "|" + "---|" * 13,
    ]
    for r in results:
        t, curve = r.get("timings", {}), r.get("loss_curve") or [[0, None]]
        rows.append(
            f"| {r['model'].get('label', r['model'].get('name'))} | {r['config'].get('variant', 'paper')} | "
            f"{number_cell(r['miou'])} | {number_cell(r.get('single_scale_miou'))} | "
            f"{number_cell(r['pixel_accuracy'])} | {r['iterations']:,} | {number_cell(curve[-1][1], 3)} | "
            f"{number_cell(t.get('features'), 1)} | {number_cell(t.get('head'), 1)} | "
            f"{number_cell(t.get('data'), 1)} | {number_cell(t.get('total'), 1)} | {r['features'].get('precision')} | "
            f"{r['features'].get('cached')} |"
        )
    return "\n".join(rows)


def probe_summary(results: Sequence[dict[str, Any]], title: str = "Dense linear probe") -> str:
    """The markdown report of one or several runs on the same data."""
    first = results[0]
    cfg = first["config"]
    budget = f"{first['iterations']:,} iterations × batch {cfg['batch_size']}"
    lines = [
        f"# {title}",
        "",
        f"Dataset: {cfg.get('dataset')} — {first['num_train']} training images, {first['num_val']} query "
        f"images; protocol {cfg.get('variant', 'paper')}; {budget} at {cfg['input_size']} px, augmentation "
        f"{cfg['augment']}, seed {cfg['seed']}. "
        "mIoU in % over every original pixel of the query images, identity class mapping.",
        "",
        probe_table(results),
        "",
        "## Per-class IoU",
        "",
        per_class_table([{**r, "label": r["model"].get("label")} for r in results]),
        "",
    ]
    return "\n".join(lines)


def write_probe_run(result: dict[str, Any], confusions: ImageConfusions | None, out_dir: str | os.PathLike) -> Path:
    """``results.json`` + ``summary.md`` (+ ``per_image_confusion.npz``, Hummingbird's format) of one
    run; returns the JSON path."""
    out_dir = Path(out_dir)
    if confusions is not None:
        confusions.save(out_dir / CONFUSION_FILE)
    path = atomic_write_text(out_dir / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / "summary.md", probe_summary([result]))
    return path
