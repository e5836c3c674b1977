import math

import pytest
import torch
from ssl_helpers import naive_dino_loss

from locatdino.ssl import DINOLoss


@pytest.mark.parametrize("v_t,v_s", [(2, 2), (2, 10), (1, 4), (3, 5)])
def test_loss_matches_naive_per_pair(v_t, v_s):
    torch.manual_seed(v_t * 10 + v_s)
    k, b = 32, 5
    loss_fn = DINOLoss(k, student_temp=0.1)
    loss_fn.center.copy_(torch.randn(k) * 0.3)
    student, teacher = torch.randn(v_s, b, k) * 3, torch.randn(v_t, b, k) * 3
    got = loss_fn(student, loss_fn.teacher_targets(teacher, 0.04))
    want, n_pairs = naive_dino_loss(student, teacher, loss_fn.center, 0.04, 0.1)
    assert n_pairs == v_t * v_s - v_t
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_eighteen_pairs_for_two_plus_eight_crops():
    assert naive_dino_loss(torch.zeros(10, 1, 3), torch.zeros(2, 1, 3), 0, 1, 1)[1] == 18


def test_uniform_outputs_give_ln_k():
    k = 64
    loss_fn = DINOLoss(k)
    loss = loss_fn(torch.zeros(4, 3, k), loss_fn.teacher_targets(torch.zeros(2, 3, k), 0.04))
    assert loss.item() == pytest.approx(math.log(k), rel=1e-6)


def test_gradient_reaches_student_only_through_cross_pairs():
    loss_fn = DINOLoss(8)
    student = torch.randn(2, 3, 8, requires_grad=True)
    loss_fn(student, loss_fn.teacher_targets(torch.randn(2, 3, 8), 0.04)).backward()
    assert student.grad.abs().sum() > 0


def test_center_update_matches_formula():
    k = 16
    loss_fn = DINOLoss(k, center_momentum=0.9)
    c0 = torch.randn(k)
    loss_fn.center.copy_(c0)
    teacher = torch.randn(2, 6, k)
    loss_fn.update_center(teacher)
    want = 0.9 * c0 + 0.1 * teacher.reshape(-1, k).mean(0)
    torch.testing.assert_close(loss_fn.center, want)


def test_bad_shapes_name_the_shapes():
    loss_fn = DINOLoss(8)
    with pytest.raises(ValueError, match=r"\(1, 3, 8\)"):
        loss_fn(torch.randn(1, 3, 8), torch.rand(1, 3, 8))


def test_accumulated_center_update_equals_one_update_on_the_whole_batch():
    """Micro-batches of 3 and 5 images accumulated, then one update = one update on all 8."""
    torch.manual_seed(0)
    k = 16
    parts = [torch.randn(2, 3, k), torch.randn(2, 5, k)]
    whole, accumulated = DINOLoss(k), DINOLoss(k)
    for loss_fn in (whole, accumulated):
        loss_fn.center.copy_(torch.randn(k, generator=torch.Generator().manual_seed(1)))
    whole.update_center(torch.cat(parts, dim=1))
    for part in parts:
        accumulated.accumulate_center(part)
    c0 = accumulated.center.clone()
    assert torch.equal(accumulated.center, c0)  # nothing moves before the step
    accumulated.apply_center_update()
    torch.testing.assert_close(accumulated.center, whole.center, rtol=1e-6, atol=1e-7)
    want = 0.9 * c0 + 0.1 * torch.cat([p.reshape(-1, k) for p in parts]).mean(0)
    torch.testing.assert_close(accumulated.center, want, rtol=1e-6, atol=1e-7)

    accumulated.accumulate_center(parts[0])
    accumulated.discard_center_update()  # a skipped step: nothing pending any more
    with pytest.raises(RuntimeError, match="no teacher output was accumulated"):
        accumulated.apply_center_update()
