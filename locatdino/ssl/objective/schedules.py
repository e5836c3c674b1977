"""Per-iteration DINO schedules, computed once as arrays and indexed by step (docs/pretraining.md).

As in the DINO and DINOv2 references, every schedule is a NumPy array with one value per
optimizer step, so that resuming only needs the step counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REFERENCE_BATCH = 256  # lr = base_lr × global_batch / 256 (Goyal et al. 2017, as in DINO)


def scaled_lr(base_lr: float, global_batch: int, reference_batch: int = REFERENCE_BATCH) -> float:
    """The linear batch-size scaling rule: ``base_lr × global_batch / reference_batch`` (256 in
    DINO, 512 in timm's / DeiT's supervised recipe)."""
    return base_lr * global_batch / reference_batch


def cosine_schedule(
    base: float, final: float, total_steps: int, warmup_steps: int = 0, warmup_start: float = 0.0
) -> np.ndarray:
    """``[total_steps]``: linear ``warmup_start → base`` over ``warmup_steps`` (both ends included),
    then ``final + ½(base − final)(1 + cos(π i / n))`` over the ``n`` remaining steps (DINO's
    ``cosine_scheduler``; the last value stays just above ``final``). A warm-up longer than the
    run is cut, not compressed."""
    warmup = np.linspace(warmup_start, base, warmup_steps)[:total_steps]
    n = total_steps - len(warmup)
    cosine = final + 0.5 * (base - final) * (1 + np.cos(np.pi * np.arange(n) / max(n, 1)))
    return np.concatenate([warmup, cosine])


def warmup_constant_schedule(start: float, value: float, total_steps: int, warmup_steps: int) -> np.ndarray:
    """``[total_steps]``: linear ``start → value`` over ``warmup_steps``, then constant ``value``
    (the teacher-temperature warm-up, per iteration instead of the reference's per epoch)."""
    warmup = np.linspace(start, value, warmup_steps)[:total_steps]
    return np.concatenate([warmup, np.full(total_steps - len(warmup), value)])


def warmup_cosine_hold_schedule(
    start: float, peak: float, end: float, total_steps: int, warmup_steps: int, cosine_steps: int | None = None
) -> np.ndarray:
    """``[total_steps]``: linear ``start → peak`` over ``warmup_steps`` (``peak`` itself not reached),
    a half cosine ``peak → end`` over ``cosine_steps`` (both ends included; ``None``: the rest of
    the run), then ``end`` (DINOv3's ``linear_warmup_cosine_decay``, its Gram-loss weight
    schedule). ``ValueError`` when the warm-up and cosine do not fit the run."""
    cosine_steps = total_steps - warmup_steps if cosine_steps is None else cosine_steps
    if warmup_steps < 0 or cosine_steps < 0 or warmup_steps + cosine_steps > total_steps:
        raise ValueError(
            f"a schedule of {warmup_steps} warm-up and {cosine_steps} cosine steps does not fit "
            f"a run of {total_steps} steps"
        )
    warmup = np.linspace(start, peak, warmup_steps, endpoint=False)
    cosine = end + (peak - end) * (1 + np.cos(np.linspace(0, np.pi, cosine_steps))) / 2
    return np.concatenate([warmup, cosine, np.full(total_steps - warmup_steps - cosine_steps, end)])


@dataclass(frozen=True)
class DINOSchedules:
    """The four per-step schedules of a run; :meth:`at` clamps steps past the end to the last value."""

    lr: np.ndarray
    weight_decay: np.ndarray
    teacher_momentum: np.ndarray
    teacher_temp: np.ndarray

    @classmethod
    def build(
        cls,
        *,
        total_steps: int,
        steps_per_epoch: float,
        global_batch: int,
        base_lr: float,
        min_lr: float,
        warmup_epochs: float,
        weight_decay: float,
        weight_decay_end: float,
        momentum_teacher: float,
        momentum_teacher_end: float,
        teacher_temp: float,
        warmup_teacher_temp: float,
        warmup_teacher_temp_epochs: float,
    ) -> DINOSchedules:
        """Epoch-valued settings are converted to steps with ``steps_per_epoch`` (rounded)."""
        if total_steps < 1 or steps_per_epoch <= 0:
            raise ValueError(
                f"DINOSchedules: need total_steps >= 1 and steps_per_epoch > 0, got {total_steps} and {steps_per_epoch}"
            )

        def steps(epochs: float) -> int:
            return int(round(epochs * steps_per_epoch))

        return cls(
            lr=cosine_schedule(scaled_lr(base_lr, global_batch), min_lr, total_steps, steps(warmup_epochs)),
            weight_decay=cosine_schedule(weight_decay, weight_decay_end, total_steps),
            teacher_momentum=cosine_schedule(momentum_teacher, momentum_teacher_end, total_steps),
            teacher_temp=warmup_constant_schedule(
                warmup_teacher_temp, teacher_temp, total_steps, steps(warmup_teacher_temp_epochs)
            ),
        )

    def __len__(self) -> int:
        return len(self.lr)

    def at(self, step: int) -> dict[str, float]:
        """Values for optimizer step ``step`` (0-based): ``lr``, ``weight_decay``, ``teacher_momentum``,
        ``teacher_temp``."""
        i = min(max(step, 0), len(self) - 1)
        return {
            "lr": float(self.lr[i]),
            "weight_decay": float(self.weight_decay[i]),
            "teacher_momentum": float(self.teacher_momentum[i]),
            "teacher_temp": float(self.teacher_temp[i]),
        }
