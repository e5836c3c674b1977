"""What a comparison may say: a winner only when the interval excludes 0 (docs/evaluation.md)."""

import numpy as np
import pytest

from locatdino import demo
from locatdino.evaluation.bootstrap import PairedInterval
from locatdino.evaluation.compare.intervals import attach_differences, difference_text, probe_record
from locatdino.evaluation.compare.report import difference_lines, headline_table
from locatdino.evaluation.image_confusions import ImageConfusions


@pytest.mark.parametrize(
    "low,high,covers", [(-0.4, 0.9, True), (0.0, 1.2, True), (-2.0, -0.0, True), (0.1, 0.9, False), (-1.5, -0.2, False)]
)
def test_no_measurable_difference_exactly_when_the_interval_holds_zero(low, high, covers):
    interval = PairedInterval((low + high) / 2, low, high)
    text = difference_text("locat", "vit", interval)
    assert ("no measurable difference" in text) == covers == interval.covers_zero
    assert f"[{low:+.2f}, {high:+.2f}]" in text  # the interval is named either way
    if not covers:
        assert text.startswith("locat ahead of vit" if low > 0 else "vit ahead of locat")


def _model(name, index, hits):
    return {
        "spec": {"name": name, "model": "m", "checkpoint": None},
        "model": {"label": name, "name": "m", "checkpoint": None},
        "scores": {"": {}},
        "parameters": 1,
        "forward": {},
        "hbird": {"miou": 0.0, "miou_matched": 0.0, "per_image_confusion": f"per_image_confusion/model{index}.npz"},
        "probes": probe_record("knn", np.array(hits, bool)),
    }


def _matrices(rng, n, accuracy):
    """Per-image 3-class matrices of ``n`` images: 100 pixels each, a share ``accuracy`` right."""
    target = rng.integers(0, 3, (n, 100))
    pred = np.where(rng.random(target.shape) < accuracy, target, (target + 1) % 3)
    return np.stack([np.bincount(t * 3 + p, minlength=9).reshape(3, 3) for t, p in zip(target, pred)])


def test_report_and_demo_word_each_difference_by_its_interval(tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    accuracies = {"vit-dino": 0.5, "locatvit-dino": 0.5, "vit-random": 0.8, "locatvit-random": 0.5}
    models = []
    for i, (name, accuracy) in enumerate(accuracies.items()):
        confusions = ImageConfusions.from_matrices(_matrices(rng, n, accuracy))
        confusions.save(tmp_path / f"per_image_confusion/model{i}.npz")
        hits = rng.random(n) < (0.9 if name == "vit-random" else 0.5)
        models.append(_model(name, i, hits))
    models[1]["probes"] = models[0]["probes"]  # same k-NN answers: exactly [0, 0]
    attach_differences(models, tmp_path)
    same = models[1]["differences"][""]["knn_top1"]
    assert (same["delta"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    assert models[2]["differences"][""]["miou"]["low"] > 0  # 0.8 vs 0.5 of the pixels right
    lines = difference_lines(models)
    assert "- Hummingbird mIoU: no measurable difference between locatvit-dino and vit-dino" in lines[0]
    assert any(line.startswith("- Hummingbird mIoU: vit-random ahead of vit-dino by") for line in lines)
    table = headline_table(models)
    assert f"| {PairedInterval.from_dict(models[2]['differences']['']['miou']).text()} |" in table
    low, high = models[0]["probes"]["knn_top1_interval"]
    assert f"{models[0]['probes']['knn_top1']:.1f} [{low:.1f}, {high:.1f}]" in table

    report = {"dataset": {"num_val": n}, "config": {"input_size": 64}, "models": models}
    text = "\n".join(demo.conclusion(report, "16 steps", tmp_path))
    assert "Hummingbird mIoU: no measurable difference between locatvit-dino and vit-dino" in text
    assert "class-token k-NN top-1: no measurable difference between locatvit-dino and vit-dino" in text
    assert "pretraining vs random init, vit, Hummingbird mIoU: vit-random ahead of vit-dino by" in text
    assert "pretraining vs random init, locatvit, Hummingbird mIoU: no measurable difference" in text
