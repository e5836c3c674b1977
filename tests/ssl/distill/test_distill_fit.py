"""``locatdino fit`` with the distillation recipe on the CPU, shrunk: a LocAtViT student under a
patch-16 teacher file (its 2 x 2 grid resampled to the student's 4 x 4), the distillation loss in
the log, resume from ``last.ckpt``, export of the student's EMA; refusals before training."""

import csv
import json

import pytest
import timm
import torch
from ssl_helpers import ROOT, TINY_MODEL, tiny_overrides

from locatdino import cli as command_line
from locatdino.ssl.export import cli as export
from locatdino.ssl.run import cli

STUDENT = "locatvit_tiny_patch8_224"
STUDENT_KWARGS = {**TINY_MODEL["backbone_kwargs"], "patch_size": 8}


def distill_overrides(tmp_path) -> list[str]:
    """tiny_overrides on configs/distill_tiny_cpu.yaml: a LocAtViT-T/8 student, 2 blocks, 32 px global
    crops (4 x 4 tokens), no local crops, and a random test_vit teacher file at patch 16 (2 x 2)."""
    torch.manual_seed(0)
    torch.save(timm.create_model("test_vit", num_classes=0, img_size=32).state_dict(), tmp_path / "teacher.pth")
    args = tiny_overrides(tmp_path)
    args[args.index("--config") + 1] = str(ROOT / "configs" / "distill_tiny_cpu.yaml")
    args[args.index("--model.backbone_kwargs") + 1] = json.dumps(STUDENT_KWARGS)
    args[args.index("--data.init_args.multicrop") + 1] = json.dumps({"global_crop_size": 32, "num_local_crops": 0})
    return [*args, "--model.backbone", STUDENT, "--model.teacher", f"test_vit:{tmp_path / 'teacher.pth'}"]


def _logged(run, version: int) -> list[dict]:
    with open(run / "logs" / f"version_{version}" / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow
def test_fit_with_the_distillation_recipe_resumes_and_exports(tmp_path):
    args = distill_overrides(tmp_path)
    run = tmp_path / "run"
    assert cli.main([*args, "--trainer.max_steps", "3"]) == 0
    rows = _logged(run, 0)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    for r in rows:  # the recipe's weights: 1 x (class + 1 x patch), no DINO
        total = float(r["train/distill_cls_loss"]) + float(r["train/distill_patch_loss"])
        assert float(r["train/distill_loss"]) == pytest.approx(total, rel=1e-5)
        assert float(r["train/loss"]) == pytest.approx(total, rel=1e-5)
        assert 0 < float(r["train/distill_cls_loss"]) < 2  # a cosine distance
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert not [k for k in saved["state_dict"] if k.startswith("distill_teacher.")] and saved["global_step"] == 3

    assert cli.main([*args, "--trainer.max_steps", "5", "--ckpt_path", "last"]) == 0
    assert [int(r["step"]) for r in _logged(run, 1)] == [3, 4]
    assert torch.load(last, weights_only=True)["global_step"] == 5

    out = tmp_path / "student.pth"
    assert export.main([str(last), str(out)]) == 0
    model = timm.create_model(STUDENT, num_classes=0, **STUDENT_KWARGS)
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)  # the student's EMA, no teacher


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--model.distill_loss_weight", "0"],
            "model.distill_loss_weight and model.dino_loss_weight: both 0, nothing would be learned",
        ),
        (["--model.distill_patch_weight", "-1"], "model.distill_patch_weight: must be a number >= 0, got -1"),
        (["--model.teacher", "swin_tiny_patch4_window7_224:{file}"], "model.teacher swin_tiny_patch4_window7_224:"),
    ],
)
def test_bad_distillation_settings_are_one_line_before_training(tmp_path, capsys, extra, message):
    extra = [e.format(file=tmp_path / "teacher.pth") for e in extra]
    args = [*distill_overrides(tmp_path), *extra]
    capsys.readouterr()
    assert command_line.main(["fit", *args]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("locatdino fit: ") and message in err[0], err
    assert not (tmp_path / "run" / "checkpoints").exists()
