"""2-process DDP and FSDP on CPU (gloo) through ``locatdino fit`` in a subprocess.

Lightning's ``ddp`` re-executes the command line for rank 1, so the run must not happen inside
pytest's process. ``ddp_helpers`` callbacks (this folder is on ``PYTHONPATH``) dump every rank's
state at the end, and can poison one rank's batch to check that a skipped step is skipped on
every rank.
"""

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from ddp_helpers import assert_same_checkpoint, assert_same_training_state
from ssl_helpers import ROOT, locatdino_in_subprocess, tiny_overrides

pytestmark = pytest.mark.slow
CLIPPED = ("--trainer.max_steps", "3", "--model.clip_grad", "0.05")  # clipping active on most tensors


def fit_in_subprocess(tmp_path: Path, *extra: str, shards: Path | None = None, timeout: int = 300) -> dict:
    dump = tmp_path / "ranks"
    locatdino_in_subprocess(
        tmp_path,
        "fit",
        *tiny_overrides(tmp_path, shards),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.callbacks+=ddp_helpers.SaveRankState",
        "--trainer.callbacks.out_dir",
        str(dump),
        *extra,
        timeout=timeout,
    )
    return {r: torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ddp")
    return tmp_path, fit_in_subprocess(tmp_path, "--trainer.strategy", "ddp", *CLIPPED)


def test_ddp_two_ranks_end_identical(ddp_run):
    _, ranks = ddp_run
    assert_same_training_state(ranks)
    assert int(ranks[0]["_global_step"]) == 3


def test_fsdp_matches_ddp(ddp_run, tmp_path):
    """Same data, seed and steps: FSDP (sharded clipping norms, EMA on shards) ends where DDP ends."""
    ddp_dir, _ = ddp_run
    fit_in_subprocess(tmp_path, "--trainer.strategy", "dino_fsdp", *CLIPPED)
    assert_same_checkpoint(
        ddp_dir / "run" / "checkpoints" / "last.ckpt", tmp_path / "run" / "checkpoints" / "last.ckpt"
    )


def test_ddp_uneven_shards_and_a_step_skipped_on_one_rank(tmp_path):
    from locatdino.data.shards.sources import ScenesSource
    from locatdino.data.shards.writer import write_shards

    shards = tmp_path / "uneven"
    index = write_shards(ScenesSource(11, 0, 48), shards, maxcount=8, workers=0, progress=False)
    assert sorted(s["num_samples"] for s in index["shards"]) == [3, 8]
    ranks = fit_in_subprocess(
        tmp_path,
        "--trainer.strategy",
        "ddp",
        "--trainer.max_steps",
        "4",
        "--model.on_nonfinite",
        "skip",
        "--trainer.callbacks+=ddp_helpers.NaNBatch",
        "--trainer.callbacks.rank",
        "1",
        "--trainer.callbacks.step",
        "2",
        shards=shards,
    )
    assert_same_training_state(ranks)
    assert int(ranks[0]["_skipped_steps"]) == int(ranks[1]["_skipped_steps"]) == 1


def test_ddp_two_ranks_with_the_multicrop_on_the_device(tmp_path):
    """``augment_on: gpu`` (on CPU tensors here): every rank's batch hook augments its own decoded
    images (first batches differ), the weights stay identical, the checkpoint counts the batches."""
    ranks = fit_in_subprocess(
        tmp_path, "--trainer.strategy", "ddp", "--trainer.max_steps", "2", "--data.init_args.augment_on", "gpu"
    )
    assert_same_training_state(ranks)
    assert ranks[0]["_first_batch"].shape == (2, 4, 3, 32, 32)
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["ShardDataModule"] == {"epoch": 1, "augmented_batches": 2}


def test_fsdp_vitl_recipe_constructs_and_steps(tmp_path):
    """configs/dino_large_fsdp.yaml on 2 CPU ranks: ViT-L/16 widths (1024, 16 heads, MLP 4096) and
    head, but 4 of the 24 identical blocks to keep the suite fast (every block is the same FSDP
    unit type; the full 24-block run takes ~80 s and 6.5 GB per rank here, see README)."""
    run = tmp_path / "run"
    locatdino_in_subprocess(
        tmp_path,
        "fit",
        "--config",
        str(ROOT / "configs" / "dino_large_fsdp.yaml"),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.precision",
        "32-true",
        "--trainer.max_steps",
        "2",
        "--trainer.default_root_dir",
        str(run),
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--model.backbone_kwargs",
        '{"depth": 4}',
        "--model.out_dim",
        "1024",
        "--step_checkpoint.save_last",
        "false",
        "--epoch_checkpoint.save_last",
        "false",
        "--epoch_checkpoint.save_top_k",
        "0",
        "--data.init_args.train_urls",
        str(tmp_path / "shards"),
        "--data.init_args.synthetic",
        "16",
        "--data.init_args.synthetic_size",
        "48",
        "--data.init_args.batch_size",
        "2",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.multicrop",
        '{"global_crop_size": 32, "local_crop_size": 16, "num_local_crops": 2}',
        timeout=600,
    )
    assert "DINOFSDPStrategy" in (run / "logs" / "version_0" / "config.yaml").read_text()
    rows = [r for r in csv.DictReader(open(run / "logs" / "version_0" / "metrics.csv")) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(math.isfinite(float(r["train/loss"])) for r in rows)


def test_supervised_ddp_two_ranks_end_identical_and_validate(tmp_path):
    """The supervised objective on 2 ranks: each reads its own scenes, both end with the same
    weights, and the held-out top-1 is computed over both ranks' validation shards."""
    dump = tmp_path / "ranks"
    locatdino_in_subprocess(
        tmp_path,
        "fit",
        "--config",
        str(ROOT / "configs" / "sup_tiny_cpu.yaml"),
        "--model.init_args.backbone_kwargs",
        json.dumps({"img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2}),
        "--data.init_args.train_urls",
        str(tmp_path / "train"),
        "--data.init_args.val_urls",
        str(tmp_path / "val"),
        "--data.init_args.synthetic",
        "16",
        "--data.init_args.synthetic_val",
        "6",
        "--data.init_args.synthetic_size",
        "48",
        "--data.init_args.batch_size",
        "4",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.transform",
        json.dumps({"input_size": 32}),
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.callbacks+=ddp_helpers.SaveRankState",
        "--trainer.callbacks.out_dir",
        str(dump),
    )
    ranks = {r: torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)}
    assert_same_training_state(ranks)
    assert int(ranks[0]["_global_step"]) == 2  # 16 scenes / (4 per rank x 2 ranks)
    with open(tmp_path / "run" / "logs" / "version_0" / "metrics.csv") as f:
        top1 = [float(r["val/top1"]) for r in csv.DictReader(f) if r.get("val/top1")]
    assert len(top1) == 1 and 0 <= top1[0] <= 100
