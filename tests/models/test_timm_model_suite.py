"""The kinds of test timm's ``tests/test_models.py`` runs on every ``vit_*`` model, on every
``locatvit_*`` registry entry: forward (and with gradient checkpointing), backward, default
config and head API, ``features_only`` and ``forward_intermediates``, TorchScript, FX tracing
forward and backward with timm's leaf-module / autowrap registrations, FX then TorchScript.

Written for this project (the same checks, not a copy), at tiny sizes: the registered widths,
``depth`` overridden to 1-3 blocks and 64 px inputs (a 4×4 grid, not the 14×14 build grid, so
the variance rescaling runs too).
"""

import io
import math

import pytest
import timm
import torch
from timm import set_scriptable
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

ALL = timm.list_models("locatvit_*")
WITH_CFG = timm.list_models("locatvit_*", name_matches_cfg=True)  # every architecture (deprecations are not listed)
SIZE = 64
no_jit_deprecation = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")


def _create(name: str, depth: int = 1, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, depth=depth, **kwargs)


def _image(batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))


def _fx_graph_module(model: torch.nn.Module) -> torch.nn.Module:
    """timm's FX route: torchvision's feature extractor with timm's no-trace registrations,
    returning the last node of the train and of the eval graph (the model output)."""
    tracer_kwargs = dict(
        leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(), param_shapes_constant=True
    )
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(
        model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer_kwargs
    )


def _assert_every_parameter_has_a_gradient(model: torch.nn.Module) -> None:
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("name", ALL)
def test_forward_and_with_gradient_checkpointing(name):
    model = _create(name, depth=2).eval()
    x = _image()
    out = model(x)
    assert out.shape == (1, 1000) and not out.isnan().any()
    model.set_grad_checkpointing()
    torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", WITH_CFG)
def test_backward_reaches_every_parameter(name):
    model = _create(name, num_classes=42).train()
    out = model(_image(2))
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(model)
    assert out.shape == (2, 42) and not out.isnan().any()


@pytest.mark.parametrize("name", WITH_CFG)
def test_default_config_and_head_api(name):
    model = _create(name).eval()
    cfg, state = model.pretrained_cfg, model.state_dict()
    assert f"{cfg['classifier']}.weight" in state and f"{cfg['first_conv']}.weight" in state
    assert model.num_classes == cfg["num_classes"] and model.num_features == model.head_hidden_size > 0
    x = _image()
    tokens = model.forward_features(x)
    grid = (SIZE // model.patch_embed.patch_size[0]) ** 2  # patch 16, or 8 for locatvit_tiny_patch8_224
    assert tokens.shape == (1, model.num_prefix_tokens + grid, model.num_features)
    pre_logits = model.forward_head(tokens, pre_logits=True)
    assert pre_logits.shape == (1, model.head_hidden_size)
    model.reset_classifier(0)
    assert model.num_classes == 0
    torch.testing.assert_close(model(x), pre_logits)
    headless = _create(name, num_classes=0).eval()
    assert headless(x).shape == (1, headless.num_features)


@pytest.mark.parametrize("name", WITH_CFG)
def test_features_only_and_forward_intermediates(name):
    x = _image()
    features = _create(name, depth=3, features_only=True).eval()
    outs = features(x)
    channels, reductions = features.feature_info.channels(), features.feature_info.reduction()
    assert len(outs) == len(channels) == 3
    for c, r, o in zip(channels, reductions, outs):
        assert o.shape == (1, c, math.ceil(SIZE / r), math.ceil(SIZE / r)) and not o.isnan().any()

    model = _create(name, depth=3).eval()
    final, intermediates = model.forward_intermediates(x, output_fmt="NCHW")
    assert [t.shape for t in intermediates] == [o.shape for o in outs]
    torch.testing.assert_close(final, model.forward_features(x))
    model.set_grad_checkpointing()
    torch.testing.assert_close(model.forward_intermediates(x, output_fmt="NCHW")[0], final, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_fx_traced_forward_is_bitwise_eager(name):
    model = _create(name, depth=2).eval()
    graph_module = _fx_graph_module(model)
    for x in (_image(), torch.randn(2, 3, 48, 80)):  # the grid is read when the graph runs
        with torch.inference_mode():
            want = model(x)
            got = torch.cat(list(graph_module(x).values()))
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", WITH_CFG)
def test_fx_traced_backward_reaches_every_parameter(name):
    model = _create(name, num_classes=42).train()
    graph_module = _fx_graph_module(model)
    out = torch.cat(list(graph_module(_image(2)).values()))
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(graph_module)
    assert sum(p.numel() for p in graph_module.parameters()) == sum(p.numel() for p in model.parameters())
    assert out.shape == (2, 42) and not out.isnan().any()


@no_jit_deprecation
@pytest.mark.parametrize("name", WITH_CFG)
def test_torchscript_forward_equals_eager_and_survives_save_load(name):
    with set_scriptable(True):
        model = _create(name, depth=2).eval()
    scripted = torch.jit.script(model)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    for x in (_image(), torch.randn(2, 3, 48, 80)):  # the grid of each input reaches every layer
        with torch.no_grad():
            want = model(x)
            torch.testing.assert_close(scripted(x), want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-6)


@no_jit_deprecation
@pytest.mark.parametrize("name", WITH_CFG)
def test_fx_traced_then_scripted_forward_equals_eager(name):
    with set_scriptable(True):
        model = _create(name, depth=2).eval()
    scripted = torch.jit.script(_fx_graph_module(model))
    x = torch.randn(1, 3, 48, 80)
    with torch.inference_mode():
        torch.testing.assert_close(torch.cat(list(scripted(x).values())), model(x), rtol=1e-5, atol=1e-6)
