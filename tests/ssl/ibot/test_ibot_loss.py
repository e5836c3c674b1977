import math

import pytest
import torch
import torch.nn.functional as F

from locatdino.ssl import IBOTPatchLoss


def naive_patch_loss(student, teacher, masks, center, t_temp, s_temp):
    """docs/pretraining.md crop by crop: each masked crop's mean over its masked patches of
    −Σ_k softmax((t − c) / τ_t) log softmax(s / τ_s), summed, divided by all crops."""
    total, row = 0.0, 0
    for crop in masks:
        n = int(crop.sum())
        for _ in range(n):
            p = F.softmax((teacher[row] - center) / t_temp, dim=-1)
            total = total - (p * F.log_softmax(student[row] / s_temp, dim=-1)).sum() / n
            row += 1
    return total / masks.shape[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_matches_naive_per_crop_formula(seed):
    g = torch.Generator().manual_seed(seed)
    k, crops, n = 16, 6, 9
    masks = torch.rand(crops, n, generator=g) < 0.4
    masks[0] = False  # an unmasked crop counts in the denominator only
    m = int(masks.sum())
    student, teacher = (
        torch.randn(m, k, generator=g, dtype=torch.float64) * 3,
        torch.randn(m, k, generator=g, dtype=torch.float64),
    )
    loss_fn = IBOTPatchLoss(k).double()
    loss_fn.center.copy_(torch.randn(k, generator=g) * 0.3)
    got = loss_fn(student, loss_fn.teacher_targets(teacher, 0.05), masks)
    want = naive_patch_loss(student, teacher, masks, loss_fn.center, 0.05, 0.1)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_uniform_outputs_give_ln_k_times_masked_share_of_crops():
    k = 32
    masks = torch.zeros(4, 10, dtype=torch.bool)
    masks[1, :3] = masks[2, 5:] = True  # 2 of 4 crops masked
    loss_fn = IBOTPatchLoss(k)
    zeros = torch.zeros(int(masks.sum()), k)
    assert loss_fn(zeros, loss_fn.teacher_targets(zeros, 0.04), masks).item() == pytest.approx(math.log(k) / 2)


def test_no_masked_patch_gives_zero_loss_and_leaves_the_centre():
    loss_fn = IBOTPatchLoss(8)
    loss_fn.center.fill_(0.5)
    empty = torch.zeros(0, 8)
    assert loss_fn(empty, loss_fn.teacher_targets(empty, 0.04), torch.zeros(2, 4, dtype=torch.bool)).item() == 0.0
    loss_fn.update_center(empty)
    assert torch.equal(loss_fn.center, torch.full((8,), 0.5))


def test_sinkhorn_centering_ignores_the_centre():
    torch.manual_seed(0)
    teacher = torch.randn(12, 8)
    a, b = IBOTPatchLoss(8, centering="sinkhorn_knopp"), IBOTPatchLoss(8, centering="sinkhorn_knopp")
    b.center.fill_(3.0)
    torch.testing.assert_close(a.teacher_targets(teacher, 0.1), b.teacher_targets(teacher, 0.1))
    assert not a.uses_center and IBOTPatchLoss(8).uses_center


def test_bad_shapes_and_centering_are_one_line_errors():
    loss_fn = IBOTPatchLoss(8)
    masks = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"M = masks.sum\(\) = 6.*\(5, 8\)"):
        loss_fn(torch.randn(5, 8), torch.rand(5, 8), masks)
    with pytest.raises(ValueError, match="centering must be one of"):
        IBOTPatchLoss(8, centering="none")
