"""Decoding per CPU core, and what one loader worker does per image on each multi-crop path.

One process, one thread, median of ``--reps`` calls per image (after one warm-up), over images
of the sizes the recipes read: the tiny recipe's 96 px scenes, an ImageNet-sized 448 × 448 photo
(the ViT-S recipe), a 1024 × 768 photo (where libjpeg's reduced-scale decoding pays). Decoders:
PIL (``decode_rgb``: what the loader runs), PIL with ``draft`` (libjpeg decodes at 1/2, 1/4 or
1/8 scale while staying at least the GPU path's decoded side), ``torchvision.io.decode_jpeg`` and
``decode_png`` on the CPU. Per path, the whole per-image work of a worker: ``cpu``: decode +
``MultiCropTransform`` (the recipe's crops); ``gpu``: draft decode + resize to the decoded side
(``DecodedImage``). A 16-core node feeds about 15 × a row's images/s (a core stays with the
training process).

    python -m benchmarks.speed.decode
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable

import torch
from PIL import Image
from torchvision.io import decode_jpeg, decode_png

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.data.scenes import render_scene, scene_rng
from locatdino.data.transforms.decode import decode_rgb
from locatdino.data.transforms.decoded_images import DecodedImage, default_image_size
from locatdino.data.transforms.multicrop import MultiCropTransform

RECIPE_CROPS = {  # recipe: the MultiCropTransform fields that differ from the default (configs/*.yaml)
    "tiny": dict(global_crop_size=64, local_crop_size=32, num_local_crops=4, color_jitter_prob=0.3, grayscale_prob=0.0),
    "vits": {},
}
IMAGES = {
    "96 px JPEG (tiny)": ((96, 96), "JPEG", "tiny"),
    "448x448 JPEG (ViT-S)": ((448, 448), "JPEG", "vits"),
    "1024x768 JPEG (ViT-S)": ((768, 1024), "JPEG", "vits"),
    "448x448 PNG (ViT-S)": ((448, 448), "PNG", "vits"),
}


def encoded(hw: tuple[int, int], fmt: str) -> bytes:
    image, _ = render_scene(scene_rng(0, 3), *hw)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(data: bytes, fmt: str, recipe: str, reps: int) -> dict[str, float]:
    multicrop = MultiCropTransform(**RECIPE_CROPS[recipe])
    decoded = DecodedImage(default_image_size(multicrop))
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = {
        "PIL decode": ms(lambda: decode_rgb(data), reps),
        f"PIL draft decode (>= {decoded.size} px)": ms(lambda: decoded.decode(data), reps),
    }
    if fmt == "JPEG":
        rows["torchvision decode_jpeg"] = ms(lambda: decode_jpeg(raw), reps)
    else:
        rows["torchvision decode_png"] = ms(lambda: decode_png(raw), reps)
    rows["cpu path: decode + multi-crop"] = ms(lambda: multicrop(decode_rgb(data)), reps)
    rows[f"gpu path: draft decode + resize to {decoded.size} px"] = ms(lambda: decoded(decoded.decode(data)), reps)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    add_results_option(ap, "decode.json")
    args = ap.parse_args()
    args.results = results_file(args, "decode.json")  # before any measuring
    torch.set_num_threads(1)
    results = {}
    print(f"{'image':<24} {'work per image':<44} {'ms':>7} {'img/s/core':>11}")
    for label, (hw, fmt, recipe) in IMAGES.items():
        data = encoded(hw, fmt)
        results[label] = measure(data, fmt, recipe, args.reps)
        for name, value in results[label].items():
            print(f"{label:<24} {name:<44} {value:7.2f} {1e3 / value:11.0f}", flush=True)
        write_results(args.results, "decode.json", {"ms_per_image": results})


if __name__ == "__main__":
    main()
