"""iBOT's masked-patch loss (Zhou et al., ICLR 2022, Eq. 2; DINOv2's ``iBOTPatchLoss``; docs/pretraining.md)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from locatdino.ssl.dino.loss import DINOLoss, at_least_fp32
from locatdino.ssl.ibot.sinkhorn import sinkhorn_knopp

CENTERINGS = ("center", "sinkhorn_knopp")


class IBOTPatchLoss(DINOLoss):
    """Cross-entropy between the teacher's targets for a crop's patch, seen unmasked, and the
    student's prediction for the same patch of the same crop, seen masked.

    Only masked patches count. Each crop's term is the mean over its masked patches; the loss is
    the sum of those terms divided by the number of crops, masked or not (each masked patch
    weighted by 1 / its crop's masked count, as DINOv2 does; iBOT's per-image mean over a batch
    where unmasked images contribute 0 is the same number).

    The teacher's targets are DINO's — centred with their own running centre (a separate
    :class:`DINOLoss` centre over the patch prototypes, same momentum rule and gradient-accumulation
    protocol, docs/pretraining.md) and sharpened by the teacher patch temperature — or, with
    ``centering="sinkhorn_knopp"``, balanced by :func:`~locatdino.ssl.ibot.sinkhorn.sinkhorn_knopp`
    (no centre is used or updated then).

    Args:
        out_dim: ``K``, the patch head's prototypes.
        student_temp: ``τ_s`` (0.1).
        center_momentum: EMA momentum of the patch centre (0.9).
        centering: ``"center"`` (iBOT) or ``"sinkhorn_knopp"`` (DINOv2's option).
        sinkhorn_iterations: Sinkhorn–Knopp iterations (3).
    """

    def __init__(
        self,
        out_dim: int,
        student_temp: float = 0.1,
        center_momentum: float = 0.9,
        centering: Literal["center", "sinkhorn_knopp"] = "center",
        sinkhorn_iterations: int = 3,
    ) -> None:
        super().__init__(out_dim, student_temp, center_momentum)
        if centering not in CENTERINGS:
            raise ValueError(f"IBOTPatchLoss: centering must be one of {CENTERINGS}, got {centering!r}")
        self.centering = centering
        self.sinkhorn_iterations = sinkhorn_iterations

    @property
    def uses_center(self) -> bool:
        """Whether the targets subtract the running centre (which then needs its updates)."""
        return self.centering == "center"

    @torch.no_grad()
    def teacher_targets(self, teacher_out: Tensor, temp: float) -> Tensor:
        """Targets ``[M, K]`` of the teacher's patch logits ``[M, K]`` at the masked positions."""
        if self.uses_center:
            return super().teacher_targets(teacher_out, temp)
        return sinkhorn_knopp(teacher_out, temp, self.sinkhorn_iterations)

    def forward(self, student_out: Tensor, teacher_probs: Tensor, masks: Tensor) -> Tensor:  # type: ignore[override]
        """The loss of one micro-batch.

        Args:
            student_out: student patch logits ``[M, K]`` at the masked positions, in the order of
                ``masks.nonzero()`` (crop-major, then row-major over the grid: ``tokens[masks]``).
            teacher_probs: teacher targets ``[M, K]`` at the same positions (:meth:`teacher_targets`).
            masks: ``[C, N]`` bool, the masks of all ``C`` global crops (``M = masks.sum()``).
        """
        m = int(masks.sum())
        if student_out.shape != teacher_probs.shape or student_out.shape[0] != m or masks.ndim != 2:
            raise ValueError(
                f"IBOTPatchLoss: need student and teacher [M, K] with M = masks.sum() = {m} and "
                f"masks [C, N], got student {tuple(student_out.shape)}, teacher "
                f"{tuple(teacher_probs.shape)}, masks {tuple(masks.shape)}"
            )
        log_q = F.log_softmax(at_least_fp32(student_out) / self.student_temp, dim=-1)
        per_patch = -(teacher_probs * log_q).sum(-1)
        counts = masks.sum(-1, keepdim=True).expand_as(masks)[masks]  # each patch's crop count
        return (per_patch / counts.to(per_patch.dtype)).sum() / masks.shape[0]
