"""``locatdino knn``: DINO's weighted k-NN classification of frozen class tokens (docs/evaluation.md).

    locatdino knn --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --dataset imagefolder --data-dir data/imagenet --out runs/knn-in1k

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are scored one after another
on the same images, the first the reference of every Δ. Each model's train and validation class
tokens are computed once (``locatdino.probes.class_features``) and every ``--k`` is read from one
neighbour search (``locatdino.probes.knn``). ``OUT/results.json`` holds, per model and k, top-1 and
top-5 with 95 % Wilson intervals over the validation images and the Δ to the first model with its
paired-bootstrap interval; ``OUT/report.md`` the same as a table. Results already there are kept
unless ``--overwrite`` (checked before any work).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from locatdino.arguments import ArgumentParser, ConfigTable, at_least, option_groups, positive_float
from locatdino.evaluation.bootstrap import accuracy_interval
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import add_data_arguments, add_loader_arguments, encoder_device, record_run
from locatdino.evaluation.precision import PRECISIONS
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.wilson import wilson_interval
from locatdino.help_format import DefaultsOnceHelpFormatter
from locatdino.output_files import (DiskFullError, atomic_write_text, ensure_writable, output_lock,
                                    remove_stale_temporaries)
from locatdino.probes.class_features import Embeddings, class_token_embeddings
from locatdino.probes.class_splits import (CLASS_DATASETS, LabelledImages, align_classes, open_class_split,
                                           split_record)
from locatdino.probes.knn import BACKENDS, check_knn_settings, knn_classify, topk_hits
from locatdino.probes.knn_report import KNN_FILES, knn_report, knn_table


@dataclass(frozen=True)
class KnnConfig:
    """The k-NN protocol's settings (defaults: the reference's ``eval_knn.py``)."""

    ks: tuple[int, ...] = (10, 20, 100, 200)
    temperature: float = 0.07
    input_size: int = 224
    batch_size: int = 64
    backend: str = "auto"  # faiss beside a CPU encoder (the faster there), torch beside a GPU one
    precision: str = "fp32"  # the reference's arithmetic: its numbers are reproduced, not approximated
    cache_dir: str | None = None
    max_cache_ram_mb: int = 4096
    num_workers: int | None = None
    seed: int = 0
    progress: bool = True


KNN_TABLE = ConfigTable(
    KnnConfig,
    options={"--k": "ks", "--temperature": "temperature", "--input-size": "input_size", "--batch-size": "batch_size",
             "--knn-backend": "backend", "--precision": "precision", "--cache-dir": "cache_dir",
             "--cache-ram-mb": "max_cache_ram_mb", "--workers": "num_workers", "--seed": "seed",
             "--no-progress": "progress"},
    internal={},
    negated=frozenset({"--no-progress"}),
)


def _parser() -> ArgumentParser:
    d = KnnConfig()
    p = ArgumentParser(
        prog="locatdino knn",
        description="DINO's weighted k-NN on frozen class tokens: each validation image is labelled by the "
        "vote exp(cos / T) of its k most similar train images; top-1 and top-5 per k.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model)
    add_data_arguments(groups.data, CLASS_DATASETS)
    protocol, runtime = groups.protocol, groups.runtime
    protocol.add_argument("--k", type=at_least(1), nargs="+", default=list(d.ks), metavar="K",
                          help="neighbour counts, all from one search (the reference: 10 20 100 200; 20 headline)")
    protocol.add_argument("--temperature", type=positive_float, default=d.temperature, metavar="T",
                          help="vote weight exp(cos / T)")
    protocol.add_argument("--input-size", type=at_least(1), default=d.input_size, metavar="S",
                          help="centre-crop side; images are first resized to S x 256 / 224 on their short side "
                          "(the reference: 256 then 224)")
    protocol.add_argument("--seed", type=int, default=d.seed, help="subsets (--num-train/--num-val), random init")
    runtime.add_argument("--knn-backend", choices=("auto", *BACKENDS), default=d.backend,
                         help="exact search: torch (in blocks, on the encoder's device), faiss (IndexFlatIP, CPU), "
                         "or auto (faiss beside a CPU encoder, torch beside a GPU)")
    runtime.add_argument("--device", default="auto",
                         help="encoder device: auto (CUDA when available), cpu, cuda, cuda:1, ...")
    runtime.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                         help="encoder precision (fp32: the reference's numbers; auto, bf16, int8: faster, "
                         "see locatdino hbird --help)")
    runtime.add_argument("--batch-size", type=at_least(1), default=d.batch_size, help="images per forward")
    runtime.add_argument("--cache-dir", default=None,
                         help="folder for class tokens too large for RAM (default: the system's temporary folder)")
    runtime.add_argument("--cache-ram-mb", type=at_least(0), default=d.max_cache_ram_mb,
                         help="largest split of class tokens kept in RAM; larger ones are memory-mapped files")
    add_loader_arguments(runtime)
    groups.output.add_argument("--out", default="knn_results", metavar="DIR", help="results.json + report.md")
    groups.output.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    return p


def _open_splits(args: argparse.Namespace) -> tuple[LabelledImages, LabelledImages]:
    common = dict(seed=args.seed, scene_size=args.scene_size)
    train = open_class_split(args.dataset, args.data_dir, args.train_split, args.num_train, default_scenes=300,
                             option="--num-train", **common)
    val = open_class_split(args.dataset, args.data_dir, args.val_split, args.num_val, default_scenes=100,
                           option="--num-val", **common)
    return train, align_classes(train, val, args.val_split)


def _check_outputs(out: Path, cache_dir: str | None, overwrite: bool) -> None:
    """Fail before any work when ``out`` cannot be written or holds an earlier run's results."""
    earlier = [out / name for name in KNN_FILES if (out / name).exists()]
    if earlier and not overwrite:
        raise SystemExit(f"locatdino knn: --out {out} holds results of an earlier run ({earlier[0]}"
                         f"{f' and {len(earlier) - 1} more' if len(earlier) > 1 else ''}): pass --overwrite to "
                         "replace them, or another --out")
    folders = [(out, "--out")] + ([(Path(cache_dir), "--cache-dir")] if cache_dir is not None else [])
    try:
        for folder, flag in folders:
            ensure_writable(folder, flag)
            remove_stale_temporaries(folder)
    except OSError as err:
        raise SystemExit(f"locatdino knn: {err}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    runs = model_runs(args, parser)
    device = encoder_device(args.device, "knn")
    cfg = replace(KNN_TABLE.build(args), ks=tuple(sorted(set(args.k))))
    try:
        train, val = _open_splits(args)
        check_knn_settings(cfg.ks, cfg.temperature, len(train))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino knn: {err}") from None
    models = load_backbones(runs, args.seed, cfg.input_size)  # a bad model creates no output folder
    out = Path(args.out)
    _check_outputs(out, cfg.cache_dir, args.overwrite)
    with output_lock(out, "--out"):  # a second run into --out is refused, not raced
        return _score_all(argv, args, cfg, runs, models, train, val, device)


def _score_all(argv: list[str], args: argparse.Namespace, cfg: KnnConfig, runs: list[ModelRun],
               models: list[nn.Module], train: LabelledImages, val: LabelledImages, device: torch.device) -> int:
    """Every model's k-NN, then the Δ of each to the first, written once all have run."""
    out = Path(args.out)
    results, hits = [], []
    for run, model in zip(runs, models):
        print(f"[knn] {run.label}: {len(train)} train / {len(val)} validation images, {split_record(train)['classes']} "
              f"classes, {cfg.input_size} px, k {' '.join(map(str, cfg.ks))}, T {cfg.temperature:g}",
              file=sys.stderr, flush=True)
        result, model_hits = _score(cfg, model.to(device), train, val)
        results.append(record_run(result, args, run, model))
        hits.append(model_hits)
        model.cpu()
    for result, model_hits in zip(results[1:], hits[1:]):
        if len(model_hits[cfg.ks[0]][0]) == len(hits[0][cfg.ks[0]][0]):  # the same images decoded for both
            result["differences"] = {
                str(k): {name: accuracy_interval(model_hits[k][i], hits[0][k][i]).to_dict()
                         for i, name in enumerate(("top1", "top5"))} for k in cfg.ks}
    report = {"command": "locatdino knn " + shlex.join(argv), "models": results}
    try:
        atomic_write_text(out / "results.json", json.dumps(report, indent=2) + "\n")
        atomic_write_text(out / "report.md", knn_report(report))
    except DiskFullError as err:
        raise SystemExit(f"locatdino knn: {err}") from None
    print(knn_table(results))
    print(f"[knn] results written to {out}", file=sys.stderr)
    return 0


def _score(cfg: KnnConfig, model: nn.Module, train: LabelledImages,
           val: LabelledImages) -> tuple[dict[str, Any], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """One model's record (``results.json``) and its per-image top-1 / top-5 hits per k."""
    start, timings = time.perf_counter(), {}
    embed = dict(precision=cfg.precision, batch_size=cfg.batch_size, workers=cfg.num_workers,
                 cache_dir=cfg.cache_dir, max_ram_bytes=cfg.max_cache_ram_mb << 20, show_progress=cfg.progress)
    with class_token_embeddings(model, train, cfg.input_size, desc="train class tokens", **embed) as memory, \
            class_token_embeddings(model, val, cfg.input_size, desc="validation class tokens", **embed) as queries:
        timings["features"] = time.perf_counter() - start
        _note_skipped(memory, "train")
        _note_skipped(queries, "validation")
        try:
            check_knn_settings(cfg.ks, cfg.temperature, len(memory.labels))
        except ValueError as err:
            raise SystemExit(f"locatdino knn: {err} (after skipping images that do not decode)") from None
        search_start, backend = time.perf_counter(), _backend(cfg.backend, model)
        rankings = knn_classify(torch.from_numpy(np.asarray(memory.features)), torch.from_numpy(memory.labels),
                                torch.from_numpy(np.asarray(queries.features)), cfg.ks, cfg.temperature,
                                num_classes=len(train.class_names), backend=backend)
        timings["search"] = time.perf_counter() - search_start
        labels = torch.from_numpy(queries.labels)
        hits = {k: (topk_hits(rankings[k], labels, 1).numpy(), topk_hits(rankings[k], labels, min(5, k)).numpy())
                for k in cfg.ks}
        data = {"train": {**split_record(train), "skipped": memory.skipped},
                "val": {**split_record(val), "scored": len(queries.labels), "skipped": queries.skipped}}
    timings["total"] = time.perf_counter() - start
    scores = {str(k): {**_accuracy("top1", top1), **_accuracy("top5", top5)} for k, (top1, top5) in hits.items()}
    config = {**asdict(cfg), "ks": list(cfg.ks), "search": backend,
              "resize": "short side floor(S * 256 / 224), bicubic; centre crop S"}
    return {"knn": scores, "data": data, "config": config, "timings": timings,
            "provenance": run_provenance()}, hits


def _backend(name: str, model: nn.Module) -> str:
    """``--knn-backend``, ``auto`` resolved: FAISS's blocked BLAS is the faster on a CPU
    (benchmarks/RESULTS.md), the torch search keeps a GPU encoder's features on its GPU."""
    if name != "auto":
        return name
    return "faiss" if next(model.parameters()).device.type == "cpu" else "torch"


def _accuracy(name: str, hits: np.ndarray) -> dict[str, Any]:
    """``{name}`` in percent and ``{name}_interval``, its 95 % Wilson interval over the images."""
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return {name: 100 * float(hits.mean()), f"{name}_interval": [100 * low, 100 * high]}


def _note_skipped(embeddings: Embeddings, split: str) -> None:
    if embeddings.skipped:
        names = ", ".join(embeddings.skipped[:3]) + (", ..." if len(embeddings.skipped) > 3 else "")
        print(f"[knn] skipped {len(embeddings.skipped)} {split} image{'s' * (len(embeddings.skipped) != 1)} that do "
              f"not decode: {names} (all named in results.json)", file=sys.stderr, flush=True)
