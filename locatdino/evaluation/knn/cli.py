"""``locatdino knn``: DINO's weighted k-NN classification of frozen class tokens (docs/evaluation.md).

    locatdino knn --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --dataset imagefolder --data-dir data/imagenet --out runs/knn-in1k

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are scored one after another
on the same images, the first the reference of every Δ. Each model's train and validation class
tokens are computed once (``locatdino.evaluation.class_features``) and every ``--neighbours`` k is
read from one neighbour search (``locatdino.evaluation.knn_classifier``). ``OUT/results.json`` holds, per model
and k, top-1 and top-5 with 95 % Wilson intervals over the validation images and the Δ to the first model with its
paired-bootstrap interval; ``OUT/report.md`` the same as a table. An earlier run's output there
is kept unless ``--overwrite`` (checked before any work; ``locatdino.common.output_folder``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    OptionGroups,
    add_shared_option,
    at_least,
    positive_float,
)
from locatdino.evaluation.bootstrap import accuracy_interval
from locatdino.evaluation.class_features import class_token_embeddings
from locatdino.evaluation.class_splits import (
    CLASS_DATASETS,
    LabelledImages,
    note_skipped,
    open_class_splits,
    split_record,
)
from locatdino.evaluation.knn.report import KNN_LAYOUT
from locatdino.evaluation.knn_classifier import RANKED, check_knn_settings, check_temperature, knn_classify, topk_hits
from locatdino.evaluation.model_runs import ModelRun
from locatdino.evaluation.options import add_data_arguments, add_encoder_arguments, add_loader_arguments
from locatdino.evaluation.provenance import run_provenance
from locatdino.evaluation.results import ReportLayout, score
from locatdino.evaluation.runner import Protocol, Scored, build_parser, fail, run
from locatdino.evaluation.wilson import wilson_interval


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
    options={
        "--neighbours": "ks",
        "--temperature": "temperature",
        "--input-size": "input_size",
        "--batch-size": "batch_size",
        "--knn-backend": "backend",
        "--precision": "precision",
        "--cache-dir": "cache_dir",
        "--cache-ram-mb": "max_cache_ram_mb",
        "--workers": "num_workers",
        "--seed": "seed",
        "--no-progress": "progress",
    },
    internal={},
    negated=frozenset({"--no-progress"}),
)


def _temperature(text: str) -> float:
    """argparse ``type`` of ``--temperature``: a positive number whose votes are representable."""
    value = positive_float(text)
    try:
        check_temperature(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


@dataclass(frozen=True)
class KnnSetup:
    """What every model of a run is scored with."""

    cfg: KnnConfig
    train: LabelledImages
    val: LabelledImages


class KnnProtocol(Protocol):
    command = "knn"
    description = (
        "DINO's weighted k-NN on frozen class tokens: each validation image is labelled by the vote "
        "exp(cos / T) of its k most similar train images; top-1 and top-5 per k, written to OUT/results.json "
        "and OUT/report.md."
    )
    out_default = "knn_results"

    @property
    def layout(self) -> ReportLayout:
        return KNN_LAYOUT

    def add_arguments(self, groups: OptionGroups) -> None:
        d = KnnConfig()
        add_data_arguments(groups.data, CLASS_DATASETS, command=self.command)
        protocol, runtime = groups.protocol, groups.runtime
        protocol.add_argument(
            "--neighbours",
            type=at_least(1),
            nargs="+",
            default=list(d.ks),
            metavar="K",
            help="neighbour counts k, all from one search (the reference: 10 20 100 200; 20 headline)",
        )
        protocol.add_argument(
            "--temperature", type=_temperature, default=d.temperature, metavar="T", help="vote weight exp(cos / T)"
        )
        add_shared_option(
            protocol, "--input-size", d.input_size, note="224, the reference's Resize 256 / CenterCrop 224"
        )
        add_shared_option(protocol, "--seed", d.seed)
        add_shared_option(
            runtime,
            "--knn-backend",
            d.backend,
            use="auto: faiss beside a CPU encoder (the faster there), torch beside a GPU one",
        )
        add_encoder_arguments(runtime, d.precision)
        add_shared_option(runtime, "--batch-size", d.batch_size, use="the class tokens of both splits")
        add_shared_option(runtime, "--cache-dir")
        add_shared_option(runtime, "--cache-ram-mb", d.max_cache_ram_mb)
        add_loader_arguments(runtime)

    def prepare(self, args: argparse.Namespace) -> KnnSetup:
        cfg = replace(KNN_TABLE.build(args), ks=tuple(sorted(set(args.neighbours))))
        train, val = open_class_splits(args)
        if max(cfg.ks) > len(train):
            raise ValueError(
                f"--neighbours {max(cfg.ks)}: the train split {args.train_split!r} holds "
                f"{len(train)} images (use k <= {len(train)})"
            )
        return KnnSetup(cfg, train, val)

    def load_options(self, args: argparse.Namespace, setup: KnnSetup) -> dict[str, Any]:
        return {"input_size": setup.cfg.input_size}

    def announce(self, run: ModelRun, setup: KnnSetup) -> str:
        cfg, train, val = setup.cfg, setup.train, setup.val
        return (
            f"{len(train)} train / {len(val)} validation images, {split_record(train)['classes']} classes, "
            f"{cfg.input_size} px, k {' '.join(map(str, cfg.ks))}, T {cfg.temperature:g}"
        )

    def score(self, model: nn.Module, run: ModelRun, setup: KnnSetup, device: torch.device) -> Scored:
        record, hits = _score(setup.cfg, model, setup.train, setup.val)
        return Scored(record, paired=hits)

    def difference(self, scored: Scored, first: Scored, setup: KnnSetup) -> dict[str, Any] | None:
        hits, reference = scored.paired, first.paired
        k0 = setup.cfg.ks[0]
        if len(hits[k0][0]) != len(reference[k0][0]):  # not the same images decoded
            return None
        return {
            f"k={k}": {
                name: accuracy_interval(hits[k][i], reference[k][i]).to_dict()
                for i, name in enumerate(("top1", "top5"))
                if hits[k][i] is not None
            }
            for k in setup.cfg.ks
        }


def _parser() -> ArgumentParser:
    return build_parser(KnnProtocol())


def main(argv: list[str] | None = None) -> int:
    return run(KnnProtocol(), argv)


def _score(
    cfg: KnnConfig, model: nn.Module, train: LabelledImages, val: LabelledImages
) -> tuple[dict[str, Any], dict[int, tuple[np.ndarray, np.ndarray | None]]]:
    """One model's record (``results.json``) and its per-image top-1 / top-5 hits per k."""
    start, timings = time.perf_counter(), {}
    embed = dict(
        precision=cfg.precision,
        batch_size=cfg.batch_size,
        workers=cfg.num_workers,
        cache_dir=cfg.cache_dir,
        max_ram_bytes=cfg.max_cache_ram_mb << 20,
        show_progress=cfg.progress,
        shared=True,  # on many ranks, each encodes its share
    )
    with (
        class_token_embeddings(model, train, cfg.input_size, desc="train class tokens", **embed) as memory,
        class_token_embeddings(model, val, cfg.input_size, desc="validation class tokens", **embed) as queries,
    ):
        timings["features"] = time.perf_counter() - start
        note_skipped("knn", "train", memory.skipped)
        note_skipped("knn", "validation", queries.skipped)
        _check_decoded(train, memory, "train", "vote with")
        _check_decoded(val, queries, "validation", "score")
        try:
            check_knn_settings(cfg.ks, cfg.temperature, len(memory.labels))
        except ValueError as err:
            raise fail("knn", f"{err} (after skipping images that do not decode)") from None
        search_start, backend = time.perf_counter(), _backend(cfg.backend, model)
        device = next(model.parameters()).device if backend == "torch" else torch.device("cpu")  # search there
        rankings = knn_classify(
            torch.from_numpy(np.asarray(memory.features)).to(device),
            torch.from_numpy(memory.labels),
            torch.from_numpy(np.asarray(queries.features)),
            cfg.ks,
            cfg.temperature,
            num_classes=len(train.class_names),
            backend=backend,
        )
        timings["search"] = time.perf_counter() - search_start
        labels = torch.from_numpy(queries.labels)
        ranked = len(train.class_names) > RANKED  # with at most 5 classes every image is in its top 5
        hits = {
            k: (
                topk_hits(rankings[k], labels, 1).numpy(),
                topk_hits(rankings[k], labels, min(RANKED, k)).numpy() if ranked else None,
            )
            for k in cfg.ks
        }
        data = {
            "train": {**split_record(train), "skipped": memory.skipped},
            "val": {**split_record(val), "scored": len(queries.labels), "skipped": queries.skipped},
        }
    timings["total"] = time.perf_counter() - start
    scores = {f"k={k}": {"top1": _accuracy(top1), "top5": _accuracy(top5)} for k, (top1, top5) in hits.items()}
    config = {
        **asdict(cfg),
        "ks": list(cfg.ks),
        "search": backend,
        "resize": "short side floor(S * 256 / 224), bicubic; centre crop S",
    }
    return {"scores": scores, "data": data, "config": config, "timings": timings, "provenance": run_provenance()}, hits


def _backend(name: str, model: nn.Module) -> str:
    """``--knn-backend``, ``auto`` resolved: FAISS's blocked BLAS is the faster on a CPU
    (benchmarks/RESULTS.md), the torch search keeps a GPU encoder's features on its GPU."""
    if name != "auto":
        return name
    return "faiss" if next(model.parameters()).device.type == "cpu" else "torch"


def _check_decoded(images: LabelledImages, decoded: Any, split: str, use: str) -> None:
    """One line when no image of ``split`` decoded (the first named): nothing to ``use``."""
    if not len(decoded.labels):
        raise fail(
            "knn",
            f"none of the {len(images)} {split} images decodes (first: {decoded.skipped[0]}): nothing to {use}",
        )


def _accuracy(hits: np.ndarray | None) -> dict[str, Any]:
    """A score in percent with its 95 % Wilson interval over the images (None where ``hits`` is:
    top-5 of at most 5 classes, right by construction)."""
    if hits is None:
        return score(None)
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return score(100 * float(hits.mean()), (100 * low, 100 * high))
