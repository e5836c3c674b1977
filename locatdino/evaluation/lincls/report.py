"""What ``locatdino lincls``'s ``report.md`` says around its table (a row per model, every Δ with its
interval; :mod:`locatdino.evaluation.results` writes it), and for the lr-grid variant every learning
rate's held-out and validation top-1."""

from __future__ import annotations

from typing import Any

from locatdino.evaluation.results import ReportLayout, delta_column, score_column, value_column
from locatdino.evaluation.tables import number_cell


def _input_cell(linear_input: dict[str, Any]) -> str:
    """``4 class tokens``, ``1 class token + mean patch``, ``mean of the last stage`` (Swin) (``, PRR``)."""
    n = linear_input["last_blocks"]
    text = f"{n} class token{'s' * (n != 1)}" + (" + mean patch" if linear_input["avgpool"] else "")
    if linear_input.get("pooled"):
        text = "mean of the last stage"
    return text + (", PRR" if linear_input["prr"] else "")


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


def _about(document: dict[str, Any]) -> list[str]:
    first = document["models"][0]
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
    return [
        f"Dataset: {cfg['dataset']} — {first['num_train']} training images, {first['num_val']} validation "
        f"images scored from their {cfg['input_size']} px centre crop; {how}; encoder {cfg['precision']}."
    ]


def _notes(document: dict[str, Any]) -> list[str]:
    first = document["models"][0]
    lines = ["Top-1 / top-5 in % (Wilson intervals); top-5 n/a with at most 5 classes: every image is in it.", ""]
    skipped = [
        f"{len(first['skipped'][split])} {split} images that do not decode were skipped (named in results.json)"
        for split in ("train", "val")
        if first["skipped"][split]
    ]
    if skipped:
        lines += ["; ".join(skipped) + ".", ""]
    if first["config"]["protocol"] == "fast":
        lines += ["## Learning rates", ""]
        for record in document["models"]:
            lines += _lr_table(record)
    return lines


LINCLS_LAYOUT = ReportLayout(
    title="Linear classification on frozen features",
    about=_about,
    columns=(
        value_column("protocol", lambda record: record["config"]["protocol"]),
        value_column("input", lambda record: _input_cell(record["linear_input"])),
        value_column("lr used", lambda record: f"{record['lr']:.3g}"),
        score_column("top1", "top-1"),
        delta_column("top1", "top-1"),
        score_column("top5", "top-5"),
    ),
    notes=_notes,
)
