"""Helpers shared by the data tests (fixtures: conftest.py)."""

import io

import numpy as np
import torch
import webdataset as wds
from PIL import Image


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def id_image(i: int) -> Image.Image:
    """A tiny RGB image whose first pixel encodes ``i`` (lossless PNG)."""
    return Image.new("RGB", (8, 6), (i % 256, i // 256, 7))


def id_of(pixel: torch.Tensor) -> int:
    return int(pixel[0]) + 256 * int(pixel[1])


class IdTransform:
    """Stands in for MultiCropTransform: one 1x1 'crop' carrying the image id."""

    num_global_crops = 1

    def __call__(self, image):
        return [torch.tensor(np.asarray(image)[0, 0], dtype=torch.float32).view(3, 1, 1)]


def batch_ids(batch) -> list[int]:
    return [id_of(v[:, 0, 0]) for v in batch["global"][0]]


def write_id_shards(folder, sizes, start=0):
    """Shards of id images, ``sizes[k]`` samples in shard k; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, i = [], start
    for k, n in enumerate(sizes):
        path = folder / f"part-{k:06d}.tar"
        with wds.TarWriter(str(path)) as w:
            for _ in range(n):
                w.write({"__key__": f"s{i:05d}", "png": png_bytes(id_image(i))})
                i += 1
        paths.append(str(path))
    return paths
