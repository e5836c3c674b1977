"""The GPU multi-crop (kornia, on CPU tensors here) against the CPU path, draw by draw.

Statistical checks with fixed seeds (deterministic, not timed): the crop boxes against
torchvision's ``RandomResizedCrop.make_params`` (the CPU path's sampler), every photometric op's
rate and parameter distribution against the draws of ``MultiCropTransform`` (recorded by wrapping
its ``_apply``), over thousands of crops. Rates must agree within 4 standard errors of their
difference, distributions by a two-sample Kolmogorov–Smirnov test at p > 1e-3.
"""

import math

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp
from torchvision.transforms import v2

from locatdino.data.transforms import multicrop
from locatdino.data.transforms.decoded_images import DecodedImage, collate_decoded, default_image_size
from locatdino.data.transforms.gpu_multicrop import GPUMultiCrop, cut_crops, sample_crop_boxes
from locatdino.data.transforms.multicrop import MultiCropTransform, collate_multicrop

SMALL = dict(global_crop_size=32, local_crop_size=16, num_local_crops=4)
NO_AUG = dict(
    flip_prob=0.0,
    color_jitter_prob=0.0,
    grayscale_prob=0.0,
    global_blur_prob=(0.0, 0.0),
    global_solarize_prob=(0.0, 0.0),
    local_blur_prob=0.0,
)


def _same_rate(a: np.ndarray, b: np.ndarray) -> None:
    """Two Bernoulli samples agree: |p_a - p_b| within 4 standard errors of the difference."""
    pa, pb = a.mean(), b.mean()
    pooled = (a.sum() + b.sum()) / (len(a) + len(b))
    se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / len(a) + 1 / len(b)))
    assert abs(pa - pb) <= 4 * se + 1e-12, f"rates {pa:.4f} vs {pb:.4f} (se {se:.4f})"


def _same_distribution(a, b) -> None:
    result = ks_2samp(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    assert result.pvalue > 1e-3, f"KS statistic {result.statistic:.3f}, p {result.pvalue:.2e}"


@pytest.mark.parametrize("hw", [(375, 500), (96, 96), (40, 400)])  # landscape, square, fallback-heavy
@pytest.mark.parametrize("scale", [(0.4, 1.0), (0.05, 0.4)])
def test_crop_boxes_match_torchvision_scale_aspect_and_position(hw, scale):
    n = 2000
    torch.manual_seed(0)
    ref = v2.RandomResizedCrop(16, scale)
    image = torch.zeros(3, *hw)
    cpu = np.array(
        [[p["top"], p["left"], p["height"], p["width"]] for p in (ref.make_params([image]) for _ in range(n))],
        dtype=np.float64,
    )
    gpu = sample_crop_boxes(torch.tensor([hw]), n, scale).numpy()
    assert gpu.shape == (n, 4) and (gpu == np.round(gpu)).all()
    h, w = hw
    for boxes in (cpu, gpu):
        assert (
            (boxes[:, :2] >= 0).all()
            and (boxes[:, 0] + boxes[:, 2] <= h).all()
            and (boxes[:, 1] + boxes[:, 3] <= w).all()
        )
    for stat in (
        lambda b: b[:, 2] * b[:, 3] / (h * w),  # scale
        lambda b: np.log(b[:, 3] / b[:, 2]),  # aspect ratio
        lambda b: (b[:, 0] + b[:, 2] / 2) / h,
        lambda b: (b[:, 1] + b[:, 3] / 2) / w,
    ):  # centre
        _same_distribution(stat(cpu), stat(gpu))


def test_crops_cut_the_sampled_box_from_the_non_uniformly_resized_image():
    """An image whose red channel is its column / width and green its row / height, decoded at
    60 x 90 and stored at 64 x 64: each crop's mean colour is the centre of its box."""
    h, w, s = 60, 90, 64
    cols = (torch.arange(s) + 0.5) / s  # the stored pixel centres, as fractions of the image
    image = torch.stack([cols.expand(s, s), cols[:, None].expand(s, s), torch.zeros(s, s)])[None].repeat(2, 1, 1, 1)
    sizes = torch.tensor([[h, w], [h, w]])
    torch.manual_seed(1)
    boxes = sample_crop_boxes(sizes, 5, (0.05, 1.0))
    crops = cut_crops(image, sizes, boxes, 8)
    top, left, bh, bw = boxes.float().unbind(1)
    torch.testing.assert_close(crops[:, 0].mean((1, 2)), (left + bw / 2) / w, atol=1e-3, rtol=0)
    torch.testing.assert_close(crops[:, 1].mean((1, 2)), (top + bh / 2) / h, atol=1e-3, rtol=0)
    torch.testing.assert_close(
        crops[:, 0, :, 0] * w, (left + bw / 16)[:, None].expand(-1, 8), atol=0.05 * w / s + 1e-3, rtol=0
    )  # the left column samples the box's first sixteenth: no shift


def _images(n: int, size: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _cpu_draws(config: dict, images: torch.Tensor, monkeypatch) -> dict[str, list]:
    """Per op name: ``(view index, applied, params)`` of every crop the CPU path augmented."""
    draws: dict[str, list] = {}
    original = multicrop._apply

    def recording(views, selected, op, *params):
        name = "color_jitter" if op.__name__ == "<lambda>" else op.__name__  # the jitter: a lambda
        draws.setdefault(name, []).append((views.shape[-1], selected.clone(), [p.clone() for p in params]))
        return original(views, selected, op, *params)

    monkeypatch.setattr(multicrop, "_apply", recording)
    transform = MultiCropTransform(**config)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny crops: threads only add overhead
    try:
        for image in images:
            transform(image)
    finally:
        torch.set_num_threads(threads)
    return draws


def _cpu_rows(draws: list, size: int, view: int | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Applied flags and parameter rows of the crops of one size (and one global view)."""
    flags, params = [], []
    for crop_size, selected, ps in draws:
        if crop_size != size:
            continue
        rows = slice(None) if view is None else slice(view, view + 1)
        flags.append(selected[rows].numpy())
        params.append([p[rows].numpy() for p in ps])
    return np.concatenate(flags), [np.concatenate(col) for col in zip(*params)]


def _kornia_rows(pipeline, kind: str, calls: list) -> tuple[np.ndarray, dict]:
    module = next(m for m in pipeline if type(m).__name__ == kind)
    return np.concatenate([c[id(module)]["batch_prob"] for c in calls]) > 0.5, module


def _gpu_draws(gpu: GPUMultiCrop, images: torch.Tensor, rounds: int) -> list[dict]:
    """``_params`` of every kornia module after each of ``rounds`` batches (seeds 0..rounds-1)."""
    sizes = torch.tensor([images.shape[-2:]] * len(images))
    calls = []
    for seed in range(rounds):
        gpu(images, sizes, seed=seed)
        calls.append(
            {
                id(m): {k: v.clone().numpy() for k, v in m._params.items() if torch.is_tensor(v)}
                for m in gpu.modules()
                if hasattr(m, "_params")
            }
        )
    return calls


def test_photometric_rates_and_parameters_match_the_cpu_path(monkeypatch):
    """Colour jitter, grayscale, blur and solarisation: how often, and with which parameters, per
    global view and for the local crops (600 images: 600 crops per global view and 2400 local
    crops a side)."""
    config = dict(SMALL, grayscale_prob=0.2)
    images = _images(600)
    cpu = _cpu_draws(config, images, monkeypatch)
    gpu_module = GPUMultiCrop(MultiCropTransform(**config))
    calls = _gpu_draws(gpu_module, images[:300], 2)
    groups = [
        (gpu_module.global_views[0], 32, 0),
        (gpu_module.global_views[1], 32, 1),
        (gpu_module.local_views, 16, None),
    ]
    for pipeline, size, view in groups:
        for cpu_name, kind in (
            ("color_jitter", "ColorJitter"),
            ("grayscale", "RandomGrayscale"),
            ("gaussian_blur", "RandomGaussianBlur"),
            ("solarize", "RandomSolarize"),
        ):
            cpu_flags, cpu_params = _cpu_rows(cpu[cpu_name], size, view)
            if not any(type(m).__name__ == kind for m in pipeline):  # probability 0 on the GPU path
                assert not cpu_flags.any(), (cpu_name, size, view)
                continue
            gpu_flags, module = _kornia_rows(pipeline, kind, calls)
            _same_rate(cpu_flags, gpu_flags)
            if kind == "ColorJitter":
                factors = np.concatenate(
                    [
                        np.stack(
                            [c[id(module)][f"{k}_factor"] for k in ("brightness", "contrast", "saturation", "hue")], 1
                        )
                        for c in calls
                    ]
                )
                for j in range(4):
                    _same_distribution(cpu_params[0][cpu_flags, j], factors[gpu_flags, j])
            if kind == "RandomGaussianBlur":
                sigma = np.concatenate([c[id(module)]["sigma"] for c in calls])
                _same_distribution(cpu_params[0][cpu_flags], sigma[gpu_flags])


def test_flip_rate_matches_the_cpu_path():
    """A left-to-right ramp with every other op off: a crop is flipped iff its ramp descends."""
    config = dict(SMALL, **{**NO_AUG, "flip_prob": 0.5}, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    ramp = torch.linspace(0, 255, 48).round().to(torch.uint8).expand(3, 48, 48)
    cpu_transform = MultiCropTransform(**config)
    torch.manual_seed(0)
    cpu_flags = [bool(c[0, 0, -1] < c[0, 0, 0]) for _ in range(400) for c in cpu_transform(ramp)]
    out = GPUMultiCrop(MultiCropTransform(**config))(
        ramp.expand(400, -1, -1, -1), torch.tensor([[48, 48]] * 400), seed=0
    )
    gpu_flags = torch.cat([(g[..., 0, 0, -1] < g[..., 0, 0, 0]).flatten() for g in (out["global"], out["local"])])
    assert 0.45 < gpu_flags.float().mean() < 0.55
    _same_rate(np.array(cpu_flags), gpu_flags.numpy())


def test_output_layout_matches_the_cpu_path_and_parameters_differ_per_crop():
    config = MultiCropTransform(**SMALL)
    images = _images(6)
    cpu = collate_multicrop([config(i) for i in images])
    gpu_module = GPUMultiCrop(config)
    gpu = gpu_module(images, torch.tensor([[48, 48]] * 6), seed=0)
    for key in ("global", "local"):
        assert gpu[key].shape == cpu[key].shape and gpu[key].dtype == cpu[key].dtype == torch.float32
    # every crop its own draw: boxes, jitter factors and blur sigmas all distinct within the batch
    torch.manual_seed(0)
    boxes = sample_crop_boxes(torch.tensor([[375, 500]] * 64), 4, (0.05, 0.4))
    assert len(torch.unique(boxes, dim=0)) > 0.95 * len(boxes)
    for name in ("brightness_factor", "hue_factor"):
        values = next(m for m in gpu_module.local_views if type(m).__name__ == "ColorJitter")._params[name]
        assert len(torch.unique(values)) == len(values) == 4 * 6
    sigma = next(m for m in gpu_module.local_views if type(m).__name__ == "RandomGaussianBlur")._params["sigma"]
    assert len(torch.unique(sigma)) == len(sigma)


def test_a_seed_fixes_the_crops_and_leaves_the_global_rng_alone():
    gpu = GPUMultiCrop(MultiCropTransform(**SMALL))
    images, sizes = _images(4), torch.tensor([[48, 48], [30, 60], [60, 30], [48, 48]])
    torch.manual_seed(5)
    state = torch.get_rng_state()
    a, b, c = (gpu(images, sizes, seed=s) for s in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a["global"], b["global"]) and torch.equal(a["local"], b["local"])
    assert not torch.equal(a["global"], c["global"])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"images \[B, 3, S, S\] and sizes \[B, 2\].*got \(3, 48, 48\)"):
        GPUMultiCrop(MultiCropTransform(**SMALL))(_images(1)[0], torch.tensor([[48, 48]]))


def test_decoded_images_are_fixed_size_uint8_with_their_decoded_size():
    from PIL import Image

    assert default_image_size(MultiCropTransform()) == 368  # 224 / sqrt(0.4) = 354 -> 368
    assert default_image_size(MultiCropTransform(global_crop_size=64, local_crop_size=32)) == 112
    decoded = DecodedImage(40)
    items = [decoded(Image.new("RGB", (70, 50), (9, 8, 7))), decoded(np.zeros((40, 40, 3), np.uint8))]
    batch = collate_decoded(items)
    assert batch["images"].shape == (2, 3, 40, 40) and batch["images"].dtype == torch.uint8
    assert batch["sizes"].tolist() == [[50, 70], [40, 40]]
    assert batch["images"][0, :, 20, 20].tolist() == [9, 8, 7]
