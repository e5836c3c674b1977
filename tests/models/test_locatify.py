import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from locatdino.models import GAugAttention, locatify


def test_locatify_adds_only_gaug_parameters_and_keeps_weights(tiny_vit):
    before = {k: v.clone() for k, v in tiny_vit.state_dict().items()}
    locatify(tiny_vit)
    after = tiny_vit.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    new = sorted(set(after) - set(before))
    assert new == sorted(
        f"blocks.{i}.attn.gaug.{m}.{p}" for i in range(2) for m in ("log_var", "log_alpha") for p in ("weight", "bias")
    )
    assert all(isinstance(b.attn, GAugAttention) for b in tiny_vit.blocks)
    assert tiny_vit.global_pool == "prr"


def test_twelve_block_model_has_2340_extra_parameters():
    vit = timm.create_model("vit_small_patch16_224", num_classes=0, img_size=32, embed_dim=64, num_heads=1)
    n0 = sum(p.numel() for p in vit.parameters())
    n1 = sum(p.numel() for p in locatify(vit).parameters())
    assert n1 - n0 == 12 * (3 * 64 + 3) == 2340


def test_zero_alpha_without_prr_reproduces_vanilla(tiny_vit):
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        want = tiny_vit(x)
        locatify(tiny_vit, prr=False)
        for block in tiny_vit.blocks:
            block.attn.gaug.log_alpha.bias.fill_(-1e4)  # softplus → 0: S ≡ 0
        got = tiny_vit(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_untouched_parts_are_identical(tiny_vit):
    """Patch embedding + position embedding (everything before the first block) is unchanged, and
    PRR alone changes only the pooling: the final-norm tokens stay identical."""
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        embed = tiny_vit._pos_embed(tiny_vit.patch_embed(x))
        tokens = tiny_vit.forward_features(x)
        locatify(tiny_vit, gaug=False, prr=True)
        torch.testing.assert_close(tiny_vit._pos_embed(tiny_vit.patch_embed(x)), embed, rtol=0, atol=0)
        torch.testing.assert_close(tiny_vit.forward_features(x), tokens, rtol=0, atol=0)
        assert not torch.allclose(tiny_vit.forward_head(tokens), tokens[:, 0])  # PRR-refined class token


def test_locatify_with_registers_keeps_prefix_unbiased():
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224",
        num_classes=0,
        reg_tokens=4,
        no_embed_class=True,
        dynamic_img_size=True,
        img_size=64,
        depth=2,
        embed_dim=64,
        num_heads=2,
    ).eval()
    locatify(vit)
    assert vit(torch.randn(1, 3, 48, 80)).shape == (1, 64)
    q = torch.randn(1, 2, 5 + 3 * 5, 32)
    bias = vit.blocks[0].attn.gaug(q, (3, 5))
    assert bias[:, :, :5].abs().max() == 0 and bias[:, :, :, :5].abs().max() == 0
    assert bias[:, :, 5:, 5:].min() > 0


def test_locatify_rejects_non_vit_and_other_attention():
    with pytest.raises(TypeError, match="VisionTransformer"):
        locatify(torch.nn.Linear(2, 2))
    diff = VisionTransformer(img_size=32, depth=1, embed_dim=64, num_heads=2, attn_layer="diff")
    with pytest.raises(TypeError, match="blocks.0.attn is DiffAttention"):
        locatify(diff)
