"""``locatdino demo``: ViT vs LocAtViT pretrained the same way on the built-in scenes, no download.

The question the project exists to answer, at CPU scale: does LocAtViT give better frozen
features than a ViT under the same DINO pretraining? The demo

1. ``locatdino fit`` — DINO-pretrains the tiny ViT and the tiny LocAtViT with one recipe,
   ``configs/dino_tiny_cpu.yaml``, run twice: the same command but for ``--model.backbone``
   (``vit_tiny_patch16_224``, ``locatvit_tiny_patch8_224``; kwargs and budget are the recipe's) and the
   run folder, so with the same seed and the same shards (the first fit writes the built-in scenes
   as WebDataset shards, the second reads them in the same order);
2. ``locatdino export`` — each run's EMA teacher as a plain timm state dict, and each backbone at
   random initialisation, built the same way (the recipe's kwargs and seed);
3. ``locatdino compare --baselines`` — the two teachers and the two random inits on held-out
   scenes (Hummingbird, class-token probes, figures), vanilla DINO first (the reference of every
   Δ), with the rows that need no network (each patch's pixels, the position prior) beneath them;

then prints the headline table and a conclusion computed from the measured numbers: each
difference with its 95 % paired-bootstrap interval, "no measurable difference" when it holds 0. It prints
every command it runs, so it doubles as a worked example. ``--quick`` (what the tests run) only
shortens the step budget and the evaluation; everything else is the recipe's. Every option is
checked before the first step (:func:`check_options`), the evaluation's included.

``--recipe supervised`` runs the same comparison with the paper's own pretraining
(docs/pretraining.md): both backbones trained to classify the scenes (``configs/sup_tiny_cpu.yaml``:
image-level labels, timm's recipe lightened for a minute), exported and compared the same way
(models ``vit-sup``, ``locatvit-sup``, ``vit-random``, ``locatvit-random``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from locatdino import cli
from locatdino.common.arguments import ArgumentParser, add_shared_option, at_least, option_groups
from locatdino.common.errors import UserError
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_files import atomic_write
from locatdino.common.output_folder import OutputFolder, add_overwrite_option
from locatdino.configs import CONFIG_DIR
from locatdino.evaluation.compare.cli import REPORT_FILES
from locatdino.evaluation.compare.intervals import difference_text, model_differences
from locatdino.models import create_backbone
from locatdino.models.token_grid import fitting_sizes, patch_size

# --recipe -> (the one recipe both backbones train with, the trained models' name suffix)
RECIPES = {
    "dino": (CONFIG_DIR / "dino_tiny_cpu.yaml", "dino"),
    "supervised": (CONFIG_DIR / "sup_tiny_cpu.yaml", "sup"),
}
LABELS = ("vit", "locatvit")  # model names in the report: vit-dino, locatvit-dino, vit-random, locatvit-random
# the two --model.backbone values of the comparison (the tiny recipes' vanilla ViT and its LocAtViT)
BACKBONES = ("vit_tiny_patch16_224", "locatvit_tiny_patch8_224")
# --quick: one epoch of the recipe's 512 scenes (16 steps), so that a cold run stays under 3 min on 2 cores
_QUICK = {
    "max_steps": 16,
    "num_train": 48,
    "num_val": 16,
    "input_size": 64,
    "scene_size": 64,
    "figure_images": 3,
    "linprobe_iters": 40,
}
_FULL = {
    "max_steps": None,
    "num_train": 100,
    "num_val": 50,
    "input_size": 128,
    "scene_size": 128,
    "figure_images": 4,
    "linprobe_iters": 320,
}


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="locatdino demo",
        description="Pretrain a tiny ViT and a tiny LocAtViT with the same recipe (DINO, or supervised with "
        "--recipe supervised; one recipe, two backbones), then compare both trained backbones and both random "
        "inits on held-out built-in scenes (no download).",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    model, protocol = groups.model, groups.protocol
    model.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="dino",
        help="how both backbones are pretrained: DINO (configs/dino_tiny_cpu.yaml) or supervised on the "
        "scenes' image-level labels (configs/sup_tiny_cpu.yaml, the paper's recipe)",
    )
    model.add_argument(
        "--backbones",
        nargs=2,
        default=list(BACKBONES),
        metavar=("VIT", "LOCATVIT"),
        help="the --model.backbone of the vanilla and of the LocAtViT run of the recipe (timm names)",
    )
    model.add_argument(
        "--max-steps", type=at_least(1), default=None, help="training steps (default: the recipe's budget)"
    )
    add_shared_option(
        model,
        "--seed",
        note="the recipe's; it seeds the pretraining and random inits of both "
        "backbones, the held-out scenes and memory views stay the same",
    )
    protocol.add_argument(
        "--quick",
        action="store_true",
        help=f"a few-minute run: {_QUICK['max_steps']} training steps, smaller evaluation",
    )
    add_shared_option(groups.data, "--num-train", note=f"{_FULL['num_train']}, --quick {_QUICK['num_train']}")
    add_shared_option(groups.data, "--num-val", note=f"{_FULL['num_val']}, --quick {_QUICK['num_val']}")
    add_shared_option(
        protocol, "--input-size", note=f"the demo's tiny budget: {_FULL['input_size']}, --quick {_QUICK['input_size']}"
    )
    add_shared_option(groups.output, "--out", "runs/demo")
    add_overwrite_option(groups.output)
    return p


def _run(argv: list[str]) -> int:
    """Run one ``locatdino`` sub-command in this process, after printing it."""
    print(f"\n$ locatdino {shlex.join(argv)}", flush=True)
    return cli.main(argv)


def model_args(recipe: dict[str, Any]) -> dict[str, Any]:
    """The objective's arguments of a recipe: ``model.init_args`` when it names a class, else ``model``."""
    model = recipe.get("model") or {}
    return (model.get("init_args") or {}) if "class_path" in model else model


def _save_random_init(recipe: dict[str, Any], backbone: str, path: Path) -> None:
    """``backbone`` built with the recipe's kwargs at random initialisation (its seed), as a plain state
    dict (atomically)."""
    torch.manual_seed(recipe.get("seed_everything") or 0)
    model = create_backbone(backbone, **(model_args(recipe).get("backbone_kwargs") or {}))
    atomic_write(path, lambda f: torch.save(model.state_dict(), f))


def backbone_files(out: Path, tag: str) -> dict[str, tuple[Path, Path]]:
    """The files the demo writes into ``out`` itself, per label: (trained backbone, random init)."""
    trained = "teacher" if tag == "dino" else "supervised"
    return {label: (out / f"{label}_{trained}.pth", out / f"{label}_random_init.pth") for label in LABELS}


def check_options(
    recipe: dict[str, Any], backbones: list[str], input_size: int, out: Path, overwrite: bool = False, tag: str = "dino"
) -> OutputFolder:
    """What would fail after the pretraining, checked before it: the evaluation input size
    against each backbone's patch size with the recipe's kwargs (built on the meta device), and ``--out`` (writable,
    not holding an earlier demo's output, its runs' or report's included, unless ``overwrite``, nor
    files the demo did not write where it writes: :mod:`locatdino.common.output_folder`)."""
    for label, name in zip(LABELS, backbones):
        with torch.device("meta"):
            patch = patch_size(create_backbone(name, **(model_args(recipe).get("backbone_kwargs") or {})))[0]
        if input_size % patch:
            raise UserError(
                f"--input-size {input_size} is not a multiple of the patch size {patch} of the {label} "
                f"backbone {name}: use {fitting_sizes(input_size, patch)}"
            )
    folder, report = OutputFolder(out, "demo"), OutputFolder(out / "compare", "compare")
    fits = sorted(str(p.relative_to(out)) for p in out.glob("fit-*/checkpoints/*.ckpt"))  # fit's own rule, up front
    earlier = [*folder.earlier(), *(f"compare/{name}" for name in report.earlier()), *fits]
    if earlier and not overwrite:
        raise folder.earlier_output(earlier)
    folder.check([path.name for pair in backbone_files(out, tag).values() for path in pair], overwrite)
    report.check(REPORT_FILES, overwrite)
    return folder


def _data_args(recipe: dict[str, Any], out: Path) -> list[str]:
    """Where a recipe's data goes under the demo's folder: DINO's scenes, or labelled train/val scenes."""
    if "val_urls" in (recipe.get("data") or {}).get("init_args", {}):
        return [
            "--data.init_args.train_urls",
            str(out / "scenes_labelled" / "train"),
            "--data.init_args.val_urls",
            str(out / "scenes_labelled" / "val"),
        ]
    return ["--data.init_args.train_urls", str(out / "scenes_shards")]


def conclusion(report: dict[str, Any], steps: str, folder: str | Path, tag: str = "dino") -> list[str]:
    """What was measured, in words: trained vs trained, and each trained model vs its random init
    (``tag``: the trained models' suffix, ``dino`` or ``sup``), each difference with its 95 %
    paired-bootstrap interval over the held-out scenes (``folder``: the compare report's, holding
    the per-image confusion matrices); a winner is named only when the interval excludes 0."""
    models = {m["spec"]["name"]: m for m in report["models"]}
    how = "DINO" if tag == "dino" else "supervised training"
    lines = [
        f"measured on {report['dataset']['num_val']} held-out scenes at {report['config']['input_size']} px "
        f"after {steps} of {how} each (one seed; 95 % intervals resample the scenes, not the training: "
        "the spread over seeds is in benchmarks/RESULTS.md):"
    ]
    vit, locat = models.get(f"vit-{tag}"), models.get(f"locatvit-{tag}")
    if vit and locat:
        differences = model_differences(locat, vit, folder)
        for metric, label in (("miou", "Hummingbird mIoU"), ("knn_top1", "class-token k-NN top-1")):
            if metric in differences:
                lines.append(f"  {label}: {difference_text(f'locatvit-{tag}', f'vit-{tag}', differences[metric])}")
    for label in LABELS:
        t, r = models.get(f"{label}-{tag}"), models.get(f"{label}-random")
        if t and r and "miou" in (differences := model_differences(t, r, folder)):
            lines.append(
                f"  pretraining vs random init, {label}, Hummingbird mIoU: "
                + difference_text(f"{label}-{tag}", f"{label}-random", differences["miou"])
            )
    return lines + over_pixels(models, [f"{label}-{tag}" for label in LABELS], folder)


def over_pixels(models: dict[str, Any], trained: list[str], folder: str | Path) -> list[str]:
    """What each trained model adds over its input pixels (the ``pixels`` row of ``compare
    --baselines``), by both protocols with its interval, and what the layout alone scores."""
    pixels, prior = models.get("pixels"), models.get("position-prior")
    lines = []
    for name in (n for n in trained if n in models and pixels):
        differences = model_differences(models[name], pixels, folder)
        for metric, label in (("miou", "Hummingbird mIoU"), ("linprobe", "linear probe mIoU")):
            if metric in differences:
                lines.append(
                    f"  what {name} adds over the pixels, {label}: "
                    + difference_text(name, "pixels", differences[metric])
                )
    if prior and prior.get("hbird"):
        probe = (prior.get("linprobe") or {}).get("miou")
        lines.append(
            f"  the layout alone (position-prior: the memory's classes at each place, no image) scores "
            f"{prior['hbird']['miou']:.2f} Hummingbird mIoU"
            + (f" and {probe:.2f} linear probe mIoU" if probe is not None else "")
        )
    return lines


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    given = {
        "max_steps": args.max_steps,
        "num_train": args.num_train,
        "num_val": args.num_val,
        "input_size": args.input_size,
    }  # the budget's entries an option may set
    budget = {**(_QUICK if args.quick else _FULL), **{k: v for k, v in given.items() if v is not None}}
    out = Path(args.out)
    path, tag = RECIPES[args.recipe]
    recipe = yaml.safe_load(path.read_text())
    folder = check_options(recipe, args.backbones, budget["input_size"], out, args.overwrite, tag)
    with folder.writing(args.overwrite):  # a second demo into --out is refused, not raced
        return _pretrain_and_compare(args, budget, path, recipe, folder, tag)


def _pretrain_and_compare(
    args: argparse.Namespace, budget: dict[str, Any], path: Path, recipe: dict[str, Any], folder: OutputFolder, tag: str
) -> int:
    """Steps 1-3 of the module docstring, then the conclusion; the exit status of ``compare``."""
    out = folder.path
    started = time.perf_counter()
    specs: dict[str, str] = {}
    if args.seed is not None:
        recipe = {**recipe, "seed_everything": args.seed}
    for label, backbone in zip(LABELS, args.backbones):
        fit = [
            "fit",
            "--config",
            str(path),
            "--model.backbone",
            backbone,
            "--trainer.default_root_dir",
            str(out / f"fit-{label}"),
            *_data_args(recipe, out),
            *(["--overwrite"] if args.overwrite else []),
        ]
        if budget["max_steps"] is not None:
            fit += ["--trainer.max_steps", str(budget["max_steps"])]
        if args.seed is not None:
            fit += ["--seed_everything", str(args.seed)]
        if _run(fit):
            raise SystemExit(f"locatdino demo: pretraining {label} ({path.name}, {backbone}) failed")
        trained, random_init = backbone_files(out, tag)[label]
        if _run(
            [
                "export",
                str(out / f"fit-{label}" / "checkpoints" / "last.ckpt"),
                str(trained),
                *(["--overwrite"] if args.overwrite else []),
            ]
        ):
            raise SystemExit(f"locatdino demo: exporting the {label} backbone failed")
        _save_random_init(recipe, backbone, random_init)
        folder.wrote(trained, random_init)
        specs[f"{label}-{tag}"] = f"{label}-{tag}={backbone}:{trained}"
        specs[f"{label}-random"] = f"{label}-random={backbone}:{random_init}"
    order = [f"vit-{tag}", f"locatvit-{tag}", "vit-random", "locatvit-random"]  # the vanilla ViT: the reference
    report_dir = out / "compare"
    # fp32 and exact search: the demo's numbers are then the same on every CPU (auto picks bf16 or
    # int8 by CPU) and comparable with the table README shows
    models = [arg for key in order for arg in ("--model", specs[key])]
    status = _run(
        [
            "compare",
            *models,
            "--baselines",
            "--precision",
            "fp32",
            "--index",
            "Flat",
            "--dataset",
            "scenes",
            "--num-train",
            str(budget["num_train"]),
            "--num-val",
            str(budget["num_val"]),
            "--scene-size",
            str(budget["scene_size"]),
            "--input-size",
            str(budget["input_size"]),
            "--figure-images",
            str(budget["figure_images"]),
            "--linprobe-iters",
            str(budget["linprobe_iters"]),
            "--out",
            str(report_dir),
            *(["--overwrite"] if args.overwrite else []),
        ]
    )
    report = json.loads((report_dir / "results.json").read_text())
    steps = f"{budget['max_steps']} steps" if budget["max_steps"] is not None else "the recipe's budget"
    print("\nlocatdino demo: " + "\n".join(conclusion(report, steps, report_dir, tag)))
    minutes = (time.perf_counter() - started) / 60
    print(
        f"\nlocatdino demo: done in {minutes:.1f} min. Report: {report_dir / 'report.md'} (figures in "
        f"{report_dir / 'figures'}); training curves: {out}/fit-*/logs"
    )
    return status
