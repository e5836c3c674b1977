"""``locatdino lincls --variant fast`` on 2 CPU ranks started by torchrun gives one process's numbers:
each rank encodes its share of the cached features, every rank trains on all of them, rank 0 writes."""

import pytest

from tests.evaluation.ranks_fixtures import SCENE_OPTIONS, one_and_two_ranks

LINCLS = [
    "lincls",
    "--variant",
    "fast",
    "--model",
    "vit_tiny_patch16_224",
    *SCENE_OPTIONS,
    "--lr-grid",
    "0.01",
    "0.1",
    "--epochs",
    "2",
    "--train-batch-size",
    "6",
    "--precision",
    "fp32",
    "--workers",
    "0",
    "--no-progress",
]


@pytest.mark.slow
def test_two_ranks_score_what_one_process_scores(tmp_path):
    one, two, done = one_and_two_ranks(LINCLS, tmp_path)
    assert (two["num_train"], two["num_val"], two["skipped"]) == (one["num_train"], one["num_val"], one["skipped"])
    assert two["lr"] == one["lr"]  # the same learning rate won on the hold-out
    # the cached features differ from one process's in the last float bits (other batches, one thread
    # per rank); a head trained 2 epochs on them moves a prediction only at a tie that close
    for row_one, row_two in zip(one["lr_table"], two["lr_table"], strict=True):
        assert abs(row_two["val_top1"] - row_one["val_top1"]) <= 100 / 9 + 1e-9
    for metric in ("top1", "top5"):
        values = [run["scores"][""][metric]["value"] for run in (one, two)]
        assert values == [None, None] or abs(values[1] - values[0]) <= 100 / 9 + 1e-9, metric
    assert done.stdout.count("| vit_tiny_patch16_224 | fast |") == 1  # rank 0 alone prints the table
