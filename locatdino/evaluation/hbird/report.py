"""What Hummingbird's ``report.md`` says around its table, and the comparison of finished runs.

A model's record in ``results.json`` (:mod:`locatdino.evaluation.results`) is
:meth:`HummingbirdResult.to_dict` (mIoU in percent, per-class IoU, timings in seconds, memory size,
the full config, the model); its per-image confusion matrices go to ``OUT/<label>/`` (named in the
record), so that a comparison of finished runs gives every Δ mIoU its paired-bootstrap interval
(docs/evaluation.md).

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
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from locatdino.common.input_files import read_bounded
from locatdino.evaluation.bootstrap import matched_miou_interval, miou_interval
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.metric import images_miou
from locatdino.evaluation.results import (
    ReportLayout,
    check_document,
    delta_column,
    per_class_notes,
    score_column,
    seconds_column,
    value_column,
)
from locatdino.evaluation.tables import number_cell

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


def miou_differences(
    confusions: ImageConfusions | None, first: ImageConfusions | None, hungarian: str = "iou"
) -> dict[str, Any] | None:
    """Δ mIoU and Δ Hungarian-matched mIoU (criterion ``hungarian``) of a run to the first, each
    with its paired interval (the ``differences`` of its record); None without per-image matrices
    or when the runs scored different images."""
    if confusions is None or first is None or confusions.num_images != first.num_images:
        return None
    return {
        "": {
            "miou": miou_interval(confusions, first).to_dict(),
            "miou_matched": matched_miou_interval(confusions, first, hungarian).to_dict(),
        }
    }


def search_text(search: dict[str, Any], recall: bool = True) -> str:
    """The index a run used (a result's ``search`` record), with its nprobe and, if approximate
    and ``recall``, its measured recall@k: ``IVF1664,Flat nprobe 64 (0.993)``."""
    text = search["index"] + (f" nprobe {search['nprobe']}" if search.get("nprobe") else "")
    if recall and search.get("recall_at_k") is not None:
        text += f" ({search['recall_at_k']:.3f})"
    return text


def _search_cell(record: dict[str, Any]) -> str:
    """``precision, index`` of a run."""
    search = record.get("search")
    return f"{search.get('precision') or '–'}, {search_text(search)}" if search else "–"


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


def _about(document: dict[str, Any]) -> list[str]:
    results = document["models"]

    def common(key: str) -> str:
        values = _values(results, key)
        return json.loads(values[0]) if len(values) == 1 else "mixed ⚠"

    mixed = incompatibilities(results)
    return [
        f"Dataset: {common('dataset')} — {common('num_train')} memory images, {common('num_val')} query "
        "images. mIoU in %, identity class mapping (Hungarian-matched for comparison with published tables); "
        "no interval of a single run's mIoU: the Δ between runs carries the paired one.",
        *(["", f"⚠ Not comparable, scored on different query images: {'; '.join(mixed)}."] if mixed else []),
        "",
        *_setting_lines(results),
    ]


HBIRD_LAYOUT = ReportLayout(
    title="Hummingbird evaluation",
    about=_about,
    columns=(
        score_column("miou", "mIoU", interval=False),
        delta_column("miou", "mIoU"),
        score_column("miou_matched", "mIoU (Hungarian)", interval=False),
        delta_column("miou_matched", "mIoU (Hungarian)"),
        score_column("pixel_accuracy", "pixel acc.", interval=False),
        value_column("memory patches", lambda record: f"{record['memory_patches']:,}"),
        *(seconds_column(phase) for phase in (*_PHASES, "total")),
        value_column("peak RSS MB", lambda record: number_cell(record.get("peak_rss_mb"), 0)),
        value_column("encoder, index (recall@k)", _search_cell),
    ),
    notes=per_class_notes,
)


def label_by_folder(results: Sequence[dict[str, Any]]) -> list[str]:
    """A label per loaded model: its own when that tells the models apart, else prefixed by the
    name of its run folder, with as many parent folders as it takes to tell runs apart (``a/vit``,
    ``b/vit``)."""
    own = [r["model"]["label"] for r in results]
    if len(set(own)) == len(own):
        return own
    sources = sorted({r["source"] for r in results})
    folders = {source: Path(source).resolve().parent.parts for source in sources}

    def tail(parts: tuple[str, ...], depth: int) -> str:
        return "/".join(parts[-depth:])

    prefix = {}
    for source, parts in folders.items():
        others = [o for s, o in folders.items() if s != source]
        depth = next((d for d in range(1, len(parts)) if all(tail(parts, d) != tail(o, d) for o in others)), len(parts))
        prefix[source] = tail(parts, depth)
    models = Counter(r["source"] for r in results)  # a file of one model is named by its folder alone
    return [prefix[r["source"]] + (f"/{label}" if models[r["source"]] > 1 else "") for r, label in zip(results, own)]


def load_results(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Every model's record from ``results.json`` files of ``locatdino hbird``, or directories
    holding them (searched recursively); each gets ``source``, the file it came from."""
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
                document = json.loads(text)
            except ValueError as err:
                raise ValueError(f"{f}: not a Hummingbird results.json ({err})") from None
            check_document(document, f, "hbird")
            for record in document["models"]:
                for key in SCORES:
                    value = record.get(key)
                    if key == "miou" or value is not None:
                        _check_percentage(f, key, value)
                record["source"] = str(f)
                results.append(record)
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
    folder = Path(result["source"]).parent
    path = folder / str(name)
    if Path(str(name)).is_absolute() or ".." in Path(str(name)).parts:  # written under the run's folder only
        raise ValueError(f"{result['source']}: per_image_confusion {name!r} points outside its folder {folder}")
    confusions = ImageConfusions.load(path)
    recomputed = images_miou(confusions)
    if not abs(recomputed - result["miou"]) <= _TOLERANCE:
        raise ValueError(
            f"{result['source']}: miou {result['miou']:.4f} but its per-image matrices ({path.name}) "
            f"give {recomputed:.4f}: an edited results.json, or matrices of another run"
        )
    return confusions
