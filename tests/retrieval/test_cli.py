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


@pytest.mark.parametrize("flag", ["--out", "--memory-dir"])
def test_unwritable_output_fails_before_any_work(tmp_path, capsys, monkeypatch, flag):
    """The results come last: a folder that cannot be written is refused before a model loads."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr("locatdino.retrieval.features.load_backbone", lambda *a: pytest.fail("work started"))
    args = {"--out": str(tmp_path / "out"), flag: str(blocker / "sub" / "x")}
    with pytest.raises(SystemExit) as done:
        cli.main(["--model", "vit_tiny_patch16_224", *[a for kv in args.items() for a in kv], *TINY])
    assert str(done.value).startswith(f"locatdino hbird: {flag} {blocker / 'sub'}")
    assert "is not writable: Not a directory" in str(done.value) and "\n" not in str(done.value)
    assert "[hbird]" not in capsys.readouterr().err


@pytest.mark.slow
def test_memory_dir_on_a_full_disk_fails_in_one_line_before_encoding(tmp_path):
    """A bank larger than the disk: one line, exit 1, no staging folder (it used to die of SIGBUS)."""
    from tests.tiny_disk import python, run_on_tiny_disk

    disk = tmp_path / "disk"
    hbird = python("-m", "locatdino", "hbird", "--model", "vit_tiny_patch16_224", "--checkpoint", "none",
                   "--memory-dir", str(disk / "bank"), "--out", str(tmp_path / "out"), *TINY)
    proc = run_on_tiny_disk(disk, "64k", ["sh", "-c", '"$@"; rc=$?; echo "left: $(ls -A "$0")"; exit $rc',
                                          str(disk), *hbird])
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("left:")  # nothing: no staging folder
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and err[-1].startswith(f"locatdino hbird: {disk}/.bank.")
    assert "features.bin: No space left on device: needs " in err[-1]
    assert not (tmp_path / "out" / "results.json").exists()
