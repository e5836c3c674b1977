"""``locatdino linprobe`` through the dispatcher: outputs, provenance, errors in one line."""

import json

import pytest

from locatdino import cli
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions

SMALL = ["--dataset", "scenes", "--num-train", "6", "--num-val", "3", "--scene-size", "32", "--input-size", "32",
         "--iters", "6", "--batch-size", "4", "--augment", "off", "--precision", "fp32", "--workers", "0",
         "--no-progress"]


def test_two_models_write_results_per_image_matrices_and_a_summary(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["linprobe", "--model", "vit_tiny_patch16_224", "--model", "locatvit_tiny", "--out", str(out), *SMALL]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "| vit_tiny_patch16_224 |" in table and "| locatvit_tiny |" in table
    for label in ("vit_tiny_patch16_224", "locatvit_tiny"):
        result = json.loads((out / label / "results.json").read_text())
        assert result["model"] == {"name": label, "checkpoint": None, "label": label, "pos_embed": "timm"}
        assert result["iterations"] == 6 and result["num_train"] == 6 and result["num_val"] == 3
        assert 0 <= result["miou"] <= 100 and len(result["per_class_iou"]) == 10
        assert result["features"]["cached"] is True and result["features"]["precision"] == "fp32"
        assert result["config"]["augment"] == "off" and result["config"]["dataset"] == "scenes"
        assert result["provenance"]["software"]["torch"] and result["provenance"]["checkpoint"] is None
        confusion = ImageConfusions.load(out / label / CONFUSION_FILE).dense()  # Hummingbird's file format
        assert confusion.shape == (3, 10, 10) and confusion.sum() == 3 * 32 * 32
    assert "Dense linear probe comparison" in (out / "summary.md").read_text()


def test_errors_are_one_line_and_come_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit, match=f"locatdino linprobe: --out {blocker / 'sub'} is not writable"):
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(blocker / "sub"), *SMALL])
    assert "[linprobe]" not in capsys.readouterr().err
    bad = tmp_path / "bad.pth"
    bad.write_text("placeholder\n")
    out = tmp_path / "out"
    assert cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--model", "vit_tiny_patch16_224",
                     "--checkpoint", "none", "--checkpoint", str(bad), "--out", str(out), *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"locatdino linprobe: {bad}: is a text file") and not out.exists()
    with pytest.raises(SystemExit, match="--iters"):
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(out), *SMALL, "--iters", "2"])
