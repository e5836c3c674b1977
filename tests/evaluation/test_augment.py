import numpy as np
import pytest
import torch

from locatdino.evaluation.augment import PAD, PairedAugmentation, normalize, resize_image


def _pair():
    """A 4:3 image whose grey level encodes its mask: class c -> 60 c, in large blocks."""
    mask = torch.zeros(120, 160, dtype=torch.long)
    mask[:, 80:] = 1
    mask[60:, :] = 2
    mask[60:, 120:] = 3
    return (mask * 60).to(torch.uint8).expand(3, -1, -1).clone(), mask


def _check_aligned(image, mask):
    """Away from label edges (antialiasing blurs ~2 px), the grey level decodes to the mask."""
    one_hot = torch.nn.functional.one_hot(mask.long() + 1, 5).permute(2, 0, 1).float()[None]
    interior = -torch.nn.functional.max_pool2d(-one_hot, 7, stride=1, padding=3)  # erosion
    interior = interior[0].amax(0).bool() & (mask != PAD)
    interior[[0, -1], :] = interior[:, [0, -1]] = False  # may blend a sub-pixel padding strip
    decoded = (image[0].float() / 60).round().long()
    assert interior.float().mean() > 0.2
    assert torch.equal(decoded[interior], mask[interior].long())


def test_crop_keeps_image_and_mask_aligned_and_sized():
    aug = PairedAugmentation(64, jitter=0.0)
    for seed in range(20):
        image, mask = aug(*_pair(), torch.Generator().manual_seed(seed))
        assert image.shape == (3, 64, 64) and image.dtype == torch.uint8 and mask.shape == (64, 64)
        _check_aligned(image, mask)


def test_scale_above_one_zooms_out_onto_a_padded_canvas():
    aug = PairedAugmentation(64, scale=(1.9, 2.0), jitter=0.0)
    image, mask = aug(*_pair(), torch.Generator().manual_seed(0))
    pad = mask == PAD
    assert 0.35 < pad.float().mean() < 0.6  # the image covers ~1/2 of the canvas
    assert set(mask[~pad].unique().tolist()) == {0, 1, 2, 3}  # the whole image is visible
    canvas = image[:, pad].float() - torch.tensor([124.0, 116, 104])[:, None]
    assert (canvas.abs().amax(0) <= 1).float().mean() > 0.9  # mean colour (blurred at the seam)
    _check_aligned(image, mask)
    # boxes that fit (area <= image, the image's aspect ratio) never pad
    inside = PairedAugmentation(64, scale=(0.5, 1.0), ratio=(4 / 3, 4 / 3), jitter=0.0)
    for seed in range(10):
        assert not (inside(*_pair(), torch.Generator().manual_seed(seed))[1] == PAD).any()


def test_same_generator_same_view_and_jitter_changes_only_colours():
    aug = PairedAugmentation(48, jitter=0.1, jitter_p=1.0)
    a = aug(*_pair(), torch.Generator().manual_seed(3))
    b = aug(*_pair(), torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    plain = PairedAugmentation(48, jitter=0.0)(*_pair(), torch.Generator().manual_seed(3))
    assert torch.equal(plain[1], a[1]) and not torch.equal(plain[0], a[0])


def test_normalize_uses_the_correct_imagenet_std():
    x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    out = normalize(x)
    expected = [(1 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]  # reference: 0.255
    assert out[0, :, 0, 0].tolist() == pytest.approx(expected)
    assert resize_image(x[0], 5).shape == (3, 5, 5)


def test_augmentation_off_gives_the_whole_image_for_every_seed():
    image, mask = _pair()
    aug = PairedAugmentation(64, jitter=0.4, jitter_p=1.0, mode="off")
    views = [aug(image, mask, torch.Generator().manual_seed(seed)) for seed in range(5)]
    for view_image, view_mask in views[1:]:
        assert torch.equal(view_image, views[0][0]) and torch.equal(view_mask, views[0][1])
    assert torch.equal(views[0][0], resize_image(image, 64))  # no crop, no jitter
    assert set(views[0][1].unique().tolist()) == {0, 1, 2, 3}
    _check_aligned(*views[0])
    jittered = PairedAugmentation(64, jitter=0.4, jitter_p=1.0)(image, mask, torch.Generator().manual_seed(0))
    assert not torch.equal(jittered[0], views[0][0])


def _reference_fallback_rate(height, width, scale, ratio, n=400_000):
    """Independent estimate of how often the reference's sampler gives up: each of its 10 draws
    (area fraction uniform in ``scale``, log-aspect uniform) is rejected when the rounded box
    exceeds the image; after 10 rejections it returns the whole image (4:3 inside ``ratio``)."""
    rng = np.random.default_rng(0)
    area = height * width * rng.uniform(*scale, n)
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), n))
    w, h = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    return float(np.mean((w > width) | (h > height)) ** 10)


def test_reference_sampler_rejects_zoom_out_and_falls_back_to_the_whole_image():
    height, width = _pair()[1].shape
    aug = PairedAugmentation(64, scale=(0.5, 2.0), mode="reference")
    boxes = [aug.crop_box(height, width, torch.Generator().manual_seed(s)) for s in range(1500)]
    for top, left, h, w in boxes:
        assert 0 <= top and 0 <= left and top + h <= height and left + w <= width  # never zooms out
    whole = np.mean([box == (0, 0, height, width) for box in boxes])
    expected = _reference_fallback_rate(height, width, (0.5, 2.0), (3 / 4, 4 / 3))
    assert 0.12 < expected < 0.18  # the ~15 % of views the reference silently leaves uncropped
    assert whole == pytest.approx(expected, abs=0.03)  # 3 sigma at 1,500 views
    assert aug.crop_box(height, width, torch.Generator().manual_seed(7)) == boxes[7]  # seeded
    assert len(set(boxes)) > 1000
    zoom = PairedAugmentation(64, scale=(0.5, 2.0))  # the project's sampler at the same scale
    zoom_boxes = [zoom.crop_box(height, width, torch.Generator().manual_seed(s)) for s in range(300)]
    assert np.mean([h > height or w > width for _, _, h, w in zoom_boxes]) > 0.5
    image, mask = aug(*_pair(), torch.Generator().manual_seed(1))
    assert not (mask == PAD).any()
    _check_aligned(*PairedAugmentation(64, jitter=0.0, mode="reference")(*_pair(), torch.Generator().manual_seed(1)))
    with pytest.raises(ValueError, match="augmentation mode must be one of"):
        PairedAugmentation(64, mode="none")
