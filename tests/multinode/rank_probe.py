"""Callbacks the multi-node tests add to ``locatdino fit`` (``--trainer.callbacks+=rank_probe.X``);
importable on every rank (the tests put this folder on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
import time

from lightning.pytorch import Callback

from locatdino.data.shards import stream as shard_stream


class SampleLog(Callback):
    """Each rank writes ``<out_dir>/samples-rank<k>.json``: the (shard, key) of every sample that
    went into its training batches, and how many batches it trained on (the stream runs in the
    training process: ``num_workers 0``)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.samples, self.batches = out_dir, [], 0
        original = shard_stream.ShardStream._batches

        def logged(stream, samples, log):
            def passing():
                for sample in samples:
                    self.samples.append([os.path.basename(sample["__url__"]), sample["__key__"]])
                    yield sample

            return original(stream, passing(), log)

        shard_stream.ShardStream._batches = logged

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"samples-rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"samples": self.samples, "batches": self.batches, "world_size": trainer.world_size}, f)


class PauseAt(Callback):
    """On the job's first start (not after a restart), at the start of optimizer step ``step``,
    global rank ``rank`` writes its pid to the file ``marker`` and waits (at most ``limit`` s) until the test
    deletes it: the test signals the job meanwhile, at a known step; the other ranks wait for this
    one in their next collective."""

    def __init__(self, marker: str, step: int = 2, rank: int = 0, limit: float = 120.0) -> None:
        self.marker, self.step, self.rank, self.limit = marker, step, rank, limit

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank or trainer.ckpt_path is not None:
            return
        with open(self.marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(self.marker + ".tmp", self.marker)  # whole when the test sees it
        deadline = time.monotonic() + self.limit
        while os.path.exists(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)
