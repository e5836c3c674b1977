"""A contiguous share of the memory views gives exactly the rows one process's bank holds for them
(``build_memory(shared=True)`` concatenates the ranks' shares): the budget's noise is drawn per view."""

import numpy as np
import pytest
import torch

from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import build_memory, memory_rows, memory_views
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.evaluation.hbird.sampling import ViewNoise
from locatdino.evaluation.metric import gather_confusions
from tests.evaluation.hbird.shares_fixtures import (
    BROKEN_SCENE,
    MEMORY_SCENES,
    budget_config,
    confusions_of,
    memory_scenes,
)


def test_view_noise_of_a_share_is_the_whole_streams_rows():
    whole = ViewNoise(3, 5).next(torch.ones(10, dtype=torch.bool))
    present = torch.tensor([True, False, True, True])  # view 5 did not decode: its draws are spent all the same
    share = ViewNoise(3, 5, start=4)
    first, second = share.next(present), share.next(torch.ones(2, dtype=torch.bool))
    assert torch.equal(first, whole[[4, 6, 7]]) and torch.equal(second, whole[8:10])
    ViewNoise.SKIP_CHUNK, chunk = 7, ViewNoise.SKIP_CHUNK  # 20 skipped draws in 3 calls, a ragged last
    try:
        assert torch.equal(ViewNoise(3, 5, start=4).next(torch.ones(1, dtype=torch.bool)), whole[4:5])
    finally:
        ViewNoise.SKIP_CHUNK = chunk


@pytest.mark.filterwarnings("ignore:skipping sample 2 of BrokenAt")
def test_shares_of_the_views_hold_the_rows_of_one_bank(tiny_vit):
    extractor, train, cfg = FeatureExtractor(tiny_vit), memory_scenes(), budget_config()
    whole, skipped = build_memory(extractor, train, cfg)
    # the broken scene's 2 views skipped; at most 20 patches of each other view (zoom-out canvas has none)
    assert skipped == 2 and 15 * 20 < len(whole) <= (2 * MEMORY_SCENES - 2) * 20
    views = memory_views(train, cfg)
    parts, skips = [], []
    for share in (range(0, 5), range(5, 12), range(12, 18)):  # views 2 and 11 in the first two shares
        bank = MemoryBank.allocate(len(share) * 20, extractor.dim, train.num_classes)
        skips.append(memory_rows(bank, extractor, views, share, 20, cfg))
        parts.append(bank)
    assert skips == [1, 1, 0] and BROKEN_SCENE in range(0, 5)
    # the same patches selected: the labels (masks only) exactly; the features up to other batches' float sums
    assert np.array_equal(np.concatenate([b.labels for b in parts]), whole.labels)
    np.testing.assert_allclose(np.concatenate([b.features for b in parts]), whole.features, atol=1e-5)


def test_gather_confusions_in_one_process_is_the_matrix_itself():
    cm = confusions_of(range(3))
    assert gather_confusions(cm) is cm
