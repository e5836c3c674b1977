"""Hummingbird reports: ``results.json`` and markdown summaries, single runs and comparisons.

A run's ``results.json`` is :meth:`HummingbirdResult.to_dict` (mIoU in percent, per-class IoU,
timings in seconds, memory size, the full config, the model); its per-image confusion matrices go
beside it (``per_image_confusion.npz``, named in the JSON), so that a comparison of finished runs
gives every Δ mIoU its paired-bootstrap interval (docs/evaluation.md). Files are written atomically
(``locatdino.common.output_files``), so an interrupted run never leaves a truncated report.

A comparison is refused when the runs did not score the same query images (dataset, folder,
split, scene size, number of queries, class list, and the seed where it picks them: it renders the
built-in scenes and draws a subset of a split): one table would mix numbers that mean
different things. Protocol settings that differ (input size, memory, seed, k, ...) are allowed
and marked. Runs loaded from disk are labelled by their run folder.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from locatdino.common.input_files import read_bounded
from locatdino.common.output_files import atomic_write_text
from locatdino.evaluation.bootstrap import RESAMPLES, SEED, PairedInterval, matched_miou_interval, miou_interval
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions
from locatdino.evaluation.metric import images_miou
from locatdino.evaluation.tables import number_cell, per_class_table, run_label

_PHASES = ("features", "data", "memory", "index", "search", "transfer")
# config keys that fix the query images: runs that differ in one were scored on different data
_QUERY_KEYS = ("dataset", "data_dir", "val_split", "scene_size")
_SETTING_KEYS = (
    "input_size",
    "aug_epochs",
    "memory_size",
    "k",
    "beta",
    "index",
    "precision",
    "eval_resolution",
    "augment",
    "norm",
    "hungarian",
    "seed",
    "train_split",
)
INTERVAL_NOTE = (
    f"Δ mIoU, Δ mIoU (Hungarian): difference to the first run, with its 95 % paired-bootstrap interval over the query "
    f"images ({RESAMPLES:,} resamples, seed {SEED}); an interval that holds 0 means no measurable "
    "difference."
)


def miou_deltas(
    confusions: Sequence[ImageConfusions | None], hungarian: str = "iou"
) -> list[tuple[PairedInterval, PairedInterval] | None]:
    """Δ mIoU and Δ Hungarian-matched mIoU (criterion ``hungarian``) of every run to the first,
    each with its interval; None for the first run and for runs without per-image matrices (older
    ``results.json``) or scored on other images."""
    first = confusions[0]
    deltas: list[tuple[PairedInterval, PairedInterval] | None] = [None]
    for other in confusions[1:]:
        paired = first is not None and other is not None and other.num_images == first.num_images
        deltas.append((miou_interval(other, first), matched_miou_interval(other, first, hungarian)) if paired else None)
    return deltas


def results_table(
    results: Sequence[dict[str, Any]], deltas: Sequence[tuple[PairedInterval, PairedInterval] | None] | None = None
) -> str:
    """Markdown table, one row per run: scores, memory size, time split; with ``deltas``
    (:func:`miou_deltas`), columns of Δ mIoU and Δ matched mIoU to the first run with their intervals."""
    delta_head = "Δ mIoU [95 % interval] | " if deltas is not None else ""
    matched_head = "Δ mIoU (Hungarian) [95 %] | " if deltas is not None else ""
    head = (
        f"| model | mIoU | {delta_head}mIoU (Hungarian) | {matched_head}pixel acc. | memory patches | "
        + " | ".join(f"{p} s" for p in _PHASES)
        + " | total s | peak RSS MB | encoder | index (recall@k) |"
    )
    rule = "|" + "---|" * (head.count("|") - 1)
    rows = [head, rule]
    for i, r in enumerate(results):
        t = r.get("timings", {})
        delta = matched = ""
        if deltas is not None:
            delta, matched = (f"{'–' if d is None else d.text()} | " for d in (deltas[i] or (None, None)))
        rows.append(
            f"| {run_label(r)} | {number_cell(r['miou'])} | {delta}{number_cell(r['miou_matched'])} | {matched}"
            f"{number_cell(r['pixel_accuracy'])} | {r['memory_patches']:,} | "
            + " | ".join(number_cell(t.get(p), 1) for p in _PHASES)
            + f" | {number_cell(t.get('total'), 1)} | {number_cell(r.get('peak_rss_mb'), 0)} | "
            f"{_search_cells(r.get('search'))} |"
        )
    return "\n".join(rows)


def search_text(search: dict[str, Any], recall: bool = True) -> str:
    """The index a run used (a result's ``search`` record), with its nprobe and, if approximate
    and ``recall``, its measured recall@k: ``IVF1664,Flat nprobe 64 (0.993)``."""
    text = search["index"] + (f" nprobe {search['nprobe']}" if search.get("nprobe") else "")
    if recall and search.get("recall_at_k") is not None:
        text += f" ({search['recall_at_k']:.3f})"
    return text


def _search_cells(search: dict[str, Any] | None) -> str:
    """``precision | index`` cells of a run (older results without the record show dashes)."""
    if not search:
        return "– | –"
    return f"{search.get('precision') or '–'} | {search_text(search)}"


def _values(results: Sequence[dict[str, Any]], key: str) -> list[str]:
    top = key in ("num_train", "num_val")
    getter = _query_seed if key == "query_seed" else (lambda r: r.get(key) if top else r["config"].get(key))
    return sorted({json.dumps(getter(r)) for r in results})


def _query_seed(result: dict[str, Any]) -> int | None:
    """The seed that picked a run's query images (``config.query_seed``; runs written before it
    was recorded: the seed for the built-in scenes, which it renders), ``None`` when it picked
    none (a whole split)."""
    config = result["config"]
    return config.get("query_seed", config.get("seed") if config.get("dataset") == "scenes" else None)


def incompatibilities(results: Sequence[dict[str, Any]]) -> list[str]:
    """Why runs cannot share one table (different query images or classes); empty if they can."""
    problems = [
        f"{key} {' vs '.join(v)}"
        for key in (*_QUERY_KEYS, "num_val", "query_seed")
        if len(v := _values(results, key)) > 1
    ]
    if len({tuple(r["per_class_iou"]) for r in results}) > 1:
        problems.append("class lists differ")
    return problems


def differing_settings(results: Sequence[dict[str, Any]]) -> list[str]:
    """Protocol settings that differ between runs (comparable, but worth a word)."""
    return [f"{key} {' vs '.join(v)}" for key in (*_SETTING_KEYS, "num_train") if len(v := _values(results, key)) > 1]


def _setting_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    lines = [_line(key, [r["config"].get(key) for r in results]) for key in _SETTING_KEYS]
    return lines + _provenance_lines(results)


def _line(key: str, values: list[Any]) -> str:
    shown = sorted({json.dumps(v) for v in values})
    return f"- {key}: {', '.join(shown)}" + ("  ⚠ differs between runs" if len(shown) > 1 else "")


def _provenance_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """Machine and software of the runs (``results.json`` files older than the provenance
    record show null): timings compare only on one CPU, scores only with the same libraries."""
    prov = [r.get("provenance") or {} for r in results]
    cpu = [p.get("cpu") or {} for p in prov]
    soft = [p.get("software") or {} for p in prov]
    return [
        _line("cpu", [c.get("model") for c in cpu]),
        _line("cpu vector extensions", [c.get("flags") for c in cpu]),
        _line("gpus", [p.get("gpus") for p in prov]),
        *(_line(name, [s.get(name) for s in soft]) for name in ("locatdino_commit", "torch", "timm", "faiss")),
    ]


def summary_markdown(
    results: Sequence[dict[str, Any]],
    title: str = "Hummingbird evaluation",
    deltas: Sequence[tuple[PairedInterval, PairedInterval] | None] | None = None,
) -> str:
    """The markdown report of one or several runs (a comparison when several, with ``deltas``:
    :func:`miou_deltas`)."""

    def common(key: str) -> str:
        values = _values(results, key)
        return json.loads(values[0]) if len(values) == 1 else "mixed ⚠"

    mixed = incompatibilities(results)
    lines = [
        f"# {title}",
        "",
        f"Dataset: {common('dataset')} — {common('num_train')} memory images, {common('num_val')} query "
        "images. mIoU in %, identity class mapping (Hungarian-matched for comparison with published tables).",
        *(["", f"⚠ Not comparable, scored on different query images: {'; '.join(mixed)}."] if mixed else []),
        "",
        *_setting_lines(results),
        "",
        results_table(results, deltas),
        "",
        *([INTERVAL_NOTE, ""] if deltas is not None else []),
        "## Per-class IoU",
        "",
        per_class_table(results),
        "",
    ]
    return "\n".join(lines)


def write_run(result: dict[str, Any], out_dir: str | os.PathLike, confusions: ImageConfusions | None = None) -> Path:
    """``results.json`` + ``summary.md`` of one run in ``out_dir``, and its per-image confusion
    matrices when given (named in the JSON); returns the JSON path."""
    out_dir = Path(out_dir)
    if confusions is not None:
        confusions.save(out_dir / CONFUSION_FILE)
        result["per_image_confusion"] = CONFUSION_FILE
    path = atomic_write_text(out_dir / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / "summary.md", summary_markdown([result]))
    return path


def label_by_folder(results: Sequence[dict[str, Any]]) -> list[str]:
    """A label per loaded run: the name of its run folder, with as many parent folders as it
    takes to tell runs apart (``a/vit``, ``b/vit``)."""
    folders = [Path(r["source"]).resolve().parent.parts for r in results]

    def tail(parts: tuple[str, ...], depth: int) -> str:
        return "/".join(parts[-depth:])

    labels = []
    for i, parts in enumerate(folders):
        others = folders[:i] + folders[i + 1 :]
        depth = next((d for d in range(1, len(parts)) if all(tail(parts, d) != tail(o, d) for o in others)), len(parts))
        labels.append(tail(parts, depth))
    return labels


def load_results(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Runs from ``results.json`` files or directories holding them (searched recursively); each
    gets ``source``, the file it came from."""
    results = []
    for p in map(Path, paths):
        files = sorted(p.rglob("results.json")) if p.is_dir() else [p]
        if not files:
            raise FileNotFoundError(f"{p}: no results.json found")
        for f in files:
            try:
                text = read_bounded(f, MAX_RESULTS_BYTES, "Hummingbird results.json")  # no FIFO, device, huge file
            except OSError as err:
                raise ValueError(f"{f}: not a Hummingbird results.json ({err.strerror or err})") from None
            try:
                data = json.loads(text)
                data["miou"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{f}: not a Hummingbird results.json ({err})") from None
            for key in SCORES:
                value = data.get(key)
                if key == "miou" or value is not None:
                    _check_percentage(f, key, value)
            data["source"] = str(f)
            results.append(data)
    return results


SCORES = ("miou", "miou_matched", "pixel_accuracy")  # percentages a report prints
MAX_RESULTS_BYTES = 64 << 20  # a results.json holds a few kB; past this it is something else
_TOLERANCE = 1e-3  # percent: a stored mIoU against its own per-image matrices (float rounding only)


def _check_percentage(path: Path, key: str, value: Any) -> None:
    """``ValueError`` unless ``value`` is a finite number in [0, 100] (an edited or damaged file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: {key} is {value!r}, not a number")
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise ValueError(f"{path}: {key} {value:.6g} is not a percentage in [0, 100]")


def run_confusions(result: dict[str, Any]) -> ImageConfusions | None:
    """The per-image confusion matrices of a loaded run (None for runs written without them),
    checked against the run's stored ``miou``: a report never rests on a figure its own matrices
    contradict (an edited results.json, or matrices of another run)."""
    name = result.get("per_image_confusion")
    if name is None:
        return None
    path = Path(result["source"]).parent / name
    confusions = ImageConfusions.load(path)
    recomputed = images_miou(confusions)
    if not abs(recomputed - result["miou"]) <= _TOLERANCE:
        raise ValueError(
            f"{result['source']}: miou {result['miou']:.4f} but its per-image matrices ({path.name}) "
            f"give {recomputed:.4f}: an edited results.json, or matrices of another run"
        )
    return confusions
