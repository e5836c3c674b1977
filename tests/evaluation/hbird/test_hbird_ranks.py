"""Hummingbird on 2 CPU ranks started by torchrun: each rank encodes its share of the memory views and of the
query images, and the gathered bank, confusion matrices and scores are one process's."""

import numpy as np
import pytest

from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import build_memory
from tests.evaluation.encoded_count import RUNTIME_OPTIONS, counted_runs
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model
from tests.evaluation.hbird.shares_fixtures import CONFUSION_IMAGES, budget_config, confusions_of, memory_scenes
from tests.evaluation.ranks_fixtures import SCENE_OPTIONS, torchrun

HBIRD = [
    "hbird",
    "--model",
    "tiny=vit_tiny_patch16_224",
    *SCENE_OPTIONS,
    "--aug-epochs",
    "2",
    "--memory-size",
    "92",  # 2 of the 4 patches of each of 23 x 2 views: the sampling noise decides which
    "--k",
    "5",
    *RUNTIME_OPTIONS,
]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:skipping sample 2 of BrokenAt")
def test_two_ranks_build_one_processs_memory_and_matrices(tmp_path):
    done = torchrun(2, "tests/evaluation/hbird/shares_worker.py", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    got = [np.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    bank, skipped = build_memory(
        FeatureExtractor(tiny_vit_model()), memory_scenes(), budget_config(memory_dtype="float16")
    )
    one = confusions_of(range(CONFUSION_IMAGES))
    for rank in got:  # every rank holds the whole bank and every image's matrix
        assert int(rank["skipped"]) == skipped == 2
        # the same patches, sampling included: labels exactly; features up to other batches' float sums,
        # stored in float16 (1e-3 relative: ulp of unit-length rows' entries)
        assert np.array_equal(rank["labels"], bank.labels)
        np.testing.assert_allclose(rank["features"].astype(np.float32), bank.features.astype(np.float32), atol=1e-3)
        assert np.array_equal(rank["matrix"], one.matrix.numpy()) and np.array_equal(rank["images"], one.images.dense())
        assert np.array_equal(rank["weight"], np.ones((2, 3)))  # rank 0's weights everywhere


@pytest.mark.slow
def test_two_ranks_score_what_one_process_scores(tmp_path):
    """Each rank encodes its share of the 23 x 2 memory views and 9 queries, the gathered scores are one process's."""
    one, two, encoded = counted_runs(HBIRD, tmp_path)
    assert encoded == [46 + 9, 23 + 5, 23 + 4]
    assert two["config"] == one["config"] and two["search"] == one["search"]
    counts = [(r["num_train"], r["num_val"], r["skipped"], r["memory_patches"]) for r in (one, two)]
    assert counts[0] == counts[1] == (23, 9, 0, 92)
    # in fp32 the ranks' features differ from one process's in the last float bits at most (other batches, one
    # thread per rank): a patch's label could change only at a tie of two classes' transferred scores that close,
    # so the scores agree to the report's two decimals (in practice to the last bit)
    for metric in ("miou", "miou_matched", "pixel_accuracy"):
        assert round(two[metric], 2) == round(one[metric], 2), metric
    assert two["per_class_iou"] == one["per_class_iou"]
    confusions = [np.load(tmp_path / out / "tiny" / "per_image_confusion.npz") for out in ("one", "two")]
    assert int(confusions[1]["num_images"]) == int(confusions[0]["num_images"]) == 9
