"""``locatdino linprobe`` on 2 CPU ranks started by torchrun: each rank encodes its share of the cached training
features and of the query images, every rank trains the same head, and the scores are one process's."""

import json

import pytest

from tests.evaluation.encoded_count import counted
from tests.evaluation.ranks_fixtures import SCENE_OPTIONS, torchrun

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
    "--precision",
    "fp32",  # bf16 features change with the batch beyond the last float bits
    "--workers",
    "0",
    "--no-progress",
]


@pytest.mark.slow
def test_two_ranks_probe_what_one_process_probes(tmp_path):
    one_encoded = counted([*LINPROBE, "--out", str(tmp_path / "one")])
    done = torchrun(2, "tests/evaluation/encoded_count.py", str(tmp_path), *LINPROBE, "--out", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads((tmp_path / out / "results.json").read_text())["models"][0] for out in ("one", "two"))
    encoded = [int((tmp_path / f"encoded{rank}").read_text()) for rank in (0, 1)]
    assert one_encoded == 23 + 9 and encoded == [12 + 5, 11 + 4]  # shares of the 23 training and 9 query images
    assert two["config"] == one["config"] and two["features"] == one["features"]
    counts = [(r["num_train"], r["num_val"], r["skipped"], r["iterations"]) for r in (one, two)]
    assert counts[0] == counts[1] == (23, 9, 0, 8)
    # in fp32 the ranks' features and head differ from one process's in the last float bits at most (other
    # batches and thread counts): a pixel's label could change only at a tie of two logits that close, so the
    # scores agree to the report's two decimals and the loss curve to its five
    for metric in ("miou", "pixel_accuracy"):
        assert round(two[metric], 2) == round(one[metric], 2), metric
    assert two["per_class_iou"] == one["per_class_iou"] and two["loss_curve"] == one["loss_curve"]
    assert done.stdout.count("| tiny |") == 1  # rank 0 alone prints the table
    assert sorted(p.name for p in (tmp_path / "two").rglob("*")) == sorted(
        p.name for p in (tmp_path / "one").rglob("*")
    )
