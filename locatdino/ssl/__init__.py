"""Pretraining, one sub-package per role.

The objectives, as LightningModules: :mod:`~locatdino.ssl.dino` (DINO self-distillation),
:mod:`~locatdino.ssl.ibot` (DINO plus masked-patch prediction), :mod:`~locatdino.ssl.distill`
(distillation from a frozen teacher) and :mod:`~locatdino.ssl.supervised` (classification), on
what they share in :mod:`~locatdino.ssl.objective` (the base class, head, schedules, teacher EMA,
collapse monitor, gradient clipping, start weights, FSDP wrapping). The ``fit`` command in :mod:`~locatdino.ssl.run`
(CLI, checks, restarts, signals, timeouts, checkpoint files), its progress, curves and trackers in
:mod:`~locatdino.ssl.logs`, and ``export`` in :mod:`~locatdino.ssl.export`.

The names below are the stable public paths: recipes name ``locatdino.ssl.DINOModule``,
``locatdino.ssl.DistillModule``, ``locatdino.ssl.DINOFSDPStrategy``,
``locatdino.ssl.AtomicCheckpointIO``. Importing the package registers the Lightning strategy name
``dino_fsdp`` (:class:`DINOFSDPStrategy`).
"""

from locatdino.ssl.dino import DINOLoss, DINOModule
from locatdino.ssl.distill import DistillLoss, DistillModule
from locatdino.ssl.export.cli import export_backbone
from locatdino.ssl.ibot import BlockMasking, IBOTModule, IBOTPatchLoss, KoLeoLoss
from locatdino.ssl.objective import (
    CollapseMonitor,
    DINOFSDPStrategy,
    DINOHead,
    DINOSchedules,
    DINOWrapPolicy,
    GramLoss,
    PretrainingObjective,
    clip_grad_per_tensor_,
    cosine_schedule,
    scaled_lr,
    teacher_entropies,
    update_teacher,
    warmup_constant_schedule,
)
from locatdino.ssl.run.checkpoint_io import AtomicCheckpointIO, atomic_torch_save
from locatdino.ssl.supervised import SupervisedModule

__all__ = [
    "AtomicCheckpointIO",
    "BlockMasking",
    "CollapseMonitor",
    "DINOHead",
    "DINOLoss",
    "DINOFSDPStrategy",
    "DINOModule",
    "DINOSchedules",
    "DistillLoss",
    "DistillModule",
    "DINOWrapPolicy",
    "GramLoss",
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
