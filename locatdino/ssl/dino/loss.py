"""The DINO self-distillation loss (Caron et al., ICCV 2021, Eq. 1 and Alg. 1; docs/pretraining.md)."""

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
    batch mean of the teacher logits, averaged over every rank; with gradient accumulation,
    :meth:`accumulate_center` per micro-batch and :meth:`apply_center_update` once per optimizer
    step.

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
        self._pending: Tensor | None = None  # [K + 1]: summed teacher logits and their count

    @torch.no_grad()
    def teacher_targets(self, teacher_out: Tensor, temp: float) -> Tensor:
        """``softmax((t − center) / τ_t)`` in fp32 (or fp64): ``[V_t, B, K]`` logits → probabilities."""
        return F.softmax((at_least_fp32(teacher_out) - self.center) / temp, dim=-1)

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
        log_q = F.log_softmax(at_least_fp32(student_out) / self.student_temp, dim=-1)
        # Σ_t Σ_s p_t·log q_s = (Σ_t p_t)·(Σ_s log q_s); then drop the V_t same-view pairs.
        all_pairs = (teacher_probs.sum(0) * log_q.sum(0)).sum()
        same_view = (teacher_probs * log_q[:v_t]).sum()
        n_pairs = v_t * v_s - v_t
        return -(all_pairs - same_view) / (n_pairs * student_out.shape[1])

    @torch.no_grad()
    def accumulate_center(self, teacher_out: Tensor) -> None:
        """Add one micro-batch's teacher logits ``[V_t, B, K]`` to the pending centre update.

        With gradient accumulation every micro-batch's targets must use the centre from before
        the optimizer step, and the centre must move once per step by the mean over all its
        micro-batches, as one larger batch would (docs/pretraining.md): accumulate here, then
        :meth:`apply_center_update` after the step.
        """
        flat = at_least_fp32(teacher_out).flatten(0, -2)
        stats = torch.cat([flat.sum(0), flat.new_tensor([flat.shape[0]])])
        self._pending = stats if self._pending is None else self._pending + stats

    @torch.no_grad()
    def apply_center_update(self) -> None:
        """``center ← m·center + (1 − m)·mean``, the mean of every teacher logit accumulated since
        the last update, over views, images, micro-batches and ranks.

        The sum and the count are all-reduced together, so ranks with different batch sizes
        still give the exact global mean. Every rank must call it the same number of times.
        """
        stats, self._pending = self._pending, None
        if stats is None:
            raise RuntimeError("DINOLoss.apply_center_update: no teacher output was accumulated")
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        if stats[-1] == 0:  # nothing was counted on any rank (iBOT: no masked patch): the centre stays
            return
        batch_center = stats[:-1] / stats[-1]
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1.0 - self.center_momentum)

    def discard_center_update(self) -> None:
        """Forget the accumulated teacher outputs (a skipped optimizer step)."""
        self._pending = None

    @torch.no_grad()
    def update_center(self, teacher_out: Tensor) -> None:
        """Accumulate ``teacher_out`` and apply the update at once (no gradient accumulation)."""
        self.accumulate_center(teacher_out)
        self.apply_center_update()


def at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in fp32, or as it is when already fp32 / fp64 (a 64-true run stays in fp64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
