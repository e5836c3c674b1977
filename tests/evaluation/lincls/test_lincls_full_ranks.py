"""``lincls --variant full`` on 2 CPU ranks under torchrun trains as DINO's ``eval_linear`` under DDP:
each rank decodes and encodes its half of every global batch of one process, in one process's order,
and the averaged gradients give one process's head and scores."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.evaluation.lincls.full_ranks_worker import run
from tests.evaluation.ranks_fixtures import torchrun

WORKER = Path(__file__).with_name("full_ranks_worker.py")
BATCHES = (4, 4, 3)  # an epoch of 11 training images in global batches of 4
SHARES = ((2, 2, 2), (2, 2, 1))  # what each of 2 ranks takes of each batch


def chunks(items: np.ndarray, sizes: tuple[int, ...]) -> list[list[int]]:
    starts = np.cumsum([0, *sizes])
    return [items[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]


@pytest.mark.slow
def test_two_ranks_train_one_process_head_each_on_half_of_every_batch(tmp_path):
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    run(tmp_path / "one")
    done = torchrun(2, str(WORKER), str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    one = np.load(tmp_path / "one" / "full0.npz")
    ranks = [np.load(tmp_path / "two" / f"full{rank}.npz") for rank in (0, 1)]
    assert int(one["world"]) == 1 and [int(r["world"]) for r in ranks] == [2, 2]

    # each rank decoded its share of each global batch of one process, in its order: no image twice, none left out
    epochs = len(one["loaded"]) // sum(BATCHES)
    assert epochs == 2 and len(one["loaded"]) == 2 * sum(BATCHES)
    assert [len(r["loaded"]) for r in ranks] == [epochs * sum(share) for share in SHARES]  # 12 and 10, not 22 each
    one_batches = chunks(one["loaded"], BATCHES * epochs)
    rank_batches = [chunks(r["loaded"], share * epochs) for r, share in zip(ranks, SHARES)]
    assert one_batches == [first + second for first, second in zip(*rank_batches)]
    assert Counter(one["loaded"].tolist()) == Counter({i: epochs for i in range(sum(BATCHES))})
    assert one_batches[0] != one_batches[len(BATCHES)]  # reshuffled in the second epoch

    # one process sums each batch's gradient in one product, the ranks 2 + 2 images and then all-reduce, and the
    # backbone's features of 2 images differ from those of 4 in the last float bits: the weights (about 0.01
    # and more) agree to 1e-5, far below what one step moves them
    for rank in ranks:
        np.testing.assert_allclose(rank["weight"], one["weight"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(rank["bias"], one["bias"], rtol=0, atol=1e-5)
        # a prediction could flip only at a tie of logits within float error: the scores are equal
        assert rank["scores"].tolist() == one["scores"].tolist() and rank["hits"].tolist() == one["hits"].tolist()
        assert rank["skipped"].tolist() == one["skipped"].tolist() == ["scene 5"]
    top1, top5, num_train, num_val = one["scores"]
    assert (num_train, num_val) == (10, 7) and 0 <= top1 <= top5 <= 100
    assert np.abs(one["weight"]).max() > 0.05  # it trained: no longer the N(0, 0.01) initialisation
