import json

import pytest
import timm
import torch

from locatdino.retrieval import cli

TINY = ["--num-train", "6", "--num-val", "2", "--scene-size", "64", "--input-size", "64", "--workers", "0",
        "--no-progress", "--k", "10"]


@pytest.mark.slow
def test_compares_two_checkpoints_of_one_model(tmp_path, capsys):
    torch.manual_seed(1)
    ckpt = tmp_path / "dino_vitt.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), ckpt)
    out = tmp_path / "out"
    argv = ["--model", "vit_tiny_patch16_224", "--checkpoint", str(ckpt), "--model", "vit_tiny_patch16_224",
            "--checkpoint", "none", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "| vit_tiny_patch16_224-dino_vitt |" in table and "| vit_tiny_patch16_224 |" in table
    runs = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")}
    assert set(runs) == {"vit_tiny_patch16_224-dino_vitt", "vit_tiny_patch16_224"}
    run = runs["vit_tiny_patch16_224-dino_vitt"]
    assert run["model"]["checkpoint"] == str(ckpt) and run["config"]["dataset"] == "scenes"
    assert run["num_train"] == 6 and run["memory_patches"] > 0 and 0 <= run["miou"] <= 100
    assert set(run["per_class_iou"]) >= {"sky", "animal"}
    assert run["miou"] != runs["vit_tiny_patch16_224"]["miou"]  # different weights, different score
    assert "# Hummingbird comparison" in (out / "summary.md").read_text()

    assert cli.main(["report", str(out), "--out", str(tmp_path / "cmp.md")]) == 0
    assert "| vit_tiny_patch16_224 |" in capsys.readouterr().out
    assert "| class |" in (tmp_path / "cmp.md").read_text()


def test_random_init_is_drawn_from_the_seed(tmp_path, capsys):
    """``--checkpoint none`` scores the weights ``torch.manual_seed(--seed)`` draws, every run."""
    from locatdino.models import create_backbone

    torch.manual_seed(3)
    ckpt = tmp_path / "seed3.pth"
    torch.save(create_backbone("vit_tiny_patch16_224").state_dict(), ckpt)
    torch.manual_seed(0)  # the global state before the run must not matter
    argv = ["--model", "vit_tiny_patch16_224", "--checkpoint", "none", "--model", "vit_tiny_patch16_224",
            "--checkpoint", str(ckpt), "--seed", "3", "--out", str(tmp_path / "out"), *TINY]
    assert cli.main(argv) == 0
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*/results.json"))]
    assert len(runs) == 2 and runs[0]["miou"] == runs[1]["miou"]


def test_argument_errors(tmp_path):
    with pytest.raises(SystemExit, match="2 --model but 1 --checkpoint"):
        cli.main(["--model", "a", "--model", "b", "--checkpoint", "x"])
    with pytest.raises(SystemExit, match="needs a data directory"):
        cli.main(["--model", "vit_tiny_patch16_224", "--dataset", "voc"])


def test_device_and_knn_backend_flags(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli._device("auto") == torch.device("cpu")
    with pytest.raises(SystemExit, match="--device cuda:1 but torch sees no CUDA GPU"):
        cli._device("cuda:1")
    with pytest.raises(SystemExit, match="invalid --device 'gpu'"):
        cli._device("gpu")
    args = cli._parser().parse_args(["--model", "m", "--knn-backend", "torch"])
    assert cli._config(args, None).knn_backend == "torch"
