"""Intervals of a comparison and what they allow to be said (docs/evaluation.md).

Between two models of one ``locatdino compare`` run (same query and test images): Δ mIoU (and Δ
Hungarian-matched mIoU) with its paired bootstrap over the query images (from each model's per-image
confusion matrices, written under ``per_image_confusion/`` of the report folder) and Δ top-1 of each
class-token probe with the same bootstrap over the test images (from each model's per-image hits,
kept in ``results.json``). Each model's top-1 also gets its own binomial (Wilson) interval.

"A beats B" is said only when the interval excludes 0; otherwise the text says "no measurable
difference". The report, the demo's conclusion and ``benchmarks/studies/compare.py`` all word a
difference through :func:`difference_text`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from locatdino.evaluation.bootstrap import PairedInterval, accuracy_interval, matched_miou_interval, miou_interval
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.wilson import wilson_interval

PROBES = ("knn", "logistic")  # class-token probes whose per-image hits a report keeps


def confusion_file(index: int, protocol: str = "hbird") -> str:
    """Where the ``index``-th model's per-image matrices of ``protocol`` (``hbird`` or ``linprobe``)
    go, relative to the report folder (model names are free text, positions are not)."""
    return f"per_image_confusion/model{index}{'' if protocol == 'hbird' else '_' + protocol}.npz"


def probe_record(name: str, hits: np.ndarray) -> dict[str, Any]:
    """``{name}_top1`` (percent), its 95 % Wilson interval and the per-image hits of one probe."""
    hits = np.asarray(hits, bool)
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return {
        f"{name}_top1": 100 * float(hits.mean()),
        f"{name}_top1_interval": [100 * low, 100 * high],
        f"{name}_hits": hits.astype(int).tolist(),
    }


def model_differences(
    a: dict[str, Any], b: dict[str, Any], folder: str | Path, hungarian: str = "iou"
) -> dict[str, PairedInterval]:
    """Δ of model ``a`` over model ``b`` (``results.json`` model records of the report in ``folder``)
    with intervals: ``miou`` and ``miou_matched`` (Hummingbird, identity and Hungarian-matched
    under criterion ``hungarian``), ``linprobe`` (the dense linear probe's mIoU) and
    ``{probe}_top1``, for whatever both models measured."""
    out = {}
    for protocol, metric in (("hbird", "miou"), ("linprobe", "linprobe")):
        files = [(m.get(protocol) or {}).get("per_image_confusion") for m in (a, b)]
        if all(files):
            confusions = [ImageConfusions.load(Path(folder) / f) for f in files]
            out[metric] = miou_interval(*confusions)
            if protocol == "hbird":
                out["miou_matched"] = matched_miou_interval(*confusions, criterion=hungarian)
    for probe in PROBES:
        hits = [(m.get("probes") or {}).get(f"{probe}_hits") for m in (a, b)]
        if all(h is not None for h in hits) and len(hits[0]) == len(hits[1]):
            out[f"{probe}_top1"] = accuracy_interval(np.array(hits[0]), np.array(hits[1]))
    return out


def attach_differences(models: list[dict[str, Any]], folder: str | Path, hungarian: str = "iou") -> None:
    """Give every model record after the first its ``differences`` to the first (the reference of
    the comparison), in the schema of every command's ``results.json``: ``{"": {metric: PairedInterval.to_dict()}}``."""
    for m in models[1:]:
        differences = model_differences(m, models[0], folder, hungarian)
        m["differences"] = {"": {k: v.to_dict() for k, v in differences.items()}}


def difference_text(a: str, b: str, interval: PairedInterval, unit: str = "points") -> str:
    """``a`` vs ``b`` in words: the leader and its margin only when the interval excludes 0."""
    bounds = f"95 % interval of {a} − {b}: [{interval.low:+.2f}, {interval.high:+.2f}]"
    if interval.covers_zero:
        return f"no measurable difference between {a} and {b} ({a} − {b} = {interval.delta:+.2f} {unit}, {bounds})"
    winner, loser = (a, b) if interval.low > 0 else (b, a)
    return f"{winner} ahead of {loser} by {abs(interval.delta):.2f} {unit} ({bounds})"
