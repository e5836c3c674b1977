"""``locatdino fit`` with Gram anchoring on the tiny DINO recipe: fit, the Gram loss in the log,
resume from ``last.ckpt`` with the Gram teacher, export; refusals before training."""

import csv
import json

import pytest
import timm
import torch
from ssl_helpers import TINY_MODEL, tiny_overrides

from locatdino import cli as command_line
from locatdino.ssl.export import cli as export
from locatdino.ssl.run import cli

# from step 1 on, refreshed after steps 1 and 3 (it + 1 a multiple of 2)
GRAM = {"it_load_ema_teacher": 1, "update_frequency": 2, "loss_weight": 2.0}


def _logged(run, version: int) -> list[dict]:
    with open(run / "logs" / f"version_{version}" / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow
def test_fit_with_gram_anchoring_resumes_and_exports(tmp_path):
    args = [*tiny_overrides(tmp_path), "--model.gram", json.dumps(GRAM)]
    run = tmp_path / "run"
    assert cli.main([*args, "--trainer.max_steps", "3"]) == 0
    rows = _logged(run, 0)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert [r["train/gram_loss"] != "" for r in rows] == [False, True, True]  # the Gram teacher from step 1
    assert all(float(r["train/gram_loss_weight"]) == 2.0 for r in rows[1:])
    for r in rows[1:]:
        total = float(r["train/dino_loss"]) + 2.0 * float(r["train/gram_loss"])
        assert float(r["train/loss"]) == pytest.approx(total, rel=1e-5)
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["state_dict"]
    assert int(saved["gram.updates"]) == 1 and bool(saved["gram.loaded_ema"])
    gram_keys = [k for k in saved if k.startswith("gram.teacher.backbone.")]
    assert len(gram_keys) == len([k for k in saved if k.startswith("teacher.backbone.")])

    assert cli.main([*args, "--trainer.max_steps", "5", "--ckpt_path", "last"]) == 0
    resumed = _logged(run, 1)
    assert [int(r["step"]) for r in resumed] == [3, 4] and all(r["train/gram_loss"] for r in resumed)
    assert int(torch.load(last, weights_only=True)["state_dict"]["gram.updates"]) == 2

    out = tmp_path / "teacher.pth"
    assert export.main([str(last), str(out)]) == 0
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"])
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)  # the EMA teacher, no Gram teacher


def test_a_gram_teacher_of_another_architecture_is_one_line_before_training(tmp_path, capsys):
    wider = timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, **{**TINY_MODEL["backbone_kwargs"], "embed_dim": 96}
    )
    torch.save(wider.state_dict(), tmp_path / "vit96.pth")
    args = [*tiny_overrides(tmp_path), "--model.gram", json.dumps({"ckpt": str(tmp_path / "vit96.pth")})]
    capsys.readouterr()
    assert command_line.main(["fit", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"locatdino fit: model.gram.ckpt {tmp_path / 'vit96.pth'}: "), err
    assert "[96" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
