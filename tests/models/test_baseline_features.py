"""The network-free patch features against their definitions, written as plain loops."""

import pytest
import torch

from locatdino.evaluation.features import FeatureExtractor
from locatdino.models import dense_features
from locatdino.models.baselines import PatchPosition, PixelPatches


def test_pixel_patches_are_each_patchs_values():
    x = torch.randn(2, 3, 12, 8)
    feats = PixelPatches(4)(x)
    assert feats.shape == (2, 3, 2, 48)
    for b in range(2):
        for i in range(3):
            for j in range(2):
                expected = torch.stack(
                    [x[b, c, 4 * i + r, 4 * j + s] for c in range(3) for r in range(4) for s in range(4)]
                )
                assert torch.equal(feats[b, i, j], expected)
    with pytest.raises(ValueError, match="not a multiple of the patch size 4"):
        PixelPatches(4)(torch.zeros(1, 3, 10, 8))


def test_patch_position_is_a_one_hot_of_the_place():
    feats = PatchPosition(8, 3)(torch.zeros(2, 3, 24, 24))
    assert feats.shape == (2, 3, 3, 9)
    for i in range(3):
        for j in range(3):
            assert feats[:, i, j].argmax(-1).tolist() == [3 * i + j] * 2 and feats[:, i, j].sum().item() == 2
    with pytest.raises(ValueError, match="4×4 grid, this position feature is for 3×3"):
        PatchPosition(8, 3)(torch.zeros(1, 3, 32, 32))


def test_the_frozen_feature_path_reads_them_unchanged():
    """FeatureExtractor normalises the images as for a network and runs the baseline in fp32 on the
    CPU whatever precision is asked (no weights to quantise or autocast); dense_features in NCHW."""
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    extractor = FeatureExtractor(PixelPatches(8), precision="int8", l2_normalize=False)
    assert (extractor.precision, extractor.device.type, extractor.patch_size, extractor.dim) == ("fp32", "cpu", 8, 192)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    normalised = (images.float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    torch.testing.assert_close(extractor(images)[1, 0, 1, :64], normalised[1, 0, :8, 8:].reshape(-1))
    nchw = dense_features(PixelPatches(8), normalised, output_fmt="NCHW")
    assert torch.equal(nchw.permute(0, 2, 3, 1), extractor(images))
