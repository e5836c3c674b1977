"""The FlexAttention ``score_mod`` path against the separable CPU path and a dense reference.

FlexAttention runs on CPU in its eager form (the same ``score_mod``, unfused), forward only; the
gradient test lifts that CPU guard to run FlexAttention's reference dense backward, which checks
that the profiles are wired as differentiable captured tensors (what the CUDA kernels use).
"""

import pytest
import torch
import torch.nn.attention.flex_attention as flex_api

import locatdino.models.gaug.flex_bias_attention as flex_module
from locatdino.models.gaug.flex_bias_attention import flex_bias_attention
from locatdino.models.gaug.separable_bias_attention import separable_bias_attention
from tests.models.gaug.test_separable_bias_attention import reference


def _inputs(num_prefix, h, w, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = num_prefix + h * w
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for _ in range(3))
    rows = 2 * torch.rand(2, 3, h * w, h, generator=g)  # bias up to 4: visible in the output
    cols = 2 * torch.rand(2, 3, h * w, w, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v, rows, cols)]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    ("num_prefix", "h", "w"), [(0, 3, 4), (1, 4, 3), (5, 3, 5)], ids=["no prefix", "class token", "class + 4 registers"]
)
def test_forward_matches_dense_reference_and_separable_path(num_prefix, h, w):
    q, k, v, rows, cols = _inputs(num_prefix, h, w)
    with torch.no_grad():
        got = flex_bias_attention(q, k, v, rows, cols, num_prefix)
        want = reference(*(t.double() for t in (q, k, v, rows, cols)), num_prefix)
        separable = separable_bias_attention(q, k, v, rows, cols, num_prefix)
        no_bias = flex_bias_attention(q, k, v, 0 * rows, 0 * cols, num_prefix)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, separable, rtol=1e-5, atol=1e-5)
    assert (got - no_bias).abs().max() > 0.1  # the bias is really applied


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_gradients_reach_the_profiles(monkeypatch):
    monkeypatch.setattr(flex_api, "_validate_device", lambda *tensors: None)
    num_prefix, h, w = 5, 3, 4
    inputs = _inputs(num_prefix, h, w, requires_grad=True, seed=1)
    grad_out = torch.randn(2, 3, num_prefix + h * w, 16, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(flex_bias_attention(*inputs, num_prefix), inputs, grad_out)
    want = torch.autograd.grad(separable_bias_attention(*inputs, num_prefix), inputs, grad_out)
    for name, a, b in zip(("q", "k", "v", "rows", "cols"), got, want):
        assert b.abs().max() > 1e-3, name
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_dino_step_compiles_three_variants(monkeypatch):
    """The module docstring's count, through dynamo on the CPU (``aot_eager`` stands in for
    inductor): teacher forward at the global size without gradients, student at the global and
    local sizes with gradients; the first-call probe of a variant adds no compile, a second step none."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from locatdino.models import GAugAttention
    from locatdino.ssl import DINOModule

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch._dynamo.config.patch(recompile_limit=flex_module._MAX_VARIANTS)(
        torch.compile(flex_module._attend, backend=counter, dynamic=False)
    )
    monkeypatch.setattr(flex_module, "_kernel", lambda device: compiled)
    flex_module.reset_flex_state()
    monkeypatch.setattr(flex_api, "_validate_device", lambda *tensors: None)
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = DINOModule(
        "locatvit_tiny_patch16_224",
        dict(img_size=64, depth=1, embed_dim=64, num_heads=2),
        batch_size=2,
        out_dim=32,
        hidden_dim=32,
        bottleneck_dim=16,
    )
    for layer in module.modules():
        if isinstance(layer, GAugAttention):
            layer.gaug_path = "flex"
    crops = {"global": torch.randn(2, 2, 3, 64, 64), "local": torch.randn(3, 2, 3, 32, 32)}
    for _ in range(2):
        with torch.no_grad():
            probs = module.dino_loss.teacher_targets(module.forward_branch(module.teacher, [crops["global"]]), 0.04)
        module.dino_loss(module.forward_branch(module.student, [crops["global"], crops["local"]]), probs).backward()
        assert counter.frame_count == 3
    assert flex_module.flex_failure() is None and not flex_module.flex_report()["failed"]
    flex_module.reset_flex_state()
