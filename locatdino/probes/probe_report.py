"""``results.json``, ``per_image_confusion.npz`` and markdown of ``locatdino linprobe`` runs.

A run's ``results.json`` is :meth:`LinearProbeResult.to_dict` plus the model and the dataset; the
per-image confusion matrices (``[N, C, C]``, one per scored query image, for paired bootstrap
intervals) go beside it, compressed. Written atomically (``locatdino.output_files``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from locatdino.output_files import atomic_write, atomic_write_text
from locatdino.retrieval.report import _fmt, per_class_table

PROBE_FILES = ("results.json", "per_image_confusion.npz", "summary.md")  # what write_probe_run writes


def probe_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per run: mIoU, pixel accuracy, budget, time split and precision."""
    rows = ["| model | mIoU | pixel acc. | iterations | final loss | features s | head s | data s | total s | "
            "encoder | cached |", "|" + "---|" * 11]
    for r in results:
        t, curve = r.get("timings", {}), r.get("loss_curve") or [[0, None]]
        rows.append(
            f"| {r['model'].get('label', r['model'].get('name'))} | {_fmt(r['miou'])} | {_fmt(r['pixel_accuracy'])} | "
            f"{r['iterations']:,} | {_fmt(curve[-1][1], 3)} | {_fmt(t.get('features'), 1)} | {_fmt(t.get('head'), 1)} | "
            f"{_fmt(t.get('data'), 1)} | {_fmt(t.get('total'), 1)} | {r['features'].get('precision')} | "
            f"{r['features'].get('cached')} |")
    return "\n".join(rows)


def probe_summary(results: Sequence[dict[str, Any]], title: str = "Dense linear probe") -> str:
    """The markdown report of one or several runs on the same data."""
    first = results[0]
    cfg = first["config"]
    budget = f"{first['iterations']:,} iterations × batch {cfg['batch_size']}"
    lines = [f"# {title}", "",
             f"Dataset: {cfg.get('dataset')} — {first['num_train']} training images, {first['num_val']} query "
             f"images; {budget} at {cfg['input_size']} px, augmentation {cfg['augment']}, seed {cfg['seed']}. "
             "mIoU in % over every original pixel of the query images, identity class mapping.", "",
             probe_table(results), "", "## Per-class IoU", "",
             per_class_table([{**r, "label": r["model"].get("label")} for r in results]), ""]
    return "\n".join(lines)


def write_probe_run(result: dict[str, Any], per_image: np.ndarray | None, out_dir: str | os.PathLike) -> Path:
    """``results.json`` + ``summary.md`` (+ ``per_image_confusion.npz``) of one run; returns the JSON path."""
    out_dir = Path(out_dir)
    if per_image is not None:
        atomic_write(out_dir / "per_image_confusion.npz",
                     lambda f: np.savez_compressed(f, confusion=per_image.astype(np.int64)))
    path = atomic_write_text(out_dir / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / "summary.md", probe_summary([result]))
    return path
