"""The picture of a run's curves: ``<default_root_dir>/curves.png``, written when ``fit`` ends.

Lightning's CSV logger starts a new ``logs/version_N/metrics.csv`` at every (re)start, so a
resumed run is split over several files, and the older one holds steps the newer one redid
(a resume restarts from the last checkpoint, not from the last logged step). Stitching keeps
each step from the latest version that logged it: version N contributes only the steps before
version N+1's first one. Four panels: loss; teacher entropy (per sample and of the batch mean,
the collapse signals; DINO only); learning rate with the teacher momentum (DINO); held-out
scores in percent: Hummingbird mIoU when a ``HummingbirdMonitor`` logged it, the k-NN top-1 of a
``KnnMonitor``, the supervised objective's validation top-1.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path

from locatdino.common.output_files import atomic_write

CURVES_NAME = "curves.png"
_PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # title, metrics on the left axis, metrics on a right axis
    ("loss", ("train/loss",), ()),
    ("teacher entropy", ("teacher/entropy", "teacher/batch_entropy"), ()),
    ("schedules", ("train/lr",), ("train/teacher_momentum",)),
    ("held-out (%)", ("hbird/mIoU", "monitor/knn_top1", "val/top1"), ()),
)


def _versions(log_dir: Path) -> list[Path]:
    found = [
        (int(m[1]), p)
        for p in log_dir.glob("version_*/metrics.csv")
        if (m := re.fullmatch(r"version_(\d+)", p.parent.name))
    ]
    return [p for _, p in sorted(found)]


def _read(path: Path) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of one ``metrics.csv`` (empty cells and non-numbers skipped)."""
    series: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                step = int(float(row.get("step") or ""))
            except ValueError:
                continue
            for key, cell in row.items():
                if key in ("step", "epoch") or not cell:
                    continue
                try:
                    series.setdefault(key, {})[step] = float(cell)
                except ValueError:
                    pass
    return series


def stitched_metrics(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every metric of the ``version_*/metrics.csv`` under ``log_dir`` as one ``(step, value)``
    series, each step from the latest version that logged it (see the module docstring)."""
    runs = [_read(p) for p in _versions(Path(log_dir))]
    merged: dict[str, dict[int, float]] = {}
    for i, run in enumerate(runs):
        later = [min(s) for r in runs[i + 1 :] for s in r.values() if s]
        cut = min(later) if later else math.inf
        for key, values in run.items():
            merged.setdefault(key, {}).update({s: v for s, v in values.items() if s < cut})
    return {key: sorted(values.items()) for key, values in merged.items()}


def write_curves(log_dir: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Plot the stitched curves of ``log_dir`` (holding ``version_*/``) to the PNG ``out``
    (atomically); ``None`` when there is no metric to plot."""
    metrics = stitched_metrics(log_dir)
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.2), layout="constrained")
    for ax, (title, left, right) in zip(fig.subplots(1, len(_PANELS)), _PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        drawn = _draw(ax, metrics, left, "-")
        if right and any(k in metrics for k in right):
            drawn += _draw(ax.twinx(), metrics, right, "--", color="tab:red")
        if drawn:
            ax.legend(handles=drawn, fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return atomic_write(out, lambda f: f.write(buf.getvalue()))


def _draw(ax, metrics: dict[str, list[tuple[int, float]]], keys: tuple[str, ...], style: str, **kwargs) -> list:
    lines = []
    for key in keys:
        if key in metrics:
            steps, values = zip(*metrics[key])
            lines += ax.plot(steps, values, style, label=key, marker="." if len(steps) < 30 else None, **kwargs)
    return lines
