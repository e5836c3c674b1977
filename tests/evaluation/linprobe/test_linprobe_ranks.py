"""``locatdino linprobe`` on 2 CPU ranks started by torchrun: each rank encodes its share of the cached training
features and of the query images, every rank trains the same head, and the scores are one process's."""

import pytest

from tests.evaluation.encoded_count import RUNTIME_OPTIONS, counted_runs
from tests.evaluation.ranks_fixtures import SCENE_OPTIONS

LINPROBE = [
    "linprobe",
    "--model",
    "tiny=vit_tiny_patch16_224",
    *SCENE_OPTIONS,
    "--train-augment",
    "off",  # the cached path: each training image encoded once, by one rank
    "--iters",
    "8",
    "--train-batch-size",
    "4",
    *RUNTIME_OPTIONS,
]


@pytest.mark.slow
def test_two_ranks_probe_what_one_process_probes(tmp_path):
    one, two, encoded = counted_runs(LINPROBE, tmp_path)
    assert encoded == [23 + 9, 12 + 5, 11 + 4]  # one process, then the ranks' shares of 23 training and 9 queries
    assert two["config"] == one["config"] and two["features"] == one["features"]
    counts = [(r["num_train"], r["num_val"], r["skipped"], r["iterations"]) for r in (one, two)]
    assert counts[0] == counts[1] == (23, 9, 0, 8)
    # in fp32 the ranks' features and head differ from one process's in the last float bits at most (other
    # batches and thread counts): a pixel's label could change only at a tie of two logits that close, so the
    # scores agree to the report's two decimals and the loss curve to its five
    for metric in ("miou", "pixel_accuracy"):
        assert round(two[metric], 2) == round(one[metric], 2), metric
    assert two["per_class_iou"] == one["per_class_iou"] and two["loss_curve"] == one["loss_curve"]
