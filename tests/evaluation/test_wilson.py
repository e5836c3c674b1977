import math

import pytest

from locatdino.evaluation.wilson import wilson_interval


def _wilson(k, n, z=1.959963984540054):
    """Wilson's score interval in closed form (Wilson 1927)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(14, 50), (0, 16), (16, 16), (1, 3), (480, 1000)])
def test_wilson_interval_matches_the_closed_form(k, n):
    low, high = wilson_interval(k, n)
    assert (low, high) == pytest.approx(_wilson(k, n), abs=1e-12)
    assert 0 <= low <= k / n <= high <= 1


def test_more_test_images_narrow_the_interval_and_bad_counts_are_refused():
    narrow, wide = wilson_interval(140, 500), wilson_interval(14, 50)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 2
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        wilson_interval(5, 4)
