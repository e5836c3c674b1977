"""Pretraining objectives as LightningModules — DINO self-distillation (loss, head, teacher EMA,
schedules), iBOT (DINO plus masked-patch prediction: masks, mask token, patch loss, KoLeo) and
supervised classification — with their shared plumbing (``PretrainingObjective``:
run length, checkpoint contents; checkpoint IO, curves, export, fit checks, the ``fit`` CLI).

Importing it registers the Lightning strategy name ``dino_fsdp`` (:class:`DINOFSDPStrategy`).
"""

from locatdino.ssl.checkpoint_io import AtomicCheckpointIO, atomic_torch_save
from locatdino.ssl.collapse import CollapseMonitor, teacher_entropies
from locatdino.ssl.dino_loss import DINOLoss
from locatdino.ssl.dino_module import DINOModule
from locatdino.ssl.export import export_backbone
from locatdino.ssl.fsdp import DINOFSDPStrategy, DINOWrapPolicy
from locatdino.ssl.grad_clip import clip_grad_per_tensor_
from locatdino.ssl.head import DINOHead
from locatdino.ssl.ibot import BlockMasking, IBOTModule, IBOTPatchLoss, KoLeoLoss
from locatdino.ssl.objective import PretrainingObjective
from locatdino.ssl.schedules import DINOSchedules, cosine_schedule, scaled_lr, warmup_constant_schedule
from locatdino.ssl.supervised_module import SupervisedModule
from locatdino.ssl.teacher_update import update_teacher

__all__ = [
    "AtomicCheckpointIO",
    "BlockMasking",
    "CollapseMonitor",
    "DINOHead",
    "DINOLoss",
    "DINOFSDPStrategy",
    "DINOModule",
    "DINOSchedules",
    "DINOWrapPolicy",
    "IBOTModule",
    "IBOTPatchLoss",
    "KoLeoLoss",
    "PretrainingObjective",
    "SupervisedModule",
    "atomic_torch_save",
    "clip_grad_per_tensor_",
    "cosine_schedule",
    "export_backbone",
    "scaled_lr",
    "teacher_entropies",
    "update_teacher",
    "warmup_constant_schedule",
]
