"""DINO self-distillation: loss, head, teacher EMA, schedules, LightningModule, callbacks."""

from locatdino.ssl.checkpoint_io import AtomicCheckpointIO, atomic_torch_save
from locatdino.ssl.collapse import CollapseMonitor, teacher_entropies
from locatdino.ssl.dino_loss import DINOLoss
from locatdino.ssl.dino_module import DINOModule
from locatdino.ssl.grad_clip import clip_grad_per_tensor_
from locatdino.ssl.head import DINOHead
from locatdino.ssl.schedules import DINOSchedules, cosine_schedule, scaled_lr, warmup_constant_schedule
from locatdino.ssl.teacher_update import update_teacher

__all__ = [
    "AtomicCheckpointIO",
    "CollapseMonitor",
    "DINOHead",
    "DINOLoss",
    "DINOModule",
    "DINOSchedules",
    "atomic_torch_save",
    "clip_grad_per_tensor_",
    "cosine_schedule",
    "scaled_lr",
    "teacher_entropies",
    "update_teacher",
    "warmup_constant_schedule",
]
