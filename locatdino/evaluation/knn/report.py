"""Markdown of ``locatdino knn`` runs: one row per model and k, every Δ with its interval."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from locatdino.evaluation.bootstrap import RESAMPLES, SEED, PairedInterval
from locatdino.evaluation.tables import NOT_APPLICABLE, score_cell

KNN_FILES = ("results.json", "report.md")  # what a run writes into --out


def _delta_cell(result: dict[str, Any], k: str, name: str) -> str:
    if result["knn"][k][name] is None:
        return NOT_APPLICABLE
    record = (result.get("differences") or {}).get(k, {}).get(name)
    return "—" if record is None else PairedInterval.from_dict(record).text()


def knn_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per model and k: top-1 and top-5 in % with 95 % intervals, Δ to the first model."""
    rows = [
        "| model | k | top-1 [95 %] | Δ top-1 [95 %] | top-5 [95 %] | Δ top-5 [95 %] |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for k, scores in result["knn"].items():
            rows.append(
                f"| {result['model']['label']} | {k} | {score_cell(scores, 'top1')} | "
                f"{_delta_cell(result, k, 'top1')} | {score_cell(scores, 'top5')} | "
                f"{_delta_cell(result, k, 'top5')} |"
            )
    return "\n".join(rows)


def knn_report(report: dict[str, Any]) -> str:
    """``report.md`` of a run (``report``: its ``results.json``)."""
    first = report["models"][0]
    cfg, data = first["config"], first["data"]
    skipped = [
        f"{len(data[split]['skipped'])} {split} images that do not decode were skipped (named in results.json)"
        for split in ("train", "val")
        if data[split]["skipped"]
    ]
    lines = [
        "# DINO k-NN classification",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Dataset: {cfg['dataset']} — {data['train']['images']} train images ({data['train']['classes']} "
        f"classes), {data['val']['scored']} validation images scored; class token after the final norm, "
        f"L2-normalised; {cfg['input_size']} px centre crop; votes exp(cos / {cfg['temperature']:g}); "
        f"encoder {cfg['precision']}.",
        "",
        knn_table(report["models"]),
        "",
        "Top-1 / top-5 in % with 95 % Wilson intervals over the validation images (top-5 n/a with at most 5 "
        "classes: every image is in it); Δ = model − first model with its 95 % paired-bootstrap interval "
        f"({RESAMPLES:,} resamples of the validation images, the same draws for both models, seed {SEED}).",
        "",
    ]
    if skipped:
        lines += ["; ".join(skipped) + ".", ""]
    return "\n".join(lines)
