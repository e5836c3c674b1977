"""The EMA teacher update of DINO (Caron et al., ICCV 2021, Alg. 1; docs/pretraining.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


@torch.no_grad()
def update_teacher(student_params: Iterable[Tensor], teacher_params: Iterable[Tensor], momentum: float) -> None:
    """``θ_t ← m·θ_t + (1 − m)·θ_s`` for every pair of parameters, in place, in one fused call.

    Both lists come from two modules of the same architecture (same order, same shapes; under
    FSDP the same local shards). ``m = 1`` leaves the teacher bit-for-bit unchanged.
    """
    student, teacher = list(student_params), list(teacher_params)
    if len(student) != len(teacher):
        raise ValueError(f"update_teacher: {len(student)} student vs {len(teacher)} teacher parameters")
    torch._foreach_lerp_(teacher, student, 1.0 - momentum)
