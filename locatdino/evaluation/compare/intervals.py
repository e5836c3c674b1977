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
    with intervals: :func:`paired_differences` of the per-image matrices their records name and the
    per-image hits they hold."""

    def confusions(m: dict[str, Any]) -> dict[str, ImageConfusions]:
        files = {protocol: (m.get(protocol) or {}).get("per_image_confusion") for protocol in ("hbird", "linprobe")}
        return {protocol: ImageConfusions.load(Path(folder) / f) for protocol, f in files.items() if f}

    return paired_differences(confusions(a), confusions(b), a.get("probes"), b.get("probes"), hungarian)


def paired_differences(
    a_confusions: dict[str, ImageConfusions | None],
    b_confusions: dict[str, ImageConfusions | None],
    a_probes: dict[str, Any] | None,
    b_probes: dict[str, Any] | None,
    hungarian: str = "iou",
) -> dict[str, PairedInterval]:
    """Δ of model ``a`` over model ``b`` with intervals, for whatever both measured: ``miou`` and
    ``miou_matched`` (Hummingbird's per-image matrices, ``*_confusions["hbird"]``; identity and
    Hungarian-matched under criterion ``hungarian``), ``linprobe`` (the dense linear probe's mIoU,
    ``*_confusions["linprobe"]``) and ``{probe}_top1`` (the per-image hits of ``*_probes``)."""
    out = {}
    for protocol, metric in (("hbird", "miou"), ("linprobe", "linprobe")):
        confusions = [c.get(protocol) for c in (a_confusions, b_confusions)]
        if all(c is not None for c in confusions):
            out[metric] = miou_interval(*confusions)
            if protocol == "hbird":
                out["miou_matched"] = matched_miou_interval(*confusions, criterion=hungarian)
    for probe in PROBES:
        hits = [(m or {}).get(f"{probe}_hits") for m in (a_probes, b_probes)]
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
