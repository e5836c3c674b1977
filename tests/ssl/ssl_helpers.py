"""Helpers of the DINO tests: tiny module and trainer factories, in-memory multi-crop batches.

A module of its own (not conftest.py): several test folders have a conftest, and ``import
conftest`` would pick whichever was imported first.
"""

import lightning.pytorch as pl
import torch

from locatdino.ssl import DINOModule

# A 2-block, 64-wide ViT at 32 px global / 16 px local crops and a small head.
TINY_MODEL = dict(
    backbone_kwargs=dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
    out_dim=128, hidden_dim=64, bottleneck_dim=32,
)


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
    kwargs = dict(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, log_every_n_steps=1, default_root_dir=tmp_path)
    return pl.Trainer(**{**kwargs, **overrides})
