import json
import os
import signal
from collections import Counter
from unittest import mock

import lightning as L
import pytest
import torch
from lightning.fabric.utilities.data import _auto_add_worker_init_fn  # what Lightning's Trainer runs

from locatdino.data.shards.stream import ShardLoader, ShardStream, expand_urls, shard_sizes
from tests.data.data_fixtures import IdTransform, batch_ids, write_id_shards


def _run(stream, workers=2):
    return [batch_ids(b) for b in ShardLoader(stream, num_workers=workers)]


def test_two_ranks_two_workers_see_every_sample_exactly_once(id_shards):
    seen = Counter()
    for rank in range(2):
        stream = ShardStream(id_shards, IdTransform(), batch_size=4, rank=rank, world_size=2, shuffle_buffer=8)
        for ids in _run(stream):
            seen.update(ids)
    assert sorted(seen) == list(range(30)) and set(seen.values()) == {1}


def test_resampled_uneven_shards_give_every_rank_the_same_batch_count(tmp_path):
    urls = write_id_shards(tmp_path, [11, 2, 5])
    for rank in range(2):
        stream = ShardStream(urls, IdTransform(), batch_size=3, num_batches=5, rank=rank, world_size=2, resampled=True)
        batches = _run(stream)
        assert len(batches) == 5 and all(len(b) == 3 for b in batches)


def test_cycling_with_fewer_shards_than_ranks_times_workers_never_starves(tmp_path):
    urls = write_id_shards(tmp_path, [4, 4, 4])
    counts = []
    for rank in range(2):
        stream = ShardStream(urls, IdTransform(), batch_size=4, num_batches=7, rank=rank, world_size=2)
        counts.append(len(_run(stream)))
    assert counts == [7, 7]


def test_epochs_reshuffle_reproducibly(id_shards):
    def order(epoch):
        stream = ShardStream(id_shards, IdTransform(), batch_size=30, shuffle_buffer=30, seed=3)
        stream.epoch = epoch
        return [i for b in stream for i in batch_ids(b)]

    assert order(1) == order(1)
    assert order(1) != order(2) and sorted(order(1)) == sorted(order(2)) == list(range(30))


def test_loader_length_and_epoch_counter(id_shards):
    stream = ShardStream(id_shards, IdTransform(), batch_size=2, num_batches=4)
    loader = ShardLoader(stream, num_workers=0)
    assert len(loader) == 4
    assert [len(list(loader)) for _ in range(2)] == [4, 4] and stream.epoch == 2


def test_expand_urls_forms(id_shards, tmp_path):
    folder = tmp_path / "ids"
    assert expand_urls(str(folder)) == id_shards
    assert expand_urls(str(folder / "part-*.tar")) == id_shards
    assert expand_urls(str(folder / "part-{000001..000002}.tar")) == id_shards[1:3]
    assert expand_urls(f"{id_shards[0]}::{id_shards[4]}") == [id_shards[0], id_shards[4]]
    with pytest.raises(FileNotFoundError, match="no shards match"):
        expand_urls(str(folder / "nope-*.tar"))


def _index(folder, counts, urls, grow=0):
    entries = [
        {"name": os.path.basename(u), "num_samples": n, "bytes": os.path.getsize(u) - grow}
        for u, n in zip(urls, counts)
    ]
    (folder / "index.json").write_text(json.dumps({"shards": entries}))


def test_shard_sizes_from_index_or_tar_headers(id_shards, tmp_path):
    assert shard_sizes(id_shards) == [7, 3, 9, 5, 6]
    _index(tmp_path / "ids", [7, 30], id_shards[:2])  # the probed first shard agrees: the index is used
    assert shard_sizes(id_shards[:3]) == [7, 30, 9]
    assert shard_sizes(["https://example.com/a.tar"]) is None


@pytest.mark.parametrize(
    "counts, grow", [([2, 1], 0), ([70, 30], 0), ([7, 3], 100)], ids=["undercount", "overcount", "rewritten shards"]
)
def test_an_index_that_does_not_describe_its_shards_is_not_trusted(id_shards, tmp_path, caplog, counts, grow):
    """index.json undercounting (most samples silently unused), overcounting (blamed on damaged
    tars) or recording other byte sizes: the samples are counted from the tars, with a warning."""
    _index(tmp_path / "ids", counts, id_shards[:2], grow)
    assert shard_sizes(id_shards[:2]) == [7, 3]
    assert "counting" in caplog.text
    (tmp_path / "ids" / "index.json").write_text("{not json")
    assert shard_sizes(id_shards[:2]) == [7, 3]


def test_folders_named_like_shards_are_not_shards(id_shards, tmp_path):
    (tmp_path / "ids" / "extra.tar").mkdir()
    assert expand_urls(str(tmp_path / "ids")) == id_shards
    assert expand_urls(str(tmp_path / "ids" / "*.tar")) == id_shards
    (tmp_path / "only" / "a.tar").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no shards match"):
        expand_urls(str(tmp_path / "only"))


def test_invalid_configurations_are_refused(id_shards):
    with pytest.raises(ValueError, match="num_batches"):
        ShardStream(id_shards, IdTransform(), 2, resampled=True)
    with pytest.raises(ValueError, match="rank 2"):
        ShardStream(id_shards, IdTransform(), 2, rank=2, world_size=2)
    assert torch.utils.data.IterableDataset in type(ShardStream(id_shards, IdTransform(), 2)).__mro__


class SignalAndDraw:
    """A transform that reports, from the worker that runs it, whether SIGTERM is ignored there
    and one draw of torch's global RNG."""

    num_global_crops = 1

    def __call__(self, image):
        ignored = float(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
        return [torch.tensor([ignored, torch.rand(()).item(), 0.0]).view(3, 1, 1)]


def test_workers_ignore_stop_signals_and_keep_lightnings_per_rank_seeding(id_shards):
    """A worker leaves SIGTERM to the training process, and the loader sets no worker_init_fn of
    its own, so Lightning's (seeded by global seed, worker and rank) is added: two ranks' workers
    draw different augmentations."""
    draws = []
    for rank in range(2):
        with mock.patch.dict(os.environ):  # seed_everything's PL_* variables stay in this test
            L.seed_everything(0, workers=True)
            loader = ShardLoader(
                ShardStream(id_shards, SignalAndDraw(), batch_size=5, rank=rank, world_size=2), num_workers=1
            )
            assert loader.worker_init_fn is None
            _auto_add_worker_init_fn(loader, rank)
            values = torch.cat([b["global"][0][:, :2, 0, 0] for b in loader])
        assert values[:, 0].eq(1).all()  # SIGTERM ignored in the worker
        draws.append(values[:, 1])
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # the test process keeps its own
    assert not torch.equal(draws[0][:3], draws[1][:3])
