"""``locatdino demo`` end to end at a toy budget: the README's main command stays runnable."""

import torch

from locatdino import demo


def test_demo_fits_exports_and_compares_with_random_init(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["--out", str(out), "--max-steps", "2", "--num-train", "4", "--num-val", "2", "--input-size", "64"]
    assert demo.main(argv) == 0

    printed = capsys.readouterr().out
    assert "pretraining changed Hummingbird mIoU by" in printed
    summary = (out / "hbird" / "summary.md").read_text()
    assert "locatvit_tiny-random_init" in summary and "locatvit_tiny-teacher" in summary
    # the baseline is built like the teacher (recipe 64 px / patch 8 -> 8 x 8 patches + cls), not at 224 px
    for name in ("random_init.pth", "teacher.pth"):
        state = torch.load(out / name, weights_only=True)
        assert tuple(state["pos_embed"].shape) == (1, 65, 192), name
