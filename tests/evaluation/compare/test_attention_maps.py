import pytest
import torch

from locatdino.evaluation.augment import normalize
from locatdino.evaluation.compare.attention_maps import class_token_attention, locality_per_block
from locatdino.models import create_backbone


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "locatvit_tiny_patch16_224"])
def test_class_token_attention_is_the_models_own_attention_row(name):
    """Against the attention matrix of timm's unfused path (captured at attn_drop)."""
    torch.manual_seed(0)
    model = create_backbone(name, img_size=64).eval()
    images = torch.randint(0, 256, (2, 3, 64, 48), dtype=torch.uint8)
    attn = model.blocks[-1].attn
    attn.fused_attn = False
    seen = []
    attn.attn_drop.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model.forward_features(normalize(images))
    expected = seen[-1][:, :, 0, 1:].reshape(2, 3, 4, 3)
    torch.testing.assert_close(class_token_attention(model, images), expected, rtol=1e-4, atol=1e-6)


def test_locality_only_for_locatvit_and_at_init_as_the_spec_says():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    assert locality_per_block(create_backbone("vit_tiny_patch16_224", img_size=64), images) is None
    stats = locality_per_block(create_backbone("locatvit_tiny_patch16_224", img_size=64), images)
    assert [s["block"] for s in stats] == list(range(12))
    # init: var ≈ 1 and alpha ≈ ln 2 at the build grid (docs/locatvit.md)
    assert all(abs(s["sigma"] - 1) < 0.1 and abs(s["alpha"] - 0.693) < 0.05 for s in stats)
