"""CUDA without FlexAttention: no ``N × N`` tensor at large inputs (simulated on the CPU: the path
is chosen as on CUDA, the chunk budget shrunk so that a 42-token input counts as large)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import locatdino.models.gaug.attention as attention_module
import locatdino.models.gaug.flex_bias_attention as flex_module
import locatdino.models.gaug.separable_bias_attention as sba
from locatdino.models import GAugAttention
from tests.models.gaug.test_attention import _layer, _run

B, H, N = 2, 2, 42  # 2 prefix tokens + a 5 × 8 grid


class SquareTensors(TorchDispatchMode):
    """Counts the ``[..., N, N]`` tensors operators return (a custom operator counts as one)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += sum(isinstance(t, torch.Tensor) and tuple(t.shape[-2:]) == (N, N) for t in tree_leaves(out))
        return out


@pytest.fixture
def cuda_without_flex(monkeypatch):
    """Paths chosen as on CUDA once FlexAttention failed; each kernel's calls and chunk buffers recorded."""
    resolve = GAugAttention._resolve_path
    monkeypatch.setattr(
        GAugAttention, "_resolve_path", lambda self, device, plain: resolve(self, torch.device("cuda"), plain)
    )
    monkeypatch.setattr(flex_module, "_failure", "simulated: every kernel option failed")
    taken, buffers = [], []
    for name in ("outer_product_mask", "separable_bias_attention"):
        kernel = getattr(attention_module, name)
        monkeypatch.setattr(
            attention_module, name, lambda *args, _kernel=kernel, _name=name: taken.append(_name) or _kernel(*args)
        )
    scratch = sba.scratch
    monkeypatch.setattr(sba, "scratch", lambda slot, shape, *args: buffers.append(shape) or scratch(slot, shape, *args))
    return taken, buffers


def _wide_layer():
    layer = _layer()
    layer.patch_grid.record((5, 8))
    return layer


def test_small_inputs_keep_the_materialised_mask(cuda_without_flex):
    taken, _ = cuda_without_flex
    with SquareTensors() as square:
        _run(_wide_layer(), torch.randn(B, N, 32))
    assert taken == ["outer_product_mask"] and square.count > 0  # the mask: it fits one chunk


def test_large_inputs_take_the_chunked_path_with_the_masks_output_and_gradients(monkeypatch, cuda_without_flex):
    taken, buffers = cuda_without_flex
    monkeypatch.setattr(sba, "_CHUNK_BYTES", 1)  # 16-row chunks: the 42 × 42 mask is "large"
    x = torch.randn(B, N, 32)
    with SquareTensors() as square:
        got = _run(_wide_layer(), x)
    assert taken == ["separable_bias_attention"] and square.count == 0
    rows_of_keys = [shape for shape in buffers if shape[-1] == N]  # mask, scores and probabilities chunks
    assert len(rows_of_keys) >= 3 * 3 and all(shape[-2] <= 16 for shape in rows_of_keys)  # 3 chunks of ≤ 16 rows

    layer = _wide_layer()
    layer.gaug_path = "mask"
    want = _run(layer, x)
    assert len(got) == len(want) == 2 + len(list(layer.parameters()))
    for a, b in zip(got, want):  # output, input gradient, every parameter gradient
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
