import pytest
import torch
from torch import nn

from locatdino.evaluation import precision as precision_module
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.precision import int8_encoder, resolve_precision
from locatdino.models import create_backbone

CPU = torch.device("cpu")


def _images(n=2, size=32):
    return (torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)


@pytest.mark.parametrize(
    "flags, capability, expected",
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512", "bf16"),
        ({"avx2", "amx_bf16"}, "AVX512", "bf16"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX2", "int8"),  # ATEN_CPU_CAPABILITY=avx2: no native bf16 kernels
        ({"avx2", "avx512f"}, "AVX512", "int8"),
        (set(), "DEFAULT", "fp32"),
    ],
)
def test_auto_picks_what_the_cpu_runs_natively(monkeypatch, flags, capability, expected):
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert resolve_precision("auto", CPU) == expected
    assert resolve_precision("fp32", CPU) == "fp32"  # an explicit choice is kept


def test_precision_errors():
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", CPU)
    with pytest.raises(ValueError, match="int8' runs on the CPU only, the encoder is on cuda"):
        resolve_precision("int8", torch.device("cuda"))
    assert resolve_precision("auto", torch.device("meta")) == "fp32"


def test_int8_quantizes_a_copy_of_the_block_linears(tiny_vit):
    before = {k: v.clone() for k, v in tiny_vit.state_dict().items()}
    q = int8_encoder(tiny_vit)
    # 2 blocks x (qkv, proj, fc1, fc2) quantized, the original untouched
    quantized = [n for n, m in q.named_modules() if type(m).__name__ == "Linear" and "quantized" in type(m).__module__]
    assert sorted(quantized) == sorted(
        f"blocks.{b}.{n}" for b in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
    )
    assert sum(type(m) is nn.Linear for m in tiny_vit.modules()) == 8
    assert all(torch.equal(v, tiny_vit.state_dict()[k]) for k, v in before.items())
    x = _images()
    fp32, int8 = FeatureExtractor(tiny_vit)(x), FeatureExtractor(tiny_vit, precision="int8")(x)
    assert (fp32 * int8).sum(-1).min() > 0.98  # cosine per patch
    assert (fp32 - int8).abs().max() > 1e-4  # yet really computed in int8 (fp32 repeats to ~1e-7)


def test_int8_keeps_gaug_in_fp32():
    model = create_backbone("locatvit_tiny_patch16_224", img_size=32, patch_size=8).eval()
    q = int8_encoder(model)
    gaug = q.blocks[0].attn.gaug
    assert type(gaug.log_var) is nn.Linear and type(q.blocks[0].attn.qkv) is not nn.Linear
    x = _images()
    cosine = (FeatureExtractor(model)(x) * FeatureExtractor(model, precision="int8")(x)).sum(-1)
    assert cosine.min() > 0.98


def test_int8_needs_block_linears():
    with pytest.raises(ValueError, match="no Linear layers under 'blocks.'"):
        int8_encoder(nn.Sequential(nn.Linear(2, 2)))
