"""``locatdino fit`` with the iBOT recipes: in-process fit, resume and export; 2 ranks on gloo."""

import csv

import pytest
import timm
import torch
from ddp_helpers import assert_same_checkpoint, assert_same_training_state
from ssl_helpers import TINY_IBOT, ibot_overrides, locatdino_in_subprocess

from locatdino.ssl.export import cli as export
from locatdino.ssl.run import cli


def _logged(run, version: int) -> list[dict]:
    with open(run / "logs" / f"version_{version}" / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow
def test_fit_resume_and_export_of_the_tiny_recipe(tmp_path):
    args = ibot_overrides(tmp_path, "locatvit_tiny_patch8_224")
    run = tmp_path / "run"
    assert cli.main([*args, "--trainer.max_steps", "3"]) == 0
    rows = _logged(run, 0)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(float(r["train/ibot_loss"]) > 0 and r["train/dino_loss"] and r["train/teacher_patch_temp"] for r in rows)
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["ibot_mask_seed"] == 0 and "ibot_loss.center" in saved["state_dict"]

    assert cli.main([*args, "--trainer.max_steps", "5", "--ckpt_path", "last"]) == 0
    assert [int(r["step"]) for r in _logged(run, 1)] == [3, 4]

    out = tmp_path / "teacher.pth"
    assert export.main([str(last), str(out)]) == 0
    model = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, **TINY_IBOT["backbone_kwargs"])
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)  # no mask token, no head


def _two_ranks(tmp_path, strategy: str) -> dict:
    dump = tmp_path / "ranks"
    locatdino_in_subprocess(
        tmp_path,
        "fit",
        *ibot_overrides(tmp_path),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        strategy,
        "--trainer.max_steps",
        "3",
        "--model.clip_grad",
        "0.05",
        "--trainer.callbacks+=ddp_helpers.SaveRankState",
        "--trainer.callbacks.out_dir",
        str(dump),
    )
    return {r: torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ibot_ddp")
    return tmp_path, _two_ranks(tmp_path, "ddp")


@pytest.mark.slow
def test_ddp_two_ranks_end_identical(ddp_run):
    """2 ranks on gloo: each masks and reads its own crops; after 3 steps (per-tensor clipping
    active) weights, teacher and both centres (all-reduced) are the same on both ranks."""
    _, ranks = ddp_run
    assert_same_training_state(ranks)
    assert int(ranks[0]["_global_step"]) == 3
    assert ranks[0]["ibot_loss.center"].abs().sum() > 0


@pytest.mark.slow
def test_fsdp_matches_ddp(ddp_run, tmp_path):
    """The same run sharded (DINOWrapPolicy: the patch head is a unit too; the mask token in the
    root unit) ends where DDP ends."""
    ddp_dir, _ = ddp_run
    _two_ranks(tmp_path, "dino_fsdp")
    assert_same_checkpoint(
        ddp_dir / "run" / "checkpoints" / "last.ckpt", tmp_path / "run" / "checkpoints" / "last.ckpt"
    )
