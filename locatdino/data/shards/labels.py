"""``ShardImageLabels``: a map-style (image, class) dataset over ImageFolder-style shards.

``locatdino shards`` writes a class-folder tree with a ``cls`` entry (the class index) per sample
and the class names under ``classes`` in ``index.json``. The class-token probes of ``locatdino
compare`` read such shards with random access, indexed like :class:`ShardSegmentation` (member
offsets of local tars, nothing decoded until read).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from locatdino.data.shards.segmentation import read_member, shard_samples
from locatdino.data.shards.stream import expand_urls
from locatdino.data.shards.writer import INDEX_NAME
from locatdino.data.transforms.decode import IMAGE_KEYS, decode_rgb

LABEL_KEY = "cls"


class ShardImageLabels:
    """``ds[i] -> (PIL RGB image, class index)`` from shards whose samples hold an image and ``cls``;
    ``class_names`` from the ``index.json`` beside the first shard (else the indices)."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = expand_urls(urls)
        self._items: list[tuple[str, str, object, int]] = []  # (url, key, image ref, label)
        for url in self.urls:
            for key, members in shard_samples(url):
                image_key = next((k for k in IMAGE_KEYS if k in members), None)
                if image_key is not None and LABEL_KEY in members:
                    label = int(read_member(url, members[LABEL_KEY]).decode().strip())
                    self._items.append((url, key, members[image_key], label))
        if not self._items:
            raise ValueError(
                f"no samples with an image and {LABEL_KEY} in {len(self.urls)} shard(s), e.g. {self.urls[0]}"
            )
        index = Path(os.path.dirname(self.urls[0]) or ".") / INDEX_NAME
        names = json.loads(index.read_text()).get("classes") if index.is_file() else None
        self.num_classes = max(label for *_, label in self._items) + 1
        self.class_names = list(names) if names else [str(i) for i in range(self.num_classes)]

    def __len__(self) -> int:
        return len(self._items)

    def label(self, index: int) -> int:
        return self._items[index][3]

    def sample_name(self, index: int) -> str:
        """``shard:key`` of sample ``index``: where a sample that does not decode is."""
        url, key, *_ = self._items[index]
        return f"{url}:{key}"

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        url, key, image, label = self._items[index]
        try:
            return decode_rgb(read_member(url, image)), label
        except ValueError as exc:
            raise ValueError(f"{url}:{key}: {exc}") from None
