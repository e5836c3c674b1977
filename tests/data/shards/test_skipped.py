"""SkippedSamplesLogger counts what the stream counted: a truncated shard's note stands for every
sample the shard lost, a shard error's note for none."""

from types import SimpleNamespace

import torch

from locatdino.data.shards.skipped import SkippedSamplesLogger


def test_the_count_is_the_streams_count_not_the_number_of_notes():
    logged = []
    module = SimpleNamespace(log=lambda name, value, **_: logged.append((name, value)))
    trainer = SimpleNamespace(global_rank=0)
    callback = SkippedSamplesLogger()
    batches = [
        {
            "skipped": torch.tensor(4),
            "skipped_keys": [
                "a.tar: 3 sample(s) missing of 5 (truncated or damaged tar)",
                "b.tar:k1: UnidentifiedImageError: x",
            ],
        },
        {"skipped": torch.tensor(0), "skipped_keys": ["shard error, rest of shard lost: ReadError: y"]},
        {"skipped": torch.tensor(0), "skipped_keys": []},
        {"skipped": torch.tensor(2)},  # a batch without the notes: the count alone
    ]
    for i, batch in enumerate(batches):
        callback.on_train_batch_end(trainer, module, None, batch, i)
    assert [value for _, value in logged] == [4.0, 4.0, 4.0, 6.0]
    assert callback.total == 6 and callback.named == 3
