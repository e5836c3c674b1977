import pytest
import torch

from locatdino.models import dense_features, locatify
from locatdino.models.dense_features import prr_tokens


@pytest.mark.parametrize("gaug", [False, True], ids=["vanilla", "locatvit"])
def test_default_is_last_block_before_norm(tiny_vit, gaug):
    if gaug:
        locatify(tiny_vit)
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        feats = dense_features(tiny_vit, x)
        tokens = tiny_vit.blocks(tiny_vit._pos_embed(tiny_vit.patch_embed(x)))
    assert feats.shape == (2, 3, 5, 64)
    torch.testing.assert_close(feats.reshape(2, 15, 64), tokens[:, 1:])
    nchw = dense_features(tiny_vit, x, layer=0, norm=True, output_fmt="NCHW")
    assert nchw.shape == (2, 64, 3, 5)


def test_prr_matches_timm_pool_on_class_token(tiny_vit):
    locatify(tiny_vit, gaug=False)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens = tiny_vit.forward_features(x)
        refined = prr_tokens(tokens, num_heads=2, pool=tiny_vit.attn_pool)
        torch.testing.assert_close(refined[:, 0], tiny_vit.attn_pool(tokens))
        feats = dense_features(tiny_vit, x, norm=True, prr=True)
    torch.testing.assert_close(feats.reshape(2, 16, 64), refined[:, 1:])


def test_clear_errors(tiny_vit):
    with pytest.raises(ValueError, match="50×64 px is not a multiple of the patch size 16×16"):
        dense_features(tiny_vit, torch.randn(1, 3, 50, 64))
    with pytest.raises(IndexError, match="layer 2 out of range"):
        dense_features(tiny_vit, torch.randn(1, 3, 64, 64), layer=2)
    with pytest.raises(ValueError, match="output_fmt"):
        dense_features(tiny_vit, torch.randn(1, 3, 64, 64), output_fmt="NLC")
