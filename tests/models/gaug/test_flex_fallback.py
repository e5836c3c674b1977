"""GAug's ``auto`` path falls back to the materialised mask when FlexAttention cannot compile or
run its first call (simulated on the CPU: the path choice is asked as if on CUDA)."""

import warnings

import pytest
import torch

import locatdino.models.gaug.flex_bias_attention as flex_module
from locatdino.models import GAugAttention
from locatdino.models.gaug.flex_bias_attention import FlexAttentionUnavailable, flex_failure
from locatdino.models.gaug.separable_bias_attention import separable_bias_attention
from tests.models.gaug.test_attention import _layer, _run

_resolve_path = GAugAttention._resolve_path


@pytest.fixture
def as_on_cuda(monkeypatch):
    """A fresh flex state, and the automatic path chosen as it would be on CUDA."""
    monkeypatch.setattr(flex_module, "_failure", None)
    monkeypatch.setattr(flex_module, "_proven", set())
    monkeypatch.setattr(GAugAttention, "_resolve_path",
                        lambda self, device, plain: _resolve_path(self, torch.device("cuda"), plain))


def _failing_kernel(monkeypatch, exc):
    calls = []

    def kernel(*args):
        calls.append(args)
        raise exc

    monkeypatch.setattr(flex_module, "_kernel", lambda device: kernel)
    return calls


def test_compile_error_falls_back_to_the_mask_path_with_one_warning(monkeypatch, as_on_cuda):
    calls = _failing_kernel(monkeypatch, RuntimeError("Failed to find C compiler. Please specify via CC"))
    layer, x = _layer(), torch.randn(2, 14, 32)
    assert layer._resolve_path(x.device, plain=True) == "flex"
    with pytest.warns(UserWarning) as caught:
        got = _run(layer, x)
    assert [str(w.message) for w in caught] == [
        "GAug uses the materialised-mask path from now on: FlexAttention failed on cpu: "
        "RuntimeError: Failed to find C compiler. Please specify via CC"]
    assert len(calls) == 1 and flex_failure() == "RuntimeError: Failed to find C compiler. Please specify via CC"
    layer.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: later calls go straight to the mask path
        again = _run(layer, x)
    assert len(calls) == 1 and layer._resolve_path(x.device, plain=True) == "mask"
    layer.zero_grad()
    layer.gaug_path = "mask"
    for a, b, c in zip(got, again, _run(layer, x)):  # output, input and parameter gradients
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


class _BackwardFails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("simulated: backward kernel failed to compile")


def test_a_failing_first_backward_is_caught_in_the_forward(monkeypatch, as_on_cuda):
    """The backward kernels compile lazily (at ``loss.backward()``, too late to fall back): a
    gradient-carrying first call runs its backward at once."""
    monkeypatch.setattr(flex_module, "_kernel",
                        lambda device: lambda *args: _BackwardFails.apply(separable_bias_attention(*args)))
    layer = _layer()
    with pytest.warns(UserWarning, match="mask path from now on: .*RuntimeError: simulated: backward kernel"):
        got = _run(layer, torch.randn(2, 14, 32))  # the model's own backward then runs on the mask path
    assert all(torch.isfinite(t).all() for t in got)


def test_a_working_variant_is_proven_once(monkeypatch, as_on_cuda):
    calls = []

    def kernel(*args):
        calls.append(args[0].requires_grad)
        return separable_bias_attention(*args)

    monkeypatch.setattr(flex_module, "_kernel", lambda device: kernel)
    layer = _layer().eval()
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(2, 14, 32))
        layer(torch.randn(3, 14, 32))  # another batch size: another variant
    assert len(calls) == 4 and len(flex_module._proven) == 2 and flex_failure() is None


def test_forced_flex_raises_and_out_of_memory_is_no_kernel_failure(monkeypatch, as_on_cuda):
    _failing_kernel(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"))
    layer = _layer()
    with pytest.raises(torch.OutOfMemoryError):
        layer(torch.randn(2, 14, 32))
    assert flex_failure() is None
    _failing_kernel(monkeypatch, RuntimeError("triton compile failed"))
    layer.gaug_path = "flex"
    with pytest.raises(FlexAttentionUnavailable, match="RuntimeError: triton compile failed"):
        layer(torch.randn(2, 14, 32))
    with pytest.raises(FlexAttentionUnavailable, match="off in this process: RuntimeError: triton"):
        layer(torch.randn(2, 14, 32))
