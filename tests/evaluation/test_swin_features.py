"""The evaluations' features of a Swin (LocAtSwin here): the last stage's map, its average pool."""

import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.lincls import LinearInput
from locatdino.models import create_backbone, dense_features
from locatdino.models.dense_features import feature_layers, feature_map
from locatdino.models.token_grid import patch_size
from tests.models.tiny import TINY_SWIN

# built at 64 px (stages of 16, 8, 4, 2 tokens per side), run at any multiple of 32 px
SWIN = {**TINY_SWIN, "img_size": 64}


@pytest.fixture(scope="module")
def locatswin():
    torch.manual_seed(0)
    return create_backbone("locatswin_tiny", **SWIN).eval()


def _last_stage(model, x):
    """The last stage's output map, by hand: patch embedding, then every stage, ``[B, h, w, C]``."""
    return model.layers(model.patch_embed(x))


def test_dense_features_are_the_last_stage_map_and_its_pool_the_class_feature(locatswin):
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        stage = _last_stage(locatswin, x)
        assert stage.shape == (2, 3, 3, 128)
        torch.testing.assert_close(dense_features(locatswin, x), stage)  # the reference choice: before the norm
        normed = dense_features(locatswin, x, norm=True, prr=True)
        # k-NN's class feature (the num_classes=0 model's output): PRR then the average pool of that map
        torch.testing.assert_close(locatswin(x), normed.mean((1, 2)), rtol=1e-5, atol=1e-6)
        assert dense_features(locatswin, x, layer=0, output_fmt="NCHW").shape == (2, 16, 24, 24)


def test_extractor_geometry_follows_the_stage(locatswin):
    assert patch_size(locatswin) == (32, 32) and feature_layers(locatswin) == 4
    assert feature_map(locatswin) == (32, 128) and feature_map(locatswin, 1) == (8, 32)
    extractor = FeatureExtractor(locatswin)
    assert (extractor.patch_size, extractor.dim, extractor.grid(96)) == (32, 128, 3)
    images = torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8)
    feats = extractor(images)
    assert feats.shape == (1, 2, 2, 128)
    torch.testing.assert_close(feats.norm(dim=-1), torch.ones(1, 2, 2))
    with pytest.raises(ValueError, match="not a multiple of the patch size 32"):
        extractor.grid(80)


def test_hummingbird_runs_on_a_locatswin(scenes, locatswin):
    cfg = HummingbirdConfig(input_size=96, num_workers=0, progress=False, batch_size=8, aug_epochs=1)
    result = hummingbird(locatswin, *scenes, cfg)
    assert 0 < result.miou <= 100
    assert 0 < result.memory_patches <= 16 * 3 * 3  # one view of each of the 16 memory scenes, 3 × 3 tokens


def test_linear_input_of_a_swin_is_its_pooled_last_stage(locatswin):
    inputs = LinearInput.reference(locatswin)
    assert inputs.pooled and inputs.dim(locatswin.num_features) == 128
    assert inputs.to_dict()["pooled"] is True
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = F.layer_norm(_last_stage(locatswin, x), (128,), locatswin.norm.weight, locatswin.norm.bias)
        torch.testing.assert_close(inputs(locatswin, x), expected.mean((1, 2)))
        torch.testing.assert_close(LinearInput.reference(locatswin, prr=True)(locatswin, x), locatswin(x))
    with pytest.raises(ValueError, match="--last-blocks and --avgpool pick a ViT's tokens"):
        LinearInput.reference(locatswin, last_blocks=1)
