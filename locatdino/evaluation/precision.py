"""Encoder precision of a frozen backbone's forward: which arithmetic is fast on which machine.

Hummingbird spends most of its time in the encoder forward (the ``features`` phase of the
``timings`` every results file records: 2.0 of 2.5 s for a tiny ViT in ``demo --quick``), and the
fastest arithmetic depends on the hardware, not on the model:

- ``bf16`` autocast is ~2x faster than fp32 where the CPU has native bf16 dot products
  (AVX512-BF16 or AMX) and on GPUs, but ~3x *slower* where bf16 is emulated (AVX2-only CPUs).
- ``int8`` quantizes the weights of the blocks' Linear layers per output channel and their
  inputs per batch (PyTorch's dynamic quantization: fbgemm kernels on x86, AVX2 and up); the
  attention products stay fp32. CPU only.
- ``auto`` picks per device: bf16 on GPUs that have it and on CPUs with native bf16 (and torch
  using its AVX-512 kernels: ``ATEN_CPU_CAPABILITY=avx2`` turns bf16 off), int8 on other x86
  CPUs with AVX2, fp32 elsewhere.

Their effect on the mIoU is measured against fp32 by ``benchmarks/speed/hbird.py``.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import torch
from torch import nn

PRECISIONS = ("auto", "fp32", "bf16", "int8")


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    from locatdino.evaluation.provenance import cpu_model_and_flags

    return cpu_model_and_flags()[1] or set()


def resolve_precision(precision: str, device: torch.device) -> str:
    """``precision`` with ``auto`` replaced by what is fastest on ``device`` (module docstring);
    refuses int8 off the CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"precision 'int8' runs on the CPU only, the encoder is on {device}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type != "cpu":
        return "fp32"
    flags = cpu_flags()
    if flags & {"avx512_bf16", "amx_bf16"} and torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return "bf16"
    if "avx2" in flags and "fbgemm" in torch.backends.quantized.supported_engines:  # x86 with AVX2
        return "int8"
    return "fp32"


def encoder_for(model: nn.Module, precision: str, device: torch.device) -> tuple[nn.Module, str]:
    """``(the module to run, the resolved precision)``: ``model`` itself, or its int8 copy."""
    precision = resolve_precision(precision, device)
    return (int8_encoder(model) if precision == "int8" else model), precision


def int8_encoder(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose transformer-block Linear layers (qkv, proj, MLP) are dynamically
    quantized to int8; ``model`` itself is left untouched. GAug's small Linear layers keep fp32:
    its bias code reads their weights directly."""
    names = {
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear and name.startswith("blocks.") and ".gaug." not in name
    }
    if not names:
        raise ValueError(f"{type(model).__name__} has no Linear layers under 'blocks.' to quantize")
    with warnings.catch_warnings():
        # torch.ao.quantization warns of its deprecation; the pinned torch still ships and tests it
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), names, dtype=torch.qint8)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of a resolved ``precision`` (bf16 only; int8 lives in the weights)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
