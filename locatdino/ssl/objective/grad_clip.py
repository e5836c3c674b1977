"""Per-parameter-tensor gradient clipping, as in the DINO reference (docs/pretraining.md).

Unlike ``torch.nn.utils.clip_grad_norm_`` (one global norm), every tensor's gradient is scaled
down on its own to norm ≤ ``max_norm``: ``g ← g · min(1, max_norm / (‖g‖ + 1e-6))``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor


@torch.no_grad()
def clip_grad_per_tensor_(
    parameters: Iterable[Tensor], max_norm: float, sharded: bool = False, eps: float = 1e-6
) -> Tensor:
    """Clip each parameter's ``.grad`` in place; return the pre-clipping norms ``[n_params]``.

    Args:
        parameters: the parameters (those without ``.grad`` count as norm 0 and are left alone).
        max_norm: the per-tensor threshold (3.0 in the reference).
        sharded: gradients are shards of the full tensors (FSDP): the squared norms of the local
            shards are all-reduced so every rank clips with the full tensor's norm. All ranks must
            pass the parameters in the same order.
        eps: added to the norm before dividing, as in the reference.
    """
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not params:
        return torch.zeros(0)
    device = grads[0].device if grads else params[0].device
    norms = torch.zeros(len(params), device=device, dtype=torch.float32)
    with_grad = [i for i, p in enumerate(params) if p.grad is not None]
    if grads:
        norms[with_grad] = torch.stack(torch._foreach_norm(grads)).float()
    if sharded and dist.is_available() and dist.is_initialized():
        norms = norms.square()
        dist.all_reduce(norms)
        norms = norms.sqrt()
    coef = (max_norm / (norms + eps)).clamp(max=1.0)
    if grads:
        torch._foreach_mul_(grads, list(coef[with_grad].unbind()))
    return norms
