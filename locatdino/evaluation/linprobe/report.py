"""What ``locatdino linprobe``'s ``report.md`` says around its table (:mod:`locatdino.evaluation.results`
writes it): a row per model with its Δ mIoU to the first, then the per-class IoU.

A model's record is :meth:`LinearProbeResult.to_dict` plus the model and the dataset; its per-image
confusion matrices (one per scored query image, for paired bootstrap intervals) go to
``OUT/<label>/`` in Hummingbird's file format
(:class:`~locatdino.evaluation.image_confusions.ImageConfusions`).
"""

from __future__ import annotations

from typing import Any

from locatdino.evaluation.results import (
    ReportLayout,
    delta_column,
    per_class_notes,
    score_column,
    seconds_column,
    value_column,
)
from locatdino.evaluation.tables import number_cell


def _about(document: dict[str, Any]) -> list[str]:
    first = document["models"][0]
    cfg = first["config"]
    budget = f"{first['iterations']:,} iterations × batch {cfg['batch_size']}"
    return [
        f"Dataset: {cfg.get('dataset')} — {first['num_train']} training images, {first['num_val']} query "
        f"images; protocol {cfg.get('variant', 'paper')}; {budget} at {cfg['input_size']} px, augmentation "
        f"{cfg['augment']}, seed {cfg['seed']}. "
        "mIoU in % over every original pixel of the query images, identity class mapping; no interval of a "
        "single run's mIoU: the Δ between runs carries the paired one."
    ]


def _final_loss(record: dict[str, Any]) -> str:
    curve = record.get("loss_curve") or [[0, None]]
    return number_cell(curve[-1][1], 3)


LINPROBE_LAYOUT = ReportLayout(
    title="Dense linear probe",
    about=_about,
    columns=(
        value_column("protocol", lambda record: record["config"].get("variant", "paper")),
        score_column("miou", "mIoU", interval=False),
        delta_column("miou", "mIoU"),
        value_column("one-scale mIoU", lambda record: number_cell(record.get("single_scale_miou"))),
        score_column("pixel_accuracy", "pixel acc.", interval=False),
        value_column("iterations", lambda record: f"{record['iterations']:,}"),
        value_column("final loss", _final_loss),
        *(seconds_column(phase) for phase in ("features", "head", "data", "total")),
        value_column("encoder", lambda record: record["features"].get("precision")),
        value_column("cached", lambda record: record["features"].get("cached")),
    ),
    notes=per_class_notes,
)
