"""2-process DDP and FSDP on CPU (gloo) through ``locatdino fit`` in a subprocess.

Lightning's ``ddp`` re-executes the command line for rank 1, so the run must not happen inside
pytest's process. ``ddp_helpers`` callbacks (this folder is on ``PYTHONPATH``) dump every rank's
state at the end, and can poison one rank's batch to check that a skipped step is skipped on
every rank.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_fit_cli import ROOT, tiny_overrides

pytestmark = pytest.mark.slow


def fit_in_subprocess(tmp_path: Path, *extra: str, shards: Path | None = None, timeout: int = 300) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    dump = tmp_path / "ranks"
    cmd = [sys.executable, "-m", "locatdino", "fit", *tiny_overrides(tmp_path, shards),
           "--trainer.accelerator", "cpu", "--trainer.devices", "2",
           "--trainer.callbacks+=ddp_helpers.SaveRankState", "--trainer.callbacks.out_dir", str(dump), *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r: torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)}


def assert_same_training_state(ranks: dict) -> None:
    a, b = ranks[0], ranks[1]
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k]) and k != "_first_batch"]
    assert different == []
    assert not torch.equal(a["_first_batch"], b["_first_batch"])  # each rank read its own data


def test_ddp_two_ranks_end_identical(tmp_path):
    ranks = fit_in_subprocess(tmp_path, "--trainer.strategy", "ddp", "--trainer.max_steps", "3")
    assert_same_training_state(ranks)
    assert int(ranks[0]["_global_step"]) == 3


def test_ddp_uneven_shards_and_a_step_skipped_on_one_rank(tmp_path):
    from locatdino.data.shard_sources import ScenesSource
    from locatdino.data.shard_writer import write_shards

    shards = tmp_path / "uneven"
    index = write_shards(ScenesSource(11, 0, 48), shards, maxcount=8, workers=0, progress=False)
    assert sorted(s["num_samples"] for s in index["shards"]) == [3, 8]
    ranks = fit_in_subprocess(
        tmp_path, "--trainer.strategy", "ddp", "--trainer.max_steps", "4", "--model.on_nonfinite", "skip",
        "--trainer.callbacks+=ddp_helpers.NaNBatch", "--trainer.callbacks.rank", "1", "--trainer.callbacks.step", "2",
        shards=shards,
    )
    assert_same_training_state(ranks)
    assert int(ranks[0]["_skipped_steps"]) == int(ranks[1]["_skipped_steps"]) == 1

