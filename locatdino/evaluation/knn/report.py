"""What ``locatdino knn``'s ``report.md`` says around its table: a row per model and k, top-1 and
top-5 with their Δ to the first model (:mod:`locatdino.evaluation.results` writes it)."""

from __future__ import annotations

from typing import Any

from locatdino.evaluation.results import ReportLayout, delta_column, score_column


def _about(document: dict[str, Any]) -> list[str]:
    first = document["models"][0]
    cfg, data = first["config"], first["data"]
    return [
        f"Dataset: {cfg['dataset']} — {data['train']['images']} train images ({data['train']['classes']} "
        f"classes), {data['val']['scored']} validation images scored; class token after the final norm, "
        f"L2-normalised; {cfg['input_size']} px centre crop; votes exp(cos / {cfg['temperature']:g}); "
        f"encoder {cfg['precision']}."
    ]


def _notes(document: dict[str, Any]) -> list[str]:
    data = document["models"][0]["data"]
    lines = ["Top-1 / top-5 in % (Wilson intervals); top-5 n/a with at most 5 classes: every image is in it.", ""]
    skipped = [
        f"{len(data[split]['skipped'])} {split} images that do not decode were skipped (named in results.json)"
        for split in ("train", "val")
        if data[split]["skipped"]
    ]
    return lines + (["; ".join(skipped) + ".", ""] if skipped else [])


KNN_LAYOUT = ReportLayout(
    title="DINO k-NN classification",
    about=_about,
    columns=(
        score_column("top1", "top-1"),
        delta_column("top1", "top-1"),
        score_column("top5", "top-5"),
        delta_column("top5", "top-5"),
    ),
    notes=_notes,
    setting_header="k",
)
