import numpy as np
import pytest
import torch
from PIL import Image

from locatdino.data.transforms import multicrop
from locatdino.data.transforms.multicrop import MultiCropTransform, collate_multicrop

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # written out: an independent check

NO_AUG = dict(
    flip_prob=0.0,
    color_jitter_prob=0.0,
    grayscale_prob=0.0,
    global_blur_prob=(0.0, 0.0),
    global_solarize_prob=(0.0, 0.0),
    local_blur_prob=0.0,
)


def _constant(rgb, size=(70, 50), mode="RGB"):
    return Image.new("RGB", size, rgb).convert(mode)


def test_shapes_dtypes_and_order():
    t = MultiCropTransform(global_crop_size=64, local_crop_size=32, num_local_crops=3)
    crops = t(Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)))
    assert [tuple(c.shape) for c in crops] == [(3, 64, 64)] * 2 + [(3, 32, 32)] * 3
    assert all(c.dtype == torch.float32 for c in crops)


def test_normalisation_is_imagenet_mean_std():
    t = MultiCropTransform(global_crop_size=32, local_crop_size=16, num_local_crops=2, **NO_AUG)
    crops = t(_constant((200, 100, 30)))
    expected = (torch.tensor([200, 100, 30]) / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    for c in crops:
        torch.testing.assert_close(c, expected.view(3, 1, 1).expand_as(c), atol=1e-6, rtol=0)


def test_per_crop_probabilities_are_honoured():
    # solarize only the second global crop, grayscale nothing: a constant image shows it exactly
    t = MultiCropTransform(
        global_crop_size=32, local_crop_size=16, num_local_crops=1, **{**NO_AUG, "global_solarize_prob": (0.0, 1.0)}
    )
    g1, g2, loc = t(_constant((200, 200, 200)))
    mean, std = IMAGENET_MEAN[0], IMAGENET_STD[0]
    assert g1[0, 0, 0].item() == pytest.approx((200 / 255 - mean) / std, abs=1e-5)
    assert g2[0, 0, 0].item() == pytest.approx((55 / 255 - mean) / std, abs=1e-5)
    assert loc[0, 0, 0].item() == pytest.approx((200 / 255 - mean) / std, abs=1e-5)


def test_grayscale_always_gives_equal_channels_before_normalisation():
    t = MultiCropTransform(
        global_crop_size=32, local_crop_size=16, num_local_crops=2, **{**NO_AUG, "grayscale_prob": 1.0}
    )
    std, mean = torch.tensor(IMAGENET_STD).view(3, 1, 1), torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    for c in t(_constant((220, 40, 90))):
        raw = c * std + mean
        torch.testing.assert_close(raw[0], raw[1], atol=1e-5, rtol=0)
        torch.testing.assert_close(raw[1], raw[2], atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK"])
def test_any_pil_mode_gives_rgb_crops(mode):
    crops = MultiCropTransform(global_crop_size=32, local_crop_size=16, num_local_crops=1)(
        _constant((10, 120, 250), mode=mode)
    )
    assert [c.shape[0] for c in crops] == [3, 3, 3]


def test_default_global_scale_widens_without_local_crops():
    assert MultiCropTransform(num_local_crops=0)._global_crop.scale == (0.14, 1.0)
    assert MultiCropTransform()._global_crop.scale == (0.4, 1.0)


def test_probability_list_must_match_global_crop_count():
    with pytest.raises(ValueError, match="global_blur_prob"):
        MultiCropTransform(num_global_crops=3)


def test_collate_is_view_major_with_skip_count():
    samples = [
        [torch.full((3, 8, 8), 10.0 * b + v) for v in range(2)]
        + [torch.full((3, 4, 4), 10.0 * b + v) for v in range(2, 5)]
        for b in range(4)
    ]
    batch = collate_multicrop(samples, skipped=3)
    assert batch["global"].shape == (2, 4, 3, 8, 8)
    assert batch["local"].shape == (3, 4, 3, 4, 4)
    assert batch["global"][1, 2, 0, 0, 0].item() == 21.0
    assert batch["local"][2, 3, 0, 0, 0].item() == 34.0
    assert batch["skipped"].dtype == torch.int64 and batch["skipped"].item() == 3


def test_collate_without_local_crops():
    batch = collate_multicrop([[torch.zeros(3, 8, 8)] * 2] * 5)
    assert batch["global"].shape == (2, 5, 3, 8, 8)
    assert batch["local"].shape[:2] == (0, 5)
    assert "skipped" not in batch


@pytest.mark.parametrize("chunk_pixels", [1, 16 * 16 * 3], ids=["one crop per chunk", "chunks of 3 + 3"])
def test_chunking_does_not_change_the_crops(monkeypatch, chunk_pixels):
    """Same random draws, crops augmented in one chunk or several: equal up to the blur kernel's
    width, which follows the largest sigma of its chunk (taps of < 1e-3 weight)."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8))
    t = MultiCropTransform(
        global_crop_size=32,
        local_crop_size=16,
        num_local_crops=6,
        color_jitter_prob=0.5,
        grayscale_prob=0.5,
        local_blur_prob=0.5,
    )
    torch.manual_seed(0)
    whole = t(image)
    monkeypatch.setattr(multicrop, "_CHUNK_PIXELS", chunk_pixels)
    torch.manual_seed(0)
    chunked = t(image)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
