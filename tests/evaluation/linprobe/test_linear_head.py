"""The dense probe's head and schedule against naive re-implementations (docs/evaluation.md)."""

import math

import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.linprobe.head import LinearSegHead, bilinear_resize
from locatdino.evaluation.linprobe.one_cycle import BETAS, MIN_STEPS, one_cycle, probe_optimizer


def _naive_head(head, x):
    """conv → GroupNorm(1, C) written out → GELU → conv, with the head's weights."""
    h = torch.einsum("oc,bchw->bohw", head.proj.weight[:, :, 0, 0], x)
    mean = h.mean(dim=(1, 2, 3), keepdim=True)  # one group: channels AND positions of each image
    var = h.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
    h = (h - mean) / torch.sqrt(var + head.norm.eps)
    h = h * head.norm.weight.view(1, -1, 1, 1) + head.norm.bias.view(1, -1, 1, 1)
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # exact GELU
    w = head.classifier.weight[:, :, 0, 0]
    return torch.einsum("oc,bchw->bohw", w, h) + head.classifier.bias.view(1, -1, 1, 1)


def test_head_matches_a_naive_implementation_and_normalises_channels_and_positions_together():
    torch.manual_seed(0)
    head = LinearSegHead(24, 7)
    with torch.no_grad():  # non-trivial affine and classifier so every term is exercised
        head.norm.weight.uniform_(0.5, 1.5), head.norm.bias.uniform_(-0.5, 0.5), head.classifier.bias.normal_()
    x = torch.randn(3, 24, 5, 6) * 3 + 1
    assert head.proj.weight.shape == (512, 24, 1, 1) and head.proj.bias is None
    assert head.classifier.weight.shape == (7, 512, 1, 1) and isinstance(head.norm, torch.nn.GroupNorm)
    assert head.norm.num_groups == 1 and head.norm.num_channels == 512
    torch.testing.assert_close(head(x), _naive_head(head, x), atol=1e-4, rtol=1e-4)
    # a per-pixel LayerNorm (channels only) is a different head: the test can tell them apart
    h = head.proj(x)
    per_pixel = F.layer_norm(h.permute(0, 2, 3, 1), (512,)).permute(0, 3, 1, 2)
    assert not torch.allclose(
        head.norm(h), per_pixel * head.norm.weight.view(1, -1, 1, 1) + head.norm.bias.view(1, -1, 1, 1), atol=1e-2
    )
    # images are normalised independently: changing one leaves the others' logits unchanged
    y = x.clone()
    y[0] *= 5
    torch.testing.assert_close(head(y)[1:], head(x)[1:])
    out = head(x, (20, 24))
    assert out.shape == (3, 7, 20, 24)
    torch.testing.assert_close(
        out, F.interpolate(head(x), size=(20, 24), mode="bilinear", align_corners=False), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("grid,size", [((16, 16), (128, 128)), ((5, 7), (37, 50)), ((8, 8), (4, 6)), ((3, 4), (3, 4))])
def test_bilinear_resize_is_torchs_bilinear(grid, size):
    x = torch.randn(2, 3, *grid)
    expected = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    torch.testing.assert_close(bilinear_resize(x, size), expected, atol=1e-5, rtol=1e-5)


def _naive_lr(step, total, lr):
    """Linear warm-up from lr/1e4 over the first 25 % (to step 0.25·total − 1), then linear down
    to lr/1e4 at the last step, as torch's OneCycleLR places the phase ends."""
    low, warm_end, last = lr / 1e4, 0.25 * total - 1, total - 1
    if step <= warm_end:
        return low + (lr - low) * step / warm_end
    return lr + (low - lr) * (step - warm_end) / (last - warm_end)


@pytest.mark.parametrize("total", [20, 20_000])
def test_one_cycle_schedule_against_the_formula(total):
    lr = 1e-3
    optimizer = probe_optimizer([torch.nn.Parameter(torch.zeros(1))], lr)
    schedule = one_cycle(optimizer, lr, total)
    checks = {0, 1, total // 8, total // 4 - 1, total // 4, total // 2, total - 2, total - 1}
    seen = {}
    optimizer.step()  # once, so the scheduler may step; the lr does not depend on the updates
    for step in range(total):
        if step in checks:
            seen[step] = optimizer.param_groups[0]["lr"]
            assert optimizer.param_groups[0]["betas"] == BETAS  # no momentum cycling
        if step < total - 1:
            schedule.step()
    for step, value in seen.items():
        assert value == pytest.approx(_naive_lr(step, total, lr), rel=1e-6, abs=1e-12), step
    assert seen[0] == pytest.approx(lr / 1e4) and seen[total - 1] == pytest.approx(lr / 1e4)
    assert seen[total // 4 - 1] == pytest.approx(lr)
    assert optimizer.param_groups[0]["weight_decay"] == 0.01


def test_one_cycle_refuses_too_few_steps():
    optimizer = probe_optimizer([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match=str(MIN_STEPS)):
        one_cycle(optimizer, 1e-3, MIN_STEPS - 1)
