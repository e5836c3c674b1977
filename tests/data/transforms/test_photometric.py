import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from locatdino.data.transforms import photometric as P

torch.manual_seed(0)
X = torch.rand(5, 3, 23, 31)
# include gray pixels (zero chroma) and saturated extremes, where hue formulas branch
X[0, :, :4] = 0.5
X[1, :, :, :3] = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
FACTORS = torch.tensor([0.0, 0.6, 1.0, 1.4, 2.0])
HUES = torch.tensor([-0.5, -0.1, 0.0, 0.07, 0.5])


def _naive(op, x, factors):
    return torch.stack([op(x[i], float(factors[i])) for i in range(len(x))])


@pytest.mark.parametrize(
    "ours, ref, factors",
    [
        (P.adjust_brightness, TF.adjust_brightness, FACTORS),
        (P.adjust_contrast, TF.adjust_contrast, FACTORS),
        (P.adjust_saturation, TF.adjust_saturation, FACTORS),
        (P.adjust_hue, TF.adjust_hue, HUES),
    ],
)
def test_per_image_ops_match_torchvision(ours, ref, factors):
    torch.testing.assert_close(ours(X, factors), _naive(ref, X, factors), atol=2e-6, rtol=0)


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)])
def test_color_jitter_applies_the_ops_in_the_given_order(order):
    factors = torch.tensor(
        [[1.3, 0.7, 1.5, 0.1], [0.6, 1.4, 0.8, -0.07], [1.1, 1.2, 0.0, 0.3]] + [[1.0, 1.0, 1.0, 0.0]] * 2
    )
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    expected = []
    for i in range(5):
        img = X[i]
        for op_id in order:
            img = ops[op_id](img, float(factors[i, op_id]))
        expected.append(img)
    out = P.color_jitter(X, factors, order)
    torch.testing.assert_close(out, torch.stack(expected), atol=2e-6, rtol=0)
    torch.testing.assert_close(out[3:], X[3:], atol=1e-6, rtol=0)  # identity factors


def test_grayscale_matches_torchvision():
    torch.testing.assert_close(P.grayscale(X), TF.rgb_to_grayscale(X, num_output_channels=3))


def test_separable_blur_matches_dense_torchvision_blur():
    sigma = torch.tensor([0.3, 1.0, 2.0, 1.5, 0.1])
    radius = 6  # ceil(3 * 2.0)
    ours = P.gaussian_blur(X, sigma)
    for i in range(5):
        ref = TF.gaussian_blur(X[i], [2 * radius + 1] * 2, [float(sigma[i])] * 2)
        # a shorter kernel zero-padded to the group's radius is the same kernel up to ~1e-7 mass
        torch.testing.assert_close(ours[i], ref, atol=1e-4, rtol=0)


def test_solarize_matches_pil_threshold_128_on_uint8():
    u8 = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(1, 3, 16, 16)
    ref = TF.solarize(u8, 128).float() / 255
    torch.testing.assert_close(P.solarize(u8.float() / 255), ref)
