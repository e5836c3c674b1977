import pytest
import torch
import torch.nn.functional as F

from locatdino.models.gaug import separable_bias_attention as sba


def reference(q, k, v, rows, cols, num_prefix):
    """Plain autograd: dense bias padded with zero prefix rows/columns, unfused attention."""
    B, H, n, h = rows.shape
    bias = (rows[..., :, None] * cols[..., None, :]).reshape(B, H, n, n)
    bias = F.pad(bias, (num_prefix, 0, num_prefix, 0))
    attn = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + bias
    return attn.softmax(-1) @ v


@pytest.mark.parametrize("num_prefix", [0, 1, 5])
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30], ids=["16-row chunks", "one chunk"])
def test_matches_autograd_reference(num_prefix, chunk_bytes, monkeypatch):
    monkeypatch.setattr(sba, "_CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(0)
    h, w = 5, 7
    n = num_prefix + h * w
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rows = torch.rand(2, 3, h * w, h, dtype=torch.float64, requires_grad=True)
    cols = torch.rand(2, 3, h * w, w, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 3, n, 8, dtype=torch.float64)
    inputs = [q, k, v, rows, cols]
    got = sba.separable_bias_attention(q, k, v, rows, cols, num_prefix)
    want = reference(q, k, v, rows, cols, num_prefix)
    torch.testing.assert_close(got, want)
    for g, r in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad)):
        torch.testing.assert_close(g, r)


def test_bf16_inputs_with_fp32_profiles():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 17, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    rows = torch.rand(1, 2, 16, 4, requires_grad=True)
    cols = torch.rand(1, 2, 16, 4, requires_grad=True)
    out = sba.separable_bias_attention(q, k, v, rows, cols, 1)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    want = reference(*(t.detach().double() for t in (q, k, v, rows, cols)), 1)
    torch.testing.assert_close(out.double(), want, rtol=0.05, atol=0.05)
    assert rows.grad.dtype == torch.float32 and torch.isfinite(rows.grad).all()
