import math

import pytest
import torch
import torch.nn.functional as F

from locatdino.ssl import KoLeoLoss


def naive_koleo(x, eps=1e-8):
    """−mean_i log(min_{j≠i} ‖x̂_i − x̂_j‖ + eps) with a double loop over the normalised rows."""
    x = F.normalize(x.detach(), dim=-1, eps=eps)
    logs = []
    for i in range(len(x)):
        nearest = min(float((x[i] - x[j]).norm()) for j in range(len(x)) if j != i)
        logs.append(math.log(nearest + eps))
    return -sum(logs) / len(logs)


def test_matches_the_double_loop():
    torch.manual_seed(0)
    x = torch.randn(9, 5, dtype=torch.float64) * 4
    assert KoLeoLoss()(x).item() == pytest.approx(naive_koleo(x), rel=1e-12)


def test_spreading_points_lowers_it_and_gradients_are_finite():
    close = torch.tensor([[1.0, 0.0], [0.99, 0.01], [0.0, 1.0]], requires_grad=True)
    spread = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    loss = KoLeoLoss()(close)
    assert loss > KoLeoLoss()(spread)
    loss.backward()
    assert torch.isfinite(close.grad).all() and close.grad.abs().sum() > 0


def test_needs_two_rows():
    with pytest.raises(ValueError, match=r"B >= 2, got \(1, 4\)"):
        KoLeoLoss()(torch.randn(1, 4))
