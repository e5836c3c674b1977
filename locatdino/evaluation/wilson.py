"""Binomial confidence interval of a top-1 accuracy (Wilson score interval, SciPy's ``binomtest``).

A probe's top-1 on ``n`` test images is a binomial proportion; on the built-in scenes' 50 test
images one image is 2 points, and the 95 % interval of 28 % runs from 17 % to 42 %. Wilson's
interval keeps its nominal coverage at small ``n`` and stays inside [0, 1], where the normal
approximation p ± z·√(p(1−p)/n) does neither.
"""

from __future__ import annotations

from scipy.stats import binomtest


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """``(low, high)`` in [0, 1] for ``successes`` right answers out of ``trials``."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"binomial interval needs 0 <= successes <= trials >= 1, got {successes} of {trials}")
    ci = binomtest(int(successes), int(trials)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)
