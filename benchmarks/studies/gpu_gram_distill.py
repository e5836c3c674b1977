"""LocAt, Gram anchoring, both, or distillation, with a GPU's budget: the Gram study on one GPU.

    python -m benchmarks.studies.gpu_gram_distill --out gpu_gram_distill_out  # one CUDA GPU: inside 9 minutes
    python -m benchmarks.studies.gpu_gram_distill --dry-run --out /tmp/gd     # toy size on the CPU
                                                    # (tests/benchmarks/test_gpu_gram_distill.py)

The five arms of ``gram_distill.py`` (``gram_arms.py``) trained and scored as ``gpu_study.py``
trains and scores its runs, with its scenes, size, loaders, deadline and evaluations:

- ``dino``: ViT-T/8 with ``configs/dino_tiny_cpu.yaml``;
- ``dino_gram``: the same with DINOv3's Gram anchoring, the recipe's commented block scaled to the
  run's length (the Gram teacher is the EMA teacher of the run's middle step, refreshed after
  every quarter from 3/4 on; Gram loss weight 1.0, DINOv3's);
- ``locat``, ``locat_gram``: the same two with LocAtViT-T/8 (``locatvit_tiny_patch8_224``);
- ``distill``: a LocAtViT-T/8 student of ``configs/distill_tiny_cpu.yaml`` whose frozen teacher is
  the ``dino`` arm's trained network (its EMA teacher, kept in a temporary file: so that arm runs
  first), or the release ``--teacher NAME:FILE`` (e.g. ``vit_small_patch16_224.dino:FILE``; it is
  loaded and checked before anything else starts).

As in ``gpu_study.py``, every arm starts from its backbone's random init of the same seed, a short
measurement of each arm's real step sets its number of optimizer steps so that the arms share the
time left equally (a Gram arm's step includes its Gram teacher's forward: it gets fewer steps; the
distill arm's share leaves out its teacher's training, the dino arm's), and each schedule is built
for that length and run to its end. Every trained network is scored against its random init by
Hummingbird mIoU and the cached dense linear probe with the paired bootstrap interval over the
query scenes, and ``gram_arms.PAIRS``' arm-against-arm differences (Gram against none, LocAt
against ViT, distillation against the LocAt DINO run) by the same interval, one seed.

``--out`` (refused when it exists and is not empty; a few hundred kB, no checkpoints) holds what
``gpu_study.py`` writes: ``results.json`` (with ``pairs``), ``table.md`` (the runs, then the pairs),
``delta.png``, ``logs/<arm>/metrics.csv`` (``gram_loss`` of the Gram arms, ``distill_loss`` of
distillation), ``confusions/*.npz``. Without internet access, bring the packages as ``gpu_study.py``
says and run ``PYTHONPATH=/tmp/site:. python -m benchmarks.studies.gpu_gram_distill --out …``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.studies import gpu_study
from benchmarks.studies.gpu_study import BACKBONES, RECIPES, Study, say
from benchmarks.studies.gram_arms import ARMS, PAIRS, gram_block
from locatdino.ssl.distill.teacher import FrozenTeacher

# NAME:FILE gives no depth or width: the dino arm's network is saved as the teacher of a registered
# model of its architecture, the recipe's ViT-T (patch and image size read from the file) at the
# study's size, timm's ``test_vit`` at the dry run's, whose backbones take that shape
TOY_VIT = "test_vit"
TOY = replace(
    gpu_study.TOY,
    model=dict(backbone_kwargs=dict(img_size=32, patch_size=8, embed_dim=64, depth=6, num_heads=2, mlp_ratio=3)),
)
OBJECTIVE_OF_RECIPE = {recipe: objective for objective, (_, recipe) in RECIPES.items()}
SHOWN = {"dino": "dino", "dino_gram": "dino + Gram", "locat": "dino", "locat_gram": "dino + Gram"}


def arm_objective(arm: str) -> str:
    """The objective (a key of ``gpu_study.RECIPES``) the arm's recipe trains."""
    return OBJECTIVE_OF_RECIPE[ARMS[arm][1]]


def arm_options(arm: str, teacher: str) -> Callable[[int], dict]:
    """The module arguments of ``arm`` over its recipe's, for a run of ``steps``: the Gram block
    scaled to the run, or the distillation teacher ``NAME:FILE``."""
    if ARMS[arm][2]:
        return lambda steps: {"gram": gram_block(steps)}
    if arm_objective(arm) == "distill":
        return lambda steps: {"teacher": teacher}
    return lambda steps: {}


def arms_to_run(chosen: list[str], teacher: str | None) -> list[str]:
    """``chosen`` in the study's order, the dino arm added when distill needs it as its teacher."""
    arms = [a for a in ARMS if a in chosen]
    if "distill" in arms and teacher is None and "dino" not in arms:
        arms.insert(0, "dino")
    return arms


def save_backbone(model: torch.nn.Module, path: Path, vit: str) -> str:
    """``model`` (a ViT of the registered model ``vit``'s shape) as ``locatdino export``'s ``pth``, a
    state dict of timm key names, at ``path``; its ``NAME:FILE`` for a teacher (the file gives the
    patch and image size)."""
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
    return f"{vit}:{path}"


def run_arms(study: Study, arms: list[str], teacher: str | None, augment_on: str, scratch: Path, vit: str) -> dict:
    """Measure every arm, share the time, then train and score them in order (dino before distill,
    whose teacher it is unless ``teacher`` is given; ``vit``: the registered model of its shape)."""
    size, seed = study.size, study.seed
    gpu_study.score_random_inits(study, sorted({ARMS[a][0] for a in arms}, key=list(BACKBONES).index))
    # the measurement's teacher: the release, or a random network of the dino arm's architecture (the same cost)
    measuring = teacher or save_backbone(gpu_study.random_backbone("vit", size, seed), scratch / "random_vit.pth", vit)
    loaders = {}
    for arm in arms:
        backbone, objective = ARMS[arm][0], arm_objective(arm)
        loaders[arm] = gpu_study.make_loader(objective, backbone, study.scenes, size, augment_on, seed)
        length = size.warmup_steps + size.timed_steps
        m = gpu_study.measure(objective, backbone, loaders[arm], size, seed, **arm_options(arm, measuring)(length))
        study.results["measured"][arm] = m
        say(f"{arm}: {m['s_per_step']:.3f} s/step, {m['overhead_s']:.1f} s set-up")
    share = gpu_study.training_share(study, len(arms))
    distill_shown = f"distill ({teacher or 'of the dino arm'})"
    for arm in arms:
        backbone, objective = ARMS[arm][0], arm_objective(arm)
        shown = SHOWN.get(arm, distill_shown)
        module = gpu_study.train_and_score(
            study, arm, backbone, objective, loaders[arm], share, arm_options(arm, teacher or ""), shown
        )
        if arm == "dino" and teacher is None:
            teacher = save_backbone(module.eval_backbone, scratch / "dino_teacher.pth", vit)
        del module
        if study.device == "cuda":
            torch.cuda.empty_cache()
    study.results["pairs"] = [
        {"label": label, **gpu_study.deltas(study.out, a, b)}
        for label, a, b in PAIRS
        if b != "random" and {a, b} <= set(arms)
    ]
    return gpu_study.finish(study)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu_study.add_options(p)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument(
        "--teacher", default=None, help="the distill arm's frozen teacher, NAME:FILE (default: the dino arm's run)"
    )
    args = p.parse_args(argv)
    settings = gpu_study.run_settings(args, "gpu_gram_distill", TOY)
    if settings is None:
        return 1
    out, size, augment_on = settings
    if args.teacher is not None:
        try:
            FrozenTeacher(args.teacher)
        except ValueError as err:
            print(f"gpu_gram_distill: {str(err).replace('model.teacher', '--teacher', 1)}", flush=True)
            return 1
    study = gpu_study.start_study(out, size, args.seed, augment_on)
    with tempfile.TemporaryDirectory(prefix="gpu_gram_distill_") as scratch:
        vit = TOY_VIT if args.toy else BACKBONES["vit"]
        run_arms(study, arms_to_run(args.arms, args.teacher), args.teacher, augment_on, Path(scratch), vit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
