import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import AttentionPoolPrr

from locatdino.models import locatify
from locatdino.models.prr import PrrPool


def naive_prr(x, num_heads, pool):
    """PRR by its definition: every token attends to every token (q = k = v, per head), then pool."""
    B, N, C = x.shape
    heads = x.reshape(B, N, num_heads, C // num_heads).permute(0, 2, 1, 3).double()
    attn = (heads @ heads.transpose(-2, -1) * (C // num_heads) ** -0.5).softmax(-1)
    refined = (attn @ heads).permute(0, 2, 1, 3).reshape(B, N, C)
    return refined[:, 0] if pool == "token" else refined.mean(1)


@pytest.mark.parametrize("fused", [True, False], ids=["SDPA", "unfused"])
@pytest.mark.parametrize("pool", ["token", "avg"])
@pytest.mark.parametrize("norms", [False, True], ids=["no norms", "pre and post norm"])
def test_prr_pool_gives_timms_output_and_the_definitions(pool, fused, norms):
    torch.manual_seed(0)
    x = torch.randn(3, 17, 32) * 2
    timm_pool = AttentionPoolPrr(32, num_heads=4, pool_type=pool, pre_norm=norms, post_norm=norms)
    ours = PrrPool(32, num_heads=4, pool_type=pool, pre_norm=norms, post_norm=norms)
    timm_pool.fused_attn = ours.fused_attn = fused
    got = ours(x)
    assert got.shape == (3, 32)
    torch.testing.assert_close(got, timm_pool(x), rtol=1e-5, atol=1e-5)
    if not norms:
        torch.testing.assert_close(got.double(), naive_prr(x, 4, pool), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("pool", "query_rows"), [("token", 1), ("avg", 17)])
def test_the_class_token_pool_attends_from_the_class_token_alone(pool, query_rows, monkeypatch):
    rows = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda q, *a, **kw: rows.append(q.shape[2]) or sdpa(q, *a, **kw)
    )
    PrrPool(32, num_heads=4, pool_type=pool)(torch.randn(2, 17, 32))
    assert rows == [query_rows]


def test_locatvit_and_locatify_pool_with_prr_pool():
    assert type(timm.create_model("locatvit_tiny_patch16_224", num_classes=0).attn_pool) is PrrPool
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, global_pool="prr")
    assert type(vit.attn_pool) is AttentionPoolPrr
    pool = vit.attn_pool
    assert locatify(vit, gaug=False).attn_pool is pool and type(pool) is PrrPool  # converted in place
    plain = locatify(timm.create_model("vit_tiny_patch16_224", num_classes=0, class_token=False, global_pool="avg"))
    assert type(plain.attn_pool) is PrrPool and plain.attn_pool.pool == "avg"
