"""Write WebDataset tar shards from a ``ShardSource``, in parallel, with an index beside them.

Layout of ``out_dir`` after a run::

    shard-000000.tar ... shard-000041.tar   consecutive, ``maxcount`` samples each (the last fewer)
    index.json                              counts per shard, classes, sizes, brace pattern

How a run stays safe:
- the items are cut into chunks of ``maxcount``; each worker process writes its chunks with
  ``webdataset.ShardWriter`` (which also starts a new shard past ``maxsize`` bytes) into a
  temporary folder inside ``out_dir``; only when every chunk succeeded are the shards renamed to
  consecutive names and ``index.json`` written (atomically). A failed run leaves ``out_dir``
  as it was (a killed run's temporary folder is removed at the next start in the same
  ``out_dir``). The output is the same for any number of workers. The workers end with the run
  (:func:`locatdino.common.processes.worker_pool`): a stopped or killed run leaves none behind.
- an ``out_dir`` that already holds shards is refused unless ``overwrite=True``, which deletes
  the shards the previous ``index.json`` lists, only after the new set is complete; a ``.tar``
  that index does not list, or ``.tar`` files without an index, stop the run before any work
  (naming one) and are never deleted, so a ``*.tar`` glob never mixes two runs.
- ``prefix`` is a file-name stem (:func:`check_prefix`): ``../x`` or ``/abs/x`` would write
  outside ``out_dir``, over whatever is there.
- a sample the source cannot decode (``DecodeError``) is skipped, counted and named in the index
  (``skipped_files``); a source with no usable sample is refused, and a disk that fills ends the
  run with one line (:class:`~locatdino.common.output_files.DiskFullError`), ``out_dir`` as it was.
"""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import re
import shutil
import time
from collections import Counter
from concurrent.futures import FIRST_EXCEPTION, wait
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from tqdm import tqdm

from locatdino.common.output_files import (
    DiskFullError,
    atomic_write_text,
    disk_full_message,
    make_temporary_dir,
    remove_stale_temporaries,
)
from locatdino.common.processes import worker_pool
from locatdino.common.progress import progress as progress_bar
from locatdino.common.threads import available_cores
from locatdino.data.shards.sources import ShardSource
from locatdino.data.transforms.decode import DecodeError

INDEX_NAME = "index.json"
SKIPPED_NAMED = 100  # skipped files named in index.json (all are counted)
_PREFIX = re.compile(r"[\w+-][\w.+-]*")
_SHARD_NAME = re.compile(r"[\w+-][\w.+-]*\.tar")  # a file name in out_dir, no path
_worker: dict[str, Any] = {}


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a file-name stem (letters, digits, ``_ - + .``; no path separator,
    no ``..``), else ``ValueError`` naming ``--prefix``."""
    if not _PREFIX.fullmatch(prefix) or ".." in prefix:
        raise ValueError(
            f"--prefix {prefix!r} is not a file-name stem (letters, digits, '_', '-', '+', '.'; no '/' "
            "or '..'): the shards are written into OUT_DIR"
        )
    return prefix


def _init_worker(source: ShardSource, counter: Any) -> None:
    if counter is not None:  # a pool process: processes, not threads, give the parallelism
        torch.set_num_threads(1)
    _worker.update(source=source, counter=counter)


def _write_chunk(chunk: int, items: list[Any], tmp: str, maxcount: int, maxsize: float) -> dict[str, list[Any]]:
    """Write one chunk of items with a ShardWriter; returns ``{"shards": [{path, num_samples,
    cls}], "skipped": ["<file>: <reason>"]}`` (a shard left empty by skips is removed)."""
    source, counter = _worker["source"], _worker["counter"]
    shards: list[dict[str, Any]] = []
    skipped: list[str] = []
    classes: Counter[str] = Counter()

    def finished(fname: str) -> None:
        if writer.count == 0:  # ShardWriter opens its first shard before the first sample
            os.remove(fname)
            return
        shards.append({"path": fname, "num_samples": writer.count, "cls": dict(classes)})
        classes.clear()

    writer = wds.ShardWriter(
        os.path.join(tmp, f"{chunk:06d}-%04d.tar"), maxcount=maxcount, maxsize=maxsize, post=finished, verbose=0
    )
    with writer:
        for item in items:
            try:
                sample = source.sample(item)
                writer.write(sample)
                classes.update([sample["cls"]] if "cls" in sample else [])
            except DecodeError as exc:
                skipped.append(str(exc))
            if counter is not None:
                with counter.get_lock():
                    counter.value += 1
    return {"shards": shards, "skipped": skipped}


def _listed_shards(out: Path) -> list[str]:
    """The shard names ``out``'s index.json lists (plain file names ending in ``.tar``); an index
    that lists none this way is refused in one line (nothing is removed on its word)."""
    index = out / INDEX_NAME
    refused = "(written by locatdino shards?): refusing to remove anything; choose another directory"
    try:
        names = [shard["name"] for shard in json.loads(index.read_text())["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise FileExistsError(f"{index} does not list its shards {refused}") from None
    bad = [name for name in names if not (isinstance(name, str) and _SHARD_NAME.fullmatch(name))]
    if bad:
        raise FileExistsError(f"{index} lists {bad[0]!r}, not a shard file name {refused}")
    return names


def _previous_shards(out: Path, overwrite: bool) -> list[Path]:
    """The shards of an earlier run that ``overwrite`` replaces: exactly those its index.json
    lists. Refused in one line, before any work: a folder holding shards without ``overwrite``, a
    ``.tar`` the index does not list, ``.tar`` files and no index."""
    tars = sorted(p.name for p in out.glob("*.tar"))
    index = out / INDEX_NAME
    if not tars and not index.exists():
        return []
    if not overwrite:
        found = f"{len(tars)} .tar file(s)" + (" and index.json" if index.exists() else "")
        raise FileExistsError(
            f"{out} already holds shards ({found}); pass --overwrite (overwrite=True) to "
            "replace them, or choose another directory"
        )
    if not index.exists():  # so there are .tar files
        raise FileExistsError(
            f"{out} holds {len(tars)} .tar file(s) (e.g. {tars[0]}) but no {INDEX_NAME}: no shard set of "
            "locatdino shards to replace; move them or choose another directory"
        )
    listed = _listed_shards(out)
    unlisted = [name for name in tars if name not in listed]
    if unlisted:
        more = f" and {len(unlisted) - 1} more" if len(unlisted) > 1 else ""
        raise FileExistsError(
            f"{out} holds {unlisted[0]}{more}, which its {INDEX_NAME} does not list: --overwrite replaces only "
            "the listed shards, and a *.tar glob would mix two sets; move it or choose another directory"
        )
    return [out / name for name in listed if (out / name).is_file()]


def write_shards(
    source: ShardSource,
    out_dir: str | Path,
    *,
    maxcount: int = 10_000,
    maxsize: float = 1e9,
    workers: int | None = None,
    prefix: str = "shard",
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Write ``source`` as tar shards into ``out_dir``; returns the index (also saved as index.json).

    Args:
        source: a ``ShardSource`` (see ``locatdino.data.shards.sources.build_source``).
        maxcount: samples per shard (also the unit of work of one process).
        maxsize: bytes after which ``ShardWriter`` starts a new shard (a shard may exceed it by
            one sample).
        workers: writer processes (default: the cores this process may use; 0 or 1 writes in this process).
        prefix: shard file-name stem (:func:`check_prefix`).
    """
    check_prefix(prefix)
    if maxcount < 1 or not maxsize > 0:
        raise ValueError(f"maxcount must be at least 1 and maxsize more than 0 bytes, got {maxcount} and {maxsize}")
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    previous = _previous_shards(out, overwrite)
    items = source.items()
    chunks = [items[i : i + maxcount] for i in range(0, len(items), maxcount)]
    workers = min(workers if workers is not None else available_cores(), len(chunks))
    tmp = str(make_temporary_dir(out / "tmp-shards"))
    start = time.time()
    try:
        with progress_bar(total=len(items), unit="img", desc=f"shards → {out}", disable=not progress) as bar:
            results = _run(source, chunks, tmp, maxcount, maxsize, workers, bar)
        written = [s for chunk in results for s in chunk["shards"]]
        skipped = [note for chunk in results for note in chunk["skipped"]]
        if not written:
            raise ValueError(f"nothing to write: none of the {len(skipped)} file(s) decodes, e.g. {skipped[0]}")
        for old in previous:
            old.unlink()
        index = _finalise(written, skipped, out, prefix, source, time.time() - start)
    except OSError as exc:  # a full disk, also when a writer process met it
        if disk_full_message(exc) is None:
            raise
        raise DiskFullError(
            errno.ENOSPC,
            f"{out}: {os.strerror(errno.ENOSPC)} while writing shards (no shard written; the folder is as it was)",
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not any(out.iterdir()):  # a failed first run leaves no empty folder behind
            out.rmdir()
    return index


def _run(
    source: ShardSource, chunks: list[list[Any]], tmp: str, maxcount: int, maxsize: float, workers: int, bar: tqdm
) -> list[dict[str, list[Any]]]:
    if workers <= 1:
        _init_worker(source, None)
        results = []
        for i, chunk in enumerate(chunks):
            results.append(_write_chunk(i, chunk, tmp, maxcount, maxsize))
            bar.update(len(chunk))
        return results
    counter = mp.get_context("fork").Value("q", 0)
    with worker_pool(workers, initializer=_init_worker, initargs=(source, counter)) as pool:
        futures = [pool.submit(_write_chunk, i, c, tmp, maxcount, maxsize) for i, c in enumerate(chunks)]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            bar.update(counter.value - bar.n)
            for f in done:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise f.exception()
        return [f.result() for f in futures]


def _finalise(
    written: list[dict[str, Any]], skipped: list[str], out: Path, prefix: str, source: ShardSource, seconds: float
) -> dict[str, Any]:
    shards, class_counts = [], Counter()
    for i, s in enumerate(written):
        name = f"{prefix}-{i:06d}.tar"
        os.replace(s["path"], out / name)
        shards.append({"name": name, "num_samples": s["num_samples"], "bytes": (out / name).stat().st_size})
        class_counts.update(s["cls"])
    index = {
        "format": "locatdino-shards/1",
        "source": source.kind,
        "urls": f"{prefix}-{{{0:06d}..{len(shards) - 1:06d}}}.tar",
        "num_samples": sum(s["num_samples"] for s in shards),
        "num_shards": len(shards),
        "total_bytes": sum(s["bytes"] for s in shards),
        "shards": shards,
        **source.metadata(),
        "class_counts": {k: class_counts[k] for k in sorted(class_counts, key=int)} if class_counts else None,
        "skipped_files": {"count": len(skipped), "first": skipped[:SKIPPED_NAMED]},
        "seconds": round(seconds, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(out / INDEX_NAME, json.dumps(index, indent=1))
    return index
