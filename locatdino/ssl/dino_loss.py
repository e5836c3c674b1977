"""The DINO self-distillation loss (Caron et al., ICCV 2021, Eq. 1 and Alg. 1; SPEC §2)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


class DINOLoss(nn.Module):
    """Cross-entropy between sharpened, centred teacher targets and student predictions.

    Views are view-major: ``[V, B, K]`` with ``V`` views of ``B`` images over ``K`` prototypes.
    The teacher sees the ``V_t`` global views; the student sees all ``V_s`` views, and its first
    ``V_t`` views are the teacher's views in the same order, so pair ``(t, s)`` with ``t == s`` is
    the same crop and is left out (18 pairs for 2 global + 8 local crops).

    The teacher-target computation (centring, sharpening) is :meth:`teacher_targets`, apart from
    the cross-entropy (:meth:`forward`), as in DINOv2: callers compute targets once under
    ``no_grad`` and may log their entropy. :meth:`update_center` then moves the centre towards the
    batch mean of the teacher logits, averaged over every rank.

    Args:
        out_dim: ``K``, the number of prototypes (head output dimension).
        student_temp: ``τ_s`` (0.1 in the reference).
        center_momentum: EMA momentum of the centre (0.9 in the reference).
    """

    center: Tensor

    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(out_dim))

    @torch.no_grad()
    def teacher_targets(self, teacher_out: Tensor, temp: float) -> Tensor:
        """``softmax((t − center) / τ_t)`` in fp32: ``[V_t, B, K]`` logits → probabilities."""
        return F.softmax((teacher_out.float() - self.center) / temp, dim=-1)

    def forward(self, student_out: Tensor, teacher_probs: Tensor) -> Tensor:
        """Mean over cross-view pairs of ``−Σ_k p_t log softmax(s / τ_s)``, averaged over the batch.

        Args:
            student_out: student logits ``[V_s, B, K]``.
            teacher_probs: teacher targets ``[V_t, B, K]`` from :meth:`teacher_targets`.
        """
        v_t, v_s = teacher_probs.shape[0], student_out.shape[0]
        if teacher_probs.shape[1:] != student_out.shape[1:] or v_s < max(v_t, 2):
            raise ValueError(
                f"DINOLoss: need student [V_s, B, K] with V_s >= V_t and at least one cross-view pair, "
                f"got student {tuple(student_out.shape)} and teacher {tuple(teacher_probs.shape)}"
            )
        log_q = F.log_softmax(student_out.float() / self.student_temp, dim=-1)
        # Σ_t Σ_s p_t·log q_s = (Σ_t p_t)·(Σ_s log q_s); then drop the V_t same-view pairs.
        all_pairs = (teacher_probs.sum(0) * log_q.sum(0)).sum()
        same_view = (teacher_probs * log_q[:v_t]).sum()
        n_pairs = v_t * v_s - v_t
        return -(all_pairs - same_view) / (n_pairs * student_out.shape[1])

    @torch.no_grad()
    def update_center(self, teacher_out: Tensor) -> None:
        """``center ← m·center + (1 − m)·mean(teacher_out)``, the mean over views, images and ranks.

        The sum and the count are all-reduced together, so ranks with different batch sizes
        still give the exact global mean.
        """
        flat = teacher_out.float().flatten(0, -2)
        stats = torch.cat([flat.sum(0), flat.new_tensor([flat.shape[0]])])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        batch_center = stats[:-1] / stats[-1]
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1.0 - self.center_momentum)
