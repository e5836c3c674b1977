"""What ``locatdino compare``'s ``report.md`` says around its table (:mod:`locatdino.evaluation.results`
writes it from ``results.json``).

Scores in percent. Δ columns are differences to the first model that ran (the reference of the
comparison: put the vanilla model first); Δ mIoU and Δ top-1 carry their 95 % paired-bootstrap
intervals and each top-1 its binomial (Wilson) interval (``intervals.py``). Timings and memory
come from the run that wrote it.
"""

from __future__ import annotations

import json
from typing import Any

from locatdino.evaluation.bootstrap import RESAMPLES, SEED, PairedInterval
from locatdino.evaluation.compare.intervals import difference_text
from locatdino.evaluation.hbird.report import search_text
from locatdino.evaluation.results import Column, ReportLayout, results_table
from locatdino.evaluation.tables import number_cell

_METRICS = {
    "miou": "Hummingbird mIoU",
    "miou_matched": "Hummingbird mIoU (Hungarian-matched)",
    "knn_top1": "class-token k-NN top-1",
    "logistic_top1": "class-token logistic top-1",
}


def _delta(value: float | None, ref: float | None) -> str:
    return "–" if value is None or ref is None else f"{value - ref:+.2f}"


def _model_cell(m: dict[str, Any]) -> str:
    return f"{m['spec']['name']}"


def _weights_cell(m: dict[str, Any]) -> str:
    """What the row's features come from — a checkpoint, random init, or no network (a baseline) —
    and by which rule its position embeddings are resampled at the evaluation grid."""
    if m.get("baseline"):
        return "none (no network)"
    rule = f" (pos-embed {m['pos_embed']})" if m.get("pos_embed") else ""  # reports before the rule was recorded
    return (m["spec"]["checkpoint"] or "random init") + rule


def _cell(m: dict[str, Any], part: str, text: str) -> str:
    """``text``, or ``n/a`` where ``part`` does not apply to the row (a baseline has no network)."""
    return "n/a" if part in (m.get("not_applicable") or {}) else text


def _difference(m: dict[str, Any], metric: str) -> PairedInterval | None:
    record = (m.get("differences") or {}).get("", {}).get(metric)
    return None if record is None else PairedInterval.from_dict(record)


def _top1(probes: dict[str, Any], name: str) -> str:
    """``28.0 [16.5, 42.4]``: top-1 and its Wilson interval (older reports: top-1 alone)."""
    value, interval = probes.get(f"{name}_top1"), probes.get(f"{name}_top1_interval")
    return number_cell(value, 1) + ("" if interval is None else f" [{interval[0]:.1f}, {interval[1]:.1f}]")


def _delta_cell(m: dict[str, Any], metric: str, value: float | None, ref: float | None) -> str:
    """Δ to the first model with its paired interval where one was computed, else the bare Δ."""
    interval = _difference(m, metric)
    return interval.text() if interval is not None else _delta(value, ref)


def _parameters(m: dict[str, Any]) -> str:
    return _cell(m, "parameters", "" if m["parameters"] is None else f"{m['parameters']:,}")


def _forward(key: str, digits: int) -> Any:
    return lambda m, _, first: _cell(m, "forward", number_cell((m.get("forward") or {}).get(key), digits))


def _score(part: str, key: str) -> Any:
    return lambda m, _, first: number_cell((m.get(part) or {}).get(key))


def _delta_column(metric: str, part: str) -> Any:
    """Δ to the first model with its paired interval where one was computed, else the bare Δ."""

    def cell(m: dict[str, Any], _: str, first: dict[str, Any]) -> str:
        return _delta_cell(m, metric, (m.get(part) or {}).get("miou"), (first.get(part) or {}).get("miou"))

    return cell


def _probe(name: str) -> Any:
    return lambda m, _, first: _cell(m, "probes", _top1(m.get("probes") or {}, name))


COLUMNS = (
    Column("backbone", lambda m, _, first: m["spec"]["model"]),
    Column("weights", lambda m, _, first: _weights_cell(m)),
    Column("mIoU", _score("hbird", "miou")),
    Column("Δ mIoU [95 % interval]", _delta_column("miou", "hbird")),
    Column("mIoU (Hungarian)", _score("hbird", "miou_matched")),
    Column("linear probe mIoU", _score("linprobe", "miou")),
    Column("Δ linear probe [95 %]", _delta_column("linprobe", "linprobe")),
    Column("k-NN top-1 [95 %]", _probe("knn")),
    Column("logistic top-1 [95 %]", _probe("logistic")),
    Column("parameters", lambda m, _, first: _parameters(m)),
    Column("images/s", _forward("images_per_s", 1)),
    Column("peak forward MB", _forward("peak_forward_mb", 0)),
)


def headline_table(models: list[dict[str, Any]]) -> str:
    """One row per model: Hummingbird mIoU (Δ to the first, with its interval), Hungarian mIoU,
    linear-probe mIoU (Δ, with its interval), class-token probes (with their intervals), size and speed."""
    return results_table({"models": models}, COMPARE_LAYOUT)


def difference_lines(models: list[dict[str, Any]]) -> list[str]:
    """One sentence per model after the first and metric: the measured difference to the first
    model, "no measurable difference" when its interval holds 0."""
    ref = _model_cell(models[0])
    return [
        f"- {label}: {difference_text(_model_cell(m), ref, interval)}"
        for m in models[1:]
        for metric, label in _METRICS.items()
        if (interval := _difference(m, metric)) is not None
    ]


def memory_table(models: list[dict[str, Any]]) -> str:
    """mIoU per memory fraction (columns) and model (rows)."""
    fractions = [p["fraction"] for p in models[0]["memory_curve"]]
    rows = ["| model | " + " | ".join(f"memory {f}" for f in fractions) + " |", "|" + "---|" * (len(fractions) + 1)]
    for m in models:
        by_fraction = {p["fraction"]: p for p in m["memory_curve"]}
        cells = [
            f"{number_cell(by_fraction[f]['miou'])} ({by_fraction[f]['memory_patches']:,})" if f in by_fraction else "–"
            for f in fractions
        ]
        rows.append(f"| {_model_cell(m)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def per_class_table(models: list[dict[str, Any]]) -> str:
    """Per-class IoU of every model, with Δ to the first model for the others."""
    ref = models[0]
    head = [_model_cell(ref)] + [c for m in models[1:] for c in (_model_cell(m), "Δ")]
    rows = ["| class | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 1)]
    for name, ref_iou in ref["hbird"]["per_class_iou"].items():
        cells = [number_cell(ref_iou)]
        for m in models[1:]:
            iou = m["hbird"]["per_class_iou"].get(name)
            cells += [number_cell(iou), _delta(iou, ref_iou)]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def locality_table(models: list[dict[str, Any]]) -> str | None:
    """Mean GAug σ (patches) and α per block of every LocAtViT model; None when there is none."""
    local = [m for m in models if m.get("locality")]
    if not local:
        return None
    depth = max(len(m["locality"]) for m in local)
    rows = [
        "| block | " + " | ".join(f"{_model_cell(m)} σ | {_model_cell(m)} α" for m in local) + " |",
        "|" + "---|" * (2 * len(local) + 1),
    ]
    for b in range(depth):
        cells = []
        for m in local:
            s = m["locality"][b] if b < len(m["locality"]) else None
            cells += [number_cell(s and s["sigma"]), number_cell(s and s["alpha"], 3)]
        rows.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _arithmetic(cfg: dict[str, Any], models: list[dict[str, Any]]) -> str:
    """Index and encoder precision as run: ``auto`` settings resolved (same machine for every model)."""
    search = next((m["hbird"]["search"] for m in models if (m.get("hbird") or {}).get("search")), None)
    if not search:
        return f"index {cfg['index']}, {cfg['precision']}"
    return f"index {search_text(search, recall=False)} ({cfg['index']}), {search['precision']} ({cfg['precision']})"


def _about(report: dict[str, Any]) -> list[str]:
    """The dataset and settings, and each model that failed with its one-line error."""
    models, data, cfg = report["models"], report["dataset"], report["config"]
    if any(m.get("hbird") for m in models) or not models:
        setting = (
            f"{data['num_train']} memory images × {cfg['aug_epochs']} views, {data['num_val']} query images, "
            f"{cfg['input_size']} px, k = {cfg['k']}, {_arithmetic(cfg, models)}, seed "
            f"{cfg['seed']}. mIoU in % with identity class mapping (Hungarian-matched for comparison with "
            "published tables); Δ = model − first model."
        )
    else:
        setting = (
            f"no segmentation masks, class-token probes only: {data['num_train']} train / {data['num_val']} "
            f"test images at {cfg['input_size']} px, {cfg['precision']}."
        )
    lines = [f"Dataset: {data['name']} — {setting}"]
    failed = [f"**{name} failed**: {error}" for name, error in report.get("failed", {}).items()]
    lines += ["", *failed] if failed else []
    return lines + ([] if models else ["", "No model finished."])


def _notes(report: dict[str, Any]) -> list[str]:
    """Everything after the table: baselines, differences in words, the probes' protocols, mIoU per
    memory size, per-class IoU, learned locality, figures and the config."""
    models, cfg = report["models"], report["config"]
    if not models:
        return []
    lines: list[str] = []
    probes = report.get("probes") or {}
    baselines = [m for m in models if m.get("baseline")]
    if baselines:
        lines += (
            [
                "Rows without a network, the floors the models are read against (n/a: needs a network; "
                "docs/evaluation.md):",
                "",
            ]
            + [f"- {_model_cell(m)}: {m['baseline']}." for m in baselines]
            + [""]
        )
    differences = difference_lines(models)
    if differences:
        lines += [
            f"## Differences to {_model_cell(models[0])}",
            "",
            f"95 % paired-bootstrap intervals ({RESAMPLES:,} resamples of the query images — of the test "
            f"images for the probes —, the same draws for both models, seed {SEED}); a difference is "
            "named only when its interval excludes 0.",
            "",
            *differences,
            "",
        ]
    if cfg.get("linprobe"):
        lp = cfg["linprobe"]
        lines += [
            f"Linear probe: the paper's head (1×1 conv → 512, GroupNorm(1, 512), GELU, 1×1 conv) trained on "
            f"the frozen patch tokens of the memory images for {lp['iterations']} iterations × batch "
            f"{lp['batch_size']} (AdamW, OneCycle), augmentation {lp['augment']}, scored on the query images; "
            "Δ = model − first model. `locatdino linprobe` runs the paper's full protocol.",
            "",
        ]
    if probes.get("note"):
        majority = next((m["probes"]["majority_top1"] for m in models if m.get("probes")), None)
        baseline = (
            f"; always predicting the most frequent train label scores {majority:.1f} %" if majority is not None else ""
        )
        lines += [
            f"Class-token probes (DINO's weighted k-NN, k = 20 capped at the train images, votes "
            f"exp(sim / 0.07), as `locatdino knn`; logistic regression), top-1 in % with its 95 % Wilson "
            f"interval: {probes['note']}{baseline}.",
            "",
        ]
    dense = [m for m in models if m.get("hbird")]
    if dense:
        lines += [
            "## mIoU vs memory size",
            "",
            "Fraction of the full memory (patches in brackets).",
            "",
            memory_table(dense),
            "",
        ]
        lines += ["## Per-class IoU", "", per_class_table(dense), ""]
    local = locality_table(models)
    if local:
        lines += [
            "## Learned locality (LocAtViT)",
            "",
            "Mean GAug σ (in patches, at the evaluation grid) and α over all heads and patch "
            "queries of the figure images, per block.",
            "",
            local,
            "",
        ]
    if report.get("figures"):
        lines += ["## Figures", ""] + [f"![{name}]({path})" for name, path in report["figures"].items()] + [""]
    lines += ["## Config", "", "```json", json.dumps(report["config"], indent=2, default=str), "```", ""]
    return lines


COMPARE_LAYOUT = ReportLayout(title="Model comparison", about=_about, columns=COLUMNS, notes=_notes)
