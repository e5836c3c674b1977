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


def test_reference_settings_and_provenance_reach_results_json(tmp_path):
    import hashlib
    import os
    from datetime import datetime, timedelta, timezone

    torch.manual_seed(0)
    ckpt = tmp_path / "w.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), ckpt)
    out = tmp_path / "out"
    start = datetime.now(timezone.utc).replace(microsecond=0)
    argv = ["--model", "vit_tiny_patch16_224", "--checkpoint", str(ckpt), "--augment", "off", "--norm",
            "--hungarian", "pixels", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    run = json.loads((out / "results.json").read_text())
    assert {k: run["config"][k] for k in ("augment", "norm", "hungarian")} == {
        "augment": "off", "norm": True, "hungarian": "pixels"}
    assert run["memory_patches"] == 6 * 16  # whole 64 px images: every patch of every image
    prov = run["provenance"]
    assert prov["checkpoint"] == {"path": str(ckpt), "bytes": ckpt.stat().st_size,
                                  "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest()}
    assert start <= datetime.fromisoformat(prov["timestamp"]) <= datetime.now(timezone.utc) + timedelta(seconds=1)
    assert prov["software"]["torch"] == torch.__version__.split("+")[0] and prov["software"]["timm"] == timm.__version__
    assert prov["cpu"]["logical_cores"] == os.cpu_count() and prov["cpu"]["model"]
    assert prov["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "- cpu: " in (out / "summary.md").read_text()
    assert cli._parser().parse_args(["--model", "m"]).norm is False  # the project's default: no final norm


def test_augmentation_off_with_several_epochs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="augment 'off' makes all 2 augmentation epochs identical"):
        cli.main(["--model", "vit_tiny_patch16_224", "--augment", "off", "--aug-epochs", "2",
                  "--out", str(tmp_path / "o"), *TINY])
    assert not (tmp_path / "o").exists()
