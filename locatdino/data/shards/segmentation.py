"""``ShardSegmentation``: a map-style (image, mask) dataset over labelled WebDataset shards.

Shards written by ``locatdino shards`` from VOC, ADE20K or the built-in scenes hold ``jpg`` +
``seg.png`` per sample and an ``index.json`` with ``num_classes``, ``ignore_index`` and class names.
Evaluation needs random access, so local tar files are indexed once (member offsets from the tar
headers, nothing decoded) and samples are read on demand; remote shards are read into memory.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds
from PIL import Image

from locatdino.data.shards.stream import expand_urls, tar_sample_members
from locatdino.data.shards.writer import INDEX_NAME
from locatdino.data.transforms.decode import IMAGE_KEYS, decode_mask, decode_rgb

MASK_KEY = "seg.png"


def _tar_members(path: str) -> dict[str, dict[str, tuple[int, int]]]:
    """``{key: {ext: (data offset, size)}}`` of a local tar, in file order."""
    samples: dict[str, dict[str, tuple[int, int]]] = {}
    with tarfile.open(path) as tar:
        for key, ext, m in tar_sample_members(tar):
            samples.setdefault(key, {})[ext.lower()] = (m.offset_data, m.size)
    return samples


def shard_samples(url: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, {ext: ref})`` of the samples of one shard, for random access with :func:`read_member`:
    a local tar is indexed by member offsets (nothing read), a remote one is read into memory."""
    if not os.path.isfile(url):
        for sample in wds.tarfile_to_samples()([{"url": url}]):
            yield sample["__key__"], sample
        return
    try:
        members = _tar_members(url)
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"{url}: cannot read the shard ({exc})") from None
    yield from members.items()


def read_member(url: str, ref: Any) -> bytes:
    """The bytes of one sample entry that :func:`shard_samples` listed for ``url``."""
    if isinstance(ref, bytes):
        return ref
    offset, size = ref
    with open(url, "rb") as f:
        f.seek(offset)
        return f.read(size)


class ShardSegmentation:
    """``ds[i] -> (PIL RGB image, mask [H, W])`` from shards holding an image and ``seg.png``.

    Args:
        urls: shards (directory, glob, brace pattern, list; see ``expand_urls``).
        num_classes, ignore_index, class_names: the label set. By default the ``segmentation``
            entry of the ``index.json`` beside the first shard; when ``num_classes`` is given, these
            arguments replace it (required for shards without an index).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        num_classes: int | None = None,
        ignore_index: int | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.urls = expand_urls(urls)
        meta = self._index_metadata()
        if num_classes is None and "num_classes" not in meta:
            raise ValueError(f"no index.json with 'segmentation' beside {self.urls[0]}: pass num_classes")
        self.num_classes = int(num_classes if num_classes is not None else meta["num_classes"])
        self.ignore_index = ignore_index if num_classes is not None else meta.get("ignore_index")
        self.class_names = list(class_names or meta.get("class_names") or map(str, range(self.num_classes)))
        self._items: list[tuple[str, str, Any, Any]] = []  # (url, key, image ref, mask ref)
        for url in self.urls:
            for key, members in shard_samples(url):
                image_key = next((k for k in IMAGE_KEYS if k in members), None)
                if image_key is not None and MASK_KEY in members:
                    self._items.append((url, key, members[image_key], members[MASK_KEY]))
        if not self._items:
            raise ValueError(
                f"no samples with an image and {MASK_KEY} in {len(self.urls)} shard(s), e.g. {self.urls[0]}"
            )

    def _index_metadata(self) -> dict[str, Any]:
        path = Path(os.path.dirname(self.urls[0]) or ".") / INDEX_NAME
        if not path.is_file():
            return {}
        return json.loads(path.read_text()).get("segmentation") or {}

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> tuple[Image.Image, np.ndarray]:
        url, key, image, mask = self._items[index]
        return decode_rgb(read_member(url, image), upright=False), decode_mask(read_member(url, mask))

    def sample_source(self, index: int) -> str:
        """Sample ``index`` named for messages: ``<shard>:<key>``."""
        url, key, _, _ = self._items[index]
        return f"{url}:{key}"
