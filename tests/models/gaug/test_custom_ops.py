"""The GAug custom operators are well-formed for graph capture: schema, autograd registration,
fake (meta) implementations that match the real outputs' shapes, dtypes and strides, and AOT
dispatch with dynamic shapes (``torch.library.opcheck``)."""

import pytest
import torch

import locatdino.models  # noqa: F401  (registers torch.ops.locatdino.*)
from locatdino.models.gaug.locality_bias import build_distance_table


def _profiles(h=3, w=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return (
        torch.rand(2, 2, h * w, h, dtype=dtype, generator=g, requires_grad=True),
        torch.rand(2, 2, h * w, w, dtype=dtype, generator=g, requires_grad=True),
    )


def _cases():
    rows, cols = _profiles()
    q, k, v = (torch.randn(2, 2, 13, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    z = torch.randn(2, 2, 12, 3, dtype=torch.float64, requires_grad=True)
    d_rows, d_cols = (t.double() for t in build_distance_table(3, 4, -4.5, torch.device("cpu")))
    return {
        "separable_bias_attention": (q, k, v, rows, cols, 1, 0.35, True),
        "outer_product_mask": (rows, cols, 1, torch.float32),
        "gaussian_profiles": (z, d_rows, d_cols, 196.0, 5.3, 0.1),
    }


@pytest.mark.parametrize("op", ["separable_bias_attention", "outer_product_mask", "gaussian_profiles"])
def test_opcheck(op):
    torch.library.opcheck(getattr(torch.ops.locatdino, op), _cases()[op])
