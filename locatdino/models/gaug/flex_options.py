"""Which FlexAttention kernel options the GAug ``score_mod`` compiles with, per dtype and device.

Why: inductor picks FlexAttention's tiles from the query dtype and head size alone. Its Hopper
default for bf16, head size 64 (``BLOCK_M = BLOCK_N = 128``, 3 pipeline stages) cannot hold the
two bias profiles that GAug's ``score_mod`` gathers per tile: on an H200 (torch 2.11, Triton 3.6)
every bf16 variant failed with ``out of resource: ... Required: 376832 Hardware limit: 232448``,
and the run fell back to the materialised bias. Smaller tiles or fewer stages fit.

So each variant walks a short ordered list of :class:`FlexOptions` (``candidates``), skipping those
whose :func:`shared_memory_estimate` exceeds the device's per-block limit (read from
``torch.cuda.get_device_properties``: :func:`shared_memory_limit`), and takes the first one that
compiles and passes its first forward and backward (the probe in
:mod:`~locatdino.models.gaug.flex_bias_attention`). The winner is remembered per (dtype, head
size, device capability), so later shapes start from it.

The lists, with what was measured for them on the H200 (B 64, H 6, N 197, d 64, bf16 q/k/v,
forward + backward, compiled; SDPA without a bias 0.32 ms):

- half precision: ``BLOCK_M 64, BLOCK_N 32, 1 stage`` (0.87 ms), ``64, 64, 2 stages`` (1.17 ms),
  ``32, 32, 1 stage, 4 warps`` (1.56 ms), all with fp32 profiles (the bias is added in the
  kernel's fp32 scores, as exact as the CPU path); then torch's default tiles with the profiles in
  the input dtype (1.46 ms: they compile because bf16 profiles halve the gathered bytes, but the
  bias is rounded to bf16 first, so they come after every fp32-profile option). Whether bf16
  profiles are worth their rounding is measured by ``benchmarks/gpu_check/`` (``kernels``
  section: time and error of each option), not assumed.
- fp32: torch's default tiles (compiled and matched the CPU path to 1e-5 on the H200), then the
  two single-stage options.
- any other dtype: torch's defaults only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlexOptions:
    """One candidate: the ``kernel_options`` pinned (empty: torch's defaults) and the profiles' dtype."""

    kernel: tuple[tuple[str, int], ...] = ()
    profiles: str = "fp32"  # "fp32", or "input": cast to the dtype of q (half the gathered bytes in bf16)

    @property
    def name(self) -> str:
        tiles = " ".join(f"{k}={v}" for k, v in self.kernel) or "default tiles"
        return f"{tiles}, {self.profiles} profiles"

    def kernel_options(self) -> dict[str, int] | None:
        return dict(self.kernel) or None

    def profile_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.profiles == "fp32" else dtype

    def shared_memory(self, head_dim: int, dtype: torch.dtype) -> int | None:
        """:func:`shared_memory_estimate` of these tiles, None when the tiles are torch's (unknown here)."""
        pinned = dict(self.kernel)
        if "BLOCK_M" not in pinned or "BLOCK_N" not in pinned or "num_stages" not in pinned:
            return None
        return shared_memory_estimate(
            pinned["BLOCK_M"],
            pinned["BLOCK_N"],
            pinned["num_stages"],
            head_dim,
            dtype.itemsize,
            self.profile_dtype(dtype).itemsize,
        )


def _tiles(block_m: int, block_n: int, stages: int, **extra: int) -> tuple[tuple[str, int], ...]:
    return (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("num_stages", stages), *extra.items())


HALF_CANDIDATES = (
    FlexOptions(_tiles(64, 32, 1)),
    FlexOptions(_tiles(64, 64, 2)),
    FlexOptions(_tiles(32, 32, 1, num_warps=4)),
    FlexOptions((), "input"),
)
FP32_CANDIDATES = (
    FlexOptions(),
    FlexOptions(_tiles(64, 32, 1)),
    FlexOptions(_tiles(32, 32, 1, num_warps=4)),
)


def candidates(dtype: torch.dtype) -> tuple[FlexOptions, ...]:
    """The ordered options for queries of ``dtype`` (module docstring)."""
    if dtype in (torch.bfloat16, torch.float16):
        return HALF_CANDIDATES
    return FP32_CANDIDATES if dtype == torch.float32 else (FlexOptions(),)


def shared_memory_estimate(
    block_m: int, block_n: int, num_stages: int, head_dim: int, element_size: int, profile_size: int
) -> int:
    """Bytes of shared memory one block of the forward kernel needs with these tiles, estimated::

        max(1, stages − 1) · (2·BLOCK_N·d·e + 2·BLOCK_M·BLOCK_N·p) + BLOCK_M·d·e + BLOCK_M·BLOCK_N·e

    Why this form: Triton's software pipeline keeps ``stages − 1`` loads of the inner loop in
    flight in shared memory, and each inner step loads a K and a V tile (``BLOCK_N × d``, input
    size e) and the two profile tiles the ``score_mod`` gathers (``BLOCK_M × BLOCK_N``, profile
    size p, the term that made the default tiles fail); outside the loop come the Q tile and the
    probabilities converted to the input dtype for the second product. With torch's Hopper default
    for bf16, d 64 (128, 128, 3 stages) and fp32 profiles it gives 376 832 B, the number Triton
    reported on the H200. It is an estimate, not Triton's allocator: Triton keeps some
    loads in registers (the same default tiles with bf16 profiles compiled on the H200, where this
    gives 245 760 B against a 232 448 B limit), so it only skips options that clearly cannot fit;
    those it lets through are still proven by their first call.
    """
    in_flight = max(1, num_stages - 1)
    per_stage = 2 * block_n * head_dim * element_size + 2 * block_m * block_n * profile_size
    return in_flight * per_stage + block_m * head_dim * element_size + block_m * block_n * element_size


def device_properties(device: torch.device):
    """``torch.cuda.get_device_properties`` of a CUDA device, None elsewhere (tests replace it)."""
    return torch.cuda.get_device_properties(device) if device.type == "cuda" else None


def shared_memory_limit(props) -> int | None:
    """Shared memory one block may use: the opt-in maximum where torch reports it (NVIDIA), else the
    default per-block size; None when unknown (then no option is skipped)."""
    for attribute in ("shared_memory_per_block_optin", "shared_memory_per_block"):
        value = getattr(props, attribute, None)
        if value:
            return int(value)
    return None


def fitting(
    options: tuple[FlexOptions, ...], head_dim: int, dtype: torch.dtype, limit: int | None
) -> list[FlexOptions]:
    """``options`` in order, less those whose estimate exceeds ``limit`` (logged)."""
    kept = []
    for candidate in options:
        need = candidate.shared_memory(head_dim, dtype)
        if limit is not None and need is not None and need > limit:
            log.info(
                "FlexAttention: skipping %s for %s, head size %d: needs ~%d B of shared memory, the device allows %d B",
                candidate.name,
                dtype,
                head_dim,
                need,
                limit,
            )
            continue
        kept.append(candidate)
    return kept
