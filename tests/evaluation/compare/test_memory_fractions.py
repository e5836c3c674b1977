"""``compare --memory-fractions``: a fraction whose memory cannot hold k patches is refused up front."""

from fractions import Fraction

import pytest

from locatdino.evaluation.compare import cli as compare_cli
from locatdino.evaluation.compare.measure import memory_sizes


def test_a_fraction_below_k_patches_is_refused_before_any_model_runs(tmp_path, monkeypatch):
    """``--memory-fractions 1/64`` (fewer memory patches than k) was left out of the report without a word."""
    monkeypatch.setattr(compare_cli, "evaluate_model", lambda *a, **k: pytest.fail("a model ran"))
    argv = [
        "--model",
        "vit_tiny_patch16_224",
        "--out",
        str(tmp_path / "c"),
        "--num-train",
        "6",
        "--num-val",
        "1",
        "--scene-size",
        "64",
        "--input-size",
        "64",
        "--k",
        "10",
        "--no-linprobe",
    ]
    with pytest.raises(SystemExit) as refused:
        compare_cli.main([*argv, "--memory-fractions", "1/64", "1/4"])
    # 6 views x (64 / 16)² = 96 patches at most; 1/64 of them is 1
    assert str(refused.value) == (
        "locatdino compare: --memory-fractions 1/64: at most 1 memory patches (of 96 at "
        "patch 16), fewer than --k 10 or than one per memory view (6): use a larger "
        "fraction, or a smaller --k"
    )
    assert not (tmp_path / "c").exists()
    assert memory_sizes([Fraction(1, 4)], 96, 6, 10) == [(Fraction(1, 4), 24)]  # 1/4 passes the same rule


def test_default_fractions_that_cannot_be_scored_are_left_out_with_a_note(tmp_path, monkeypatch, capsys):
    ran = []

    def stop(spec, backbone, train, val, cfg, fractions, *args, **kwargs):
        ran.append(fractions)
        raise SystemExit("stop")

    monkeypatch.setattr(compare_cli, "evaluate_model", stop)
    with pytest.raises(SystemExit, match="^stop$"):
        compare_cli.main(
            [
                "--model",
                "vit_tiny_patch16_224",
                "--out",
                str(tmp_path / "c"),
                "--num-train",
                "3",
                "--num-val",
                "1",
                "--scene-size",
                "32",
                "--input-size",
                "32",
                "--k",
                "10",
                "--no-linprobe",
            ]
        )
    # 3 views x (32 / 16)² = 12 patches: 1/16 keeps 0, 1/4 keeps 3; neither reaches k 10
    assert ran == [[Fraction(1)]]
    err = capsys.readouterr().err
    assert (
        "[compare] note: default memory fraction 1/16 left out: at most 0 memory patches (of 12 at patch 16), "
        "fewer than --k 10 or than one per memory view (3)" in err
    )
    assert "[compare] note: default memory fraction 1/4 left out: at most 3 memory patches" in err
