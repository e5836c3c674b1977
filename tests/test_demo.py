"""``locatdino demo``: the README's main command stays runnable and reports what it measured."""

import json
import re

import pytest
import torch
import yaml

from locatdino import demo

NAMES = ["vit-dino", "locatvit-dino", "vit-random", "locatvit-random"]
BASELINES = ["pixels", "position-prior"]


@pytest.mark.slow
def test_quick_demo_compares_both_teachers_and_both_random_inits(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--quick", "--max-steps", "4", "--out", str(out)]) == 0

    captured = capsys.readouterr()
    for stream in captured:  # not a terminal (as in a job's log): plain lines, no carriage return or escape
        assert "\r" not in stream and "\x1b[" not in stream
    printed = captured.out
    assert re.search(r"Hummingbird mIoU: (no measurable difference between|\S+ ahead of).*95 % interval", printed)
    assert (
        len(
            re.findall(
                r"pretraining vs random init, (vit|locatvit), Hummingbird mIoU: "
                r"(no measurable difference|\S+ ahead of)",
                printed,
            )
        )
        == 2
    )
    # what each teacher adds over its input pixels, by both protocols; the layout alone
    assert (
        len(
            re.findall(
                r"what (vit|locatvit)-dino adds over the pixels, (Hummingbird|linear probe) mIoU: "
                r"(no measurable difference|\S+ ahead of)",
                printed,
            )
        )
        == 4
    )
    assert re.search(r"the layout alone .* scores \d+\.\d\d Hummingbird mIoU and \d+\.\d\d linear probe", printed)
    report = json.loads((out / "compare" / "results.json").read_text())
    assert [m["spec"]["name"] for m in report["models"]] == NAMES + BASELINES and not report["failed"]
    assert [m["spec"]["model"] for m in report["models"]] == [*demo.BACKBONES] * 2 + BASELINES
    md = (out / "compare" / "report.md").read_text()
    for m in report["models"]:
        assert 0 <= m["hbird"]["miou"] <= 100 and (m["probes"] is None) == (m["spec"]["name"] in BASELINES)
        assert m["probes"] is None or 0 <= m["probes"]["knn_top1"] <= 100
        assert re.search(rf"\| {m['spec']['name']} \| \S+ \| .+? \| \d+\.\d\d \|", md), m["spec"]["name"]
    assert len(report["figures"]) == 6  # per-class, memory, predictions, PCA, attention, locality
    for path in report["figures"].values():
        data = (out / "compare" / path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, path
    # the random inits are built like the teachers (the recipes' kwargs), and the teachers did train
    for label in ("vit", "locatvit"):
        teacher = torch.load(out / f"{label}_teacher.pth", weights_only=True)
        random_init = torch.load(out / f"{label}_random_init.pth", weights_only=True)
        assert teacher["pos_embed"].shape == random_init["pos_embed"].shape
        assert not torch.equal(teacher["blocks.0.attn.qkv.weight"], random_init["blocks.0.attn.qkv.weight"])


@pytest.mark.parametrize("recipe, name", [("dino", "dino_tiny_cpu.yaml"), ("supervised", "sup_tiny_cpu.yaml")])
def test_both_backbones_train_with_one_recipe(tmp_path, monkeypatch, recipe, name):
    """The two fit commands are the same but for --model.backbone and the run folder."""
    ran = []

    def run(argv):
        if argv[0] == "compare":
            raise StopIteration
        ran.append(argv)
        return 0

    monkeypatch.setattr(demo, "_run", run)
    monkeypatch.setattr(demo, "_save_random_init", lambda *args: None)
    with pytest.raises(StopIteration):
        demo.main(["--quick", "--recipe", recipe, "--out", str(tmp_path / "out")])
    fits = [argv for argv in ran if argv[0] == "fit"]
    assert len(fits) == 2 and fits[0][fits[0].index("--config") + 1].endswith(f"/configs/{name}")
    backbones = [argv[argv.index("--model.backbone") + 1] for argv in fits]
    roots = [argv[argv.index("--trainer.default_root_dir") + 1] for argv in fits]
    assert backbones == ["vit_tiny_patch16_224", "locatvit_tiny_patch8_224"]
    assert roots == [str(tmp_path / "out" / "fit-vit"), str(tmp_path / "out" / "fit-locatvit")]
    same = [[a for a in argv if a not in (backbone, root)] for argv, backbone, root in zip(fits, backbones, roots)]
    assert same[0] == same[1]
    recipe_file = yaml.safe_load((demo.CONFIG_DIR / name).read_text())
    assert demo.model_args(recipe_file)["backbone"] == backbones[0]  # the recipe's own backbone is the ViT's


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--input-size", "60"],
            "locatdino demo: --input-size 60 is not a multiple of the patch size 8 of the vit "
            "backbone vit_tiny_patch16_224: use 56 or 64",
        ),
        (["--out", "{file}/runs"], "locatdino demo: --out {file}/runs cannot be created: {file} is a file"),
    ],
)
def test_options_that_would_fail_after_pretraining_are_refused_before_it(tmp_path, capsys, monkeypatch, argv, expected):
    """``demo --quick --input-size 0`` once pretrained for 7 minutes before failing in 42 lines."""
    from locatdino import cli

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(demo, "_run", lambda argv: pytest.fail(f"ran {argv} before checking the options"))
    argv = [a.format(file=blocker) for a in argv]
    assert cli.main(["demo", "--quick", "--out", str(tmp_path / "out"), *argv]) == 1
    assert capsys.readouterr().err == expected.format(file=blocker) + "\n"


def test_an_earlier_demo_is_kept_unless_overwrite(tmp_path, capsys, monkeypatch):
    """A second demo into one --out replaced the first one's runs; now it is refused before any work."""
    from locatdino import cli

    out = tmp_path / "out"
    (out / "fit-vit" / "checkpoints").mkdir(parents=True)
    (out / "fit-vit" / "checkpoints" / "last.ckpt").write_bytes(b"earlier")
    monkeypatch.setattr(demo, "_run", lambda argv: pytest.fail(f"ran {argv} before checking --out"))
    assert cli.main(["demo", "--quick", "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"locatdino demo: --out {out} holds the output of an earlier run "
        "(fit-vit/checkpoints/last.ckpt): pass --overwrite to replace it, or choose "
        "another --out\n"
    )
    assert (out / "fit-vit" / "checkpoints" / "last.ckpt").read_bytes() == b"earlier"
    ran = []
    monkeypatch.setattr(demo, "_run", lambda argv: ran.append(argv) or 1)  # the first fit "fails": stop there
    with pytest.raises(SystemExit):
        cli.main(["demo", "--quick", "--out", str(out), "--overwrite"])
    assert ran[0][0] == "fit" and "--overwrite" in ran[0]


def test_supervised_models_are_named_sup(tmp_path):
    report = {
        "dataset": {"num_val": 16},
        "config": {"input_size": 64},
        "models": [
            {"spec": {"name": n}, "hbird": {"miou": v}}
            for n, v in (("vit-sup", 30.0), ("locatvit-sup", 31.0), ("vit-random", 17.0), ("locatvit-random", 18.0))
        ],
    }
    text = "\n".join(demo.conclusion(report, "96 steps", tmp_path, "sup"))
    assert "after 96 steps of supervised training each" in text


def test_files_of_the_demos_names_and_a_running_demo_are_never_overwritten(tmp_path, capsys, monkeypatch):
    """The demo saved its random-init backbones over whatever had their names in --out, and two
    demos into one --out raced; now both are refused before any work."""
    import os

    from locatdino import cli
    from locatdino.common.output_files import output_lock

    out = tmp_path / "out"
    out.mkdir()
    (out / "locatvit_random_init.pth").write_bytes(b"a user's file")
    (out / "notes.txt").write_text("kept")
    monkeypatch.setattr(demo, "_run", lambda argv: pytest.fail(f"ran {argv} before checking --out"))
    for overwrite in ([], ["--overwrite"]):  # a file no demo recorded writing is never the demo's
        assert cli.main(["demo", "--quick", "--out", str(out), *overwrite]) == 1
        assert capsys.readouterr().err == (
            f"locatdino demo: --out {out} holds locatvit_random_init.pth, which "
            "locatdino demo did not write: move it or choose another --out (a run "
            "replaces only files it wrote)\n"
        )
    assert (out / "locatvit_random_init.pth").read_bytes() == b"a user's file"
    other = tmp_path / "other"
    with output_lock(other, "--out"):  # another demo, still running
        assert cli.main(["demo", "--quick", "--out", str(other), "--overwrite"]) == 1
    assert capsys.readouterr().err.startswith(
        f"locatdino demo: --out {other} is in use by another run (pid {os.getpid()}"
    )
    assert sorted(p.name for p in out.iterdir()) == ["locatvit_random_init.pth", "notes.txt"]
    recipe = {"model": {"backbone": "vit_tiny_patch16_224", "backbone_kwargs": {"depth": 1}}, "seed_everything": 3}
    demo._save_random_init(recipe, "vit_tiny_patch16_224", other / "locatvit_random_init.pth")
    state = torch.load(other / "locatvit_random_init.pth", weights_only=True)
    assert "blocks.0.attn.qkv.weight" in state and "blocks.1.attn.qkv.weight" not in state
