"""Helpers of the DINO tests: tiny module and trainer factories, in-memory multi-crop batches,
``locatdino fit`` arguments for a tiny run and a subprocess runner.

A module of its own (not conftest.py): several test folders have a conftest, and ``import
conftest`` would pick whichever was imported first.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from locatdino.ssl import DINOModule

ROOT = Path(__file__).resolve().parents[2]

# A 2-block, 64-wide ViT at 32 px global / 16 px local crops and a small head.
TINY_MODEL = dict(
    backbone_kwargs=dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
    out_dim=128,
    hidden_dim=64,
    bottleneck_dim=32,
)


TINY_IBOT = {**TINY_MODEL, "backbone_kwargs": {**TINY_MODEL["backbone_kwargs"], "patch_size": 8}}


def random_batch(batch: int = 4, v_g: int = 2, v_l: int = 2, size: int = 32, local_size: int = 16, seed: int = 0):
    """A multi-crop batch in the INTERFACES.md format."""
    g = torch.Generator().manual_seed(seed)
    return {
        "global": torch.randn(v_g, batch, 3, size, size, generator=g),
        "local": torch.randn(v_l, batch, 3, local_size, local_size, generator=g),
    }


def batches_loader(batches):
    """A DataLoader yielding the given batch dicts as they are (one per step)."""
    return torch.utils.data.DataLoader(batches, batch_size=None)


def tiny_module(**overrides) -> DINOModule:
    """A DINOModule on the tiny ViT (any argument overridable)."""
    kwargs = {**TINY_MODEL, "backbone": "vit_tiny_patch16_224", "batch_size": 4, **overrides}
    return DINOModule(**kwargs)


def tiny_trainer(tmp_path=None, **overrides) -> pl.Trainer:
    """A quiet 1-step CPU Trainer without logger or checkpoints (any argument overridable)."""
    kwargs = dict(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
    )
    return pl.Trainer(**{**kwargs, **overrides})


def tiny_overrides(tmp_path: Path, shards: Path | None = None) -> list[str]:
    """configs/dino_tiny_cpu.yaml shrunk further: 2 blocks, 32/16 px crops, 24 scenes of 48 px."""
    return [
        "--config",
        str(ROOT / "configs" / "dino_tiny_cpu.yaml"),
        "--model.backbone_kwargs",
        json.dumps(TINY_MODEL["backbone_kwargs"]),
        "--model.out_dim",
        "128",
        "--model.hidden_dim",
        "64",
        "--model.bottleneck_dim",
        "32",
        "--data.init_args.train_urls",
        str(shards or tmp_path / "shards"),
        "--data.init_args.synthetic",
        "0" if shards else "24",
        "--data.init_args.synthetic_size",
        "48",
        "--data.init_args.batch_size",
        "4",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.multicrop",
        json.dumps({"global_crop_size": 32, "local_crop_size": 16, "num_local_crops": 2}),
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.log_every_n_steps",
        "1",
        "--step_checkpoint.every_n_train_steps",
        "2",
    ]


def locatdino_in_subprocess(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m locatdino ARGS`` in a fresh process, asserting exit status 0.

    A subprocess because Lightning's ``ddp`` re-executes the command line for rank 1; one
    thread per rank (2 shared cores); this folder on ``PYTHONPATH`` for ``ddp_helpers``.
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "locatdino", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


class LossRecorder(pl.Callback):
    """Each step's loss (``losses``); stops the run after global step ``stop_at`` when given."""

    def __init__(self, stop_at: int | None = None):
        self.losses, self.stop_at = [], stop_at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        if trainer.global_step == self.stop_at:
            trainer.should_stop = True


def resumed_losses(tmp_path: Path, build, batch) -> tuple[list[float], list[float], list[float], pl.Trainer]:
    """Six steps on ``batch`` three ways: uninterrupted; stopped after step 3 (``last.ckpt``); and
    resumed from it with another seed (the other init must be replaced by the checkpoint's weights).
    ``build()`` makes the module (called after seeding). Returns the losses of the whole run, of
    its first part and of the resumed part, and the resumed run's trainer."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(seed, callbacks, ckpt_path=None, **trainer_kw):
        torch.manual_seed(seed)
        trainer = tiny_trainer(tmp_path, max_steps=6, callbacks=callbacks, **trainer_kw)
        trainer.fit(build(), batches_loader([batch, batch]), ckpt_path=ckpt_path)
        return trainer

    def checkpoint():
        return ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=0, save_last=True)

    whole, first, second = LossRecorder(), LossRecorder(stop_at=3), LossRecorder()
    run(0, [whole])
    run(0, [first, checkpoint()], enable_checkpointing=True)
    trainer = run(1, [second, checkpoint()], ckpt_path="last", enable_checkpointing=True)
    return whole.losses, first.losses, second.losses, trainer


def naive_dino_loss(student, teacher, center, t_temp, s_temp):
    """Per-pair loop of the reference (main_dino.py: DINOLoss.forward)."""
    s_out = [F.log_softmax(s / s_temp, dim=-1) for s in student]
    t_out = [F.softmax((t - center) / t_temp, dim=-1) for t in teacher]
    total, n = 0.0, 0
    for iq, q in enumerate(t_out):
        for v, logq in enumerate(s_out):
            if v == iq:
                continue
            total = total + (-q * logq).sum(-1).mean()
            n += 1
    return total / n, n


def ibot_overrides(tmp_path, backbone: str = "vit_tiny_patch16_224") -> list[str]:
    """tiny_overrides (the tiny DINO run shrunk further) with the iBOT recipe and 4 x 4 tokens per global crop."""
    args = tiny_overrides(tmp_path)
    args[args.index("--config") + 1] = str(ROOT / "configs" / "ibot_tiny_cpu.yaml")
    args += ["--model.backbone", backbone]
    args[args.index("--model.backbone_kwargs") + 1] = json.dumps(TINY_IBOT["backbone_kwargs"])
    return [*args, "--model.patch_out_dim", "96"]
