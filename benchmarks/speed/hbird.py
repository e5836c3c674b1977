"""Hummingbird evaluation: the reference's data flow and the project, side by side in one run.

    python -m benchmarks.speed.hbird reference \\
        --sizes 448 --num-train 300 --num-val 100 --repeats 1 --cases defaults fp32
    python -m benchmarks.speed.hbird reference --isa avx2 ...
    python -m benchmarks.speed.hbird scaling
    python -m benchmarks.speed.hbird index-sweep --sizes 448

``reference`` — a random-init ViT-S/16 on built-in scenes written in Pascal VOC layout (500×375
JPEG + palette PNG; the first ``--num-train`` / ``--num-val`` of 300 / 100), 1 augmentation
epoch, k = 30, batch 16; our cases (``--cases``) are the defaults (precision and index ``auto``),
the same in the reference's arithmetic (fp32, exact search), the reference's settings, and bf16 or
int8 alone. Every case runs in a fresh
subprocess of this script (its own peak RSS), one after the other, the cases of one repeat
interleaved, so every ratio is measured on the same machine in the same run; the CPU (model,
vector extensions, what torch and FAISS dispatch to) is printed and saved with the rows. The
baseline is *the reference's data flow, re-written here* (the public reference cannot be
installed offline, and its FAISS path needs a GPU): colour jitter on the PIL image, then
ToTensor + Normalize (with its std typo), then torchvision's RandomResizedCrop.get_params box
cut out of the image and mask tensors; the wrapper's probe forward of 32 random 224 px images;
features from ``forward_features`` (final norm on) without the class token; every patch's
one-hot pixel labels averaged per patch; an exact ``IndexFlatIP`` on CPU; neighbour features
gathered again for the attention; every predicted pixel kept until the end; its metric (an IoU
matrix scored class pair by class pair over all pixels with joblib, Hungarian matching on it,
per-class counts) — mean over all classes, absent ones counting 0, as the reference reports.

``--isa avx2`` runs every case with the environment that makes this machine's libraries take
their AVX2 code paths (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``FBGEMM_ENABLE_INSTRUCTIONS``,
``MKL_ENABLE_INSTRUCTIONS``,
``FAISS_SIMD_LEVEL`` — this faiss build dispatches at run time and ignores ``FAISS_OPT_LEVEL`` —,
``OPENBLAS_CORETYPE``): an approximation of an AVX2-only CPU, not one (cache sizes and clocks
stay those of this machine).

``scaling`` — memory sizes 1e4 → 1e6 patches (budgeted memories of 224 px views of the same
scenes), exact ``Flat`` vs ``IVF`` indices: build/search time, recall@30 of IVF against exact on
the model's features, peak RSS.

``index-sweep`` — the ``auto`` index's choice of cells and nprobe: one int8 encoder pass over
300 + 100 images (features cached), then the whole evaluation with exact search and with each IVF
setting: build, recall check and search time, recall@30, mIoU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.results_io import add_results_option, results_file, write_results

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("HBIRD_BENCH_DATA", "/tmp/locatdino-bench/voc-scenes"))
AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "FAISS_SIMD_LEVEL": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
BATCH = 16


# ---------------------------------------------------------------------------------------- data
def _write_scene(args: tuple[str, int, Path]) -> str:
    import torch
    from PIL import Image

    from locatdino.data.scenes import render_scene, scene_rng

    torch.set_num_threads(1)
    split, i, voc = args
    image, mask = render_scene(scene_rng(0, i, split), 375, 500)
    name = f"{split}_{i:05d}"
    Image.fromarray(image).save(voc / "JPEGImages" / f"{name}.jpg", quality=90)
    png = Image.fromarray(mask, mode="P")
    png.putpalette([v for c in range(256) for v in ((c * 37) % 256, (c * 91) % 256, (c * 53) % 256)])
    png.save(voc / "SegmentationClass" / f"{name}.png")
    return name


def voc_scenes(n_train: int = 300, n_val: int = 100) -> Path:
    """Built-in scenes in Pascal VOC layout (written once per size, then reused); scene i is the
    same image in every size."""
    root = DATA if (n_train, n_val) == (300, 100) else DATA.with_name(f"{DATA.name}-{n_train}x{n_val}")
    voc = root / "VOC2012"
    lists = voc / "ImageSets" / "Segmentation"
    if (lists / "val.txt").is_file():
        return root
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    jobs = [("train", i, voc) for i in range(n_train)] + [("val", i, voc) for i in range(n_val)]
    with ProcessPoolExecutor(2) as pool:
        names = list(pool.map(_write_scene, jobs, chunksize=8))
    (lists / "train.txt").write_text("\n".join(n for n in names if n.startswith("train")) + "\n")
    (lists / "val.txt").write_text("\n".join(n for n in names if n.startswith("val")) + "\n")
    return root


def _vit_s(name: str = "vit_small_patch16_224"):
    """The benchmark's random-init backbone (ViT-S/16 unless ``--model`` names another)."""
    import torch

    from locatdino.evaluation.features import load_backbone

    torch.manual_seed(0)
    return load_backbone(name)


# ------------------------------------------------------------------------- reference baseline
def _pair_iou(pred: np.ndarray, gt: np.ndarray, c_gt: int, c_pred: int) -> float:
    both = np.sum((gt == c_gt) & (pred == c_pred))
    return float(both) / max(float(np.sum(gt == c_gt) + np.sum(pred == c_pred) - both), 1e-8)


def reference_metric(gt: np.ndarray, pred: np.ndarray, c: int) -> tuple[float, float]:
    """The reference's matched mIoU over flat pixel arrays: an IoU matrix scored pair by pair in
    joblib workers, Hungarian matching maximising summed IoU, predictions remapped, per-class
    counts. Returns (mean over all classes with absent ones 0, as the reference reports; mean over
    the classes present or predicted, comparable to the project's ``miou_matched``)."""
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor
    from scipy.optimize import linear_sum_assignment

    scores = Parallel(n_jobs=-1)(delayed(_pair_iou)(pred, gt, g, p) for p in range(c) for g in range(c))
    get_reusable_executor().shutdown(wait=True)  # reap the workers so their CPU time is counted
    iou_matrix = np.array(scores).reshape(c, c).T  # [gt, pred]
    rows, cols = linear_sum_assignment(1 - iou_matrix)
    remapped = np.zeros(len(pred))
    for g, p in zip(rows, cols):
        remapped[pred == p] = g
    jac, present = [], []
    for g in range(c):
        is_gt, is_pred = gt == g, remapped == g
        tp, fp, fn = np.sum(is_gt & is_pred), np.sum(~is_gt & is_pred), np.sum(is_gt & ~is_pred)
        jac.append(float(tp) / max(float(tp + fp + fn), 1e-8))
        present.append(tp + fp + fn > 0)
    return 100 * float(np.mean(jac)), 100 * float(np.mean(np.array(jac)[present]))


def reference_style(size: int, n_train: int, n_val: int, model: str, workers: int = 1) -> dict:
    """The public reference's data flow (re-written, not copied): see the module docstring."""
    import faiss
    import torch
    import torch.nn.functional as F
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF
    from torch.utils.data import DataLoader

    from locatdino.data import build_segmentation_dataset

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.255)  # the reference's typo, kept
    to_input = [T.ToTensor(), T.Normalize(mean, std)]
    jitter = T.Compose(
        [T.RandomApply([T.ColorJitter(**{k: 0.1})], p=0.5) for k in ("brightness", "contrast", "saturation", "hue")]
        + to_input
    )
    val_image = T.Compose([T.Resize((size, size), antialias=True)] + to_input)
    nearest = T.InterpolationMode.NEAREST

    class Pairs(torch.utils.data.Dataset):
        def __init__(self, split, train):
            self.ds = build_segmentation_dataset("voc", str(voc_scenes(n_train, n_val)), split)
            self.train = train

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            image, mask = self.ds[i]
            target = TF.to_tensor(np.asarray(mask, dtype=np.uint8))  # float in [0, 1], as the reference
            if self.train:
                x = jitter(image)
                box = T.RandomResizedCrop.get_params(x, scale=(0.5, 2.0), ratio=(3 / 4, 4 / 3))
                x = TF.resized_crop(x, *box, [size, size], antialias=True)
                target = TF.resized_crop(target, *box, [size, size], interpolation=nearest)
            else:
                x, target = val_image(image), TF.resize(target, [size, size], interpolation=nearest)
            return x, target

    model, c, k, beta, p = _vit_s(model), 21, 30, 0.02, 16
    times = {"features": 0.0, "search": 0.0, "metric": 0.0}
    start = time.perf_counter()
    with torch.no_grad():
        model.get_intermediate_layers(torch.rand(32, 3, 224, 224))  # the wrapper's probe forward

        def features(x):
            t = time.perf_counter()
            f = model.forward_features(x)[:, 1:]
            times["features"] += time.perf_counter() - t
            return f

        feats, labels = [], []
        for x, y in DataLoader(Pairs("train", True), batch_size=BATCH, num_workers=workers):
            f = features(x)
            y = (y * 255).long()
            y[y == 255] = 0
            g = size // p  # patchify + one-hot of every pixel, mean per patch
            patches = y.view(-1, 1, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, g, g, p * p)
            labels.append(F.one_hot(patches, c).float().mean(3).flatten(0, 2))
            feats.append((f / torch.norm(f, dim=2, keepdim=True)).flatten(0, 1))
        feats, labels = torch.cat(feats), torch.cat(labels)
        index = faiss.IndexFlatIP(feats.shape[1])
        index.add(feats.numpy())
        preds, targets = [], []
        for x, y in DataLoader(Pairs("val", False), batch_size=BATCH, num_workers=workers):
            q = features(x)
            b, n, d = q.shape
            t = time.perf_counter()
            _, ids = index.search(q.reshape(-1, d).numpy(), k)
            times["search"] += time.perf_counter() - t
            ids = torch.from_numpy(ids.astype(np.int64)).flatten()
            keys, vals = feats[ids].view(b, n, k, d), labels[ids].view(b, n, k, c)
            attn = torch.einsum("bnd,bnkd->bnk", F.normalize(q, dim=-1), F.normalize(keys, dim=-1)) / beta
            scores = torch.einsum("bnk,bnkc->bnc", torch.softmax(attn, -1), vals)
            scores = scores.reshape(b, size // p, size // p, c).permute(0, 3, 1, 2)
            preds.append(F.interpolate(scores, size=(size, size), mode="bilinear").argmax(1, keepdim=True))
            targets.append((y * 255).long())
        t = time.perf_counter()
        preds, targets = torch.cat(preds), torch.cat(targets)
        valid = targets != 255
        miou, miou_present = reference_metric(targets[valid].numpy().astype(int), preds[valid].numpy().astype(int), c)
        times["metric"] += time.perf_counter() - t
    times["total"] = time.perf_counter() - start
    return {"miou_reference": miou, "miou_matched": miou_present, "timings": times, "memory_patches": len(feats)}


# ----------------------------------------------------------------------------------- our cases
def ours(size: int, n_train: int, n_val: int, model: str, **settings) -> dict:
    from locatdino.data import build_segmentation_dataset
    from locatdino.evaluation.hbird import HummingbirdConfig, hummingbird

    root = str(voc_scenes(n_train, n_val))
    train, val = (build_segmentation_dataset("voc", root, s) for s in ("train", "val"))
    cfg = HummingbirdConfig(input_size=size, batch_size=BATCH, progress=False, **settings)
    r = hummingbird(_vit_s(model), train, val, cfg)
    return {
        "miou": r.miou,
        "miou_matched": r.miou_matched,
        "timings": r.timings,
        "memory_patches": r.memory_patches,
        "search": r.search,
    }


def run_case(case: dict, env: dict | None = None) -> dict:
    """Run one case in a fresh interpreter; adds its peak RSS (main process, and worst worker)."""
    cmd = [sys.executable, "-m", __spec__.name, "_case", json.dumps(case)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise RuntimeError(f"case {case} failed:\n{proc.stderr[-3000:]}")
    return {**case, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _case_main(spec: str) -> None:
    case = json.loads(spec)
    kind = case.pop("kind")
    case.pop("label", None)  # names the row in the table only
    if kind == "scaling":
        out = {"rows": scaling_case(**case)}
    elif kind == "index-sweep":
        out = {"rows": index_sweep_case(**case)}
    elif kind == "machine":
        from locatdino.evaluation.provenance import cpu_info, software_versions

        out = {"cpu": cpu_info(), "software": software_versions()}
    else:
        out = reference_style(**case) if kind == "reference-style" else ours(**case)
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["peak_rss_mb"] = me.ru_maxrss / 1024
    out["worker_peak_rss_mb"] = children.ru_maxrss / 1024
    # CPU seconds of the case and its workers: steadier than wall time on a shared machine
    out["cpu_s"] = me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
    out["load_avg"] = os.getloadavg()[0]
    print(json.dumps(out))


# Our cases (``--cases``): the default path (precision and index ``auto``); the same in the
# reference's arithmetic (fp32 encoder, exact search), which ``defaults`` must match in mIoU; the
# reference's protocol (crop sampler, final norm, scoring at the input size) in the default
# arithmetic: README's speed claim at equal work; the
# reference's settings (its crop sampler, final norm, scoring at the input size: the matched mIoU
# is then the quantity the baseline reports) in that arithmetic; each reduced precision alone.
OUR_CASES = {
    "defaults": ("ours, defaults", {}),
    "fp32": ("ours, fp32 + exact search", {"precision": "fp32", "index": "Flat"}),
    "reference-protocol": (
        "ours, reference protocol, defaults",
        {"augment": "reference", "norm": True, "eval_resolution": "input"},
    ),
    "reference-settings": (
        "ours, reference settings",
        {"augment": "reference", "norm": True, "eval_resolution": "input", "precision": "fp32", "index": "Flat"},
    ),
    "bf16": ("ours, bf16 encoder + exact search", {"precision": "bf16", "index": "Flat"}),
    "int8": ("ours, int8 encoder + exact search", {"precision": "int8", "index": "Flat"}),
}


def reference(
    sizes: list[int], n_train: int, n_val: int, repeats: int, env: dict, cases: list[str], model: str
) -> dict:
    """Every case ``repeats`` times, baseline and ours interleaved (this machine is shared: single
    runs vary with the load of other jobs; compare medians); the CPU as the cases saw it (``--isa``)
    and the rows."""
    voc_scenes(n_train, n_val)
    machine = run_case({"kind": "machine"}, env)
    print(json.dumps(machine), flush=True)
    rows = []
    for rep, size in ((r, s) for r in range(repeats) for s in sizes):
        common = {"size": size, "n_train": n_train, "n_val": n_val, "model": model}
        runs = [{"kind": "reference-style", "label": "reference data flow (re-written)", **common}]
        runs += [{"kind": "ours", "label": OUR_CASES[c][0], **common, **OUR_CASES[c][1]} for c in cases]
        for case in runs:
            row = {**run_case(case, env), "repeat": rep, "label": case["label"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(side_by_side_table(rows, machine), flush=True)
    return {"cases_machine": machine, "rows": rows}


def side_by_side_table(rows: list[dict], machine: dict) -> str:
    """Markdown: medians per case and size, and the baseline's median over ours (same run)."""
    cpu = machine["cpu"]
    flags = ", ".join(f for f, on in (cpu.get("flags") or {}).items() if on)
    lines = [
        f"CPU: {cpu['model']} ({cpu['logical_cores']} logical cores; {flags}; torch {cpu['torch_capability']}, "
        f"faiss {cpu.get('faiss_simd_level')})",
        "",
        "| px | case | encoder, index (recall@30) | total s | features s | search s | other s | CPU s | peak RSS GB | "
        "mIoU (matched) | baseline wall / this | baseline CPU / this | RSS / baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sorted({r["size"] for r in rows}):
        by_case: dict[str, list[dict]] = {}
        for r in rows:
            if r["size"] == size:
                by_case.setdefault(r["label"], []).append(r)

        def med(rs, key):
            return statistics.median(r["timings"][key] if key in r["timings"] else r[key] for r in rs)

        base = next(iter(by_case.values()))
        base_total, base_cpu, base_rss = med(base, "total"), med(base, "cpu_s"), med(base, "peak_rss_mb")
        for label, rs in by_case.items():
            total, feat, search = med(rs, "total"), med(rs, "features"), med(rs, "search")
            cpu_s, rss = med(rs, "cpu_s"), med(rs, "peak_rss_mb")
            lines.append(
                f"| {size} | {label} | {_search_cell(rs[0].get('search'))} | {total:.1f} | {feat:.1f} | {search:.1f} | "
                f"{total - feat - search:.1f} | "
                f"{cpu_s:.1f} | {rss / 1024:.2f} | {med(rs, 'miou_matched'):.2f} | {base_total / total:.2f}× | "
                f"{base_cpu / cpu_s:.2f}× | {rss / base_rss:.2f} |"
            )
    loads = [r["load_avg"] for r in rows]
    lines.append(
        f"\nLoad average (1 min) at the end of the cases: {min(loads):.1f}–{max(loads):.1f} on "
        f"{cpu['logical_cores']} cores; medians of {len(rows) // len(by_case)} repeats."
    )
    return "\n".join(lines)


def _search_cell(search: dict | None) -> str:
    """Encoder precision and index of a case; the baseline (no record) is fp32 exact search."""
    from locatdino.evaluation.hbird.report import search_text

    return f"{search['precision']}, {search_text(search)}" if search else "fp32, Flat"


# ------------------------------------------------------------------------------------- scaling
def _ivf(m: int) -> str:
    from locatdino.evaluation.hbird.index_choice import ivf_cells

    return f"IVF{ivf_cells(m)},Flat"


def scaling_case(memory_size: int, n_val: int = 50) -> list[dict]:
    """One memory size (run in its own process): build the memory once, then per index the
    build time, the full query pass (features, search, transfer + metric), mIoU, recall@30."""
    from locatdino.data import build_segmentation_dataset
    from locatdino.evaluation.features import FeatureExtractor
    from locatdino.evaluation.hbird import HummingbirdConfig, PatchIndex, build_memory, evaluate_queries
    from locatdino.evaluation.phase_clock import PhaseClock
    from locatdino.evaluation.splits import SubsetSplit
    from locatdino.evaluation.views import QueryViews, collate_views

    train = build_segmentation_dataset("voc", str(voc_scenes()), "train")
    val = SubsetSplit(build_segmentation_dataset("voc", str(voc_scenes()), "val"), np.arange(n_val))
    extractor = FeatureExtractor(_vit_s(), precision="bf16")
    epochs = max(1, -(-memory_size // (len(train) * 196)))
    cfg = HummingbirdConfig(
        input_size=224,
        memory_size=memory_size,
        aug_epochs=epochs,
        precision="bf16",
        memory_dtype="float16",
        eval_resolution="input",
        progress=False,
    )
    clock = PhaseClock()
    bank, _ = build_memory(extractor, train, cfg, clock)
    memory_times = {k: round(v, 2) for k, v in clock.totals.items()}
    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # noqa: E731
    views = [QueryViews(val, 224)[i] for i in range(min(n_val, 16))]
    probe = extractor(collate_views(views)[0]).flatten(0, 2).numpy()  # real query patches
    exact_ids, rows = None, []
    for spec, nprobe in (("Flat", None), (_ivf(len(bank)), 8), (_ivf(len(bank)), 32)):
        t = time.perf_counter()
        index = PatchIndex(bank.dim, spec, nprobe=nprobe).build(bank.features)
        build = time.perf_counter() - t
        ids = index.search(probe, 30)[1]
        exact_ids = ids if exact_ids is None else exact_ids
        recall = float(np.mean([len(np.intersect1d(a, b)) / 30 for a, b in zip(ids, exact_ids)]))
        q_clock = PhaseClock()
        cm, _ = evaluate_queries(extractor, bank, index, val, cfg, q_clock)
        rows.append(
            {
                "memory_patches": len(bank),
                "aug_epochs": epochs,
                "index": spec,
                "nprobe": nprobe,
                "memory_build_s": memory_times,
                "index_build_s": round(build, 2),
                **{f"{k}_s": round(v, 2) for k, v in q_clock.totals.items()},
                "queries": n_val * 196,
                "miou": round(100 * cm.compute().miou, 2),
                "recall@30": round(recall, 4),
                "peak_rss_mb": round(rss()),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del index
    return rows


# (IVF cells per √M, nprobe); (None, None) = exact search
SWEEP = ((None, None), (4, 64), (4, 32), (4, 16), (2, 32), (2, 16))


def index_sweep_case(size: int, n_train: int, n_val: int) -> list[dict]:
    """Every index of ``SWEEP`` on the same cached int8 features (exact search first: it also
    measures the memory size M)."""
    from locatdino.data import build_segmentation_dataset
    from locatdino.evaluation.feature_cache import CachedExtractor
    from locatdino.evaluation.features import FeatureExtractor
    from locatdino.evaluation.hbird import HummingbirdConfig, hummingbird
    from locatdino.evaluation.hbird.index_choice import ivf_cells

    root = str(voc_scenes(n_train, n_val))
    train, val = (build_segmentation_dataset("voc", root, s) for s in ("train", "val"))
    extractor = CachedExtractor(FeatureExtractor(_vit_s(), precision="int8"), max_bytes=4 << 30)
    rows, memory = [], None
    for cells, nprobe in SWEEP:
        spec = "Flat" if cells is None else f"IVF{ivf_cells(memory, cells)},Flat"
        cfg = HummingbirdConfig(input_size=size, batch_size=BATCH, progress=False, index=spec, nprobe=nprobe)
        r = hummingbird(extractor, train, val, cfg)
        memory = r.memory_patches
        rows.append(
            {
                "index": spec,
                "nprobe": nprobe,
                "recall@30": r.search.get("recall_at_k"),
                "miou": round(r.miou, 3),
                **{f"{k}_s": r.timings.get(k) for k in ("index", "recall", "search")},
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def scaling(sizes: list[int]) -> list[dict]:
    voc_scenes()
    rows = []
    for m in sizes:
        for row in run_case({"kind": "scaling", "memory_size": m})["rows"]:
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("reference", "scaling", "index-sweep", "_case"))
    p.add_argument("spec", nargs="?")
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-train", type=int, default=300, help="memory images (first N of 300)")
    p.add_argument("--num-val", type=int, default=100, help="query images (first N of 100)")
    p.add_argument("--model", default="vit_small_patch16_224", help="random-init backbone of the reference part")
    p.add_argument(
        "--cases",
        nargs="+",
        choices=tuple(OUR_CASES),
        default=["defaults", "fp32", "reference-settings"],
        help="our cases to run beside the baseline",
    )
    p.add_argument(
        "--isa",
        choices=("native", "avx2"),
        default="native",
        help="avx2: make torch, oneDNN, fbgemm, MKL, FAISS and OpenBLAS take their AVX2 paths",
    )
    add_results_option(p, "hbird-<part>-<settings>.json")
    args = p.parse_args(argv)
    if args.part == "_case":
        return _case_main(args.spec)
    env = AVX2_ENV if args.isa == "avx2" else {}
    names = {
        "reference": f"hbird-reference-{args.model}-{args.num_train}x{args.num_val}-{args.isa}.json",
        "index-sweep": f"hbird-index-sweep-{(args.sizes or [448])[0]}.json",
    }
    name = names.get(args.part, "hbird-scaling.json")
    path = results_file(args, name)  # before any measuring
    if args.part == "reference":
        numbers = reference(
            args.sizes or [224, 448], args.num_train, args.num_val, args.repeats, env, args.cases, args.model
        )
    elif args.part == "index-sweep":
        size = (args.sizes or [448])[0]
        rows = run_case({"kind": "index-sweep", "size": size, "n_train": args.num_train, "n_val": args.num_val})["rows"]
        print("\n".join(json.dumps(r) for r in rows))
        numbers = {"rows": rows}
    else:
        numbers = {"rows": scaling(args.sizes or [10_000, 100_000, 1_000_000])}
    write_results(path, name, numbers)


if __name__ == "__main__":
    main()
