"""Distillation from a frozen teacher as a LightningModule (docs/pretraining.md, "Distillation from
a frozen teacher"; lightly-train's ``distillation`` method, the most asked shortcut to a small
model with a large release's features)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from locatdino.models.token_grid import token_grid
from locatdino.ssl.dino.module import DINOModule, StepLosses
from locatdino.ssl.distill.loss import DistillLoss
from locatdino.ssl.distill.teacher import FrozenTeacher

TEACHER_PREFIX = "distill_teacher."  # its keys, left out of every checkpoint
FINGERPRINT_KEY = "distill_teacher_fingerprint"


class DistillModule(DINOModule):
    """A student backbone (any timm ViT, LocAtViT included) trained to reproduce a frozen
    teacher's class and patch features, optionally beside DINO's loss.

    Per step the global crops ``[V_g, B, 3, H, W]`` go through the frozen teacher
    (:class:`~locatdino.ssl.distill.teacher.FrozenTeacher`: no gradient, eval mode, bf16 on CUDA)
    and through the student; the student's class embedding (``backbone(x)``: the class token
    after the final norm, after PRR for LocAtViT) and its patch tokens each go through a linear
    projection to the teacher's width (``projection.cls``, ``projection.patch``; trained with the
    student, truncated-normal init as lightly-train's) and are matched to the teacher's class
    embedding and its patch tokens, resampled to the student's token grid when the patches
    differ (:func:`~locatdino.ssl.distill.teacher.match_grid`), by :class:`DistillLoss`::

        distill_loss = D(P_cls s_cls, t_cls) + distill_patch_weight · D(P_patch s_patch, t_patch)
        loss = distill_loss_weight · distill_loss + dino_loss_weight · dino_loss

    Everything else is :class:`DINOModule`'s: the lr, weight-decay and momentum schedules,
    clipping, non-finite handling, gradient accumulation, and the EMA of the student, which is
    the evaluated and exported network (``teacher.backbone.*`` in the checkpoint, as every
    ``fit`` run: ``locatdino export`` and the evaluations read it unchanged; ``momentum_teacher``
    and ``momentum_teacher_end`` 0 export the student itself). With ``dino_loss_weight`` 0 (the
    default) DINO's forwards are skipped and the heads stay as built (frozen), so they cost
    nothing but memory; the local crops are then not read (the recipes make none).

    Checkpoints leave the frozen teacher out (a ViT-L teacher would make every checkpoint of a
    ViT-S run several times larger); they keep a fingerprint of its weights instead, and a resumed
    run, which loads the teacher from ``model.teacher`` again, refuses a file whose weights differ
    since, in one line.

    Args:
        teacher: the frozen teacher, ``NAME:FILE`` (required): a timm / LocAtViT model name and
            its weights in any format ``locatdino.models.create_backbone`` reads (a DINO, DINOv2
            or DINOv3 release, an export, a ``fit`` checkpoint's EMA teacher). A model without
            patch tokens, or weights of another architecture than NAME, are refused in one line.
        teacher_image_size: the side the teacher sees the crops at (``None``: theirs; a side its
            patch does not divide is taken to the nearest multiple).
        distill_distance: ``"cosine"`` or ``"mse"`` (:class:`DistillLoss`).
        distill_loss_weight: weight of the distillation term.
        distill_patch_weight: weight of the patch term beside the class term (lightly-train's
            ``loss_local_weight``, 1).
        dino_loss_weight: weight of DINO's loss (0: off).
        **kwargs: :class:`DINOModule`'s arguments (its ``gram`` option excepted).
    """

    loss_name = "distillation"

    def __init__(
        self,
        teacher: str | None = None,
        teacher_image_size: int | None = None,
        distill_distance: Literal["cosine", "mse"] = "cosine",
        distill_loss_weight: float = 1.0,
        distill_patch_weight: float = 1.0,
        dino_loss_weight: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if teacher is None:
            raise ValueError("model.teacher: DistillModule needs its frozen teacher, NAME:FILE")
        if kwargs.get("gram") is not None:
            raise ValueError("model.gram: Gram anchoring is an option of DINO and iBOT, not of DistillModule")
        loss = DistillLoss(distill_distance)  # (its one-line error before any model is built)
        super().__init__(**kwargs)
        self.distill_loss = loss
        self.distill_teacher = FrozenTeacher(teacher, teacher_image_size)
        embed_dim, teacher_dim = self.student["backbone"].num_features, self.distill_teacher.embed_dim
        self.projection = nn.ModuleDict(
            {"cls": nn.Linear(embed_dim, teacher_dim), "patch": nn.Linear(embed_dim, teacher_dim)}
        )
        for linear in self.projection.values():
            nn.init.trunc_normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)
        self._no_weight_decay |= {n for n, p in self.projection.named_parameters(prefix="projection") if p.ndim <= 1}
        if dino_loss_weight == 0:
            self.student["head"].requires_grad_(False)  # untrained: no optimizer state, no DDP bucket
        if self.hparams.compile:
            self.distill_teacher.backbone.compile(dynamic=False)
        self.final_tokens("student")

    def trained_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [*super().trained_parameters(), *self.projection.named_parameters(prefix="projection")]

    def step_losses(self, batch: dict[str, Tensor], values: dict[str, float]) -> StepLosses:
        """The distillation loss of the global crops (plus DINO's, when weighted)."""
        h = self.hparams
        crops = batch["global"]
        images = crops.flatten(0, 1)
        grid = token_grid(self.student["backbone"], tuple(images.shape[-2:]))
        t_cls, t_patches = self.distill_teacher(images, grid)
        s_cls, s_patches = self.final_tokens("student")(self.student["backbone"], images)
        cls_loss = self.distill_loss(self.projection["cls"](s_cls), t_cls)
        patch_loss = self.distill_loss(self.projection["patch"](s_patches), t_patches)
        distill = cls_loss + h.distill_patch_weight * patch_loss
        parts: dict[str, Tensor | float] = {
            "distill_loss": distill.detach(),
            "distill_cls_loss": cls_loss.detach(),
            "distill_patch_loss": patch_loss.detach(),
        }
        loss = h.distill_loss_weight * distill
        if h.dino_loss_weight == 0:
            return StepLosses(loss, None, [], parts)
        with torch.no_grad():
            teacher_out = self.forward_branch(self.teacher, [crops])
            teacher_probs = self.dino_loss.teacher_targets(teacher_out, values["teacher_temp"])
        embeddings = [s_cls]  # the global crops' forward is the one above
        if "local" in batch and batch["local"].shape[0] > 0:
            embeddings.append(self.student["backbone"](batch["local"].flatten(0, 1)))
        student_out = self.student["head"](torch.cat(embeddings)).unflatten(0, (-1, crops.shape[1]))
        dino = self.dino_loss(student_out, teacher_probs)
        parts["dino_loss"] = dino.detach()
        return StepLosses(loss + h.dino_loss_weight * dino, teacher_probs, [(self.dino_loss, teacher_out)], parts)

    def centred_losses(self) -> tuple:
        return (self.dino_loss,) if self.hparams.dino_loss_weight else ()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(TEACHER_PREFIX)
        }
        checkpoint[FINGERPRINT_KEY] = self.distill_teacher.fingerprint

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Put the teacher, loaded from ``model.teacher``, back into the state the run resumes from,
        once its weights are those the checkpoint was trained with."""
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(FINGERPRINT_KEY)
        if saved is not None and saved != self.distill_teacher.fingerprint:
            raise ValueError(
                f"model.teacher {self.hparams.teacher}: not the weights this run was trained with "
                "(the file changed since the checkpoint was saved): resume with the run's teacher file"
            )
        checkpoint["state_dict"].update({TEACHER_PREFIX + k: v for k, v in self.distill_teacher.state_dict().items()})
