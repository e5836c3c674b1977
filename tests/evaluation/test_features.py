import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.augment import normalize
from locatdino.evaluation.features import FeatureExtractor
from locatdino.models import dense_features


def _images(b=2, size=32):
    return torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_features_are_normalised_last_block_patch_tokens(tiny_vit):
    x = _images()
    feats = FeatureExtractor(tiny_vit)(x)
    assert feats.shape == (2, 4, 4, 64) and feats.dtype == torch.float32
    assert torch.allclose(feats.norm(dim=-1), torch.ones(2, 4, 4), atol=1e-5)
    with torch.no_grad():
        ref = F.normalize(dense_features(tiny_vit, normalize(x)), dim=-1)
    assert torch.allclose(feats, ref, atol=1e-5)
    first = FeatureExtractor(tiny_vit, layer=0)(x)
    assert not torch.allclose(first, feats, atol=1e-3)


def test_bf16_is_close_to_fp32_and_train_mode_is_restored(tiny_vit):
    x = _images()
    tiny_vit.train()
    try:
        fp32 = FeatureExtractor(tiny_vit)(x)
        bf16 = FeatureExtractor(tiny_vit, precision="bf16")(x)
        assert tiny_vit.training
    finally:
        tiny_vit.eval()
    assert (fp32 * bf16).sum(-1).min() > 0.99  # cosine similarity per patch


def test_clear_errors(tiny_vit):
    extractor = FeatureExtractor(tiny_vit)
    with pytest.raises(ValueError, match="input size 30 is not a multiple of the patch size 8"):
        extractor.grid(30)
    with pytest.raises(ValueError, match="precision must be one of"):
        FeatureExtractor(tiny_vit, precision="fp8")


def test_norm_on_gives_the_reference_wrappers_features(tiny_vit):
    """The reference's default wrapper, for a timm ViT, takes ``forward_features`` (final norm
    applied) without the class token: ``norm=True`` reproduces it, the default does not."""
    x = _images()
    with torch.no_grad():
        tokens = tiny_vit.forward_features(normalize(x))[:, tiny_vit.num_prefix_tokens :]
    reference = F.normalize(tokens, dim=-1).reshape(2, 4, 4, 64)
    assert torch.allclose(FeatureExtractor(tiny_vit, norm=True)(x), reference, atol=1e-5)
    assert not torch.allclose(FeatureExtractor(tiny_vit)(x), reference, atol=1e-2)
