"""Distillation's feature loss and its grid matching, each against an independent loop written
here; the teacher spec's grammar."""

import math

import pytest
import torch

from locatdino.ssl import DistillLoss
from locatdino.ssl.distill.teacher import match_grid, parse_teacher, weights_fingerprint


def naive_cosine(student, teacher):
    """``1 - s·t / (|s| |t|)`` per vector, averaged: a loop over the vectors."""
    s, t = student.reshape(-1, student.shape[-1]).double(), teacher.reshape(-1, teacher.shape[-1]).double()
    total = 0.0
    for a, b in zip(s, t):
        total += 1.0 - float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))
    return total / len(s)


def naive_mse(student, teacher):
    """The squared difference of every value, averaged: a loop over the values."""
    s, t = student.flatten().double().tolist(), teacher.flatten().double().tolist()
    return sum((a - b) ** 2 for a, b in zip(s, t)) / len(s)


@pytest.mark.parametrize("shape", [(5, 12), (3, 7, 12)])
def test_cosine_distance_is_one_minus_the_cosine_of_each_vector(shape):
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    assert float(DistillLoss("cosine")(student, teacher)) == pytest.approx(naive_cosine(student, teacher), abs=1e-6)
    # only directions count: scaling either side leaves it unchanged; equal directions give 0
    assert float(DistillLoss("cosine")(3 * student, 0.5 * teacher)) == pytest.approx(
        naive_cosine(student, teacher), abs=1e-6
    )
    assert float(DistillLoss("cosine")(2 * teacher, teacher)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("shape", [(5, 12), (3, 7, 12)])
def test_mse_distance_is_the_mean_squared_difference_of_every_value(shape):
    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    assert float(DistillLoss("mse")(student, teacher)) == pytest.approx(naive_mse(student, teacher), rel=1e-6)
    assert float(DistillLoss("mse")(2 * teacher, teacher)) == pytest.approx(naive_mse(2 * teacher, teacher), rel=1e-6)


def test_the_loss_is_fp32_inside_autocast_and_refuses_other_shapes_or_distances():
    g = torch.Generator().manual_seed(2)
    student, teacher = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = DistillLoss("cosine")(student.bfloat16(), teacher)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(naive_cosine(student.bfloat16().float(), teacher), abs=1e-6)
    with pytest.raises(ValueError, match=r"student features \(4, 64\) and teacher features \(4, 32\)"):
        DistillLoss("mse")(student, teacher[:, :32])
    with pytest.raises(ValueError, match=r"model.distill_distance: must be one of cosine, mse, got 'l1'"):
        DistillLoss("l1")


def naive_bilinear(patches, grid, target):
    """Bilinear resampling of the ``[B, h·w, D]`` token map, token by token: each output token
    samples the input at its centre mapped back (``(i + 0.5) · h / h' - 0.5``, clamped to the
    grid: align_corners False) and mixes its four neighbours."""
    b, _, d = patches.shape
    (h, w), (th, tw) = grid, target
    maps = patches.reshape(b, h, w, d).double()
    out = torch.zeros(b, th, tw, d, dtype=torch.float64)

    def source(i, size, out_size):
        x = min(max((i + 0.5) * size / out_size - 0.5, 0.0), size - 1)
        low = int(math.floor(x))
        return low, min(low + 1, size - 1), x - low

    for i in range(th):
        y0, y1, fy = source(i, h, th)
        for j in range(tw):
            x0, x1, fx = source(j, w, tw)
            out[:, i, j] = (
                (1 - fy) * (1 - fx) * maps[:, y0, x0]
                + (1 - fy) * fx * maps[:, y0, x1]
                + fy * (1 - fx) * maps[:, y1, x0]
                + fy * fx * maps[:, y1, x1]
            )
    return out.reshape(b, th * tw, d)


@pytest.mark.parametrize(
    "grid, target",
    [((4, 4), (4, 4)), ((16, 16), (14, 14)), ((4, 4), (8, 8)), ((5, 3), (4, 6)), ((2, 2), (7, 5))],
)
def test_the_teachers_grid_goes_to_the_students_as_a_naive_bilinear_resampling(grid, target):
    g = torch.Generator().manual_seed(3)
    patches = torch.randn(2, grid[0] * grid[1], 5, generator=g)
    got = match_grid(patches, grid, target)
    assert got.shape == (2, target[0] * target[1], 5)
    torch.testing.assert_close(got.double(), naive_bilinear(patches, grid, target), rtol=0, atol=1e-5)
    if grid == target:
        assert got is patches  # nothing resampled on equal grids


def test_a_constant_map_stays_constant_and_a_ramp_stays_a_ramp():
    """Sanity of the convention: upsampling a linear ramp in x keeps it linear inside the grid."""
    ramp = torch.arange(4.0).repeat(4, 1).reshape(1, 16, 1)  # x = 0, 1, 2, 3 on each row
    got = match_grid(ramp, (4, 4), (4, 8)).reshape(4, 8)
    # output centres at x' = (j + 0.5) / 2 - 0.5, clamped to [0, 3]
    want = torch.tensor([min(max((j + 0.5) / 2 - 0.5, 0.0), 3.0) for j in range(8)])
    torch.testing.assert_close(got, want.repeat(4, 1))


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("vit_tiny_patch16_224:runs/x.pth", ("vit_tiny_patch16_224", "runs/x.pth")),
        ("vit_tiny_patch16_224:C:/w/x.pth", ("vit_tiny_patch16_224", "C:/w/x.pth")),  # split at the first ':'
    ],
)
def test_the_teacher_is_name_colon_file(text, parsed):
    assert parse_teacher(text) == parsed


@pytest.mark.parametrize(
    "text", ["vit_tiny_patch16_224", "vit_tiny_patch16_224:", "t=vit_tiny_patch16_224:x.pth", ":x"]
)
def test_a_teacher_without_weights_or_with_a_label_is_refused_in_one_line(text):
    with pytest.raises(ValueError, match=r"^model.teacher .*: expected NAME:FILE") as err:
        parse_teacher(text)
    assert "\n" not in str(err.value)


def test_the_fingerprint_reads_every_value_of_any_dtype_and_shape():
    """0-d parameters (GAug's) and bf16 buffers included: a change of one value changes it."""
    module = torch.nn.Module()
    module.scale = torch.nn.Parameter(torch.tensor(0.5))
    module.register_buffer("bf16", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
    before = weights_fingerprint(module)
    assert len(before) == 64 and weights_fingerprint(module) == before
    module.bf16[1, 2] = 7
    changed = weights_fingerprint(module)
    module.scale.data.fill_(0.25)
    assert len({before, changed, weights_fingerprint(module)}) == 3
