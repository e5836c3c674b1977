"""Feature-extraction throughput of evaluation on 1, 2 and 4 CPU ranks (``locatdino.evaluation.ranks``).

    python -m benchmarks.speed.eval_ranks                       # ViT-S/16 at 112 px, 128 scenes

For each rank count torchrun starts that many processes on this machine (gloo over loopback), each
with ``cores // ranks`` threads (at least 1), so every row uses the same cores: the question is
whether ranks beat one process's threads. Each rank encodes its share of the built-in scenes and
the features are gathered to every rank, as ``locatdino knn`` does: ``knn`` is the class tokens of
``class_token_embeddings`` (the reference's resize and centre crop, then the model), ``hbird`` the
patch tokens of ``FeatureExtractor`` (Hummingbird's features), both gathered in scene order. One
untimed pass loads every kernel; the timed pass runs between two barriers, so the slowest rank and
the gather count. Images per second are of the whole split.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch
import torch.distributed as dist
from torchvision.transforms.v2.functional import pil_to_tensor

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.data import ScenesSegmentation
from locatdino.data.scenes import SCENE_CLASSES, scene_class
from locatdino.evaluation.class_features import class_token_embeddings
from locatdino.evaluation.class_splits import LabelledImages
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.ranks import current_ranks, evaluation_ranks, extract_shared

RANK_COUNTS = (1, 2, 4)


def _timed(run) -> float:
    """Seconds of ``run()`` on the slowest rank (barriers before and after)."""
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    run()
    if dist.is_initialized():
        dist.barrier()
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> None:
    """One rank: encode the scenes both ways, twice; rank 0 writes the second pass's seconds."""
    torch.set_num_threads(args.threads)
    with evaluation_ranks() as ranks:
        scenes = ScenesSegmentation(args.images, size=args.input_size, seed=0, split="train")
        pairs = [scenes[i] for i in range(args.images)]
        images = LabelledImages(
            np.array([scene_class(mask) for _, mask in pairs], np.int64),
            list(SCENE_CLASSES),
            lambda i: pairs[i][0],
            lambda i: f"scene {i}",
        )
        pixels = torch.stack([pil_to_tensor(image) for image, _ in pairs])
        torch.manual_seed(0)
        model = timm.create_model(args.model, num_classes=0, dynamic_img_size=True).eval()
        extractor = FeatureExtractor(model)

        def knn() -> None:
            embed = dict(batch_size=args.batch_size, workers=0, show_progress=False, shared=True)
            with class_token_embeddings(model, images, args.input_size, **embed) as emb:
                assert len(emb.features) == args.images

        def dense(share: range) -> np.ndarray:
            batches = pixels[share.start : share.stop].split(args.batch_size)
            return torch.cat([extractor(batch) for batch in batches] or [torch.zeros(0, 1, 1, extractor.dim)]).numpy()

        def hbird() -> None:
            assert len(extract_shared(dense, args.images)) == args.images

        seconds = {}
        for name, run in (("knn", knn), ("hbird", hbird)):
            _timed(run)  # kernels loaded, caches warm
            seconds[name] = _timed(run)
        if ranks.rank == 0:
            Path(args.worker).write_text(json.dumps({"world_size": current_ranks().world_size, "seconds": seconds}))


def measure(ranks: int, args: argparse.Namespace, cores: int) -> dict:
    """One row: torchrun with ``ranks`` processes of ``cores // ranks`` threads each."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        threads = max(1, cores // ranks)
        flags = ["--model", args.model, "--images", str(args.images), "--input-size", str(args.input_size)]
        flags += ["--batch-size", str(args.batch_size), "--threads", str(threads), "--worker", str(out)]
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([*launch, "-m", "benchmarks.speed.eval_ranks", *flags], env=env, capture_output=True)
        if done.returncode:
            raise SystemExit(f"{ranks} ranks failed:\n{done.stderr.decode()[-2000:]}")
        row = json.loads(out.read_text())
    assert row["world_size"] == ranks
    return {
        "ranks": ranks,
        "threads_per_rank": threads,
        **{f"{name}_images_per_s": round(args.images / s, 2) for name, s in row["seconds"].items()},
        **{f"{name}_s": round(s, 3) for name, s in row["seconds"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--input-size", type=int, default=112)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANK_COUNTS))
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a worker's result file
    add_results_option(parser, "eval_ranks.json")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args)
        return
    results = results_file(args, "eval_ranks.json")
    cores = len(os.sched_getaffinity(0))
    rows = []
    for ranks in args.ranks:
        rows.append(measure(ranks, args, cores))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        write_results(
            results,
            "eval_ranks.json",
            {
                "question": "How fast is feature extraction on many CPU ranks?",
                "model": args.model,
                "images": args.images,
                "input_size": args.input_size,
                "batch_size": args.batch_size,
                "cores": cores,
                "rows": rows,
            },
        )


if __name__ == "__main__":
    main()
