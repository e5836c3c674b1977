"""The collective timeout's logic on the CPU: the option's check, the strategies it reaches
(built with Lightning's public ``timeout=``; the tests read it back from the strategy), the
NCCL variables it sets (NCCL itself needs GPUs), and which errors become the one-line stop
(the texts gloo and c10d raise; the end-to-end stops are in tests/multinode)."""

import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist
from jsonargparse import Namespace
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from ssl_helpers import tiny_overrides

from locatdino.common.errors import UserError
from locatdino.ssl import DINOFSDPStrategy
from locatdino.ssl.run.cli import build_cli
from locatdino.ssl.run.collective_timeout import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    MAX_COLLECTIVE_TIMEOUT_S,
    MIN_COLLECTIVE_TIMEOUT_S,
    check_collective_timeout,
    lost_rank_message,
    nccl_environment,
    strategy_with_timeout,
    takes_timeout,
)

# what gloo raised in this project's runs: a frozen peer (timeout 5 s), a killed one
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
    "waiting 5000ms for send operation to complete"
)
GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:15550: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
    "application."
)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_naming_the_option(bad):
    with pytest.raises(UserError, match=r"^collective_timeout: must be a positive number of seconds, got"):
        check_collective_timeout(bad)
    assert check_collective_timeout(7) == 7.0


def test_a_timeout_below_the_floor_or_above_the_ceiling_is_refused_in_one_line():
    with pytest.raises(
        UserError,
        match=r"^collective_timeout: 0.001 s is below 5 s, shorter than the ranks of a "
        r"healthy run wait for each other \(start-up, checkpoint writes\): it would stop the run as if "
        r"a rank hung \(docs/multinode.md\)$",
    ):
        check_collective_timeout(0.001)
    with pytest.raises(
        UserError,
        match=r"^collective_timeout: 1e\+15 s is above 2147483.647 s \(24.8 days, the "
        r"largest timeout the process group takes: a 32-bit count of milliseconds\)$",
    ):
        check_collective_timeout(1e15)
    assert MIN_COLLECTIVE_TIMEOUT_S == 5.0 < DEFAULT_COLLECTIVE_TIMEOUT_S
    assert check_collective_timeout(MIN_COLLECTIVE_TIMEOUT_S) == 5.0
    assert check_collective_timeout(MAX_COLLECTIVE_TIMEOUT_S) == MAX_COLLECTIVE_TIMEOUT_S == 2147483.647
    assert MAX_COLLECTIVE_TIMEOUT_S / 86400 == pytest.approx(24.855, abs=1e-3)


PROCESS_GROUP = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
try:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1,
                            timeout=timedelta(seconds=float(sys.argv[1])))
    t = torch.ones(1)
    dist.all_reduce(t)
    print("ok", t.item())
except (RuntimeError, OverflowError) as err:
    print(type(err).__name__)
"""


@pytest.mark.slow
def test_the_ceiling_is_a_timeout_the_process_group_takes_and_far_above_it_one_fails():
    """A one-rank gloo group (a subprocess: no process group in the test process) at the ceiling
    works; at 1e13 s gloo refuses it, at 1e14 s Python's timedelta cannot hold it."""

    def run(seconds: float) -> str:
        return subprocess.run(
            [sys.executable, "-c", PROCESS_GROUP, str(seconds)], capture_output=True, text=True, timeout=120
        ).stdout.strip()

    assert run(MAX_COLLECTIVE_TIMEOUT_S) == "ok 1.0"
    assert run(1e13) == "RuntimeError"
    assert run(1e14) == "OverflowError"


def process_group_timeout(strategy) -> timedelta:
    """The timeout ``strategy`` will create its process group with (Lightning keeps the ``timeout=``
    it was built with in ``_timeout``; only tests read it)."""
    return strategy._timeout


@pytest.mark.parametrize(
    "name, kind",
    [
        ("ddp", DDPStrategy),
        ("ddp_find_unused_parameters_true", DDPStrategy),
        ("fsdp", FSDPStrategy),
        ("dino_fsdp", DINOFSDPStrategy),
    ],
)
def test_a_named_strategy_with_a_process_group_is_built_with_the_timeout(name, kind):
    assert process_group_timeout(kind()) == timedelta(minutes=30)  # torch's default, what a frozen node used to cost
    strategy = strategy_with_timeout(name, 7.5)
    assert type(strategy) is kind and process_group_timeout(strategy) == timedelta(seconds=7.5)


@pytest.mark.parametrize(
    "devices, num_nodes, accelerator, several",
    [
        (2, 1, "cpu", True),
        ("3", 1, "cpu", True),
        ([0, 1], 1, "cpu", True),
        (1, 2, "cpu", True),
        (1, 1, "cpu", False),
        ("1", 1, "auto", False),
        ("auto", 1, "cpu", False),
        (-1, 1, "cpu", False),
    ],
)
def test_auto_gets_the_timeout_where_it_means_several_processes(devices, num_nodes, accelerator, several):
    strategy = strategy_with_timeout("auto", 9, devices=devices, num_nodes=num_nodes, accelerator=accelerator)
    if several:
        assert type(strategy) is DDPStrategy and process_group_timeout(strategy) == timedelta(seconds=9)
    else:
        assert strategy == "auto"


def test_a_class_path_strategy_gets_the_timeout_among_its_init_args():
    given = Namespace(class_path="locatdino.ssl.objective.fsdp.DINOFSDPStrategy", init_args=Namespace(cpu_offload=True))
    changed = strategy_with_timeout(given, 12)
    assert changed.init_args == Namespace(cpu_offload=True, timeout=timedelta(seconds=12))
    assert "timeout" not in given.init_args  # the parsed config is not changed in place
    single = Namespace(class_path="lightning.pytorch.strategies.SingleDeviceStrategy", init_args=Namespace())
    assert strategy_with_timeout(single, 12) == single


def test_one_device_has_no_timeout_to_set():
    assert not takes_timeout(SingleDeviceStrategy)
    assert takes_timeout(DINOFSDPStrategy) and takes_timeout(DDPStrategy)
    assert strategy_with_timeout("single_device", 7.5) == "single_device"
    instance = SingleDeviceStrategy("cpu")
    assert strategy_with_timeout(instance, 7.5) is instance


@pytest.mark.parametrize("strategy", ["ddp", '{"class_path": "locatdino.ssl.objective.fsdp.DINOFSDPStrategy"}'])
def test_fit_builds_its_trainer_s_strategy_with_the_timeout(tmp_path, strategy):
    built = build_cli(
        [
            *tiny_overrides(tmp_path),
            "--trainer.strategy",
            strategy,
            "--trainer.devices",
            "2",
            "--collective_timeout",
            "7.5",
        ],
        run=False,
    )
    assert takes_timeout(type(built.trainer.strategy))
    assert process_group_timeout(built.trainer.strategy) == timedelta(seconds=7.5)


def test_nccl_heartbeat_follows_the_timeout_unless_the_user_set_it():
    assert nccl_environment(DEFAULT_COLLECTIVE_TIMEOUT_S, {}) == {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "240"}
    assert nccl_environment(0.2, {}) == {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1"}
    assert nccl_environment(7.5, {}) == {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "8"}
    assert nccl_environment(240, {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}) == {}


def message(error):
    return lost_rank_message(error, rank=2, step=7, collective_timeout=5, checkpoint="run/checkpoints/last.ckpt")


def test_a_frozen_peer_is_named_with_the_timeout():
    assert message(RuntimeError(GLOO_TIMEOUT)) == (
        "rank 2 stopped at step 7: no answer from another rank for collective_timeout = 5 s: it hangs (a frozen node, "
        "a stuck file system or data loader) or died without closing its connections; last checkpoint: "
        "run/checkpoints/last.ckpt (resume with --ckpt_path last)"
    )


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(GLOO_RESET),
        dist.DistBackendError(
            "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error"
        ),
        dist.DistNetworkError("failed to recv, got 0 bytes"),
    ],
)
def test_a_dead_peer_is_named(error):
    assert message(error).startswith("rank 2 stopped at step 7: another rank closed its connection: it died")


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA out of memory"),
        ValueError("timed out reading shard"),
        RuntimeError("Connection reset by peer"),
    ],
)  # not from the process group
def test_other_errors_are_left_alone(error):
    assert message(error) is None


def test_no_checkpoint_yet_is_said():
    assert lost_rank_message(
        RuntimeError(GLOO_TIMEOUT), rank=0, step=0, collective_timeout=240, checkpoint=None
    ).endswith("last checkpoint: none saved yet (resume with --ckpt_path last)")
