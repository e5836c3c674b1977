import pytest
import torch

from locatdino.ssl.ibot import sinkhorn_knopp


def naive_sinkhorn(t, temp, iterations):
    """SwAV's Algorithm 1 written with Python loops over rows and columns (fp64)."""
    m, k = t.shape
    q = [[float(torch.exp(t[i, j] / temp)) for j in range(k)] for i in range(m)]
    total = sum(map(sum, q))
    q = [[v / total for v in row] for row in q]
    for _ in range(iterations):
        cols = [sum(q[i][j] for i in range(m)) for j in range(k)]
        q = [[q[i][j] / cols[j] / k for j in range(k)] for i in range(m)]
        rows = [sum(row) for row in q]
        q = [[q[i][j] / rows[i] / m for j in range(k)] for i in range(m)]
    return torch.tensor([[v * m for v in row] for row in q], dtype=torch.float64)


@pytest.mark.parametrize("iterations", [1, 3])
def test_matches_naive_loops(iterations):
    torch.manual_seed(iterations)
    t = torch.randn(7, 5, dtype=torch.float64)
    got = sinkhorn_knopp(t, 0.1, iterations)
    torch.testing.assert_close(got, naive_sinkhorn(t, 0.1, iterations), rtol=1e-12, atol=1e-14)


def test_rows_are_distributions_and_prototypes_nearly_balanced():
    torch.manual_seed(0)
    t = torch.randn(64, 16, dtype=torch.float64) + torch.linspace(0, 3, 16, dtype=torch.float64)  # a skewed teacher
    q = sinkhorn_knopp(t, 0.2, iterations=200)
    torch.testing.assert_close(q.sum(1), torch.ones(64, dtype=torch.float64))
    torch.testing.assert_close(q.sum(0), torch.full((16,), 64 / 16, dtype=torch.float64), rtol=1e-3, atol=0)
    plain = torch.softmax(t / 0.2, dim=1).sum(0)
    assert plain.max() / plain.min() > 10  # the balancing did something


def test_large_logits_do_not_overflow():
    q = sinkhorn_knopp(torch.tensor([[80.0, 0.0], [0.0, 80.0]]), 0.04)
    assert torch.isfinite(q).all()
    torch.testing.assert_close(q.sum(1), torch.ones(2))
