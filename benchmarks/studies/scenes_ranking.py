"""Can the built-in scenes rank dense features? Hummingbird mIoU of random-init, supervised and
(optionally) DINO-pretrained backbones on the same memory/query scenes.

The supervised reference is the backbone trained for a few hundred steps to classify each patch's
majority class (a linear head on the last block's patch tokens): a model that *has* learned the
scenes' classes. If the benchmark can rank models, it must score clearly above random init.
DINO checkpoints (``locatdino export`` files) given with ``--checkpoint`` are scored alongside,
which shows what a short CPU pretraining buys.

    python -m benchmarks.studies.scenes_ranking \\
        --checkpoint runs/demo/locatvit_teacher.pth
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation
from locatdino.evaluation.augment import normalize
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.hbird.patch_labels import patch_class_counts
from locatdino.evaluation.splits import CachedSplit, open_split
from locatdino.models import create_backbone
from locatdino.models.token_grid import patch_size


def supervised(name: str, img_size: int, steps: int, images: int, seed: int) -> torch.nn.Module:
    """``name`` trained to predict every patch's majority class on ``images`` training scenes."""
    torch.manual_seed(seed)
    scenes = ScenesSegmentation(images, size=img_size, seed=seed, split="train")
    pairs = [scenes[i] for i in range(images)]
    x = torch.stack([torch.from_numpy(np.array(img)).permute(2, 0, 1) for img, _ in pairs])
    masks = torch.stack([torch.from_numpy(m).long() for _, m in pairs])
    model = create_backbone(name, img_size=img_size)
    counts, _ = patch_class_counts(masks, patch_size(model)[0], len(SCENE_CLASSES))
    target = counts.argmax(-1)  # [N, h * w], row-major like the patch tokens
    head = torch.nn.Linear(model.embed_dim, len(SCENE_CLASSES))
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=5e-4, weight_decay=0.05)
    for _ in range(steps):
        idx = torch.randint(0, images, (32,))
        tokens = model.forward_features(normalize(x[idx]))[:, model.num_prefix_tokens :]
        loss = F.cross_entropy(head(tokens).flatten(0, 1), target[idx].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="locatvit_tiny_patch16_224")
    p.add_argument("--img-size", type=int, default=64, help="build resolution (the tiny recipes' 64 px)")
    p.add_argument("--input-size", type=int, default=128, help="Hummingbird eval resolution")
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3, help="random-init draws")
    p.add_argument("--steps", type=int, default=300, help="supervised training steps (batch 32)")
    p.add_argument("--checkpoint", action="append", default=[], help="DINO export to score as well")
    add_results_option(p, "scenes_ranking.json")
    args = p.parse_args()
    args.results = results_file(args, "scenes_ranking.json")  # before any measuring

    size = args.input_size
    train = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, size, args.num_train))
    val = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, size, args.num_val))
    cfg = HummingbirdConfig(input_size=size, batch_size=32, progress=False)

    def score(model: torch.nn.Module) -> float:
        return hummingbird(model.eval(), train, val, cfg).miou

    print(f"| model ({args.model}, built at {args.img_size} px, eval {size} px) | mIoU |\n|---|---|")
    randoms = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        randoms.append(score(create_backbone(args.model, img_size=args.img_size)))
    print(f"| random init ({args.seeds} seeds) | {np.mean(randoms):.1f} ± {np.std(randoms):.1f} |", flush=True)
    miou = {"random_init": randoms, "checkpoints": {}}
    for ckpt in args.checkpoint:
        miou["checkpoints"][ckpt] = score(create_backbone(args.model, ckpt))
        print(f"| DINO teacher `{ckpt}` | {miou['checkpoints'][ckpt]:.1f} |", flush=True)
    start = time.perf_counter()
    model = supervised(args.model, args.img_size, args.steps, 512, seed=0)
    minutes = (time.perf_counter() - start) / 60
    miou["supervised"] = score(model)
    print(f"| supervised patch classifier ({args.steps} steps, {minutes:.1f} min) | {miou['supervised']:.1f} |")
    write_results(args.results, "scenes_ranking.json", {"miou": miou, "supervised_minutes": minutes})


if __name__ == "__main__":
    main()
