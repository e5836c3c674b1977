"""``torch.compile`` and ``torch.export`` of LocAtViT on CPU give the eager numbers.

The fused CPU kernel is an opaque custom operator to both (``locatdino::separable_bias_attention``
with a fake implementation and its own backward); everything else is traced. ``aot_eager``
checks the tracing (graph capture, fake tensors, autograd) without inductor's slow C++ build;
one test compiles with inductor.
"""

import pytest
import timm
import torch

from locatdino.models import GAugAttention
from tests.models.tiny import TINY


def _model(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("locatvit_tiny_patch16_224", num_classes=0, **{**TINY, "depth": 1, **kwargs})


def _output_and_grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    out = model(x)
    return [out, *torch.autograd.grad(out.square().sum(), list(model.parameters()))]


def _assert_all_close(got: list[torch.Tensor], want: list[torch.Tensor], rtol=1e-5, atol=1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["separable", "mask"])
def test_compiled_in_one_graph_equals_eager(path, monkeypatch):
    """Forward and every parameter gradient in training, one graph (``fullgraph``), two
    resolutions; the separable (CPU) and the materialised-mask kernels."""
    monkeypatch.setattr(GAugAttention, "gaug_path", path)
    model = _model().train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for x in (torch.randn(2, 3, 64, 48), torch.randn(3, 3, 32, 32)):
        _assert_all_close(_output_and_grads(compiled, x), _output_and_grads(model, x))


def test_compiled_fast_mode_equals_eager():
    """Training at a grid ≥ fast_min_grid: the 2×2-averaged profiles, traced."""
    model = _model(img_size=128).train()
    for block in model.blocks:
        block.attn.gaug.fast_min_grid = 8
    x = torch.randn(1, 3, 128, 128)
    _assert_all_close(
        _output_and_grads(torch.compile(model, backend="aot_eager", fullgraph=True), x), _output_and_grads(model, x)
    )


@pytest.mark.slow
def test_inductor_compiled_training_step_equals_eager():
    """To fp32 rounding: inductor fuses and reorders the reductions (LayerNorm, softmax, sums);
    measured differences ≤ 4e-5 on outputs of size ~1. Compiled afresh: inductor's on-disk caches
    are not keyed on a custom operator's fake implementation, so a cached graph can outlive it.
    Forward and backward only: the custom operator is opaque to inductor either way, its no-grad
    (eval) path is traced by the ``torch.export`` tests below, and each further inductor graph
    costs ~15 s of C++ build on 2 cores."""
    model = _model().train()
    # inductor's own patch context (a monkeypatch of its config module leaves the option hidden afterwards)
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(model)  # inductor, C++ kernels
        x = torch.randn(2, 3, 64, 48)
        _assert_all_close(_output_and_grads(compiled, x), _output_and_grads(model, x), 1e-4, 1e-4)


def test_export_static_shapes_equals_eager():
    model = _model().eval()
    x = torch.randn(2, 3, 64, 48)
    exported = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(x), model(x), rtol=1e-5, atol=1e-6)
    ops = {str(node.target) for node in torch.export.export(model, (x,)).graph.nodes}
    assert "locatdino.separable_bias_attention.default" in ops


def test_export_with_a_dynamic_batch_runs_any_batch():
    model = _model().eval()
    batch = torch.export.Dim("batch", max=64)
    exported = torch.export.export(model, (torch.randn(2, 3, 64, 48),), dynamic_shapes=({0: batch},)).module()
    for size in (1, 5):
        x = torch.randn(size, 3, 64, 48)
        with torch.no_grad():
            torch.testing.assert_close(exported(x), model(x), rtol=1e-5, atol=1e-6)
