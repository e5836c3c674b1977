import os
import subprocess
import sys

import pytest
import torch
from timm.layers import Attention

from locatdino.models import GAugAttention
from locatdino.models.gaug.patch_grid import PatchGrid


def _layer(**kwargs):
    torch.manual_seed(0)
    layer = GAugAttention(32, num_heads=2, qkv_bias=True, **kwargs).train()
    with torch.no_grad():
        for p in layer.gaug.parameters():
            p.normal_(0, 0.5)
    layer.patch_grid = PatchGrid(num_prefix_tokens=2, patch_size=(16, 16), dynamic_img_pad=False)
    layer.patch_grid.record((3, 4))
    return layer


def _run(layer, x, **kwargs):
    x = x.clone().requires_grad_(True)
    out = layer(x, **kwargs)
    out.backward(torch.ones_like(out))
    return [out, x.grad] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("path", ["SDPA float mask (GPU path)", "unfused (fused_attn=False)"])
def test_generic_path_matches_fused_cpu_path(path):
    """The mask + SDPA path (taken on GPU, with dropout or extra masks) and timm's unfused path
    give the fused CPU kernel's outputs and gradients."""
    x = torch.randn(2, 14, 32)
    fused = _run(_layer(), x)
    layer = _layer()
    if path.startswith("unfused"):
        layer.fused_attn = False
        other = _run(layer, x)
    else:
        other = _run(layer, x, attn_mask=torch.zeros(14, 14))
    for a, b in zip(fused, other):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_same_parameters_as_timm_attention_plus_gaug():
    timm_names = set(dict(Attention(32, num_heads=2, qkv_bias=True).named_parameters()))
    names = set(dict(_layer().named_parameters()))
    assert names - timm_names == {f"gaug.{m}.{p}" for m in ("log_var", "log_alpha") for p in ("weight", "bias")}
    assert timm_names <= names


def test_unwired_layer_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="does not know the patch grid.*locatify"):
        GAugAttention(32, num_heads=2)(torch.randn(1, 5, 32))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("path", ["flex", "mask"])
def test_forced_paths_match_the_separable_path(path):
    """Forward of the flex (CUDA) and mask paths inside the layer, prefix tokens included (the
    flex backward runs only on GPU: benchmarks/gpu_check/; its maths in test_flex_bias_attention)."""
    x = torch.randn(2, 14, 32)
    layer = _layer().eval()
    with torch.no_grad():
        want = layer(x)
        layer.gaug_path = path
        got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_automatic_path_selection():
    layer = _layer()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert layer._resolve_path(cpu, plain=True) == "separable"
    assert layer._resolve_path(cuda, plain=True) == "flex"
    assert layer._resolve_path(cuda, plain=False) == "mask"  # attention dropout or an extra mask
    assert layer._resolve_path(torch.device("mps"), plain=True) == "mask"
    assert GAugAttention(32, num_heads=4)._resolve_path(cuda, plain=True) == "by size"  # head size 8: no flex
    layer.fused_attn = False
    assert layer._resolve_path(cuda, plain=True) == "mask"
    layer.gaug_path = "flex"
    with pytest.raises(ValueError, match="'flex' has no attention dropout or extra mask"):
        layer._resolve_path(cuda, plain=False)
    layer.gaug_path = "fast"
    with pytest.raises(ValueError, match=r"gaug_path \(LOCATDINO_GAUG_PATH\) must be one of"):
        layer._resolve_path(cpu, plain=True)


@pytest.mark.slow
def test_environment_variable_sets_the_default_path():
    code = "from locatdino.models import GAugAttention; print(GAugAttention.gaug_path)"
    env = {**os.environ, "LOCATDINO_GAUG_PATH": "mask"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "mask"
