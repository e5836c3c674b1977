"""Teacher-output entropy and a collapse warning (docs/pretraining.md: "collapse to a uniform output").

DINO avoids two trivial solutions (Caron et al. 2021, §5.3): a *uniform* teacher (every image
gets the flat distribution: per-image entropy → ln K, centring dominates) and a *single
prototype* for every image (the batch-mean distribution's entropy → 0, sharpening dominates).
A healthy run has a low per-image entropy and a high batch-mean entropy.
"""

from __future__ import annotations

import math

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

ENTROPY_KEY = "teacher/entropy"
MARGINAL_ENTROPY_KEY = "teacher/batch_entropy"


def teacher_entropies(probs: Tensor) -> tuple[Tensor, Tensor]:
    """``probs [..., K]`` → (mean per-image entropy, entropy of the mean distribution), in nats."""
    flat = probs.detach().float().flatten(0, -2)
    per_image = -(flat * flat.clamp_min(1e-12).log()).sum(-1).mean()
    mean = flat.mean(0)
    marginal = -(mean * mean.clamp_min(1e-12).log()).sum()
    return per_image, marginal


class CollapseMonitor(Callback):
    """Warn when the logged teacher entropies show collapse for ``patience`` consecutive checks.

    Uniform collapse: per-image entropy ≥ (1 − tolerance)·ln K. Single-prototype collapse:
    batch-mean entropy ≤ tolerance·ln K. Reads the values the module logs under
    ``teacher/entropy`` and ``teacher/batch_entropy``; ``K`` is ``pl_module.out_dim``.
    Warns once per episode (again only after the run has recovered).

    The module logs them only every ``trainer.log_every_n_steps`` steps, and the metrics keep the
    last values in between: a check counts only values logged since the previous check
    (``pl_module.entropies_logged_at``), so ``patience`` is in logged values, never stale repeats.
    """

    def __init__(self, tolerance: float = 0.02, patience: int = 20, check_every_n_steps: int = 10) -> None:
        self.tolerance = tolerance
        self.patience = patience
        self.check_every_n_steps = check_every_n_steps
        self._streak = 0
        self._counted_step: int | None = None  # entropies_logged_at of the values counted last

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step % self.check_every_n_steps:
            return
        metrics, logged_at = trainer.callback_metrics, getattr(pl_module, "entropies_logged_at", None)
        if ENTROPY_KEY not in metrics or MARGINAL_ENTROPY_KEY not in metrics or logged_at == self._counted_step:
            return
        self._counted_step = logged_at
        ln_k = math.log(pl_module.out_dim)
        entropy, marginal = float(metrics[ENTROPY_KEY]), float(metrics[MARGINAL_ENTROPY_KEY])
        kind = None
        if entropy >= (1 - self.tolerance) * ln_k:
            kind = "uniform teacher output (per-image entropy ≈ ln K)"
        elif marginal <= self.tolerance * ln_k:
            kind = "one prototype for every image (batch-mean entropy ≈ 0)"
        self._streak = self._streak + 1 if kind else 0
        if self._streak == self.patience:
            rank_zero_warn(
                f"DINO collapse at step {trainer.global_step}: {kind}; entropy {entropy:.3f}, batch entropy "
                f"{marginal:.3f}, ln K {ln_k:.3f}. Usual fixes: lower teacher_temp, raise the teacher "
                "momentum, norm_last_layer=true, fp32/bf16 instead of fp16, a smaller out_dim on small data."
            )

    def state_dict(self) -> dict[str, int]:
        return {"streak": self._streak}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._streak = state_dict["streak"]
