"""Shared fixtures for the DINO tests: one torch thread, tiny backbones, in-memory crops."""

import pytest
import torch

import locatdino  # noqa: F401  (registers locatvit_*)

# A 2-block, 64-wide ViT at 32 px global / 16 px local crops and a small head.
TINY_MODEL = dict(
    backbone_kwargs=dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
    out_dim=128, hidden_dim=64, bottleneck_dim=32,
)


@pytest.fixture(autouse=True)
def one_thread():
    """2 cores shared by several jobs: intra-op threads spin against each other (50× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def tiny_module(**overrides):
    from locatdino.ssl import DINOModule

    kwargs = {**TINY_MODEL, "backbone": "vit_tiny_patch16_224", "batch_size": 4, **overrides}
    return DINOModule(**kwargs)


def tiny_trainer(tmp_path=None, **overrides):
    import lightning.pytorch as pl

    kwargs = dict(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, log_every_n_steps=1, default_root_dir=tmp_path)
    return pl.Trainer(**{**kwargs, **overrides})
