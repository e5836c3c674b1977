import numpy as np
import pytest

from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.hbird.index_choice import IndexChoice, auto_index, recall_at_k, sample_rows


def test_auto_is_exact_for_small_searches_and_ivf_above():
    assert auto_index(50_000, 10**6) == IndexChoice("Flat", None)  # small memory
    assert auto_index(200_000, 4_000) == IndexChoice("Flat", None)  # 8e8 pairs
    # 448 px, 300 memory / 100 query images: 4 * sqrt(235,200) = 1939.9 -> 1920 cells
    assert auto_index(235_200, 78_400) == IndexChoice("IVF1920,Flat", 64)
    assert auto_index(235_200, 78_400, nprobe=8) == IndexChoice("IVF1920,Flat", 8)


def test_recall_counts_shared_neighbours():
    exact = np.array([[1, 2, 3], [4, 5, 6]])
    assert recall_at_k(np.array([[3, 2, 9], [6, 5, 4]]), exact) == pytest.approx((2 / 3 + 1) / 2)
    rows = sample_rows(10_000, 100, seed=1)
    assert len(rows) == 100 and len(set(rows)) == 100 and np.all(np.diff(rows) > 0)
    assert np.array_equal(sample_rows(5, 100), np.arange(5))


def test_an_approximate_index_reports_its_recall(scenes, tiny_vit):
    base = dict(input_size=96, num_workers=0, progress=False, batch_size=8, precision="fp32")
    exact = hummingbird(tiny_vit, *scenes, HummingbirdConfig(**base))
    assert exact.search == {"precision": "fp32", "index": "Flat", "nprobe": None}  # auto: a small search
    results = {
        n: hummingbird(tiny_vit, *scenes, HummingbirdConfig(**base, index="IVF16,Flat", nprobe=n)) for n in (1, 16)
    }
    full, one = results[16].search, results[1].search
    assert full["recall_at_k"] == 1.0 and full["recall_queries"] == 6 * 144  # every query patch of 6 images
    assert 0 < one["recall_at_k"] < 1.0
    assert results[16].miou == pytest.approx(exact.miou, abs=1e-6)  # every cell visited = exact
    assert "recall" in results[1].timings
