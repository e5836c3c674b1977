"""A backbone's patch size and token grid have one owner, ``locatdino.models.token_grid``."""

from pathlib import Path

import pytest
import timm
from torch import nn

import locatdino
from locatdino.models.baselines import PixelPatches
from locatdino.models.token_grid import fitting_sizes, patch_size, token_grid


def test_patch_size_of_a_vit_a_baseline_and_what_is_neither():
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, patch_size=(8, 4), img_size=64, depth=1)
    assert patch_size(vit) == (8, 4)
    assert patch_size(PixelPatches(16)) == (16, 16)
    with pytest.raises(ValueError, match="^Linear has no patch_embed.patch_size: not a timm ViT"):
        patch_size(nn.Linear(2, 2))


@pytest.mark.parametrize("pad", [False, True])
def test_token_grid_is_timm_s_and_refuses_sides_the_patch_does_not_divide(pad):
    vit = timm.create_model(
        "vit_tiny_patch16_224",
        num_classes=0,
        patch_size=8,
        img_size=64,
        depth=1,
        dynamic_img_size=True,
        dynamic_img_pad=pad,
    )
    for size in ((64, 64), (32, 96), (40, 72)):
        assert token_grid(vit, size) == tuple(vit.patch_embed.dynamic_feat_size(size))
    if pad:
        assert token_grid(vit, (41, 70)) == (6, 9) == tuple(vit.patch_embed.dynamic_feat_size((41, 70)))
    else:
        with pytest.raises(ValueError, match="^input image 41×70 px is not a multiple of the patch size 8×8"):
            token_grid(vit, (41, 70))


def test_fitting_sizes():
    assert fitting_sizes(60, 16) == "48 or 64"
    assert fitting_sizes(10, 16) == "16"  # was "16 or 16"


def test_no_other_module_reads_the_patch_embedding_s_geometry():
    """``patch_embed.patch_size`` and ``dynamic_feat_size`` are read in token_grid.py only."""
    package = Path(locatdino.__file__).parent
    readers = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "token_grid.py"
        and any(
            s in p.read_text() for s in ("patch_embed.patch_size", "dynamic_feat_size", "patch_embed.dynamic_img_pad")
        )
    ]
    assert readers == []
