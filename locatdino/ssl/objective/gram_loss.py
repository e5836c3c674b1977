"""DINOv3's Gram loss (Siméoni et al. 2025, "DINOv3", §4.2; facebookresearch/dinov3
``dinov3/loss/gram_loss.py``; docs/pretraining.md, "Gram anchoring").

Long DINO training blurs the patch features: their similarities to each other drift while the
class token keeps improving. The Gram loss pulls the student's patch-similarity (Gram) matrix
towards that of an earlier network, the Gram teacher: ``MSE(X_s X_sᵀ, X_t X_tᵀ)`` on L2-normalised
patch features, per image or over the whole batch.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TOKENS_USED = ("all", "masked", "unmasked")


class GramLoss(nn.Module):
    """Mean squared difference of the student's and the Gram teacher's patch-similarity matrices.

    Both inputs are cast to fp32 (autocast is off inside: a bf16 Gram matrix of unit vectors has
    errors of ~4e-3, the size of what the loss measures late in training); with ``apply_norm`` each
    token is L2-normalised (the teacher's first, as in the reference). ``G = X Xᵀ`` per image
    (``img_level``: ``[B, N, N]``) or over every token of the batch (``[B·N, B·N]``); the MSE is the
    mean over all entries.

    Args:
        apply_norm: L2-normalise each token before the products (DINOv3 ``gram.normalized``).
        img_level: the default of :meth:`forward`'s ``img_level`` (the reference stores this
            argument without using it; here it is the default when ``forward`` is not told).
        remove_neg: set the negative entries of both matrices to 0.
        remove_only_teacher_neg: set the teacher's negative entries to 0 and leave the student's
            as they are. The reference then masks the student where ``student < 0 & teacher < 0``,
            but after the teacher's negatives were zeroed, so that mask is always empty: this is
            its behaviour. Exclusive with ``remove_neg``.
        tokens_used: ``"all"`` patch tokens, or only the ``"masked"`` / ``"unmasked"`` ones of
            iBOT's masks (then :meth:`forward` needs ``masks``, and the loss is batch-level).
    """

    def __init__(
        self,
        apply_norm: bool = True,
        img_level: bool = True,
        remove_neg: bool = True,
        remove_only_teacher_neg: bool = False,
        tokens_used: Literal["all", "masked", "unmasked"] = "all",
    ) -> None:
        super().__init__()
        if remove_neg and remove_only_teacher_neg:
            raise ValueError("GramLoss: remove_neg and remove_only_teacher_neg are exclusive (set one of them)")
        if tokens_used not in TOKENS_USED:
            raise ValueError(f"GramLoss: tokens_used must be one of {', '.join(TOKENS_USED)}, got {tokens_used!r}")
        if tokens_used != "all" and img_level:
            raise ValueError(
                f"GramLoss: tokens_used {tokens_used!r} selects a different number of tokens per image, "
                "so the loss is batch-level: set img_level false"
            )
        self.apply_norm = apply_norm
        self.img_level = img_level
        self.remove_neg = remove_neg
        self.remove_only_teacher_neg = remove_only_teacher_neg
        self.tokens_used = tokens_used

    def forward(
        self,
        student_feats: Tensor,
        teacher_feats: Tensor,
        img_level: bool | None = None,
        masks: Tensor | None = None,
    ) -> Tensor:
        """Scalar loss.

        Args:
            student_feats: ``[B, N, D]`` patch features of the student (or ``[M, D]`` already
                flattened / selected when not ``img_level``).
            teacher_feats: the Gram teacher's, the same shape.
            img_level: Gram matrices per image, else over the batch (``None``: the constructor's).
            masks: ``[B, N]`` bool, iBOT's masked patches; needed when ``tokens_used`` is not
                ``"all"``, ignored otherwise.
        """
        img_level = self.img_level if img_level is None else img_level
        if student_feats.shape != teacher_feats.shape:
            raise ValueError(
                f"GramLoss: student features {tuple(student_feats.shape)} and teacher features "
                f"{tuple(teacher_feats.shape)} differ in shape"
            )
        if img_level and student_feats.ndim != 3:
            raise ValueError(f"GramLoss: img_level needs [B, N, D] features, got {tuple(student_feats.shape)}")
        if self.tokens_used != "all":
            if masks is None:
                raise ValueError(f"GramLoss: tokens_used {self.tokens_used!r} needs the masks")
            keep = masks if self.tokens_used == "masked" else ~masks
            student_feats, teacher_feats = student_feats[keep], teacher_feats[keep]
        with torch.autocast(student_feats.device.type, enabled=False):
            target_sim = self._similarities(teacher_feats.float(), img_level)
            student_sim = self._similarities(student_feats.float(), img_level)
            if self.remove_neg:
                target_sim = target_sim.clamp_min(0.0)
                student_sim = student_sim.clamp_min(0.0)
            elif self.remove_only_teacher_neg:
                target_sim = target_sim.clamp_min(0.0)
            return F.mse_loss(student_sim, target_sim)

    def _similarities(self, feats: Tensor, img_level: bool) -> Tensor:
        """``X Xᵀ`` per image (``[B, N, N]``) or over the flattened batch (``[B·N, B·N]``)."""
        if self.apply_norm:
            feats = F.normalize(feats, dim=-1)
        if not img_level and feats.ndim == 3:
            feats = feats.flatten(0, 1)
        return feats @ feats.transpose(-1, -2)
