"""GAug's FlexAttention kernel options on a failing compiler (simulated on the CPU: the path choice
is asked as if on CUDA and the compiled kernel is replaced): the options are walked in order, the
winner is remembered and logged, every failure is logged in full, and when all fail the ``auto``
path falls back to SDPA with the bias."""

import logging
import warnings

import pytest
import torch

import locatdino.models.gaug.flex_bias_attention as flex_module
from locatdino.models import GAugAttention
from locatdino.models.gaug.flex_bias_attention import FlexAttentionUnavailable, flex_failure, flex_report
from locatdino.models.gaug.flex_options import FP32_CANDIDATES
from locatdino.models.gaug.separable_bias_attention import separable_bias_attention
from tests.models.gaug.test_attention import _layer, _run

_resolve_path = GAugAttention._resolve_path
# a compile error's detail is on its later lines: the walk must keep them all
TRITON_ERROR = (
    "No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_4\n"
    "Required: 376832 Hardware limit: 232448. Reducing block sizes or num_stages may help."
)


@pytest.fixture
def as_on_cuda(monkeypatch):
    """A fresh flex state, and the automatic path chosen as it would be on CUDA."""
    flex_module.reset_flex_state()
    monkeypatch.setattr(
        GAugAttention, "_resolve_path", lambda self, device, plain: _resolve_path(self, torch.device("cuda"), plain)
    )
    yield
    flex_module.reset_flex_state()


def _kernel(monkeypatch, fails=lambda options: True, exc=RuntimeError):
    """Replace the compiled kernel: it records the options of each call (kernel options, the
    profiles' dtype) and raises ``exc`` for those ``fails`` names, else computes the separable path."""
    calls = []

    def kernel(q, k, v, rows, cols, num_prefix, scale, options):
        calls.append((options, rows.dtype))
        if fails((options, rows.dtype)):
            raise exc(TRITON_ERROR)
        return separable_bias_attention(q, k, v, rows, cols, num_prefix, scale)

    monkeypatch.setattr(flex_module, "_kernel", lambda device: kernel)
    return calls


def _as_called(options):
    return [(o.kernel, o.profile_dtype(torch.float32)) for o in options]


def test_every_option_tried_in_order_then_one_warning_with_every_full_error(monkeypatch, as_on_cuda):
    calls = _kernel(monkeypatch)
    layer, x = _layer(), torch.randn(2, 14, 32)
    assert layer._resolve_path(x.device, plain=True) == "flex"
    with pytest.warns(UserWarning) as caught:
        got = _run(layer, x)
    assert calls == _as_called(FP32_CANDIDATES)  # fp32 queries: the fp32 list, in its order
    [warning] = [str(w.message) for w in caught]
    assert warning.startswith(
        "GAug uses SDPA with the bias (chunked at large inputs) from now on: FlexAttention "
        "failed on cpu: every kernel option failed for float32, head size 16, cpu:"
    )
    assert warning.count("RuntimeError: " + TRITON_ERROR) == len(FP32_CANDIDATES)  # every line of every error
    for options in FP32_CANDIDATES:
        assert f"\n- {options.name}: RuntimeError: No valid triton configs" in warning
    assert flex_failure() in warning and flex_report()["off"] == flex_failure()
    assert [e["error"] for e in flex_report()["failed"]] == ["RuntimeError: " + TRITON_ERROR] * len(FP32_CANDIDATES)

    layer.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: later calls go straight to the fallback
        again = _run(layer, x)
    assert len(calls) == len(FP32_CANDIDATES) and layer._resolve_path(x.device, plain=True) == "by size"
    layer.zero_grad()
    layer.gaug_path = "mask"
    for a, b, c in zip(got, again, _run(layer, x)):  # output, input and parameter gradients
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


def test_the_first_option_that_works_wins_is_logged_and_starts_later_shapes(monkeypatch, as_on_cuda, caplog):
    first, second, third = _as_called(FP32_CANDIDATES)
    calls = _kernel(monkeypatch, fails=lambda called: called in (first, second))
    layer = _layer()
    with caplog.at_level(logging.INFO, logger="locatdino.models.gaug"):
        got = _run(layer, torch.randn(2, 14, 32))
    # the third options ran the probe (forward + backward) and then the real call
    assert calls == [first, second, third, third]
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(failures) == 2 and all(m.endswith("RuntimeError: " + TRITON_ERROR) for m in failures)
    assert f"FlexAttention with {FP32_CANDIDATES[0].name} failed for float32, head size 16, cpu:" in failures[0]
    wins = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert wins == [f"FlexAttention for float32, head size 16, cpu: {FP32_CANDIDATES[2].name}"]
    assert flex_report()["chosen"] == {"float32, head size 16, cpu": FP32_CANDIDATES[2].name}
    assert flex_failure() is None and all(torch.isfinite(t).all() for t in got)

    calls.clear()
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(3, 14, 32))  # another variant: starts at the winner
        layer(torch.randn(3, 14, 32))  # proven: no probe
    assert calls == [third, third]


def test_a_failing_first_backward_moves_on_to_the_next_options(monkeypatch, as_on_cuda):
    """The backward kernels compile lazily (at ``loss.backward()``, too late to fall back): a
    gradient-carrying first call runs its backward at once, with each options it tries."""

    class BackwardFails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("simulated: backward kernel failed to compile")

    first = FP32_CANDIDATES[0].kernel
    seen = []

    def kernel(*args):
        seen.append(args[7])
        out = separable_bias_attention(*args[:7])
        return BackwardFails.apply(out) if args[7] == first else out

    monkeypatch.setattr(flex_module, "_kernel", lambda device: kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the second options work
        got = _run(_layer(), torch.randn(2, 14, 32))
    assert seen == [first, FP32_CANDIDATES[1].kernel, FP32_CANDIDATES[1].kernel]
    assert "simulated: backward kernel failed" in flex_report()["failed"][0]["error"]
    assert all(torch.isfinite(t).all() for t in got)


def test_a_working_variant_is_proven_once(monkeypatch, as_on_cuda):
    calls = _kernel(monkeypatch, fails=lambda called: False)
    layer = _layer().eval()
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(2, 14, 32))
        layer(torch.randn(3, 14, 32))  # another batch size: another variant
    assert len(calls) == 4 and len(flex_module._proven) == 2 and flex_failure() is None


def test_forced_flex_raises_and_out_of_memory_is_no_kernel_failure(monkeypatch, as_on_cuda):
    calls = _kernel(monkeypatch, exc=torch.OutOfMemoryError)
    layer = _layer()
    with pytest.raises(torch.OutOfMemoryError):
        layer(torch.randn(2, 14, 32))
    assert flex_failure() is None and len(calls) == 1  # no other options tried
    _kernel(monkeypatch)
    layer.gaug_path = "flex"
    with pytest.raises(FlexAttentionUnavailable, match="RuntimeError: No valid triton configs"):
        layer(torch.randn(2, 14, 32))
    with pytest.raises(FlexAttentionUnavailable, match="off in this process: every kernel option failed"):
        layer(torch.randn(2, 14, 32))
