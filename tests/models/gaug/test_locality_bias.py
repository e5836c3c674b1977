import math

import pytest
import torch

from locatdino.models.gaug.locality_bias import GaussianLocalityBias, distance_table, gaug_constants


@torch.no_grad()
def naive_bias(q, w_var, b_var, w_alpha, b_alpha, grid, build_grid, num_prefix):
    """docs/locatvit.md written out with explicit loops over query and key grid positions (float64)."""
    G = max(build_grid)
    c = float(G * G)
    b = math.log(c - 1) if c > 2 else 0.0
    eps = 0.1
    while 0.5 * (G - 1) ** 2 / eps**2 > 32500:
        eps *= 2
    lo = max(-0.5 * (G - 1) ** 2, -6550.0)
    h, w = grid
    B, H, N, _ = q.shape
    S = torch.zeros(B, H, N, N, dtype=torch.float64)
    for bi in range(B):
        for hi in range(H):
            for p in range(h * w):
                qp = q[bi, hi, num_prefix + p].double()
                var = c * torch.sigmoid(qp @ w_var.double().T + b_var.double() - b)
                if (h, w) != tuple(build_grid):
                    var = var * min(h, w) / min(build_grid)
                alpha = torch.nn.functional.softplus(qp @ w_alpha.double().T + b_alpha.double())[0]
                ip, jp = divmod(p, w)
                for t in range(h * w):
                    it, jt = divmod(t, w)
                    dr = max(-0.5 * (ip - it) ** 2, lo)
                    dc = max(-0.5 * (jp - jt) ** 2, lo)
                    S[bi, hi, num_prefix + p, num_prefix + t] = alpha * math.exp(
                        dr / (var[0] + eps) + dc / (var[1] + eps)
                    )
    return S


@pytest.mark.parametrize("grid", [(6, 6), (4, 4), (8, 10)], ids=["build", "smaller", "larger"])
@pytest.mark.parametrize("num_prefix", [0, 1, 5])
def test_bias_matches_naive_loops(grid, num_prefix):
    torch.manual_seed(0)
    bias = GaussianLocalityBias(head_dim=8, build_grid=(6, 6))
    with torch.no_grad():  # spread var and alpha over their ranges
        for p in bias.parameters():
            p.normal_(0, 0.7)
    q = torch.randn(1, 2, num_prefix + grid[0] * grid[1], 8)
    got = bias(q, grid)
    want = naive_bias(
        q, bias.log_var.weight, bias.log_var.bias, bias.log_alpha.weight, bias.log_alpha.bias, grid, (6, 6), num_prefix
    )
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    if num_prefix:
        assert got[:, :, :num_prefix].abs().max() == 0 and got[:, :, :, :num_prefix].abs().max() == 0


def test_constants_follow_spec():
    c, b, eps, lo = gaug_constants((14, 14))
    assert (c, eps, lo) == (196.0, 0.1, -84.5) and b == pytest.approx(math.log(195))
    assert gaug_constants((32, 32))[2] == pytest.approx(0.2)  # ½·31²/0.1² = 48 050 > 32 500 → doubled once
    assert gaug_constants((128, 128))[3] == -6550.0
    assert gaug_constants((1, 1))[1] == 0.0


def test_default_init_gives_unit_variance_and_ln2_amplitude():
    bias = GaussianLocalityBias(head_dim=64)
    S = bias(torch.zeros(1, 1, 14 * 14, 64), (14, 14))[0, 0]
    p = 5 * 14 + 5
    torch.testing.assert_close(S[p, p], torch.tensor(math.log(2)))
    for neighbour in (p - 1, p + 1, p - 14, p + 14):  # one patch away: exp(-½ / (1 + eps))
        torch.testing.assert_close(S[p, neighbour], torch.tensor(math.log(2) * math.exp(-0.5 / 1.1)))
    assert sum(p.numel() for p in bias.parameters()) == 3 * 64 + 3


def test_distance_table_is_cached_and_usable_after_inference_mode():
    with torch.inference_mode():
        rows, cols = distance_table(3, 5, -2.0, torch.device("cpu"))
    assert not rows.is_inference()
    assert distance_table(3, 5, -2.0, torch.device("cpu"))[0] is rows
    assert rows.shape == (15, 3) and cols.shape == (15, 5)
    assert rows[14].tolist() == [-2.0, -0.5, 0.0]  # query (2, 4): Δrow 2 clamped, 1, 0


def test_fast_mode_equals_coarse_kernel_repeated():
    torch.manual_seed(0)
    bias = GaussianLocalityBias(head_dim=4, build_grid=(4, 4), fast_min_grid=8).train()
    with torch.no_grad():
        for p in bias.parameters():
            p.normal_(0, 0.5)
    q = torch.randn(1, 1, 8 * 8, 4)
    fast = bias(q, (8, 8))[0, 0].view(8, 8, 8, 8)
    # reference: queries averaged over 2×2 blocks, kernel at fine rows/cols 0, 2, 4, 6
    q_coarse = q.view(4, 2, 4, 2, 4).mean((1, 3)).reshape(16, 4)
    c, b, eps, lo = gaug_constants((4, 4))
    var = c * (8 / 4) * torch.sigmoid(q_coarse @ bias.log_var.weight.T + bias.log_var.bias - b)
    alpha = torch.nn.functional.softplus(q_coarse @ bias.log_alpha.weight.T + bias.log_alpha.bias)
    pos = torch.arange(0, 8, 2).float()
    d = (-0.5 * (pos[:, None] - pos[None, :]) ** 2).clamp(min=lo)
    for ic in range(4):
        for jc in range(4):
            p = ic * 4 + jc
            coarse = alpha[p] * torch.exp(d[ic][:, None] / (var[p, 0] + eps) + d[jc][None, :] / (var[p, 1] + eps))
            want = coarse.repeat_interleave(2, 0).repeat_interleave(2, 1)
            for di in range(2):
                for dj in range(2):
                    torch.testing.assert_close(fast[2 * ic + di, 2 * jc + dj], want)
    bias.eval()  # eval or odd grids: exact kernel
    assert not torch.allclose(bias(q, (8, 8))[0, 0].view(8, 8, 8, 8), fast)


@pytest.mark.parametrize("log_var_bias", [0.0, -6.0], ids=["smooth", "floored far keys"])
def test_gradients_match_finite_differences(log_var_bias):
    """The analytic backward of the profiles, including entries held at the e⁻³⁰ floor."""
    torch.manual_seed(0)
    bias = GaussianLocalityBias(head_dim=2, build_grid=(14, 14)).double()
    with torch.no_grad():
        for p in bias.parameters():
            p.normal_(0, 0.5)
        bias.log_var.bias.add_(log_var_bias)  # tiny variance: most exponents far below -30
    q = torch.randn(1, 1, 1 + 4 * 5, 2, dtype=torch.float64, requires_grad=True)
    if log_var_bias:
        rows, cols = bias.profiles(q, (4, 5))
        assert (rows < 1e-12).float().mean() > 0.1 and (cols < 1e-12).float().mean() > 0.1
    assert torch.autograd.gradcheck(lambda q, *params: bias(q, (4, 5)), (q, *bias.parameters()))


@pytest.mark.parametrize("grid", [(6, 6), (4, 4)], ids=["build", "smaller"])
def test_gaussian_parameters_are_the_spec_variance_and_amplitude(grid):
    """var and alpha per patch query as docs/locatvit.md writes them (prefix queries dropped)."""
    torch.manual_seed(0)
    bias = GaussianLocalityBias(8, build_grid=(6, 6))
    for p in bias.parameters():
        torch.nn.init.normal_(p)
    q = torch.randn(2, 3, 1 + grid[0] * grid[1], 8)
    var, alpha = bias.gaussian_parameters(q, grid)
    c = 36.0
    z = q[:, :, 1:].double() @ bias.log_var.weight.double().T + bias.log_var.bias.double()
    expected_var = c * torch.sigmoid(z - math.log(c - 1)) * (min(grid) / 6)
    expected_alpha = torch.nn.functional.softplus(
        q[:, :, 1:].double() @ bias.log_alpha.weight.double().T + bias.log_alpha.bias.double()
    )[..., 0]
    assert var.shape == (2, 3, grid[0] * grid[1], 2) and alpha.shape == (2, 3, grid[0] * grid[1])
    torch.testing.assert_close(var.double(), expected_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha.double(), expected_alpha, rtol=1e-5, atol=1e-6)
