import numpy as np

from locatdino.evaluation.compare.pca_maps import PCAColours, upsample_nearest


def test_features_constant_per_class_give_one_colour_per_class():
    """An encoder whose patch features are constant per class: every pixel of a class gets one
    colour, and (4 classes span 3 dimensions) different classes get different colours."""
    rng = np.random.default_rng(0)
    class_feature = rng.normal(size=(4, 32)).astype(np.float32)
    patch_classes = rng.integers(0, 4, (5, 6, 6))  # 5 images of 6 x 6 patches
    memory = class_feature[rng.integers(0, 4, 500)]
    colours = PCAColours().fit(memory)
    rgb = colours.rgb(class_feature[patch_classes])  # [5, 6, 6, 3]
    pixels = upsample_nearest(rgb[0], (48, 48))  # 8 px patches
    pixel_classes = np.kron(patch_classes[0], np.ones((8, 8), dtype=int))
    assert pixels.shape == (48, 48, 3) and rgb.min() >= 0 and rgb.max() <= 1
    per_class = []
    for c in range(4):
        unique = np.unique(rgb[patch_classes == c], axis=0)
        assert len(unique) == 1, f"class {c} has {len(unique)} colours"
        assert len(np.unique(pixels[pixel_classes == c], axis=0)) <= 1
        per_class.append(unique[0])
    assert len(np.unique(np.round(per_class, 4), axis=0)) == 4
