"""``compare --memory-fractions``: a fraction whose memory cannot hold k patches is refused up front."""

from fractions import Fraction

import pytest

from locatdino.comparison import cli as compare_cli
from locatdino.comparison.measure import memory_sizes


def test_a_fraction_below_k_patches_is_refused_before_any_model_runs(tmp_path, monkeypatch):
    """``--memory-fractions 1/64`` (fewer memory patches than k) was left out of the report without a word."""
    monkeypatch.setattr(compare_cli, "compare", lambda *a, **k: pytest.fail("a model ran"))
    argv = ["--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "c"), "--num-train", "6", "--num-val", "1",
            "--scene-size", "64", "--input-size", "64", "--k", "10", "--no-linprobe"]
    with pytest.raises(SystemExit) as refused:
        compare_cli.main([*argv, "--memory-fractions", "1/64", "1/4"])
    # 6 views x (64 / 16)² = 96 patches at most; 1/64 of them is 1
    assert str(refused.value) == ("locatdino compare: --memory-fractions 1/64: at most 1 memory patches (of 96 at "
                                  "patch 16), fewer than --k 10 or than one per memory view (6): use a larger "
                                  "fraction, or a smaller --k")
    assert not (tmp_path / "c").exists()
    assert memory_sizes([Fraction(1, 4)], 96, 6, 10) == [(Fraction(1, 4), 24)]  # 1/4 passes the same rule
