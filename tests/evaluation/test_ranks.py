"""Evaluation on many ranks (``locatdino.evaluation.ranks``): the split of a split into per-rank
shares, the launch read from the environment, and, on 2 CPU ranks started by torchrun in a
subprocess, features gathered back equal to one process's with only rank 0 writing."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from locatdino.common.errors import UserError
from locatdino.evaluation import ranks
from tests.evaluation.ranks_fixtures import (
    BROKEN_SCENE,
    DROPPED_ROWS,
    LAUNCH_VARIABLES,
    SCENES,
    TABLE_ROWS,
    labelled_scenes,
    tiny_encoder,
    torchrun,
)


def naive_shares(count, world):
    """Deal the items out one by one, rank 0 first, then cut contiguous runs of those sizes."""
    sizes = [0] * world
    for i in range(count):
        sizes[i % world] += 1
    starts = np.cumsum([0, *sizes])
    return [list(range(starts[r], starts[r + 1])) for r in range(world)]


@pytest.mark.parametrize(
    ("count", "world", "sizes"),
    [(10, 3, [4, 3, 3]), (9, 2, [5, 4]), (2, 3, [1, 1, 0]), (0, 2, [0, 0]), (8, 4, [2, 2, 2, 2])],
)
def test_shares_are_contiguous_in_rank_order_each_item_once(count, world, sizes):
    got = ranks.shares(count, world)
    assert [len(share) for share in got] == sizes
    assert [list(share) for share in got] == naive_shares(count, world)
    assert [i for share in got for i in share] == list(range(count))  # no padding, no repeat
    assert [ranks.Ranks(r, world).share(count) for r in range(world)] == got


@pytest.mark.parametrize(("count", "world"), [(5, 0), (-1, 2)])
def test_an_impossible_share_is_refused(count, world):
    with pytest.raises(ValueError, match=f"cannot share {count} items among {world} ranks"):
        ranks.shares(count, world)


def _clear_launch(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_torchrun_launch_is_read_from_the_environment(monkeypatch):
    _clear_launch(monkeypatch)
    assert ranks.launched_ranks() == ranks.Ranks(0, 1, 0)
    for name, value in {
        "TORCHELASTIC_RUN_ID": "none",
        "RANK": "3",
        "GROUP_RANK": "1",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "4",
    }.items():
        monkeypatch.setenv(name, value)
    assert ranks.launched_ranks() == ranks.Ranks(3, 4, 1)


def _srun_task(monkeypatch):
    _clear_launch(monkeypatch)
    for name, value in {
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NAME": "eval",
    }.items():
        monkeypatch.setenv(name, value)
    assert ranks.launched_ranks() == ranks.Ranks(0, 1, 0)  # the batch script's own shell: one process
    monkeypatch.setenv("SLURM_STEP_ID", "0")


def test_only_a_task_that_srun_started_is_a_rank(monkeypatch):
    _srun_task(monkeypatch)
    assert ranks.launched_ranks() == ranks.Ranks(1, 2, 1)
    monkeypatch.setenv("SLURM_PROCID", "one")
    with pytest.raises(UserError, match=r"^the launcher's rank variables are not whole numbers: SLURM_PROCID=one, "):
        ranks.launched_ranks()


def test_ranks_with_no_address_to_meet_at_are_refused_before_the_process_group(monkeypatch):
    _srun_task(monkeypatch)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match="^rank 1 of 2 has no MASTER_ADDR to meet the other ranks at: under srun"):
        with ranks.evaluation_ranks():
            pass
    assert not torch.distributed.is_initialized()


def test_each_rank_computes_on_its_own_gpu():
    assert ranks.Ranks(3, 4, 1).device("cuda") == torch.device("cuda", 1)
    assert ranks.Ranks(0, 1, 0).device("cuda:2") == torch.device("cuda", 2)  # one process: as asked
    assert ranks.Ranks(3, 4, 1).device("cpu") == torch.device("cpu")


def test_one_process_gathers_its_own_rows_and_writes():
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert ranks.gather_rows(rows) is not None
    np.testing.assert_array_equal(ranks.gather_rows(rows), rows)
    out = np.zeros_like(rows)
    assert ranks.gather_rows(rows, out=out) is out
    np.testing.assert_array_equal(out, rows)
    assert ranks.gather_objects(["a"]) == ["a"]
    assert ranks.is_writer()
    np.testing.assert_array_equal(ranks.extract_shared(lambda share: rows[list(share)], 3), rows)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The worker's files after torchrun ran it on 2 CPU ranks (gloo over loopback)."""
    out = tmp_path_factory.mktemp("ranks")
    done = torchrun(2, str(Path(__file__).with_name("ranks_worker.py")), str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_two_ranks_gather_rows_of_any_count_in_order(two_ranks):
    table = np.arange(TABLE_ROWS * 3, dtype=np.float32).reshape(TABLE_ROWS, 3)
    kept = [i for i in range(TABLE_ROWS) if i not in DROPPED_ROWS]
    got = [np.load(two_ranks / f"rank{r}.npz") for r in range(2)]
    for rank in got:
        np.testing.assert_array_equal(rank["to_all"], table[kept])  # 3 + 4 rows, 2 per round
        np.testing.assert_array_equal(rank["flags"], [i % 2 == 0 for i in kept])
        assert rank["flags"].dtype == bool
    np.testing.assert_array_equal(got[0]["to_root"], table[kept])
    assert got[0]["root_got"] and not got[1]["root_got"]
    names = [json.loads((two_ranks / f"rank{r}.json").read_text())["names"] for r in range(2)]
    assert names == [["rank 0 item 0", "rank 1 item 0", "rank 1 item 1"]] * 2


@pytest.mark.slow
def test_two_ranks_encode_what_one_process_encodes_and_rank_0_alone_writes(two_ranks):
    from locatdino.evaluation.class_features import class_token_embeddings

    with class_token_embeddings(
        tiny_encoder(), labelled_scenes(), 32, batch_size=3, workers=0, show_progress=False
    ) as one:
        for r in range(2):
            rank = np.load(two_ranks / f"rank{r}.npz")
            assert int(rank["world"]) == 2
            np.testing.assert_array_equal(rank["loaded"], list(ranks.shares(SCENES, 2)[r]))  # its share, once
            np.testing.assert_array_equal(rank["kept"], [i for i in range(SCENES) if i != BROKEN_SCENE])
            np.testing.assert_array_equal(rank["kept"], one.kept)
            np.testing.assert_array_equal(rank["labels"], one.labels)
            # each rank runs other batches on one thread: float sums in another order, not bit for bit
            np.testing.assert_allclose(rank["features"], one.features, rtol=0, atol=1e-5)
            assert json.loads((two_ranks / f"rank{r}.json").read_text())["skipped"] == [f"scene {BROKEN_SCENE}"]
    assert sorted(p.name for p in two_ranks.glob("written-by-*")) == ["written-by-0"]


def test_one_process_runs_the_writers_check_itself():
    def refuse():
        raise SystemExit("locatdino knn: --out x is a file")

    assert ranks.checked_by_writer(lambda: 7) == 7
    with pytest.raises(SystemExit, match="^locatdino knn: --out x is a file$"):
        ranks.checked_by_writer(refuse)


@pytest.mark.slow
def test_two_ranks_cache_the_linear_inputs_one_process_caches(two_ranks):
    from locatdino.evaluation.lincls.features import LinearInput
    from locatdino.evaluation.lincls.protocol import LinclsConfig, encode

    model = tiny_encoder()
    cfg = LinclsConfig(input_size=32, eval_batch_size=3, num_workers=0, progress=False)
    store, skipped = encode(model, LinearInput.reference(model), labelled_scenes(), cfg, torch.device("cpu"), "")
    try:
        assert skipped == [BROKEN_SCENE]
        for r in range(2):
            rank = np.load(two_ranks / f"lincls{r}.npz")
            np.testing.assert_array_equal(rank["loaded"], list(ranks.shares(SCENES, 2)[r]))  # its share, once
            np.testing.assert_array_equal(rank["skipped"], [BROKEN_SCENE])
            np.testing.assert_array_equal(rank["filled"], store.filled)
            np.testing.assert_array_equal(rank["labels"], store.labels)
            # other batches on one thread per rank: float sums in another order, not bit for bit
            np.testing.assert_allclose(rank["features"], store.features, rtol=0, atol=1e-4)
    finally:
        store.close()
