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


@pytest.mark.parametrize(
    ("eval_bytes", "chunks"),
    [
        (1 << 30, 2),  # all heads of each image
        (2 * 43 * 43 * 8, 4),  # 2 heads, then 1, of each image
        (1, 2 * 3 * 3),  # 16-row chunks of each head
    ],
    ids=["images", "heads", "rows of a head"],
)
def test_a_forward_without_gradients_chunks_by_image_head_and_rows_with_the_training_output(
    eval_bytes, chunks, monkeypatch
):
    """Evaluation (``baddbmm`` onto the bias, ``exp``, ``(exp · v) / rowsum``) chunks by image, heads and query
    rows (``_EVAL_CHUNK_BYTES``), training (SDPA with the mask) by 16-row chunks over all heads
    here; each query row's attention is the same either way."""
    counted = {"sdpa": 0, "bmm": 0}
    sdpa, bmm = F.scaled_dot_product_attention, torch.bmm
    monkeypatch.setattr(
        sba.F,
        "scaled_dot_product_attention",
        lambda *a, **kw: counted.update(sdpa=counted["sdpa"] + 1) or sdpa(*a, **kw),
    )
    monkeypatch.setattr(sba.torch, "bmm", lambda *a, **kw: counted.update(bmm=counted["bmm"] + 1) or bmm(*a, **kw))
    monkeypatch.setattr(sba, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(sba, "_EVAL_CHUNK_BYTES", eval_bytes)
    torch.manual_seed(0)
    h, w = 6, 7  # 43 tokens: 3 chunks of 16 rows
    q, k, v = (torch.randn(2, 3, 1 + h * w, 8, dtype=torch.float64) for _ in range(3))
    rows, cols = torch.rand(2, 3, h * w, h, dtype=torch.float64), torch.rand(2, 3, h * w, w, dtype=torch.float64)
    with torch.no_grad():
        evaluated = sba.separable_bias_attention(q, k, v, rows, cols, 1)
    assert counted == {"sdpa": 0, "bmm": chunks}
    trained = sba.separable_bias_attention(q.requires_grad_(), k, v, rows, cols, 1)
    assert counted == {"sdpa": 3, "bmm": chunks}
    assert evaluated.stride() == trained.stride()
    torch.testing.assert_close(evaluated, trained.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(evaluated, reference(q.detach(), k, v, rows, cols, 1))


@pytest.mark.parametrize(("budget", "count"), [(1, 48), (5_000, 24), (20_000, 6), (1 << 30, 3)])
def test_the_evaluation_chunks_cover_every_image_head_and_row_once_within_the_budget(budget, count):
    """Rows of 16 (budget 1) or 25 (5000 B) of one head, 2 heads (20 kB), all heads of an image."""
    B, H, N, size = 3, 4, 50, 4
    covered = torch.zeros(B, H, N, dtype=torch.long)
    chunks = sba._head_chunks(B, H, N, size, budget)
    for image, heads, queries in chunks:
        covered[image, heads, queries] += 1
        mask_bytes = (heads.stop - heads.start) * (queries.stop - queries.start) * N * size
        assert mask_bytes <= max(budget, 16 * N * size)  # at least 16 rows of one head
    assert covered.eq(1).all()
    assert len(chunks) == count


def test_evaluation_in_float32_matches_the_training_path():
    """The float32 evaluation path (``exp`` without the row max, normalised after ``P v``) against
    SDPA's, on a ViT-S-like head size."""
    torch.manual_seed(0)
    h = w = 6
    x = torch.randn(2, 1 + h * w, 3, 3, 64)  # q, k, v as timm's Attention slices them: strided views
    q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
    rows, cols = torch.rand(2, 3, h * w, h) * 3, torch.rand(2, 3, h * w, w)
    with torch.no_grad():
        evaluated = sba.separable_bias_attention(q, k, v, rows, cols, 1)
    trained = sba.separable_bias_attention(q.requires_grad_(), k, v, rows, cols, 1).detach()
    torch.testing.assert_close(evaluated, trained, rtol=1e-5, atol=1e-5)
    assert evaluated.stride() == trained.stride()


@pytest.mark.parametrize(
    ("q_sign", "magnitude", "max_passes"),
    [(1.0, 1.0, 0), (1.0, 30.0, 2), (-1.0, 10.0, 2)],
    ids=["ordinary logits", "logits past exp's range", "every logit below -40"],
)
def test_the_evaluation_subtracts_the_row_max_only_where_exp_leaves_its_range(
    q_sign, magnitude, max_passes, monkeypatch
):
    """Logits of ±hundreds overflow ``exp`` (inf) or underflow it (0/0) without the row max: those
    chunks (one per image here) are redone with it and still equal softmax; ordinary ones never are."""
    passes = []
    exp_logits = sba._exp_logits
    monkeypatch.setattr(
        sba,
        "_exp_logits",
        lambda *a, subtract_max: passes.append(subtract_max) or exp_logits(*a, subtract_max=subtract_max),
    )
    torch.manual_seed(0)
    h = w = 4
    q, k, v = (torch.randn(2, 3, 1 + h * w, 8) for _ in range(3))
    if q_sign < 0:  # every q·k negative
        q, k = q.abs(), -k.abs()
    q, k = q * magnitude, k * magnitude
    rows, cols = torch.rand(2, 3, h * w, h), torch.rand(2, 3, h * w, w)
    with torch.no_grad():
        got = sba.separable_bias_attention(q, k, v, rows, cols, 1)
    assert passes.count(True) == max_passes and passes.count(False) == 2
    want = reference(*(t.double() for t in (q, k, v, rows, cols)), 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
