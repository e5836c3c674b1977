"""A learning study sized for one GPU: do DINO, iBOT or supervised pretraining beat random init?

    python -m benchmarks.studies.gpu_study --out gpu_study_run      # one CUDA GPU: everything inside 9 minutes
    python -m benchmarks.studies.gpu_study --toy --out /tmp/study   # toy size on the CPU
                                                                    # (tests/benchmarks/test_gpu_study.py)

Six runs — DINO (``configs/dino_tiny_cpu.yaml``), iBOT (``configs/ibot_tiny_cpu.yaml``) and supervised
(``configs/sup_tiny_cpu.yaml``) for tiny ViT and LocAtViT (patch 8, 64 px; the recipes' ``--model.backbone``
switch) — on built-in scenes
rendered in memory at start-up (8192 scenes, batch 256), each with *full* schedules: a short
throughput measurement of every run (its real step with its real loader, after a warm-up) sets its
number of optimizer steps so that the six runs share the time left equally, and every schedule
(lr warm-up and cosine, weight decay, teacher momentum and temperatures, masks) is built for that
length and run to its end; no time limit cuts a run. The recipes' epoch-valued settings count
epochs of the rendered scenes; the supervised lr is the tiny recipes' DeiT rule (5e-4 per 512
images: 2.5e-4 at batch 256), the lr at which supervision keeps the patch tokens' information on
the scenes (RESULTS: "Does pretraining help on the built-in scenes?").

All runs of a backbone start from the same random init (one seed), which is scored too: each
trained network (DINO's and iBOT's teacher, the supervised backbone) is compared with it by
Hummingbird mIoU and the cached dense linear probe (``supervised.score``: 100 memory / 50
query held-out scenes at 128 px, fp32), with the paired bootstrap interval over the query scenes
(docs/evaluation.md). Progress lines show where the run is.

``--out`` (refused when it exists and is not empty; a few hundred kB, no checkpoints):
``results.json`` (command, date, machine, settings, measured step times, every row; rewritten after each row),
``table.md`` (the table, also printed), ``delta.png`` (Δ against random init per run),
``logs/<run>/metrics.csv`` (losses and schedules), ``confusions/*.npz`` (per-image matrices).

Data: DINO and iBOT take the project's GPU loader path where CUDA is (``--augment-on gpu``: uint8
scenes batched by the loader, the multi-crop batched on the device, :class:`DeviceMultiCrop`),
else a CPU DataLoader whose workers do the multi-crop; supervised runs keep timm's augmentation in
the workers. LocAtViT's GAug takes its materialised-mask path (``--gaug-path``; FlexAttention's
compile is not budgeted); no ``torch.compile``. On a CUDA machine with torch, timm, Lightning and
numpy but no internet access, bring the missing packages (faiss-cpu, webdataset, kornia, ...) as
wheels: once, on a machine with internet access, ``bash benchmarks/gpu_check/wheels.sh`` (into the
git-ignored ``.whl/``); copy ``.whl/`` into the checkout on the CUDA machine and run there::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
    PYTHONPATH=/tmp/site:. python -m benchmarks.studies.gpu_study --out gpu_study_run
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the deadline counts from here: imports, rendering and compiles included

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from PIL import Image  # noqa: E402
from webdataset.utils import make_seed  # noqa: E402

from benchmarks.results_io import header  # noqa: E402
from benchmarks.speed.dino_step import StepTimer  # noqa: E402

# the evaluation protocol's names through studies.supervised: one import site for the evaluation/ move
from benchmarks.studies.supervised import CachedSplit, ImageConfusions, miou_interval, open_split, score  # noqa: E402
from locatdino.common.arguments import at_least, positive_float  # noqa: E402
from locatdino.common.output_files import atomic_write_text  # noqa: E402
from locatdino.data import MultiCropTransform, collate_multicrop  # noqa: E402
from locatdino.data.labelled_datamodule import collate_labelled  # noqa: E402
from locatdino.data.scenes import ScenesSegmentation, scene_class  # noqa: E402
from locatdino.data.transforms.classification import ClassificationTransform  # noqa: E402
from locatdino.data.transforms.gpu_multicrop import GPUMultiCrop  # noqa: E402
from locatdino.models import GAugAttention, create_backbone  # noqa: E402
from locatdino.ssl import DINOModule, DistillModule, IBOTModule, SupervisedModule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BACKBONES = {"vit": "vit_tiny_patch16_224", "locatvit": "locatvit_tiny_patch8_224"}  # the recipes' --model.backbone
# objective -> (module, recipe): the ones this study trains, and distillation for the Gram and
# distillation study built on this one (benchmarks/studies/gpu_gram_distill.py)
RECIPES = {
    "dino": (DINOModule, "dino_tiny_cpu"),
    "ibot": (IBOTModule, "ibot_tiny_cpu"),
    "supervised": (SupervisedModule, "sup_tiny_cpu"),
    "distill": (DistillModule, "distill_tiny_cpu"),
}
OBJECTIVES = ("dino", "ibot", "supervised")


@dataclass(frozen=True)
class Size:
    """Everything the GPU study and its toy differ in."""

    scenes: int = 8192
    scene_px: int = 96
    batch: int = 256
    workers: int = max(1, min(14, (os.cpu_count() or 2) - 2))
    eval_train: int = 100
    eval_val: int = 50
    eval_px: int = 128
    deadline_s: float = 540.0
    warmup_steps: int = 3  # steps before the timed ones (first-call costs, loader start-up)
    timed_steps: int = 8
    min_steps: int = 20
    log_every: int = 10
    model: dict = field(default_factory=dict)  # on top of every recipe's model arguments
    head: dict = field(default_factory=dict)  # on top of the DINO / iBOT recipes' head arguments
    multicrop: dict = field(default_factory=dict)
    input_px: int = 64  # the supervised input (the DINO recipes' global crop)


TOY = Size(
    scenes=24,
    scene_px=48,
    batch=4,
    workers=0,
    eval_train=8,
    eval_val=4,
    eval_px=32,
    deadline_s=25.0,
    warmup_steps=1,
    timed_steps=2,
    min_steps=2,
    log_every=1,
    model=dict(backbone_kwargs=dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2)),
    head=dict(out_dim=64, hidden_dim=64, bottleneck_dim=32),
    multicrop=dict(global_crop_size=32, local_crop_size=16, num_local_crops=2),
    input_px=32,
)


def elapsed() -> float:
    return time.perf_counter() - START


def say(message: str) -> None:
    print(f"[{elapsed():5.0f} s] {message}", flush=True)


def recipe(objective: str, backbone: str) -> dict:
    """The recipe's YAML (the DINO one names no class) with ``backbone`` switched in."""
    config = yaml.safe_load((ROOT / "configs" / f"{RECIPES[objective][1]}.yaml").read_text())
    model = config["model"].get("init_args", config["model"])
    model["backbone"] = BACKBONES[backbone]
    return config


def build_module(objective: str, backbone: str, size: Size, seed: int, **options):
    """The recipe's objective at ``size`` (batch, toy backbone), ``options`` (module arguments, e.g.
    ``gram`` or ``teacher``) over the recipe's; built right after seeding, so its backbone is the
    random init scored for ``backbone``."""
    cls, _ = RECIPES[objective]
    model = recipe(objective, backbone)["model"]
    args = dict(model.get("init_args", model))
    args.pop("class_path", None)
    args.update({k: v for k, v in size.head.items() if objective != "supervised"})
    if objective == "ibot" and "out_dim" in size.head:
        args["patch_out_dim"] = size.head["out_dim"]
    args["backbone_kwargs"] = {**args.get("backbone_kwargs", {}), **size.model.get("backbone_kwargs", {})}
    args.update(options)
    torch.manual_seed(seed)
    return cls(**args, batch_size=size.batch)


def random_backbone(backbone: str, size: Size, seed: int) -> torch.nn.Module:
    """The network every run of ``backbone`` starts from (same seed, built first in each module)."""
    model = recipe("dino", backbone)["model"]
    torch.manual_seed(seed)
    return create_backbone(
        model["backbone"], pos_embed="timm", **{**model["backbone_kwargs"], **size.model.get("backbone_kwargs", {})}
    )


class _RenderedScene(torch.utils.data.Dataset):
    def __init__(self, scenes: ScenesSegmentation) -> None:
        self.scenes = scenes

    def __len__(self) -> int:
        return len(self.scenes)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, mask = self.scenes[i]
        return torch.from_numpy(np.asarray(image)).permute(2, 0, 1).contiguous(), scene_class(mask)


def render(size: Size) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, 3, s, s]`` uint8 training scenes and their dominant-object labels, rendered by the workers."""
    loader = torch.utils.data.DataLoader(
        _RenderedScene(ScenesSegmentation(size.scenes, size=size.scene_px)), batch_size=64, num_workers=size.workers
    )
    images, labels = zip(*[(x, y) for x, y in loader])
    return torch.cat(images), torch.cat(labels)


class _Crops(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, transform, labels: torch.Tensor | None = None) -> None:
        self.images, self.transform, self.labels = images, transform, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        if self.labels is None:  # multi-crop of a uint8 tensor
            return self.transform(self.images[i])
        return self.transform(Image.fromarray(self.images[i].permute(1, 2, 0).numpy())), self.labels[i]


class _Scene(torch.utils.data.Dataset):
    """A rendered scene as the GPU multi-crop's input: its uint8 image (the loader only batches)."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i]


class DeviceMultiCrop(pl.LightningDataModule):
    """The project's GPU loader path (``data.init_args.augment_on: gpu``) for in-memory scenes:
    the loader yields uint8 images, and the DINO multi-crop runs batched on the training device
    (:class:`~locatdino.data.transforms.gpu_multicrop.GPUMultiCrop`, seeded per batch as the data module does)."""

    def __init__(self, loader: torch.utils.data.DataLoader, multicrop: MultiCropTransform, seed: int) -> None:
        super().__init__()
        self.loader, self.crops, self.seed, self.batches = loader, GPUMultiCrop(multicrop), seed, 0

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self.loader

    def on_after_batch_transfer(self, batch: torch.Tensor, dataloader_idx: int) -> dict:
        sizes = torch.tensor(batch.shape[-2:], device=batch.device).expand(len(batch), 2)
        self.batches += 1
        return self.crops.to(batch.device)(batch, sizes, seed=make_seed(self.seed, 0, self.batches))


def make_loader(
    objective: str,
    backbone: str,
    scenes: tuple[torch.Tensor, torch.Tensor],
    size: Size,
    augment_on: str = "cpu",
    seed: int = 0,
):
    """The recipe's augmentation over the rendered scenes: in CPU worker processes, or (DINO and
    iBOT with ``augment_on="gpu"``) batched on the training device."""
    data = recipe(objective, backbone)["data"]["init_args"]
    if objective != "supervised" and augment_on == "gpu":
        multicrop = MultiCropTransform(**{**data["multicrop"], **size.multicrop})
        loader = torch.utils.data.DataLoader(
            _Scene(scenes[0]),
            batch_size=size.batch,
            shuffle=True,
            drop_last=True,
            num_workers=min(size.workers, 2),
            persistent_workers=size.workers > 0,
            pin_memory=torch.cuda.is_available(),
        )
        return DeviceMultiCrop(loader, multicrop, seed)
    if objective == "supervised":
        transform = ClassificationTransform(**{**data["transform"], "input_size": size.input_px}).train()
        dataset, collate = _Crops(scenes[0], transform, scenes[1]), collate_labelled
    else:
        dataset, collate = (
            _Crops(scenes[0], MultiCropTransform(**{**data["multicrop"], **size.multicrop})),
            collate_multicrop,
        )
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=size.batch,
        shuffle=True,
        drop_last=True,
        num_workers=size.workers,
        persistent_workers=size.workers > 0,
        pin_memory=torch.cuda.is_available(),
        collate_fn=collate,
    )


def fit(module, loader, steps: int, size: Size, logger=None, clock: StepTimer | None = None) -> float:
    """Train ``steps`` optimizer steps (the schedules built for exactly that many); wall seconds."""
    cuda = torch.cuda.is_available()
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed" if cuda else "32-true",
        max_steps=steps,
        max_epochs=-1,
        logger=logger or False,
        callbacks=[clock] if clock else None,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=size.log_every,
    )
    start = time.perf_counter()
    if isinstance(loader, pl.LightningDataModule):
        trainer.fit(module, datamodule=loader)
    else:
        trainer.fit(module, loader)
    assert trainer.global_step == steps == module._run_length.total_steps, "the run did not reach its schedule's end"
    return time.perf_counter() - start


def measure(objective: str, backbone: str, loader, size: Size, seed: int, **options) -> dict[str, float]:
    """Median seconds per step after the warm-up, and the per-run overhead (set-up, first steps);
    ``options`` as :func:`build_module`'s, for a run of the measurement's length."""
    clock = StepTimer()
    module = build_module(objective, backbone, size, seed, **options)
    wall = fit(module, loader, size.warmup_steps + size.timed_steps, size, clock=clock)
    steps = [b - a for a, b in zip(clock.starts[size.warmup_steps : -1], clock.starts[size.warmup_steps + 1 :])]
    per_step = statistics.median(steps)
    return {"s_per_step": per_step, "overhead_s": max(wall - per_step * (size.warmup_steps + size.timed_steps), 0.0)}


def interval_text(out: Path, protocol: str, run: str, other: str) -> tuple[str, dict]:
    """``+1.2 [+0.4, +2.0] ✓`` of ``run`` − ``other`` (confusion tags, e.g. ``vit_random``) on the
    same query scenes."""
    load = lambda tag: ImageConfusions.load(out / "confusions" / f"{protocol}_{tag}.npz")  # noqa: E731
    iv = miou_interval(load(run), load(other))
    return iv.text(1) + ("" if iv.covers_zero else " ✓"), {"delta": iv.delta, "low": iv.low, "high": iv.high}


def deltas(out: Path, run: str, other: str) -> dict:
    """:func:`interval_text` of ``run`` − ``other`` by Hummingbird and the linear probe: each one's
    text (``hbird_delta_text``) and numbers (``hbird_delta``)."""
    found = {}
    for protocol in ("hbird", "linprobe"):
        found[f"{protocol}_delta_text"], found[f"{protocol}_delta"] = interval_text(out, protocol, run, other)
    return found


def write_outputs(out: Path, results: dict) -> str:
    lines = [
        "| backbone | objective | steps (epochs) | s/step | fit s | Hummingbird | Δ vs random [95 %] | "
        "linear probe | Δ vs random [95 %] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        trained = r["objective"] != "random init"
        lines.append(
            f"| {r['backbone']} | {r['objective']} | "
            + (
                f"{r['steps']} ({r['epochs']:.1f}) | {r['s_per_step']:.3f} | {r['fit_s']:.0f} |"
                if trained
                else "— | — | — |"
            )
            + f" {r['hbird']:.2f} | {r.get('hbird_delta_text', '—')} | {r['linprobe']:.2f} | "
            f"{r.get('linprobe_delta_text', '—')} |"
        )
    if results.get("pairs"):  # trained − trained differences (benchmarks/studies/gpu_gram_distill.py's)
        lines += ["", "| paired difference | Hummingbird Δ [95 %] | linear probe Δ [95 %] |", "|---|---|---|"]
        lines += [f"| {d['label']} | {d['hbird_delta_text']} | {d['linprobe_delta_text']} |" for d in results["pairs"]]
    table = "\n".join(lines)
    atomic_write_text(out / "table.md", table + "\n")
    atomic_write_text(out / "results.json", json.dumps(results, indent=1))
    return table


def plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [r for r in rows if "hbird_delta" in r]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for ax, protocol, title in zip(axes, ("hbird", "linprobe"), ("Hummingbird", "linear probe")):
        d = [r[f"{protocol}_delta"] for r in trained]
        err = [[x["delta"] - x["low"] for x in d], [x["high"] - x["delta"] for x in d]]
        ax.barh(range(len(d)), [x["delta"] for x in d], xerr=err, color="tab:blue", alpha=0.7)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(f"{title}: trained − random init (mIoU, 95 %)")
    axes[0].set_yticks(range(len(trained)), [f"{r['backbone']} {r['objective']} ({r['steps']} steps)" for r in trained])
    fig.tight_layout()
    fig.savefig(out / "delta.png", dpi=120)
    plt.close(fig)


@dataclass
class Study:
    """What every run of a study shares: its results so far, the rendered training scenes and the
    cached evaluation splits (:func:`start_study`)."""

    out: Path
    size: Size
    seed: int
    results: dict
    scenes: tuple[torch.Tensor, torch.Tensor]
    train_set: CachedSplit
    val_set: CachedSplit
    device: str
    eval_s: list[float] = field(default_factory=list)  # seconds of each scoring so far


def start_study(out: Path, size: Size, seed: int, augment_on: str) -> Study:
    """The results' header, the training scenes and the evaluation splits."""
    results = {**header(), "size": asdict(size), "seed": seed, "augment_on": augment_on, "measured": {}, "rows": []}
    (out / "confusions").mkdir(parents=True, exist_ok=True)
    say(f"rendering {size.scenes} scenes at {size.scene_px} px ({size.workers} workers)")
    scenes = render(size)
    train_set = CachedSplit(open_split("scenes", None, "train", size.eval_train, 0, size.eval_px))
    val_set = CachedSplit(open_split("scenes", None, "val", size.eval_val, 0, size.eval_px))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Study(out, size, seed, results, scenes, train_set, val_set, device)


def study_score(study: Study, model: torch.nn.Module, tag: str) -> dict[str, float]:
    """:func:`score` of ``model`` on the study's splits, its matrices saved as ``tag``; timed."""
    start = time.perf_counter()
    scores = score(
        model.to(study.device), study.train_set, study.val_set, study.size.eval_px, study.out / "confusions", tag
    )
    study.eval_s.append(time.perf_counter() - start)
    return scores


def score_random_inits(study: Study, backbones: list[str]) -> None:
    """Each backbone's random init (the network its runs start from): a row each."""
    for backbone in backbones:
        scores = study_score(study, random_backbone(backbone, study.size, study.seed), f"{backbone}_random")
        study.results["rows"].append(dict(backbone=backbone, objective="random init", **scores))
        say(f"{backbone} random init: Hummingbird {scores['hbird']:.2f}, linear probe {scores['linprobe']:.2f}")


def training_share(study: Study, runs: int) -> float:
    """Seconds of training per run: the deadline's time left, less the scoring still to come, shared equally."""
    size = study.size
    reserve = runs * 1.25 * statistics.mean(study.eval_s) + 0.05 * size.deadline_s
    share = (size.deadline_s - elapsed() - reserve) / runs
    study.results["share_s"] = share
    say(f"{share:.0f} s of training per run (deadline {size.deadline_s:.0f} s, {reserve:.0f} s kept for scoring)")
    return share


def train_and_score(
    study: Study,
    name: str,
    backbone: str,
    objective: str,
    loader,
    share: float,
    options: Callable[[int], dict] = lambda steps: {},
    shown: str | None = None,
):
    """Train ``name`` for the steps its measured speed fits in ``share`` seconds (its schedules, and
    the module arguments ``options(steps)`` of :func:`build_module`, built for that length), score it
    against its random init and add its row (``shown``: its objective column, if not ``objective``);
    returns the trained module."""
    size, m = study.size, study.results["measured"][name]
    steps = max(size.min_steps, int((share - m["overhead_s"]) / m["s_per_step"]))
    chosen = options(steps)
    module = build_module(objective, backbone, size, study.seed, **chosen)
    seconds = fit(module, loader, steps, size, CSVLogger(study.out / "logs", name=name, version=""))
    scores = study_score(study, module.eval_backbone, name)
    epochs = steps * size.batch / size.scenes
    row = dict(run=name, backbone=backbone, objective=shown or objective, steps=steps, epochs=epochs)
    row.update(s_per_step=m["s_per_step"], fit_s=seconds, **scores, **({"options": chosen} if chosen else {}))
    row.update(deltas(study.out, name, f"{backbone}_random"))
    study.results["rows"].append(row)
    write_outputs(study.out, study.results)
    say(
        f"{name}: {steps} steps in {seconds:.0f} s; Hummingbird {scores['hbird']:.2f} "
        f"({row['hbird_delta_text']}), linear probe {scores['linprobe']:.2f} ({row['linprobe_delta_text']})"
    )
    return module


def finish(study: Study) -> dict:
    study.results["total_s"] = elapsed()
    plot(study.out, study.results["rows"])
    print(write_outputs(study.out, study.results), flush=True)
    say(f"done: {study.out}")
    return study.results


def run_study(
    out: Path, size: Size, seed: int, backbones: list[str], objectives: list[str], augment_on: str = "cpu"
) -> dict:
    study = start_study(out, size, seed, augment_on)
    score_random_inits(study, backbones)
    runs = [(b, o) for o in objectives for b in backbones]
    loaders = {run: make_loader(run[1], run[0], study.scenes, size, augment_on, seed) for run in runs}
    for backbone, objective in runs:
        m = measure(objective, backbone, loaders[(backbone, objective)], size, seed)
        study.results["measured"][f"{backbone}_{objective}"] = m
        say(f"{backbone} {objective}: {m['s_per_step']:.3f} s/step, {m['overhead_s']:.1f} s set-up")
    share = training_share(study, len(runs))
    for backbone, objective in runs:
        module = train_and_score(
            study, f"{backbone}_{objective}", backbone, objective, loaders[(backbone, objective)], share
        )
        del module
        if study.device == "cuda":
            torch.cuda.empty_cache()
    return finish(study)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of this study and of those built on it: the results folder, size, seed, paths."""
    p.add_argument("--out", required=True, help="results folder (new or empty)")
    p.add_argument(
        "--toy", "--dry-run", dest="toy", action="store_true", help="toy size on the CPU (the test suite's run)"
    )
    p.add_argument("--deadline", type=positive_float, default=None, help="seconds for the whole command (GPU: 540)")
    p.add_argument("--scenes", type=at_least(1), default=None, help="rendered training scenes (GPU: 8192)")
    p.add_argument("--batch", type=at_least(1), default=None, help="images per step (GPU: 256)")
    p.add_argument("--workers", type=at_least(0), default=None, help="loader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gaug-path", default="mask", help="GAug's attention path (mask | flex | auto | separable)")
    p.add_argument(
        "--augment-on",
        choices=("cpu", "gpu"),
        default=None,
        help="DINO / iBOT multi-crop in the loader's workers or batched on the device "
        "(default: gpu where CUDA is, else cpu)",
    )


def run_settings(args: argparse.Namespace, prog: str, toy: Size = TOY) -> tuple[Path, Size, str] | None:
    """``--out``, the size (``toy`` with ``--toy``) and the multi-crop's place of :func:`add_options`'
    arguments (and GAug's path set); None, after one line naming ``prog``, for an ``--out`` that
    holds anything."""
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"{prog}: --out {out} exists and is not an empty folder: choose a new one", flush=True)
        return None
    changes = {"deadline_s": args.deadline, "scenes": args.scenes, "batch": args.batch, "workers": args.workers}
    size = replace(toy if args.toy else Size(), **{k: v for k, v in changes.items() if v is not None})
    GAugAttention.gaug_path = args.gaug_path
    return out, size, args.augment_on or ("gpu" if torch.cuda.is_available() else "cpu")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(p)
    p.add_argument("--backbones", nargs="+", choices=BACKBONES, default=list(BACKBONES))
    p.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=list(OBJECTIVES))
    args = p.parse_args(argv)
    settings = run_settings(args, "gpu_study")
    if settings is None:
        return 1
    out, size, augment_on = settings
    run_study(out, size, args.seed, args.backbones, args.objectives, augment_on)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
