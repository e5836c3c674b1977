"""What one model's frozen forward costs at the evaluation size: parameters, images/s, peak memory.

Peak memory is the forward's own: on CUDA ``torch.cuda.max_memory_allocated`` after a reset; on
CPU the process's resident-set high-water mark (``VmHWM``), reset just before the forward by
writing ``5`` to ``/proc/self/clear_refs`` (Linux ≥ 4.0) and reported as the rise over the
resident set before it, so every model of a comparison is measured from its own start. Freed
heap memory is first handed back to the system (glibc ``malloc_trim``): otherwise the forward
could reuse it unseen. Where the reset is not allowed the peak is None rather than a number
that mixes models.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_cpu_peak() -> int | None:
    """Reset the RSS high-water mark; the RSS now (kB), or None when it cannot be reset."""
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kb("VmRSS")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def forward_cost(extractor: Any, input_size: int, batch_size: int, min_seconds: float = 1.0) -> dict[str, Any]:
    """Images/s of ``extractor`` on random uint8 batches of ``batch_size`` × ``input_size`` px
    (one warm-up batch, then batches until ``min_seconds``, at least 2) and the peak memory of
    those forwards in MB."""
    images = torch.randint(
        0, 256, (batch_size, 3, input_size, input_size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    device = getattr(extractor, "device", torch.device("cpu"))
    cuda = device.type == "cuda"
    extractor(images)  # warm-up: one-time allocations are not the forward's
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _reset_cpu_peak()
    runs, start = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - start < min_seconds:
        extractor(images)
        runs += 1
    if cuda:
        torch.cuda.synchronize(device)
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        hwm = _status_kb("VmHWM")
        peak_mb = None if base is None or hwm is None else max(hwm - base, 0) / 1024
    seconds = time.perf_counter() - start
    return {
        "images_per_s": round(runs * batch_size / seconds, 2),
        "peak_forward_mb": None if peak_mb is None else round(peak_mb, 1),
        "batch_size": batch_size,
        "input_size": input_size,
    }
