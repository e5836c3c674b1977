import numpy as np
import pytest
from PIL import Image

from locatdino.data.scenes import (
    SCENE_CLASSES,
    ScenesSegmentation,
    render_scene,
    scene_class,
    scene_classes,
    scene_rng,
)


def test_deterministic_by_seed_and_index():
    a, b = render_scene(scene_rng(3, 7), 64), render_scene(scene_rng(3, 7), 64)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    c = render_scene(scene_rng(4, 7), 64)
    assert np.abs(a[0].astype(int) - c[0]).mean() > 5


def test_train_and_val_never_share_a_scene():
    train = ScenesSegmentation(6, size=48, split="train")
    val = ScenesSegmentation(6, size=48, split="val")
    for i in range(6):
        assert not np.array_equal(np.asarray(train[i][0]), np.asarray(val[i][0]))


def test_dataset_protocol_and_any_size():
    ds = ScenesSegmentation(2, size=80, seed=1)
    image, mask = ds[1]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (80, 80)
    assert mask.shape == (80, 80) and mask.dtype == np.uint8
    assert ds.num_classes == len(ds.class_names) == len(SCENE_CLASSES) >= 8 and ds.ignore_index is None
    img, lab = render_scene(scene_rng(0, 0), 40, 90)
    assert img.shape == (40, 90, 3) and lab.shape == (40, 90)
    with pytest.raises(IndexError):
        ds[2]


def test_every_class_appears_with_varied_colours():
    pixels = {k: [] for k in range(len(SCENE_CLASSES))}
    for i in range(40):
        img, lab = render_scene(scene_rng(0, i), 64)
        for k in np.unique(lab):
            pixels[k].append(img[lab == k].mean(0))
    for k, means in pixels.items():
        assert len(means) >= 3, f"class {SCENE_CLASSES[k]} appears in only {len(means)} of 40 scenes"
        # intra-class variation: the per-scene mean colour of a class moves by > 10 grey levels
        assert np.linalg.norm(np.std(means, axis=0)) > 10, SCENE_CLASSES[k]


def test_scene_class_is_the_dominant_object_class():
    ids = {name: i for i, name in enumerate(SCENE_CLASSES)}
    mask = np.full((20, 20), ids["sky"], dtype=np.uint8)  # 400 px of sky: background never wins
    mask[:2, :5] = ids["tree"]  # 10 px
    mask[5:9, :5] = ids["animal"]  # 20 px
    assert scene_class(mask) == ids["animal"]
    mask[10:14, :5] = ids["bush"]  # 20 px: a tie goes to the smaller id (bush < animal)
    assert scene_class(mask) == ids["bush"]
    no_objects = np.full((4, 4), ids["water"], dtype=np.uint8)
    no_objects[0] = ids["sky"]
    assert scene_class(no_objects) == ids["water"]  # no object visible: the most frequent class
    _, rendered = ScenesSegmentation(1, size=64)[0]
    assert SCENE_CLASSES[scene_class(rendered)] in ("tree", "bush", "building", "rock", "animal")


@pytest.mark.parametrize("share", [0.01, 0.05, 0.2])
def test_scene_classes_are_every_class_above_the_share(share):
    """Against a per-class pixel count written out longhand, on rendered scenes."""
    for i in range(6):
        _, mask = ScenesSegmentation(6, size=48)[i]
        naive = [k for k in range(len(SCENE_CLASSES)) if (mask == k).sum() / mask.size >= share]
        assert scene_classes(mask, share) == naive
        assert scene_class(mask) in range(len(SCENE_CLASSES))
    mask = np.zeros((10, 10), dtype=np.uint8)
    mask[0, :5] = 3  # exactly 5 %
    assert scene_classes(mask, 0.05) == [0, 3] and scene_classes(mask, 0.051) == [0]
    with pytest.raises(ValueError, match="min_share"):
        scene_classes(mask, 0.0)


def test_without_image_wide_effects_same_layout_same_random_stream():
    """The ablation of haze / exposure / white balance changes colours only: same mask, and the
    scene consumes exactly the random numbers of the default one."""
    rng_a, rng_b = scene_rng(2, 5), scene_rng(2, 5)
    (img_a, lab_a), (img_b, lab_b) = render_scene(rng_a, 64), render_scene(rng_b, 64, image_wide=False)
    np.testing.assert_array_equal(lab_a, lab_b)
    assert np.abs(img_a.astype(int) - img_b).mean() > 3
    assert rng_a.random() == rng_b.random()
