"""Does DINO pretraining learn at small scale? A named setting × N seeds → the teacher's (and
student's) Hummingbird mIoU against the same network at random initialisation, class-token k-NN
on an image-level scene label, and the online monitor's curve.

Each run is ``locatdino fit --config configs/dino_tiny_cpu.yaml --model.backbone <backbone>
<setting's flags> --seed_everything <seed>`` in this process; the random-init baseline is the
recipe's backbone built with the same seed (the network the run starts from). Every run appends one
JSON line to ``<out>/results.jsonl`` (the log the RESULTS table is made from) and the table rows are
printed as they finish. Settings are flags on top of the recipe, so they stay reproducible after the
recipe changes: ``p16`` is the 64 px / patch 16 recipe the project had before (4 × 4 tokens per
global crop).

    python -m benchmarks.studies.pretraining --setting recipe --backbone locatvit_tiny_patch8_224 \\
        --seeds 3 --out runs/bench_pretraining

Runs are compared in optimizer steps; ``--throughput`` converts steps to wall time: the recipe's
DINO step (Lightning, one fixed batch of the recipe's crops, no data loading) timed for each
listed setting, rounds alternating between settings so load from other jobs hits all alike::

    python -m benchmarks.studies.pretraining \\
        --throughput p16 p8 --backbone locatvit_tiny_patch8_224
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.speed.dino_step import lightning_round
from locatdino.data import MultiCropTransform, collate_multicrop
from locatdino.data.scenes import ScenesSegmentation, scene_class
from locatdino.data.scenes import render as scene_render
from locatdino.data.shards import sources as shard_sources
from locatdino.evaluation.augment import normalize
from locatdino.evaluation.class_token import knn_accuracy
from locatdino.evaluation.compare.runner import ShownImages
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird import HummingbirdMonitor
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.splits import CachedSplit, open_split
from locatdino.models import create_backbone
from locatdino.ssl import DINOModule
from locatdino.ssl.run import cli as fit_cli

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "dino_tiny_cpu.yaml"
BACKBONES = ("vit_tiny_patch16_224", "locatvit_tiny_patch8_224")  # the recipe's ViT and its LocAtViT switch

# setting -> flags on top of the recipe (see the module docstring)
SETTINGS: dict[str, list[str]] = {
    "recipe": [],
    "p16": ["--model.backbone_kwargs", "{img_size: 64, patch_size: 16}"],
    "p8": ["--model.backbone_kwargs", "{img_size: 64, patch_size: 8}"],
    "p4": ["--model.backbone_kwargs", "{img_size: 64, patch_size: 4}"],
    # DINO's blur (sigma 0.1-2 px, always on the first global crop) is sized for 224 px crops: on
    # 64 / 32 px crops it wipes out the textures that tell the scenes' classes apart
    "blur_scaled": ["--data.init_args.multicrop.blur_sigma", "[0.03, 0.6]"],  # x 64 / 224
    "no_blur": [
        "--data.init_args.multicrop.global_blur_prob",
        "[0.0, 0.0]",
        "--data.init_args.multicrop.local_blur_prob",
        "0.0",
        "--data.init_args.multicrop.global_solarize_prob",
        "[0.0, 0.0]",
    ],
    # the scenes tell several classes apart by colour (SCENE_CLASSES' colour pairs): colour jitter
    # and grayscale teach an invariance to exactly that
    "no_color": [
        "--data.init_args.multicrop.color_jitter_prob",
        "0.0",
        "--data.init_args.multicrop.grayscale_prob",
        "0.0",
    ],
    # a softer teacher (DINO's upper value): sharpening less, its targets carry more of each image
    "teacher_temp_07": ["--model.teacher_temp", "0.07", "--model.warmup_teacher_temp", "0.07"],
}


def backbone_kwargs(recipe: dict, flags: list[str]) -> dict:
    """The backbone kwargs a run uses: the setting's flag, else the recipe's."""
    if "--model.backbone_kwargs" in flags:
        return yaml.safe_load(flags[flags.index("--model.backbone_kwargs") + 1])
    return dict(recipe["model"].get("backbone_kwargs") or {})


def monitor_of(recipe: dict) -> HummingbirdMonitor:
    """The recipe's HummingbirdMonitor (its step-0 point is scored on the random init)."""
    for cb in recipe["trainer"].get("callbacks") or []:
        if cb["class_path"].endswith("HummingbirdMonitor"):
            return HummingbirdMonitor(**cb.get("init_args", {}))
    raise SystemExit("pretraining: the recipe has no HummingbirdMonitor callback")


def monitor_curve(fit_dir: Path) -> list[tuple[int, float]]:
    """``(step, hbird/mIoU)`` logged by the run's monitor (logs/version_0/metrics.csv; none when
    the run was shorter than the logging period)."""
    path = fit_dir / "logs" / "version_0" / "metrics.csv"
    if not path.is_file():
        return []
    with open(path) as f:
        rows = [
            (int(r["step"]) + 1, round(float(r["hbird/mIoU"]), 2)) for r in csv.DictReader(f) if r.get("hbird/mIoU")
        ]
    # the logger repeats the last value on its next row: keep each evaluation once
    return [row for i, row in enumerate(rows) if i == 0 or row[1] != rows[i - 1][1]]


class ClassTokenKNN:
    """Weighted k-NN (k 20, T 0.07) on the embedding ``model(x)`` of un-augmented scenes,
    labelled with :func:`scene_class`."""

    def __init__(self, num_train: int, num_val: int, size: int):
        def load(n: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
            pairs = [ScenesSegmentation(n, size=size, split=split)[i] for i in range(n)]
            x = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1) for im, _ in pairs])
            return x, torch.tensor([scene_class(m) for _, m in pairs])

        self.train, self.val = load(num_train, "train"), load(num_val, "val")

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> float:
        model.eval()
        embed = lambda x: torch.cat([model(normalize(c)) for c in x.split(64)])  # noqa: E731
        return 100 * knn_accuracy(embed(self.train[0]), self.train[1], embed(self.val[0]), self.val[1])


def throughput(backbone: str, settings: list[str], rounds: int = 2, steps: int = 4) -> dict[str, float]:
    """Median seconds per DINO step of each setting's backbone kwargs on the recipe's batch."""
    recipe = yaml.safe_load(RECIPE.read_text())
    data = recipe["data"]["init_args"]
    crops = MultiCropTransform(**data["multicrop"])
    scenes = ScenesSegmentation(data["batch_size"], size=data["synthetic_size"])
    torch.manual_seed(0)
    batch = collate_multicrop([crops(scenes[i][0]) for i in range(len(scenes))])
    model_args = {k: v for k, v in recipe["model"].items() if k not in ("backbone", "backbone_kwargs")}
    modules = {
        name: DINOModule(backbone, backbone_kwargs(recipe, SETTINGS[name]), batch_size=data["batch_size"], **model_args)
        for name in settings
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as log_dir:
        for _ in range(rounds):
            for name, module in modules.items():
                times[name] += lightning_round(module, batch, steps, log_dir)
    medians = {name: statistics.median(times[name]) for name in settings}
    for name, med in medians.items():
        print(
            f"{backbone} {name}: {med:.2f} s/step ({med / medians[settings[0]]:.2f}x {settings[0]}), "
            f"{360 / med:.0f} steps in 6 min",
            flush=True,
        )
    return medians


def token_similarity(model: torch.nn.Module, images: torch.Tensor) -> float:
    """Mean cosine similarity between the patch features of one image (uint8 ``images``), over
    images and feature pairs (self-pairs excluded), on the features the Hummingbird protocol
    retrieves with: a network that smooths its tokens together scores high."""
    feats = FeatureExtractor(model)(images).flatten(1, 2)  # [B, N, D], L2-normalised
    n = feats.shape[1]
    gram = feats @ feats.transpose(1, 2)
    return ((gram.sum((1, 2)) - n) / (n * (n - 1))).mean().item()


def eval_splits(args: argparse.Namespace) -> tuple[CachedSplit, CachedSplit]:
    """The held-out Hummingbird memory and query scenes every score of this script uses."""
    return (
        CachedSplit(open_split("scenes", None, "train", args.num_train, 0, args.input_size)),
        CachedSplit(open_split("scenes", None, "val", args.num_val, 0, args.input_size)),
    )


def plain_scenes() -> None:
    """Every scene of this process (and of the processes it forks: shard writers, loader workers)
    rendered with ``image_wide=False``. An ablation, so it lives here rather than as a data option:
    ``render_scene`` is looked up by its two callers at call time."""
    plain = functools.partial(scene_render.render_scene, image_wide=False)
    scene_render.render_scene = shard_sources.render_scene = plain


def diagnose(fit_dir: Path, layers: list[int], args: argparse.Namespace) -> dict:
    """Hummingbird mIoU of a finished run's teacher, student and random init at several blocks
    (diagnostic only: the protocol is the last block). Backbone, kwargs and seed come from the
    run's own ``config.yaml``."""
    config = yaml.safe_load((fit_dir / "logs" / "version_0" / "config.yaml").read_text())
    backbone, kwargs = config["model"]["backbone"], config["model"].get("backbone_kwargs") or {}
    ckpt = fit_dir / "checkpoints" / "last.ckpt"
    torch.manual_seed(config["seed_everything"])
    models = {
        "random": create_backbone(backbone, **kwargs),
        "teacher": create_backbone(backbone, ckpt, which="teacher", **kwargs),
        "student": create_backbone(backbone, ckpt, which="student", **kwargs),
    }
    train, val = eval_splits(args)
    images = ShownImages.from_split(val, len(val), args.input_size).images
    similarity = {name: token_similarity(m, images) for name, m in models.items()}
    print(
        f"{fit_dir}: mean cosine similarity of two patch tokens of the same scene, last block "
        "(higher = tokens more alike, less local information): "
        + ", ".join(f"{name} {value:.3f}" for name, value in similarity.items())
    )
    print(f"{fit_dir}: Hummingbird mIoU per block ({args.num_train} / {args.num_val} scenes at {args.input_size} px)")
    print("| block | " + " | ".join(models) + " | teacher − random |\n|---|---|---|---|---|")
    per_block = {}
    for layer in layers:
        cfg = HummingbirdConfig(input_size=args.input_size, batch_size=32, progress=False, num_workers=0, layer=layer)
        miou = per_block[layer] = {name: hummingbird(m.eval(), train, val, cfg).miou for name, m in models.items()}
        print(
            f"| {layer} | "
            + " | ".join(f"{v:.1f}" for v in miou.values())
            + f" | {miou['teacher'] - miou['random']:+.1f} |",
            flush=True,
        )
    return {"run": str(fit_dir), "token_similarity": similarity, "miou_per_block": per_block}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setting", choices=sorted(SETTINGS))
    p.add_argument("--throughput", nargs="+", choices=sorted(SETTINGS), help="time these settings' steps instead")
    p.add_argument("--backbone", default="locatvit_tiny_patch8_224", choices=BACKBONES)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="trainer.max_steps, lifting the recipe's max_epochs (default: the recipe's epochs)",
    )
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more fit flags (logged)")
    p.add_argument("--input-size", type=int, default=128, help="Hummingbird eval px (the demo's)")
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--knn-train", type=int, default=500)
    p.add_argument("--knn-val", type=int, default=200)
    p.add_argument("--out", default="runs/bench_pretraining")
    p.add_argument(
        "--plain-scenes",
        action="store_true",
        help="train and evaluate on scenes without their image-wide effects (haze, exposure, white balance)",
    )
    p.add_argument("--diagnose", type=Path, metavar="FIT_DIR", help="score a finished run per block instead")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 5, 8, 11], help="blocks for --diagnose")
    add_results_option(
        p,
        "pretraining-<backbone>-<setting>.json (--throughput, --diagnose: "
        "pretraining-throughput-<backbone>.json, pretraining-blocks.json)",
    )
    args = p.parse_args()
    if args.diagnose:
        path = results_file(args, "pretraining-blocks.json")  # before any measuring
        write_results(path, "pretraining-blocks.json", diagnose(args.diagnose, args.layers, args))
        return
    if args.throughput:
        path = results_file(args, f"pretraining-throughput-{args.backbone}.json")
        write_results(path, path.name, {"s_per_step": throughput(args.backbone, args.throughput)})
        return
    if not args.setting:
        p.error("--setting or --throughput is required")

    if args.plain_scenes:
        plain_scenes()
    recipe = yaml.safe_load(RECIPE.read_text())
    flags = SETTINGS[args.setting] + args.extra
    kwargs = backbone_kwargs(recipe, flags)
    out = Path(args.out)
    train, val = eval_splits(args)
    cfg = HummingbirdConfig(input_size=args.input_size, batch_size=32, progress=False, num_workers=0)
    knn = ClassTokenKNN(args.knn_train, args.knn_val, recipe["data"]["init_args"]["multicrop"]["global_crop_size"])
    monitor = monitor_of(recipe)

    def hbird(model: torch.nn.Module) -> float:
        return round(hummingbird(model.eval(), train, val, cfg).miou, 2)

    print(
        "| backbone | setting | seed | steps | fit min | teacher | student | random | Δ | "
        "k-NN teacher | k-NN random | monitor curve |\n|---|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    name = args.setting + ("+" + "_".join(a.lstrip("-").split(".")[-1] for a in args.extra) if args.extra else "")
    name += "+plain_scenes" * args.plain_scenes
    args.results = results_file(args, f"pretraining-{args.backbone}-{name}.json")  # before any training
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        fit_dir = out / args.backbone / name / f"seed{seed}"
        argv = [
            "--config",
            str(RECIPE),
            "--model.backbone",
            args.backbone,
            *flags,
            "--seed_everything",
            str(seed),
            "--trainer.default_root_dir",
            str(fit_dir),
            "--data.init_args.train_urls",
            str(out / ("scenes_shards" + "_plain" * args.plain_scenes)),
            "--trainer.enable_progress_bar",
            "false",
        ]
        if args.steps:
            # the recipe's max_epochs would stop the run first (and shorten the schedules with it)
            argv += ["--trainer.max_steps", str(args.steps), "--trainer.max_epochs", "-1"]
        start = time.perf_counter()
        if fit_cli.main(argv):
            raise SystemExit(f"pretraining: locatdino fit {' '.join(argv)} failed")
        fit_min = (time.perf_counter() - start) / 60
        ckpt = fit_dir / "checkpoints" / "last.ckpt"
        steps = int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])
        torch.manual_seed(seed)
        random = create_backbone(args.backbone, **kwargs)
        teacher = create_backbone(args.backbone, ckpt, which="teacher", **kwargs)
        student = create_backbone(args.backbone, ckpt, which="student", **kwargs)
        row = dict(
            backbone=args.backbone,
            setting=name,
            flags=flags,
            seed=seed,
            steps=steps,
            fit_min=round(fit_min, 2),
            teacher=hbird(teacher),
            student=hbird(student),
            random=hbird(random),
            knn_teacher=round(knn(teacher), 1),
            knn_random=round(knn(random), 1),
            curve=[(0, round(monitor.evaluate(random), 2)), *monitor_curve(fit_dir)],
        )
        row["delta"] = round(row["teacher"] - row["random"], 2)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        write_results(args.results, f"pretraining-{args.backbone}-{name}.json", {"rows": rows})
        curve = " ".join(f"{s}:{m:.1f}" for s, m in row["curve"])
        print(
            f"| {args.backbone} | {name} | {seed} | {steps} | {fit_min:.1f} | {row['teacher']:.1f} | "
            f"{row['student']:.1f} | {row['random']:.1f} | {row['delta']:+.1f} | {row['knn_teacher']:.1f} | "
            f"{row['knn_random']:.1f} | {curve} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
