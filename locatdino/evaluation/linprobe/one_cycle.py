"""The optimiser and learning-rate schedule of the dense linear probe (docs/evaluation.md).

AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 0.01 on every parameter) with a per-iteration
OneCycle schedule: linear warm-up over the first 25 % of the iterations from lr / 1e4 to lr, then
linear annealing to lr / 1e4 at the last iteration. torch's ``OneCycleLR`` starts at
``max_lr / div_factor`` and ends at ``start / final_div_factor``, so ``div_factor = 1e4`` and
``final_div_factor = 1`` give the paper's ends. Its default momentum cycling (AdamW's beta1
between 0.85 and 0.95) is turned off: the paper keeps betas fixed.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR

LR = 1e-3
BETAS = (0.9, 0.999)
WEIGHT_DECAY = 0.01
WARMUP_FRACTION = 0.25
DIV_FACTOR = 1e4  # start lr = end lr = lr / DIV_FACTOR
MIN_STEPS = 5  # torch's OneCycleLR divides by the warm-up length 0.25 × steps − 1: 0 at 4 steps


def probe_optimizer(
    params: Iterable[nn.Parameter], lr: float = LR, weight_decay: float = WEIGHT_DECAY
) -> torch.optim.AdamW:
    """AdamW with the paper's betas."""
    return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=weight_decay)


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, total_steps: int) -> OneCycleLR:
    """The paper's OneCycle; call ``step()`` once per iteration, after ``optimizer.step()``."""
    if total_steps < MIN_STEPS:
        raise ValueError(f"the OneCycle schedule needs at least {MIN_STEPS} iterations, got {total_steps}")
    return OneCycleLR(
        optimizer,
        max_lr=lr,
        total_steps=total_steps,
        pct_start=WARMUP_FRACTION,
        anneal_strategy="linear",
        div_factor=DIV_FACTOR,
        final_div_factor=1.0,
        cycle_momentum=False,
    )
