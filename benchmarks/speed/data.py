"""Data loading throughput: shards + MultiCropTransform vs ImageFolder + the reference PIL transform.

Both pipelines produce DINO multi-crop batches (2 × 224 px + 8 × 96 px by default) from the same
JPEGs (built-in scenes rendered at 500 × 375, like VOC/ImageNet photos) with the same number of
DataLoader workers. Epochs of the two are interleaved so that load from other processes hits both
alike; the ratio of medians is reported. A single-process breakdown says where the time goes.

    python -m benchmarks.speed.data
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageFilter, ImageOps
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision import transforms as T

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.data import MultiCropTransform, ShardLoader, ShardStream, expand_urls, write_shards
from locatdino.data.scenes import render_scene, scene_rng
from locatdino.data.shards.sources import FolderSource
from locatdino.data.transforms import photometric as P
from locatdino.data.transforms.decode import decode_rgb
from locatdino.data.transforms.multicrop import to_uint8_rgb


class _PILBlur:
    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() >= self.p:
            return img
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


class _PILSolarize:
    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, img: Image.Image) -> Image.Image:
        return ImageOps.solarize(img) if random.random() < self.p else img


class ReferenceDINO:
    """The reference ``DataAugmentationDINO`` (torchvision v1 on PIL images), the baseline."""

    def __init__(self, local_crops: int = 8) -> None:
        flip_jitter = T.Compose(
            [
                T.RandomHorizontalFlip(0.5),
                T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                T.RandomGrayscale(0.2),
            ]
        )
        norm = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        bicubic = T.InterpolationMode.BICUBIC
        self.global1 = T.Compose(
            [T.RandomResizedCrop(224, (0.4, 1.0), interpolation=bicubic), flip_jitter, _PILBlur(1.0), norm]
        )
        self.global2 = T.Compose(
            [
                T.RandomResizedCrop(224, (0.4, 1.0), interpolation=bicubic),
                flip_jitter,
                _PILBlur(0.1),
                _PILSolarize(0.2),
                norm,
            ]
        )
        self.local = T.Compose(
            [T.RandomResizedCrop(96, (0.05, 0.4), interpolation=bicubic), flip_jitter, _PILBlur(0.5), norm]
        )
        self.local_crops = local_crops

    def __call__(self, img: Image.Image) -> list[torch.Tensor]:
        return [self.global1(img), self.global2(img)] + [self.local(img) for _ in range(self.local_crops)]


def make_jpegs(folder: Path, n: int) -> None:
    (folder / "scenes").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image, _ = render_scene(scene_rng(0, i), 375, 500)
        Image.fromarray(image).save(folder / "scenes" / f"{i:05d}.jpg", quality=90)


def epoch_images_per_s(loader, n_images: int) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return n_images / (time.perf_counter() - start)


def breakdown(jpeg: bytes, reference: ReferenceDINO, ours: MultiCropTransform, reps: int = 30) -> dict[str, float]:
    """Single-process milliseconds per image of each stage."""

    def ms(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps * 1e3

    pil = decode_rgb(jpeg)
    x = to_uint8_rgb(pil)
    g = torch.stack([ours._global_crop(x) for _ in range(2)]).float() / 255
    loc = torch.stack([ours._local_crop(x) for _ in range(8)]).float() / 255
    both = (g, loc)
    factors = ours._jitter_factors(10)

    def each(op) -> None:
        for v in both:
            op(v)

    return {
        "decode JPEG (PIL)": ms(lambda: decode_rgb(jpeg)),
        "reference transform (PIL, v1)": ms(lambda: reference(pil)),
        "ours: whole transform": ms(lambda: ours(pil)),
        "ours: PIL -> uint8 tensor": ms(lambda: to_uint8_rgb(pil)),
        "ours: 10 crops + bicubic resize (uint8)": ms(
            lambda: ([ours._global_crop(x) for _ in range(2)], [ours._local_crop(x) for _ in range(8)])
        ),
        "ours: colour jitter, 10 crops": ms(
            lambda: (P.color_jitter(g, factors[:2], [0, 1, 2, 3]), P.color_jitter(loc, factors[2:], [3, 2, 1, 0]))
        ),
        "  of which hue": ms(lambda: (P.adjust_hue(g, factors[:2, 3]), P.adjust_hue(loc, factors[2:, 3]))),
        "ours: blur sigma 1, 10 crops": ms(lambda: each(lambda v: P.gaussian_blur(v, torch.ones(len(v))))),
        "ours: grayscale, 10 crops": ms(lambda: each(P.grayscale)),
        "ours: solarize, 10 crops": ms(lambda: each(P.solarize)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--local-crops", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", default=None, help="folder to keep the rendered JPEGs in between runs")
    add_results_option(ap, "data.json")
    args = ap.parse_args()
    args.results = results_file(args, "data.json")  # before any measuring
    torch.manual_seed(0)
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jpegs = Path(args.cache) if args.cache else tmp / "jpegs"
        if len(list(jpegs.glob("scenes/*.jpg"))) != args.images:
            start = time.perf_counter()
            make_jpegs(jpegs, args.images)
            print(f"rendered {args.images} JPEGs of 500x375 in {time.perf_counter() - start:.1f} s")
        index = write_shards(FolderSource(jpegs), tmp / "shards", maxcount=64, workers=args.workers, progress=False)
        print(f"wrote {index['num_shards']} shards ({index['total_bytes'] / 1e6:.1f} MB) in {index['seconds']:.1f} s")

        reference = ReferenceDINO(args.local_crops)
        ours = MultiCropTransform(num_local_crops=args.local_crops)
        baseline = DataLoader(
            datasets.ImageFolder(str(jpegs), transform=reference),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            drop_last=True,
        )
        n_batches = args.images // args.batch_size
        stream = ShardStream(
            expand_urls(str(tmp / "shards")), ours, args.batch_size, num_batches=n_batches, shuffle_buffer=256
        )
        loader = ShardLoader(stream, num_workers=args.workers)
        n = n_batches * args.batch_size
        base, mine = [], []
        for r in range(args.rounds):
            base.append(epoch_images_per_s(baseline, n))
            mine.append(epoch_images_per_s(loader, n))
            print(f"round {r}: ImageFolder + reference PIL {base[-1]:6.1f} img/s | shards + ours {mine[-1]:6.1f} img/s")
        b, m = statistics.median(base), statistics.median(mine)
        print(
            f"\nmedian: baseline {b:.1f} img/s, ours {m:.1f} img/s -> {m / b:.2f}x "
            f"({args.workers} workers, batch {args.batch_size}, 2 x 224 + {args.local_crops} x 96)"
        )

        jpeg = (jpegs / "scenes" / "00000.jpg").read_bytes()
        print("\nsingle process, ms per image:")
        stages = breakdown(jpeg, reference, ours)
        for name, value in stages.items():
            print(f"  {name:<38} {value:6.2f}")
    write_results(
        args.results,
        "data.json",
        {"images_per_s": {"reference": base, "ours": mine}, "median_ratio": m / b, "ms_per_image": stages},
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
