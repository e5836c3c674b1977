"""Callbacks the multi-process tests add to ``locatdino fit`` (``--trainer.callbacks+=...``).

Importable from every rank: the tests put this folder on ``PYTHONPATH``.
"""

import os

import torch
from lightning.pytorch import Callback


class SaveRankState(Callback):
    """Each rank writes its module state (DINO: student, teacher, centre), counters and first
    batch's images (DINO: global crops) to ``<out_dir>/rank<k>.pt``."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.first_batch = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_batch is None:
            self.first_batch = batch["global" if "global" in batch else "image"].detach().clone()

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        state["_global_step"] = torch.tensor(trainer.global_step)
        state["_skipped_steps"] = torch.tensor(getattr(pl_module, "_skipped_steps", 0))
        state["_first_batch"] = self.first_batch
        torch.save(state, os.path.join(self.out_dir, f"rank{trainer.global_rank}.pt"))


class NaNBatch(Callback):
    """Poison the global crops of rank ``rank`` at optimizer step ``step`` (a non-finite loss)."""

    def __init__(self, rank: int = 1, step: int = 2) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            batch["global"].fill_(float("nan"))


class SigtermAt(Callback):
    """Send this process SIGTERM (what a cluster scheduler does before a kill), or the signal named
    ``signal``, at optimizer step ``step``."""

    def __init__(self, step: int = 2, signal: str = "SIGTERM") -> None:
        self.step, self.signal = step, signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import os
            import signal

            os.kill(os.getpid(), signal.Signals[self.signal])


def assert_same_training_state(ranks: dict) -> None:
    """Every rank of ``{rank: SaveRankState dump}`` ended with rank 0's state (weights, counters)
    and read its own data (no two first batches equal)."""
    first = ranks[0]
    for rank, state in ranks.items():
        assert state.keys() == first.keys()
        assert [k for k in first if k != "_first_batch" and not torch.equal(first[k], state[k])] == [], rank
    batches = [state["_first_batch"] for state in ranks.values()]
    assert not any(torch.equal(a, b) for i, a in enumerate(batches) for b in batches[i + 1 :])


def assert_same_checkpoint(expected_path, got_path) -> None:
    """Two runs ended at the same step with the same weights (FSDP against DDP: sharded clipping
    norms and EMA on shards sum in another order, hence the tolerance)."""
    expected = torch.load(expected_path, weights_only=True)
    got = torch.load(got_path, weights_only=True)
    assert got["global_step"] == expected["global_step"] == 3
    assert got["state_dict"].keys() == expected["state_dict"].keys()
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)
