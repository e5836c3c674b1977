"""``curves.png``: metrics stitched over the ``version_N`` logs of a resumed run, then plotted."""

import csv

from locatdino.ssl.logs.curves import stitched_metrics, write_curves


def _log(folder, rows):
    folder.mkdir(parents=True)
    keys = sorted({k for r in rows for k in r})
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)


def test_each_step_comes_from_the_latest_version_that_logged_it(tmp_path):
    """Version 0 logged steps 0-5, the run was resumed from the step-4 checkpoint: version 1
    redid steps 4-5 and went on. version_10 sorts after version_2 (numbers, not strings)."""
    logs = tmp_path / "logs"
    _log(
        logs / "version_0",
        [{"step": s, "epoch": 0, "train/loss": 10 + s} for s in range(6)]
        + [{"step": 3, "epoch": 0, "hbird/mIoU": 20.0}],
    )
    _log(logs / "version_1", [{"step": s, "epoch": 0, "train/loss": 100 + s, "train/lr": 0.1} for s in range(4, 8)])
    _log(logs / "version_2", [])  # a start that died before logging anything
    _log(logs / "version_10", [{"step": s, "epoch": 1, "train/loss": 1000 + s} for s in (7, 8)])
    metrics = stitched_metrics(logs)
    assert metrics["train/loss"] == [
        (0, 10),
        (1, 11),
        (2, 12),
        (3, 13),
        (4, 104),
        (5, 105),
        (6, 106),
        (7, 1007),
        (8, 1008),
    ]
    assert metrics["train/lr"] == [(4, 0.1), (5, 0.1), (6, 0.1)]
    assert metrics["hbird/mIoU"] == [(3, 20.0)] and "epoch" not in metrics
    assert stitched_metrics(tmp_path / "missing") == {}


def test_write_curves_is_a_png_with_the_umask_mode(tmp_path):
    import os

    _log(
        tmp_path / "logs" / "version_0",
        [
            {
                "step": s,
                "train/loss": 5 - s,
                "teacher/entropy": 1.0,
                "train/lr": s * 1e-3,
                "train/teacher_momentum": 0.99,
            }
            for s in range(5)
        ],
    )
    out = write_curves(tmp_path / "logs", tmp_path / "curves.png")
    assert out == tmp_path / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert write_curves(tmp_path / "nothing", tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
