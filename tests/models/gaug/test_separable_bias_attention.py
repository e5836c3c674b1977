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


def test_a_forward_without_gradients_takes_larger_chunks_with_the_same_output(monkeypatch):
    """Evaluation writes the bias in ``_EVAL_CHUNK_BYTES`` chunks (here one), training in 16-row
    ones; each query row's attention is the same either way."""
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(sba.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    monkeypatch.setattr(sba, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(sba, "_EVAL_CHUNK_BYTES", 1 << 30)
    torch.manual_seed(0)
    h, w = 6, 7  # 43 tokens: 3 chunks of 16 rows
    q, k, v = (torch.randn(2, 3, 1 + h * w, 8, dtype=torch.float64) for _ in range(3))
    rows, cols = torch.rand(2, 3, h * w, h, dtype=torch.float64), torch.rand(2, 3, h * w, w, dtype=torch.float64)
    with torch.no_grad():
        one_chunk = sba.separable_bias_attention(q, k, v, rows, cols, 1)
    assert len(calls) == 1
    chunked = sba.separable_bias_attention(q.requires_grad_(), k, v, rows, cols, 1)
    assert len(calls) == 1 + 3
    torch.testing.assert_close(one_chunk, chunked.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(one_chunk, reference(q.detach(), k, v, rows, cols, 1))


@pytest.mark.parametrize(("memory", "mib"), [(None, 8), (1 << 30, 8), (8 << 30, 32), (128 << 30, 64)])
def test_the_evaluation_chunk_follows_the_memory_the_process_may_use(memory, mib):
    assert sba.eval_chunk_bytes(memory) == mib << 20
