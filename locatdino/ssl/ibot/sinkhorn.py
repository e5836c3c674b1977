"""Sinkhorn–Knopp teacher targets (SwAV, Caron et al. 2020; DINOv2's ``centering: sinkhorn_knopp``;
docs/pretraining.md).

Instead of subtracting a running centre, the teacher's sharpened scores of a batch are
balanced so that every prototype receives the same total mass over the batch (summed over every
rank) while each sample's targets still sum to one: a few alternating column / row
normalisations of ``exp(t / τ)``. No state: nothing to keep in a checkpoint or to update.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def _all_reduce(x: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(x, op=op)
    return x


@torch.no_grad()
def sinkhorn_knopp(teacher_out: Tensor, temp: float, iterations: int = 3) -> Tensor:
    """Balanced targets ``[M, K]`` of teacher logits ``[M, K]`` (``M`` samples on this rank).

    ``Q = exp(t / τ)`` scaled to total mass 1 over all ranks; then ``iterations`` times: every
    prototype's column to mass ``1 / K`` (sums over all ranks), every sample's row to mass
    ``1 / M_total``; finally rows are scaled to sum to 1. Computed in fp32 (fp64 stays fp64),
    with the global maximum subtracted first so that ``exp`` cannot overflow (a constant factor,
    normalised away).
    """
    t = teacher_out if teacher_out.dtype in (torch.float32, torch.float64) else teacher_out.float()
    k = t.shape[-1]
    peak = _all_reduce(t.max().reshape(1) if t.numel() else t.new_full((1,), -torch.inf), dist.ReduceOp.MAX)
    q = torch.exp((t - peak) / temp)
    total_samples = _all_reduce(t.new_tensor([t.shape[0]]))
    q = q / _all_reduce(q.sum().reshape(1))
    for _ in range(iterations):
        q = q / (_all_reduce(q.sum(0)) * k)
        q = q / (q.sum(1, keepdim=True) * total_samples)
    return q * total_samples
