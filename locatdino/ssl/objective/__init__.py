"""What every pretraining objective shares: the LightningModule base (``base``: run length,
checkpoint contents, resumed-run checks), the projection head (``head``), the learning-rate,
weight-decay and momentum schedules (``schedules``), the teacher EMA (``teacher_update``), the
collapse monitor (``collapse``), per-tensor gradient clipping (``grad_clip``), DINOv3's Gram loss
(``gram_loss``), a new run's start weights (``start_weights``) and the FSDP wrapping of its
networks (``fsdp``).

The floor of :mod:`locatdino.ssl`: it imports no objective, no run machinery.
"""

from locatdino.ssl.objective.base import PretrainingObjective
from locatdino.ssl.objective.collapse import CollapseMonitor, teacher_entropies
from locatdino.ssl.objective.fsdp import DINOFSDPStrategy, DINOWrapPolicy
from locatdino.ssl.objective.grad_clip import clip_grad_per_tensor_
from locatdino.ssl.objective.gram_loss import GramLoss
from locatdino.ssl.objective.head import DINOHead
from locatdino.ssl.objective.schedules import (
    DINOSchedules,
    cosine_schedule,
    scaled_lr,
    warmup_constant_schedule,
)
from locatdino.ssl.objective.teacher_update import update_teacher

__all__ = [
    "CollapseMonitor",
    "DINOFSDPStrategy",
    "DINOHead",
    "DINOSchedules",
    "DINOWrapPolicy",
    "GramLoss",
    "PretrainingObjective",
    "clip_grad_per_tensor_",
    "cosine_schedule",
    "scaled_lr",
    "teacher_entropies",
    "update_teacher",
    "warmup_constant_schedule",
]
