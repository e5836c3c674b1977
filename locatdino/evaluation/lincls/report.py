"""Markdown of ``locatdino lincls`` runs: one row per model, every Δ with its interval, and for the
lr-grid variant every learning rate's held-out and validation top-1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from locatdino.evaluation.bootstrap import RESAMPLES, SEED, PairedInterval
from locatdino.evaluation.tables import number_cell, score_cell

LINCLS_FILES = ("results.json", "report.md")  # what a run writes into --out


def _delta_cell(result: dict[str, Any]) -> str:
    record = result.get("difference")
    return "—" if record is None else PairedInterval.from_dict(record).text()


def _input_cell(linear_input: dict[str, Any]) -> str:
    """``4 class tokens``, ``1 class token + mean patch``, ``mean of the last stage`` (Swin) (``, PRR``)."""
    n = linear_input["last_blocks"]
    text = f"{n} class token{'s' * (n != 1)}" + (" + mean patch" if linear_input["avgpool"] else "")
    if linear_input.get("pooled"):
        text = "mean of the last stage"
    return text + (", PRR" if linear_input["prr"] else "")


def lincls_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per model: top-1 and top-5 in % with 95 % intervals, Δ top-1 to the first model."""
    rows = [
        "| model | protocol | input | lr used | top-1 [95 %] | Δ top-1 [95 %] | top-5 [95 %] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['model']['label']} | {r['config']['protocol']} | {_input_cell(r['linear_input'])} | "
            f"{r['lr']:.3g} | {score_cell(r, 'top1')} | {_delta_cell(r)} | {score_cell(r, 'top5')} |"
        )
    return "\n".join(rows)


def _lr_table(result: dict[str, Any]) -> list[str]:
    """The lr grid of one fast run: held-out top-1 (what picks) and validation top-1 (for reference)."""
    picked = result["lr"]
    rows = [
        f"### {result['model']['label']}",
        "",
        "| base lr (× batch / 256) | held-out top-1 | validation top-1 |",
        "|---|---|---|",
    ]
    for row in result["lr_table"]:
        mark = " (picked)" if row["lr"] == picked else ""
        if row["holdout_top1"] is None:  # its weights overflowed: not a candidate
            rows.append(f"| {row['base_lr']:g} | diverged | diverged |")
            continue
        rows.append(
            f"| {row['base_lr']:g}{mark} | {number_cell(row['holdout_top1'])} | {number_cell(row['val_top1'])} |"
        )
    return rows + [""]


def lincls_report(report: dict[str, Any]) -> str:
    """``report.md`` of a run (``report``: its ``results.json``)."""
    first = report["models"][0]
    cfg = first["config"]
    if cfg["protocol"] == "full":
        how = (
            f"DINO's linear evaluation: RandomResizedCrop + flip views, {cfg['epochs']} epochs, batch "
            f"{cfg['batch_size']}, SGD momentum 0.9, lr {cfg['lr']:g} × batch / 256 cosine to 0, no weight decay"
        )
    else:
        how = (
            f"lr-grid variant on cached centre-crop features: {len(cfg['lr_grid'])} learning rates trained at "
            f"once for {cfg['epochs']} epochs, batch {cfg['batch_size']}, the best on "
            f"{100 * cfg['holdout']:g} % of the training images held out"
        )
    lines = [
        "# Linear classification on frozen features",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Dataset: {cfg['dataset']} — {first['num_train']} training images, {first['num_val']} validation "
        f"images scored from their {cfg['input_size']} px centre crop; {how}; encoder {cfg['precision']}.",
        "",
        lincls_table(report["models"]),
        "",
        "Top-1 / top-5 in % with 95 % Wilson intervals over the validation images (top-5 n/a with at most 5 "
        "classes: every image is in it); Δ = model − first model with its 95 % paired-bootstrap interval "
        f"({RESAMPLES:,} resamples of the validation images, the same draws for both models, seed {SEED}).",
        "",
    ]
    skipped = [
        f"{len(first['skipped'][split])} {split} images that do not decode were skipped (named in results.json)"
        for split in ("train", "val")
        if first["skipped"][split]
    ]
    if skipped:
        lines += ["; ".join(skipped) + ".", ""]
    if cfg["protocol"] == "fast":
        lines += ["## Learning rates", ""]
        for result in report["models"]:
            lines += _lr_table(result)
    return "\n".join(lines)
