"""Reusable per-thread scratch buffers for the chunked attention kernels.

On CPU a fresh multi-megabyte tensor is mmapped and every page faults on first touch: for a
``[B·H, rows, N]`` chunk this costs more than writing the bias into it (measured 18 ms vs 4 ms
for a 59 MB mask). The fused GAug attention therefore writes its chunks into buffers that live
for the thread and are reused by every block and step. A buffer is only valid until the next
:func:`scratch` call with the same ``slot`` on the same thread; callers use it entirely inside
one forward or backward call and never return or save it. The size of each buffer is bounded by
the callers' chunking (a few MiB), so holding them is cheap. Other devices get a fresh tensor:
CUDA's caching allocator already reuses freed blocks without faults, and a held buffer (tens of
MiB there) would add to every later peak.
"""

from __future__ import annotations

import math
import threading

import torch

_local = threading.local()


def scratch(slot: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised ``shape`` tensor backed by this thread's buffer for ``slot`` (CPU), or a new one."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    buffers: dict = _local.__dict__.setdefault("buffers", {})
    key = (slot, dtype, device)
    numel = math.prod(shape)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        with torch.inference_mode(False):  # usable both in and outside inference mode
            buffer = torch.empty(numel, dtype=dtype, device=device)
        buffers[key] = buffer
    return buffer[:numel].view(shape)
