"""Stream multi-crop batches from WebDataset shards, split over ranks and DataLoader workers.

Order of operations in each worker (docs/data.md): shard list → rank split → worker split → tar
reading → sample shuffle buffer → robust decode → multi-crop → batch. Two modes:

- **one pass** (``num_batches=None``): every shard is read once, split round-robin over ranks
  (``rank::world_size``) then workers (``webdataset.split_by_worker``): each sample is seen exactly
  once, the last batch of a worker may be short. Ranks may get different batch counts, so use
  this for evaluation or single-process runs only.
- **fixed length** (``num_batches=N`` per rank, used for training): every rank yields exactly
  ``N`` batches per epoch, shared as evenly as possible by its workers, so DDP ranks never
  disagree on the step count (an uneven count deadlocks the gradient all-reduce). Shards come
  from an endless stream: ``resampled=True`` draws shards with replacement per worker
  (``webdataset.ResampledShards``, the multi-node recipe); otherwise the shard list is cycled, each
  cycle in a new seeded order, and the endless stream is split ``rank::world`` / ``worker::W``, so
  no rank or worker is ever without data, even with fewer shards than ranks × workers.

The rank comes from the trainer (``ShardDataModule``) instead of webdataset's ``split_by_node``
environment probing: DataLoader workers started with ``spawn`` do not inherit the process group,
and tests can simulate ranks. Shuffles are seeded by ``(seed, epoch, rank, worker)``;
``ShardLoader`` increments ``epoch`` each time an epoch starts, so every epoch differs and a run
is reproducible.

Corrupt samples (undecodable, truncated, no image key, any failure of the transform) are skipped
and counted exactly: each batch carries ``skipped`` (int64, samples this worker dropped since its
previous batch) and ``skipped_keys`` (``"<shard>:<key>: <reason>"`` strings). A damaged tar
(header errors) cannot be counted sample by sample; it is reported in ``skipped_keys`` as a shard
error and streaming continues with the next shard. Samples a truncated shard lost (fewer read
than ``index.json`` says) are counted once per epoch, not at every re-read of a cycled shard:
by the rank and worker that read the shard in the epoch's first cycle (in ``resampled`` mode,
where no cycle exists, once per worker and epoch).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import random
import signal
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import count, islice
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.shardlists import expand_urls as _expand_braces
from webdataset.tariterators import base_plus_ext
from webdataset.utils import make_seed

from locatdino.data.shards.writer import INDEX_NAME
from locatdino.data.transforms.decode import decode_rgb, find_image
from locatdino.data.transforms.multicrop import collate_multicrop

_GLOB_CHARS = set("*?[")
log = logging.getLogger(__name__)


def _is_remote(url: str) -> bool:
    return "://" in url or url.startswith("pipe:")


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """Shard URLs from a list, or a string of ``::``-separated parts, each part a directory
    (its ``*.tar``, sorted), a glob, a brace pattern (``shard-{000000..000099}.tar``) or a URL."""
    parts = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    out: list[str] = []
    for part in parts:
        for url in _expand_braces(os.path.expanduser(str(part))):
            if os.path.isdir(url):  # files only: a folder named x.tar is not a shard
                found = sorted(filter(os.path.isfile, glob.glob(os.path.join(url, "*.tar"))))
            elif _is_remote(url):
                found = [url]
            elif _GLOB_CHARS & set(url):
                found = sorted(filter(os.path.isfile, glob.glob(url)))
            else:
                found = [url] if os.path.isfile(url) else []
            if not found:
                raise FileNotFoundError(f"no shards match {url!r}")
            out += found
    if not out:
        raise FileNotFoundError(f"no shard URLs in {urls!r}")
    return out


def tar_sample_members(tar: tarfile.TarFile) -> Iterator[tuple[str, str, tarfile.TarInfo]]:
    """``(key, extension, member)`` of the files of an open tar, keyed as webdataset groups them
    into samples (``base_plus_ext``: up to the first dot of the base name; no dot, no sample)."""
    for m in tar:
        key, ext = base_plus_ext(m.name) if m.isfile() else (None, None)
        if key is not None:
            yield key, ext, m


def _count_tar_samples(url: str) -> int:
    """Distinct sample keys in a local tar; a damaged tar counts what can be read (warned)."""
    keys: set[str] = set()
    try:
        with tarfile.open(url) as tar:
            keys.update(key for key, _, _ in tar_sample_members(tar))
    except (tarfile.TarError, OSError) as exc:
        log.warning("shard %s is damaged (%s); counting its %d readable samples", url, exc, len(keys))
    return len(keys)


def shard_sizes(urls: Sequence[str]) -> list[int] | None:
    """Samples per shard from the ``index.json`` written beside the shards, else by listing local
    tar headers (no data is read); ``None`` when neither is possible (remote shards).

    The index is checked against the files before it is trusted (:func:`_checked_index`): a
    shard larger than it recorded was rewritten since, and is counted from its tar; a smaller one
    is truncated, and keeps the written count, so its lost samples are counted as skipped.
    """
    indexes: dict[str, dict[str, dict[str, Any]]] = {}
    sizes = []
    for url in urls:
        folder, name = os.path.split(url)
        if folder not in indexes:
            indexes[folder] = _checked_index(folder, url)
        entry = indexes[folder].get(name)
        if entry is not None and not _grown(entry, url):
            sizes.append(entry["num_samples"])
        elif os.path.isfile(url):
            sizes.append(_count_tar_samples(url))
        else:
            return None
    return sizes


def _grown(entry: dict[str, Any], url: str) -> bool:
    """Whether local shard ``url`` holds more bytes than ``index.json`` recorded (warned)."""
    recorded = entry.get("bytes")
    if recorded is None or not os.path.isfile(url) or os.path.getsize(url) <= recorded:
        return False
    log.warning(
        "%s has %d bytes, index.json recorded %d: counting its samples from the tar",
        url,
        os.path.getsize(url),
        recorded,
    )
    return True


def _checked_index(folder: str, probe: str) -> dict[str, dict[str, Any]]:
    """``{shard name: entry}`` of ``folder``'s ``index.json``, or ``{}`` (count from the tars) when
    there is none, it is not valid JSON, or it miscounts ``probe`` (one local shard of its size as
    recorded, whose tar headers are counted): an index left by other shards is not trusted."""
    path = Path(folder or ".") / INDEX_NAME
    if not path.is_file():
        return {}
    try:
        entries = {s["name"]: s for s in json.loads(path.read_text()).get("shards", [])}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("%s is not a shard index (%s): counting samples from the tars", path, exc)
        return {}
    entry = entries.get(os.path.basename(probe))
    if entry is not None and os.path.isfile(probe) and os.path.getsize(probe) >= entry.get("bytes", 0):  # not truncated
        counted = _count_tar_samples(probe)
        if counted != entry["num_samples"]:
            log.warning(
                "%s says %d samples in %s, its tar holds %d: the index does not describe these shards, "
                "counting every shard from its tar",
                path,
                entry["num_samples"],
                probe,
                counted,
            )
            return {}
    return entries


class _SkipLog:
    """Samples and shards a worker had to drop since its last batch.

    ``owned``: the shards whose lost samples this worker counts this epoch (``None``: all), each
    once, so a shard cycled several times per epoch is not counted at every read.
    """

    def __init__(self, owned: set[str] | None = None) -> None:
        self.count, self.notes = 0, []
        self.owned, self._counted, self._shard_errors = owned, set(), set()

    def sample(self, sample: dict[str, Any], exc: Exception) -> None:
        self.count += 1
        self.notes.append(f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}: {exc}")

    def shard_error(self, exc: Exception) -> bool:
        """webdataset handler for tar-level errors: note it (once per epoch), continue with the next shard."""
        note = f"shard error, rest of shard lost: {type(exc).__name__}: {exc}"
        if note not in self._shard_errors:
            self._shard_errors.add(note)
            self.notes.append(note)
        return True

    def short_shard(self, url: str | None, seen: int, expected: int | None) -> None:
        """A shard read ``seen`` samples (a multiple of its size when drawn twice in a row)."""
        if url in self._counted or (self.owned is not None and url not in self.owned):
            return
        lost = (expected - seen % expected) % expected if url and expected else 0
        if lost:
            self._counted.add(url)
            self.count += lost
            self.notes.append(f"{url}: {lost} sample(s) missing of {expected} (truncated or damaged tar)")

    def pop(self) -> tuple[int, list[str]]:
        out = (self.count, self.notes)
        self.count, self.notes = 0, []
        return out


class ShardStream(IterableDataset):
    """Multi-crop batches from shards for one rank (see the module docstring for the modes).

    Args:
        urls: shard URLs (already expanded, see ``expand_urls``).
        transform: image (PIL RGB) → list of crops, e.g. ``MultiCropTransform``.
        batch_size: samples per batch (per rank).
        num_batches: batches per epoch for this rank, or ``None`` for one exact pass.
        rank, world_size: this process's place in the data-parallel group.
        resampled: draw shards with replacement (needs ``num_batches``).
        shuffle_shards: shuffle the shard order (one-pass and cycling modes).
        shuffle_buffer: sample shuffle buffer per worker (1 disables).
        seed: base seed of every shuffle.
        shard_sizes: samples per shard as written (``index.json``); a shard that yields fewer
            (truncated or damaged tar) adds the missing samples to ``skipped``.
        target: ``sample → label`` (e.g. its ``cls``) for labelled streams: each item is then
            ``(transform(image), target(sample))``; a sample it fails on is skipped and counted.
        collate: items → batch dict; default :func:`collate_multicrop` (the DINO batch).
        decode: encoded bytes → what ``transform`` takes; default :func:`decode_rgb` (PIL RGB).
    """

    def __init__(
        self,
        urls: Sequence[str],
        transform: Callable[[Any], list[torch.Tensor]],
        batch_size: int,
        *,
        num_batches: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        resampled: bool = False,
        shuffle_shards: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        shard_sizes: Sequence[int] | None = None,
        target: Callable[[dict[str, Any]], Any] | None = None,
        collate: Callable[[list[Any]], dict[str, Any]] | None = None,
        decode: Callable[[bytes], Any] = decode_rgb,
    ) -> None:
        super().__init__()
        if not urls:
            raise ValueError("ShardStream: no shard URLs")
        if resampled and num_batches is None:
            raise ValueError("ShardStream: resampled=True streams forever; set num_batches")
        if not 0 <= rank < world_size:
            raise ValueError(f"ShardStream: rank {rank} not in [0, {world_size})")
        self.urls, self.transform, self.batch_size = list(urls), transform, batch_size
        self.num_batches, self.rank, self.world_size = num_batches, rank, world_size
        self.resampled, self.shuffle_shards, self.shuffle_buffer, self.seed = (
            resampled,
            shuffle_shards,
            shuffle_buffer,
            seed,
        )
        self.expected = dict(zip(self.urls, shard_sizes)) if shard_sizes is not None else {}
        self.target, self.collate, self.decode = target, collate, decode
        self.epoch = 0

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("ShardStream in one-pass mode has no length")
        return self.num_batches

    def _shard_order(self, endless: bool) -> Iterator[tuple[int, str]]:
        """``(cycle, url)`` of all shards, once or cycled forever, each cycle in a new seeded order."""
        for cycle in count() if endless else range(1):
            order = list(self.urls)
            if self.shuffle_shards:
                random.Random(make_seed(self.seed, self.epoch, cycle)).shuffle(order)
            yield from ((cycle, url) for url in order)

    def _shards(self, worker: int, owned: set[str]) -> Iterable[dict[str, str]]:
        """This worker's shards; those of the epoch's first cycle are added to ``owned`` as read."""
        if self.resampled:
            return wds.ResampledShards(
                self.urls,
                seed=make_seed(self.seed, self.epoch),
                worker_seed=lambda: make_seed(self.rank, worker),
                deterministic=True,
            )
        mine = islice(self._shard_order(self.num_batches is not None), self.rank, None, self.world_size)
        return self._noting_first_cycle(wds.split_by_worker(mine), owned)

    @staticmethod
    def _noting_first_cycle(shards: Iterable[tuple[int, str]], owned: set[str]) -> Iterator[dict[str, str]]:
        for cycle, url in shards:
            if cycle == 0:
                owned.add(url)
            yield {"url": url}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is not None:
            leave_stop_signals_to_the_trainer()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        owned: set[str] = set()
        log = _SkipLog(None if self.resampled else owned)
        samples = wds.tarfile_to_samples(handler=log.shard_error)(self._shards(worker, owned))
        if self.expected:
            samples = self._count_per_shard(samples, log)
        if self.shuffle_buffer > 1:
            rng = random.Random(make_seed(self.seed, self.epoch, self.rank, worker, 1))
            samples = wds.shuffle(self.shuffle_buffer, initial=min(100, self.shuffle_buffer), rng=rng)(samples)
        batches = self._batches(samples, log)
        if self.num_batches is None:
            return batches
        share = self.num_batches // workers + (worker < self.num_batches % workers)
        return islice(batches, share)

    def _count_per_shard(self, samples: Iterable[dict[str, Any]], log: _SkipLog) -> Iterator[dict[str, Any]]:
        """Pass samples through; when a shard ends short of its written size, count the loss."""
        url, n = None, 0
        for sample in samples:
            if sample.get("__url__") != url:
                log.short_shard(url, n, self.expected.get(url))
                url, n = sample.get("__url__"), 0
            n += 1
            yield sample
        log.short_shard(url, n, self.expected.get(url))

    def check_usable(self) -> None:
        """``ValueError`` naming the shards unless one of their samples decodes (and has its label):
        a fixed-length stream over shards where every sample is skipped would read them forever
        without yielding a batch. Reads in order up to the first good sample (usually the first)."""
        log = _SkipLog()
        read = 0
        for sample in wds.tarfile_to_samples(handler=log.shard_error)({"url": url} for url in self.urls):
            read += 1
            try:
                self.decode(find_image(sample))
                if self.target is not None:
                    self.target(sample)
                return
            except Exception as exc:  # noqa: BLE001 - what _batches would skip
                log.sample(sample, exc)
        where = self.urls[0] + (f" and {len(self.urls) - 1} more" if len(self.urls) > 1 else "")
        reason = log.notes[0] if log.notes else "no sample in them"
        raise ValueError(f"no usable sample in the shards {where}: {read} read, every one skipped ({reason})")

    def _batches(self, samples: Iterable[dict[str, Any]], log: _SkipLog) -> Iterator[dict[str, Any]]:
        buf: list[Any] = []
        for sample in samples:
            try:
                item = self.transform(self.decode(find_image(sample)))
                buf.append(item if self.target is None else (item, self.target(sample)))
            except Exception as exc:  # a bad sample is skipped and counted, never fatal
                log.sample(sample, exc)
                continue
            if len(buf) == self.batch_size:
                yield self._collate(buf, log)
                buf = []
        if buf:  # only reached in one-pass mode: keep the remainder so every sample is seen
            yield self._collate(buf, log)

    def _collate(self, buf: list[Any], log: _SkipLog) -> dict[str, Any]:
        if self.collate is None:
            batch = collate_multicrop(buf, num_global_crops=getattr(self.transform, "num_global_crops", None))
        else:
            batch = self.collate(buf)
        skipped, batch["skipped_keys"] = log.pop()
        batch["skipped"] = torch.tensor(skipped, dtype=torch.int64)
        return batch


def leave_stop_signals_to_the_trainer() -> None:
    """In a DataLoader worker: ignore SIGTERM and SIGUSR1. A scheduler signals every process of a
    job, workers included; a worker killed by it (torch's default) fails the training process's
    next batch before it could save its checkpoint. The training process handles both
    (``locatdino.ssl.run.stop_checkpoint``) and ends its workers itself. Called as a worker starts
    iterating, not as a ``worker_init_fn``: a loader with its own ``worker_init_fn`` would not get
    Lightning's ``pl_worker_init_function``, which seeds each worker by the global seed, the worker
    and the rank (without it every rank's workers draw the same augmentations)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


class ShardLoader(DataLoader):
    """DataLoader over a ``ShardStream`` (batches come ready-made: ``batch_size=None``).

    Starts a new ``epoch`` of the stream on every ``iter()``; workers are not persistent, so each
    epoch's workers receive the stream with the new epoch number (new shard and sample orders).
    ``len()`` is the fixed number of batches per rank. Workers leave a scheduler's stop signals to
    the training process (:func:`leave_stop_signals_to_the_trainer`, in ``ShardStream.__iter__``).
    """

    def __init__(self, stream: ShardStream, num_workers: int = 0, **kwargs: Any) -> None:
        super().__init__(stream, batch_size=None, num_workers=num_workers, persistent_workers=False, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        self.dataset.epoch += 1
        return super().__iter__()
