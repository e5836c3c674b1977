"""Evaluation on many ranks: each rank encodes its share of a split, the features come back in
split order, and only rank 0 writes.

DINO's ``eval_knn`` / ``eval_linear`` and DINOv2's ``eval/`` extract features on every GPU of a
``torchrun`` job; here an evaluation command does the same when a launcher started it, ``torchrun``
or ``srun`` as for ``fit`` (docs/multinode.md), and runs in one process otherwise, unchanged:

- :func:`launched_ranks` reads the launch from the variables torchrun sets, or srun in each task it
  starts (not through Lightning's cluster environments as ``fit`` does: evaluation needs the rank
  variables alone, and Lightning's ``SLURMEnvironment`` refuses a job asked with ``--ntasks``), and
  :func:`evaluation_ranks` holds the process group for the block (gloo on the CPU, NCCL on CUDA,
  met at ``MASTER_ADDR:MASTER_PORT``) and destroys it after, however the block ends;
- :meth:`Ranks.share` splits a split's ``count`` images into contiguous per-rank ranges in rank
  order (the first ``count % world_size`` ranks take one more), with no image twice: unlike a
  ``DistributedSampler``, which pads the last ranks with repeated images, the gathered features
  are exactly the split's, so every number equals one process's;
- :func:`gather_rows` concatenates the ranks' rows (any number per rank: images that do not decode
  are dropped where they are found) in rank order, which is split order, to every rank or to rank 0
  only, in bounded chunks (ImageNet's 1.28 M class tokens are 2 GB at D = 384);
  :func:`gather_objects` does the same for small Python lists (names of skipped images);
- :func:`broadcast_module`: rank 0's copy of a module every rank trained on the same data (a probe's
  head), so that one head scores every rank's share of the query images;
- :func:`is_writer`: only rank 0 writes results, reports and figures.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from locatdino.common.errors import UserError
from locatdino.common.output_files import feature_rows

SRUN_TASK_VARIABLE = "SLURM_STEP_ID"  # set by srun in every task it starts, not in a batch script's own shell
T = TypeVar("T")
GATHER_CHUNK_BYTES = 64 << 20  # per rank and collective: bounds the receive buffer at world_size x this
BYTE_SENT = (np.dtype(np.bool_), np.dtype(np.int16), np.dtype(np.uint16))  # gloo has no collectives of these


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in its launch: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def many(self) -> bool:
        return self.world_size > 1

    def share(self, count: int) -> range:
        """This rank's contiguous part of ``range(count)`` (see :func:`shares`)."""
        return shares(count, self.world_size)[self.rank]

    def device(self, device: torch.device | str) -> torch.device:
        """The device this rank computes on: its own GPU (``cuda:<local_rank>``) when ``device`` is a
        GPU and the launch has many ranks, else ``device`` itself."""
        device = torch.device(device)
        return torch.device("cuda", self.local_rank) if device.type == "cuda" and self.many else device


def shares(count: int, world_size: int) -> list[range]:
    """``range(count)`` cut into ``world_size`` contiguous ranges in rank order whose lengths differ
    by at most one (the first ``count % world_size`` are one longer): every index exactly once."""
    if world_size < 1 or count < 0:
        raise ValueError(f"cannot share {count} items among {world_size} ranks")
    base, extra = divmod(count, world_size)
    bounds = [rank * base + min(rank, extra) for rank in range(world_size + 1)]
    return [range(bounds[rank], bounds[rank + 1]) for rank in range(world_size)]


def launched_ranks() -> Ranks:
    """This process's :class:`Ranks` as its launcher says: torchrun's ``RANK`` / ``WORLD_SIZE`` /
    ``LOCAL_RANK``, or srun's ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` in a task that
    srun started (a batch script's own shell is one process); one rank without a launcher."""
    if dist.is_torchelastic_launched():
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    elif SRUN_TASK_VARIABLE in os.environ and "SLURM_PROCID" in os.environ:
        names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    else:
        return Ranks()
    try:
        return Ranks(*(int(os.environ[name]) for name in names))
    except (KeyError, ValueError):
        shown = ", ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in names)
        raise UserError(f"the launcher's rank variables are not whole numbers: {shown}") from None


def _check_rendezvous(ranks: Ranks) -> None:
    """One line when the ranks have no address to meet at: srun, unlike torchrun, sets none."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise UserError(
            f"rank {ranks.rank} of {ranks.world_size} has no {' or '.join(missing)} to meet the other ranks at: "
            "under srun export MASTER_ADDR (the first host of the job) and MASTER_PORT (launch/slurm_eval.sbatch)"
        )


@contextlib.contextmanager
def evaluation_ranks(device: torch.device | str = "cpu", collective_timeout: float | None = None) -> Iterator[Ranks]:
    """The launch's :class:`Ranks`, with its process group for the block when there are many (NCCL
    when ``device`` is a GPU, else gloo; ``collective_timeout`` for every collective, torch's default when
    None); a process group that exists already (``fit``'s) is used and left as it is."""
    ranks = launched_ranks()
    if not ranks.many or dist.is_initialized():
        yield current_ranks() if dist.is_initialized() else ranks
        return
    _check_rendezvous(ranks)
    gpu = torch.device(device).type == "cuda"
    if gpu:
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method="env://",
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=None if collective_timeout is None else timedelta(seconds=collective_timeout),
    )
    try:
        yield ranks
    finally:
        dist.destroy_process_group()


def current_ranks() -> Ranks:
    """The :class:`Ranks` of the process group this process is in (one rank when it is in none)."""
    if not dist.is_initialized():
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size(), launched_ranks().local_rank)


def is_writer() -> bool:
    """Whether this process writes the results: rank 0, or the only process."""
    return not dist.is_initialized() or dist.get_rank() == 0


def checked_by_writer(check: Callable[[], T]) -> T | None:
    """``check()`` run on rank 0 alone (the output folder's checks: the other ranks would find rank
    0's fresh files there), its result there and None elsewhere; when it fails (``SystemExit`` or
    :class:`~locatdino.common.errors.UserError`, a one-line refusal) every rank stops with the same
    line instead of waiting for rank 0 in the next collective."""
    result, error = None, None
    if is_writer():
        try:
            result = check()
        except (SystemExit, UserError) as err:
            error = err
    if dist.is_initialized() and dist.get_world_size() > 1:
        said = [None if error is None else (isinstance(error, UserError), str(error))]
        dist.broadcast_object_list(said, src=0)
        if error is None and said[0] is not None:
            user, message = said[0]
            error = UserError(message) if user else SystemExit(message)
    if error is not None:
        raise error
    return result


def _collective_device() -> torch.device:
    """Where tensors must be for the process group's collectives (NCCL: this rank's GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_rows(rows: np.ndarray, *, to_all: bool = True, out: np.ndarray | None = None) -> np.ndarray | None:
    """Every rank's ``rows [n_rank, ...]`` concatenated in rank order (``[sum n_rank, ...]``), on every
    rank (``to_all``) or on rank 0 only (None elsewhere); written into ``out`` when given (a
    memory-mapped array, say), which must have that shape. The ranks' trailing shapes and dtypes
    must agree. In one process ``rows`` itself (copied into ``out`` when given)."""
    rows = np.ascontiguousarray(rows)
    if rows.dtype in BYTE_SENT:  # types gloo has no collectives for: each row sent as its bytes
        if out is not None and not out.flags.c_contiguous:
            raise ValueError("gather_rows: out must be C-contiguous to receive rows of bytes")
        width = int(np.prod(rows.shape[1:]))
        as_bytes = rows.reshape(len(rows), width).view(np.uint8)
        gathered = gather_rows(
            as_bytes, to_all=to_all, out=None if out is None else out.reshape(len(out), width).view(np.uint8)
        )
        return None if gathered is None else gathered.view(rows.dtype).reshape(-1, *rows.shape[1:])
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if out is None:
            return rows
        out[...] = rows
        return out
    world, device = dist.get_world_size(), _collective_device()
    counts = [int(n) for n in _all_gather(torch.tensor([len(rows)], device=device))]
    receives = to_all or dist.get_rank() == 0
    total = sum(counts)
    if receives and out is None:
        out = np.empty((total, *rows.shape[1:]), rows.dtype)
    if receives and out is not None and out.shape != (total, *rows.shape[1:]):
        raise ValueError(f"gather_rows: out has shape {out.shape}, the ranks' rows make {(total, *rows.shape[1:])}")
    row_bytes = max(1, rows.itemsize * int(np.prod(rows.shape[1:])))
    step = max(1, GATHER_CHUNK_BYTES // row_bytes)
    starts = np.cumsum([0, *counts])
    for begin in range(0, max(counts), step):
        size = min(step, max(counts) - begin)
        piece = torch.zeros((size, *rows.shape[1:]), dtype=torch.from_numpy(rows[:0]).dtype)
        mine = rows[begin : begin + size]
        piece[: len(mine)] = torch.from_numpy(mine)
        parts = _gather(piece.to(device), world, to_all)
        if parts is None:
            continue
        for rank, part in enumerate(parts):
            valid = max(0, min(size, counts[rank] - begin))
            out[starts[rank] + begin : starts[rank] + begin + valid] = part[:valid].cpu().numpy()
    return out if receives else None


@contextlib.contextmanager
def gathered_rows(rows: np.ndarray, cache_dir: str | None, max_ram_bytes: int, name: str) -> Iterator[np.ndarray]:
    """Every rank's float32 ``rows [n_rank, D]`` in rank order on every rank, for the block: in RAM
    up to ``max_ram_bytes``, else memory-mapped in a temporary folder ``name`` under ``cache_dir``
    (:func:`~locatdino.common.output_files.feature_rows`); ``rows`` itself in one process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        yield rows
        return
    total = sum(gather_objects([len(rows)]))
    with feature_rows(total, rows.shape[1], cache_dir, max_ram_bytes, name) as out:
        yield gather_rows(rows, out=out)


def _all_gather(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts).cpu()


def _gather(tensor: torch.Tensor, world: int, to_all: bool) -> list[torch.Tensor] | None:
    """Every rank's ``tensor`` (same shape on all), on every rank or on rank 0 (None elsewhere)."""
    if to_all:
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor)
        return parts
    root = dist.get_rank() == 0
    parts = [torch.empty_like(tensor) for _ in range(world)] if root else None
    dist.gather(tensor, parts, dst=0)
    return parts


def gather_objects(items: list[Any], *, to_all: bool = True) -> list[Any] | None:
    """Every rank's list ``items`` (picklable, small: names, counts) concatenated in rank order, on
    every rank or on rank 0 only (None elsewhere); ``items`` itself in one process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return items
    world = dist.get_world_size()
    if to_all:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, items)
    else:
        parts = [None] * world if dist.get_rank() == 0 else None
        dist.gather_object(items, parts, dst=0)
        if parts is None:
            return None
    return [item for part in parts for item in part]


def extract_shared(
    extract: Callable[[range], np.ndarray], count: int, *, to_all: bool = True, out: np.ndarray | None = None
) -> np.ndarray | None:
    """``extract(indices)`` (the rows of images ``indices``) run by each rank on its share of
    ``range(count)`` and gathered (:func:`gather_rows`): the rows of all ``count`` images in order,
    as ``extract(range(count))`` in one process gives them."""
    return gather_rows(extract(current_ranks().share(count)), to_all=to_all, out=out)


def broadcast_module(module: nn.Module) -> nn.Module:
    """``module`` with rank 0's parameters and buffers on every rank, in place: ranks that trained the
    same head on the same batches can still differ in the last bits (GPU kernels with atomic adds),
    and their shares of the query images must be scored by one head; nothing to do in one process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)
    return module
