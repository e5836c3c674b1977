"""How long a rank waits for the others before the run stops, and the line it stops with.

Every rank of a multi-process run meets the others in collectives (the gradient all-reduce of each
step, barriers around checkpoints). When a rank dies, its peers' connections close and they fail
within seconds. When a rank hangs instead (a frozen node, a stuck file system or data loader, a
faulty GPU), nothing closes: its peers wait in the next collective until the process group's timeout
(Lightning's strategies pass torch's ``default_pg_timeout``, 30 minutes, for gloo and NCCL alike),
while every other accelerator of the job idles. ``locatdino fit --collective_timeout S`` (default
:data:`DEFAULT_COLLECTIVE_TIMEOUT_S`) builds the strategy with that timeout
(:func:`strategy_with_timeout`, through the strategies' public ``timeout=``), so a hung rank costs
``S`` seconds.

``S`` must exceed every legitimate wait of one rank for another, or a healthy run stops falsely.
The measured ones (benchmarks/RESULTS.md, "How long does a multi-node job wait for a failed node?"): writing
a checkpoint (rank 0 writes, the others wait at the barrier after it), a torch.compile of the
training step (about 2 minutes per process on the CPU; one rank compiling cold while the others
hit their cache makes them wait that long), the online Hummingbird monitor (every rank runs it,
so ranks wait only for the slowest), a large ``synthetic`` scene set written by ``prepare_data``.

NCCL (GPUs) applies the timeout in its watchdog thread: with torch's default
``TORCH_NCCL_ASYNC_ERROR_HANDLING=3`` a timed-out collective ends the process (the watchdog's
"Watchdog caught collective operation timeout" line, then SIGABRT) rather than raising here. A
second thread, the heartbeat monitor, ends the process when the watchdog itself is stuck (a hung
CUDA or NCCL call) for ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (torch: 480 s); :func:`nccl_environment`
sets it to the collective timeout unless the user set it, so that failure costs no more.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from jsonargparse import Namespace
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import StrategyRegistry

from locatdino.common.errors import UserError

DEFAULT_COLLECTIVE_TIMEOUT_S = 240.0
# Below MIN_COLLECTIVE_TIMEOUT_S a healthy run stops as if a rank hung: the processes of one job
# reach their first collective seconds apart (each imports torch and Lightning and builds its
# model), and the shortest legitimate wait measured on a real model, a ViT-S/16 checkpoint write,
# takes 0.65 s (the monitor 11.2 s, a cold compile 121 s: benchmarks/RESULTS.md).
MIN_COLLECTIVE_TIMEOUT_S = 5.0
# The largest timeout a 32-bit count of milliseconds holds (24.8 days): every layer of the process
# group takes it (c10d's store and gloo count milliseconds, NCCL's heartbeat variable is a C int of
# seconds); past about 1e13 s gloo refuses it and past 8.6e13 s Python's timedelta overflows, both
# after the Trainer is built.
MAX_COLLECTIVE_TIMEOUT_S = (2**31 - 1) / 1000
HEARTBEAT_VARIABLE = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"

# what gloo, c10d's store and NCCL say when a peer is gone (its connections closed) or silent
_CLOSED = re.compile(
    r"connection (reset|closed) by peer|broken pipe|remote process exited|failed to recv, got 0 bytes", re.I
)
_TIMED_OUT = re.compile(r"timed out|timeout", re.I)


class LostRank(Exception):
    """A collective failed because another rank died or hung; ``str()`` is one line naming it."""


def check_collective_timeout(seconds: Any) -> float:
    """``seconds`` as a float, or a one-line :class:`UserError` naming the option, checked before
    anything is built: a positive number between :data:`MIN_COLLECTIVE_TIMEOUT_S` and
    :data:`MAX_COLLECTIVE_TIMEOUT_S`."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"collective_timeout: must be a positive number of seconds, got {seconds!r}")
    if seconds < MIN_COLLECTIVE_TIMEOUT_S:
        raise UserError(
            f"collective_timeout: {seconds:g} s is below {MIN_COLLECTIVE_TIMEOUT_S:g} s, shorter than the "
            "ranks of a healthy run wait for each other (start-up, checkpoint writes): it would stop the "
            "run as if a rank hung (docs/multinode.md)"
        )
    if seconds > MAX_COLLECTIVE_TIMEOUT_S:
        raise UserError(
            f"collective_timeout: {seconds:g} s is above {MAX_COLLECTIVE_TIMEOUT_S:.3f} s (24.8 days, the "
            "largest timeout the process group takes: a 32-bit count of milliseconds)"
        )
    return float(seconds)


def takes_timeout(strategy_class: type) -> bool:
    """Whether ``strategy_class`` is built with a process-group ``timeout=`` (Lightning's DDP, FSDP,
    DeepSpeed, model-parallel and their subclasses, such as ``dino_fsdp``, which pass it on)."""
    return any(
        "timeout" in inspect.signature(cls.__init__).parameters
        for cls in strategy_class.__mro__
        if "__init__" in vars(cls)
    )


def strategy_with_timeout(
    strategy: Any, seconds: float, *, num_nodes: int = 1, devices: Any = "auto", accelerator: Any = "auto"
) -> Any:
    """``trainer.strategy`` as given, or, where it names a strategy with a process group, that
    strategy built with ``timeout=seconds`` (the group reads it when it is created):

    - a name of Lightning's ``StrategyRegistry`` (``ddp``, ``fsdp``, ``dino_fsdp``, ...): its class
      with the registered arguments and the timeout;
    - ``auto`` where it means several processes (several nodes, several devices): ``ddp``,
      Lightning's own choice there outside a notebook;
    - a ``class_path`` / ``init_args`` mapping (a recipe's ``strategy:`` block): ``init_args.timeout``
      set, the class still built by the CLI.

    Anything else (a single device, an instance) stays as it is."""
    timeout = timedelta(seconds=seconds)
    if strategy == "auto" and (num_nodes > 1 or _device_count(devices, accelerator) > 1):
        strategy = "ddp"
    if isinstance(strategy, str) and strategy in StrategyRegistry:
        entry = StrategyRegistry[strategy]
        if takes_timeout(entry["strategy"]):
            return entry["strategy"](**{**entry["init_params"], "timeout": timeout})
    elif isinstance(strategy, Namespace) and isinstance(strategy.get("class_path"), str):
        module, _, name = strategy.class_path.rpartition(".")  # the parser has made it a full path
        if takes_timeout(getattr(importlib.import_module(module), name)):
            strategy = strategy.clone()
            strategy.init_args = strategy.get("init_args") or Namespace()
            strategy.init_args.timeout = timeout
    return strategy


def _device_count(devices: Any, accelerator: Any) -> int:
    """The number of devices ``trainer.devices`` names: an int, a digit string, a list of indices,
    or for ``auto`` / ``-1`` every GPU where the accelerator may be CUDA (one device elsewhere)."""
    if devices in ("auto", -1, "-1"):
        cuda = accelerator in ("auto", "gpu", "cuda") or isinstance(accelerator, CUDAAccelerator)
        return CUDAAccelerator.auto_device_count() if cuda and CUDAAccelerator.is_available() else 1
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices.strip().isdigit():
        return int(devices)
    return devices if isinstance(devices, int) and not isinstance(devices, bool) else 1


def nccl_environment(seconds: float, environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL variables to set before the process group exists: the heartbeat timeout equal to
    the collective timeout (whole seconds, at least 1), unless ``environ`` already sets it."""
    if HEARTBEAT_VARIABLE in environ:
        return {}
    return {HEARTBEAT_VARIABLE: str(max(1, math.ceil(seconds)))}


def lost_rank_message(
    error: BaseException, *, rank: int, step: int, collective_timeout: float, checkpoint: str | None
) -> str | None:
    """One line for a collective that failed because a peer died (connection closed) or hung
    (timed out), or ``None`` when ``error`` is something else."""
    text = str(error)
    if not (isinstance(error, dist.DistError) or "/gloo/" in text):  # not raised by the process group
        return None
    if _CLOSED.search(text):
        what = "another rank closed its connection: it died (killed, out of memory, a failed node)"
    elif _TIMED_OUT.search(text):
        what = (
            f"no answer from another rank for collective_timeout = {collective_timeout:g} s: it hangs (a frozen "
            "node, a stuck file system or data loader) or died without closing its connections"
        )
    else:
        return None
    return (
        f"rank {rank} stopped at step {step}: {what}; last checkpoint: {checkpoint or 'none saved yet'} "
        "(resume with --ckpt_path last)"
    )
