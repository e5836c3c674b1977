"""The feature-matching loss of distillation (docs/pretraining.md, "Distillation from a frozen teacher").

The student's class and patch features, each through a linear projection to the teacher's width,
are pulled towards the frozen teacher's features of the same crops, which are taken after the
teacher's final norm (LayerNorm-normalised, as lightly-train's distillation reads DINOv2's
``get_intermediate_layers`` with its norm). Two distances, as lightly-train's distillation versions
use them: ``"cosine"``, ``1 - cos`` of each pair (lightly-train's ``distillationv3`` L2-normalises
the teacher's features: only directions count), and ``"mse"``, the mean squared difference of the
values (its ``distillationv2``: the teacher's scale is learned too).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DISTANCES = ("cosine", "mse")


class DistillLoss(nn.Module):
    """Mean distance of student features to teacher features, in fp32 (autocast off inside: a
    bf16 cosine of 1000-wide features is off by ~4e-3, the size of late-training losses).

    Args:
        distance: ``"cosine"`` (``1 - cos`` per feature vector, averaged) or ``"mse"`` (squared
            difference per value, averaged over every value).
    """

    def __init__(self, distance: Literal["cosine", "mse"] = "cosine") -> None:
        super().__init__()
        if distance not in DISTANCES:
            raise ValueError(f"model.distill_distance: must be one of {', '.join(DISTANCES)}, got {distance!r}")
        self.distance = distance

    def forward(self, student: Tensor, teacher: Tensor) -> Tensor:
        """Scalar loss of ``student`` ``[..., D]`` (already projected) against ``teacher`` ``[..., D]``."""
        if student.shape != teacher.shape:
            raise ValueError(
                f"DistillLoss: student features {tuple(student.shape)} and teacher features "
                f"{tuple(teacher.shape)} differ in shape"
            )
        with torch.autocast(student.device.type, enabled=False):
            student, teacher = student.float(), teacher.float()
            if self.distance == "mse":
                return F.mse_loss(student, teacher)
            return (1.0 - F.cosine_similarity(student, teacher, dim=-1)).mean()
