import copy

import pytest
import timm
import torch

from locatdino.models.gaug.patch_grid import PatchGrid
from tests.models.tiny import TINY


def test_grid_follows_each_input_and_keeps_earlier_sizes(tiny_locatvit):
    grid = tiny_locatvit.blocks[0].attn.patch_grid
    tiny_locatvit(torch.randn(1, 3, 64, 96))
    tiny_locatvit(torch.randn(1, 3, 96, 64))
    tiny_locatvit(torch.randn(1, 3, 32, 32))
    assert grid.lookup(1 + 24) == (6, 4)  # newest grid with 24 patches wins
    assert grid.lookup(1 + 4) == (2, 2)


def test_bad_inputs_raise_clear_errors(tiny_locatvit):
    with pytest.raises(ValueError, match="70×64 px is not a multiple of the patch size 16×16"):
        tiny_locatvit(torch.randn(1, 3, 70, 64))
    with pytest.raises(RuntimeError, match="GAug attention got 7 tokens"):
        tiny_locatvit.blocks[0].attn(torch.randn(1, 7, 64))


def test_deepcopy_gets_its_own_grid(tiny_locatvit):
    teacher = copy.deepcopy(tiny_locatvit)
    grids = {id(b.attn.patch_grid) for b in teacher.blocks}
    assert len(grids) == 1 and grids != {id(tiny_locatvit.blocks[0].attn.patch_grid)}
    teacher(torch.randn(1, 3, 48, 48))
    assert teacher.blocks[1].attn.patch_grid.lookup(10) == (3, 3)
    with pytest.raises(RuntimeError):
        tiny_locatvit.blocks[1].attn.patch_grid.lookup(10)


def test_gradient_checkpointing_recomputes_with_the_right_grid(tiny_locatvit):
    """Two resolutions forward, then one backward: recomputation must find each input's grid."""
    tiny_locatvit.train()
    x_global, x_local = torch.randn(2, 3, 64, 64), torch.randn(3, 3, 32, 48)

    def loss():
        return tiny_locatvit(x_global).square().sum() + tiny_locatvit(x_local).square().sum()

    loss().backward()
    want = {k: p.grad.clone() for k, p in tiny_locatvit.named_parameters()}
    tiny_locatvit.zero_grad()
    tiny_locatvit.set_grad_checkpointing(True)
    loss().backward()
    for k, p in tiny_locatvit.named_parameters():
        torch.testing.assert_close(p.grad, want[k], rtol=1e-4, atol=1e-6)


def test_oldest_grid_is_evicted():
    grid = PatchGrid(num_prefix_tokens=1, patch_size=(16, 16), dynamic_img_pad=False)
    for side in range(1, 20):
        grid.record((side, side))
    assert grid.lookup(1 + 19 * 19) == (19, 19)
    with pytest.raises(RuntimeError):
        grid.lookup(1 + 1)


def test_dynamic_img_pad_accepts_any_size_with_the_padded_grid():
    model = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, dynamic_img_pad=True, **TINY).eval()
    model(torch.randn(1, 3, 70, 40))
    assert model.blocks[0].attn.patch_grid.lookup(1 + 15) == (5, 3)
