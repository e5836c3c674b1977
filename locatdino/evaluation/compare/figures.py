"""The figures of ``locatdino compare`` (matplotlib, Agg backend, PNG).

Each is readable without the report: titles name the models, axes carry units, colours of
classes come with a legend. One function per figure, each taking plain measured values (the
``results.json`` model records and the arrays of :class:`~locatdino.evaluation.compare.runner.ModelOutcome`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

_DPI = 80


def class_palette(num_classes: int) -> np.ndarray:
    """``[num_classes + 1, 3]`` RGB in [0, 1]: tab10/tab20 for few classes, a seeded random
    palette for many; the last row (white) is for ignored / unlabelled pixels."""
    if num_classes <= 20:
        colours = plt.get_cmap("tab10" if num_classes <= 10 else "tab20")(np.arange(num_classes))[:, :3]
    else:
        colours = np.random.default_rng(0).uniform(0.1, 0.95, (num_classes, 3))
    return np.vstack([colours, np.ones((1, 3))])


def colour_labels(labels: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """Label map ``[H, W]`` → RGB ``[H, W, 3]``; out-of-range labels (ignore) are white."""
    labels = np.where((labels >= 0) & (labels < len(palette) - 1), labels, len(palette) - 1)
    return palette[labels]


def _save(fig: plt.Figure, path: str | os.PathLike) -> Path:
    """Write atomically (temporary file, then rename): an interrupted run leaves no broken PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=_DPI, bbox_inches="tight", format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def per_class_bars(models: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Grouped bars: IoU per class, one colour per model, mIoU in the legend."""
    classes = list(models[0]["hbird"]["per_class_iou"])
    x = np.arange(len(classes))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(classes) * max(1, len(models) / 2)), 3.6))
    for i, m in enumerate(models):
        values = [m["hbird"]["per_class_iou"].get(c) for c in classes]
        ax.bar(
            x + (i - (len(models) - 1) / 2) * width,
            [np.nan if v is None else v for v in values],
            width,
            label=f"{m['spec']['name']} (mIoU {m['hbird']['miou']:.1f})",
        )
    ax.set_xticks(x, classes, rotation=45 if len(classes) > 8 else 0, ha="right" if len(classes) > 8 else "center")
    ax.set_ylabel("IoU (%)")
    ax.set_title("Hummingbird per-class IoU")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def miou_vs_memory(models: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """mIoU against memory size (patches, log axis), one line per model."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for m in models:
        curve = m["memory_curve"]
        ax.plot([p["memory_patches"] for p in curve], [p["miou"] for p in curve], marker="o", label=m["spec"]["name"])
    ax.set_xscale("log")
    ax.set_xlabel("memory size (patches)")
    ax.set_ylabel("mIoU (%)")
    ax.set_title("Hummingbird mIoU vs memory size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def qualitative_grid(
    images: np.ndarray,
    masks: np.ndarray,
    predictions: dict[str, np.ndarray],
    class_names: Sequence[str],
    path: str | os.PathLike,
) -> Path:
    """Rows: query images; columns: image, ground truth, each model's prediction (Hummingbird's, and
    the linear probe's in a column named ``"<model> (probe)"``)."""
    palette = class_palette(len(class_names))
    cols = 2 + len(predictions)
    fig, axes = plt.subplots(len(images), cols, figsize=(1.8 * cols, 1.8 * len(images) + 0.6), squeeze=False)
    panels = [("image", None), ("ground truth", masks)] + [(name, pred) for name, pred in predictions.items()]
    for r, image in enumerate(images):
        for c, (title, maps) in enumerate(panels):
            ax = axes[r, c]
            ax.imshow(
                image.transpose(1, 2, 0) if maps is None else colour_labels(maps[r], palette), interpolation="nearest"
            )
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=9)
    present = np.unique(np.concatenate([masks.ravel()] + [p.ravel() for p in predictions.values()]))
    handles = [Patch(color=palette[c], label=class_names[c]) for c in present if 0 <= c < len(class_names)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    probe = " and linear probe (probe)" if any(name.endswith(" (probe)") for name in predictions) else ""
    fig.suptitle(f"Hummingbird{probe} predictions on the same query images", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(fig, path)


def pca_grid(images: np.ndarray, pca_maps: dict[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Rows: query images; columns: image, then each model's patch features as PCA → RGB."""
    cols = 1 + len(pca_maps)
    fig, axes = plt.subplots(len(images), cols, figsize=(1.8 * cols, 1.8 * len(images) + 0.4), squeeze=False)
    for r, image in enumerate(images):
        size = image.shape[1:]
        axes[r, 0].imshow(image.transpose(1, 2, 0))
        for c, (name, maps) in enumerate(pca_maps.items(), start=1):
            axes[r, c].imshow(maps[r], extent=(0, size[1], size[0], 0), interpolation="nearest")
            if r == 0:
                axes[r, c].set_title(name, fontsize=9)
        if r == 0:
            axes[r, 0].set_title("image", fontsize=9)
        for ax in axes[r]:
            ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle("Patch features: 3 principal components as RGB (PCA fitted per model on its memory)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def attention_grid(image: np.ndarray, attention: dict[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Rows: models; columns: the image, then the class token's last-block attention per head."""
    heads = max(a.shape[0] for a in attention.values())
    fig, axes = plt.subplots(
        len(attention), 1 + heads, figsize=(1.6 * (1 + heads), 1.7 * len(attention) + 0.4), squeeze=False
    )
    size = image.shape[1:]
    for r, (name, maps) in enumerate(attention.items()):
        axes[r, 0].imshow(image.transpose(1, 2, 0))
        axes[r, 0].set_ylabel(name, fontsize=9)
        for h in range(heads):
            ax = axes[r, 1 + h]
            if h < maps.shape[0]:
                ax.imshow(maps[h], cmap="inferno", extent=(0, size[1], size[0], 0), interpolation="nearest")
                if r == 0:
                    ax.set_title(f"head {h}", fontsize=9)
            else:
                ax.axis("off")
        for ax in axes[r]:
            ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle("Class-token attention of the last block, per head (bright = attended)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def locality_curves(models: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    """Mean GAug σ and α per block of every LocAtViT model; None (no file) when there is none."""
    local = [m for m in models if m.get("locality")]
    if not local:
        return None
    fig, (ax_s, ax_a) = plt.subplots(1, 2, figsize=(8, 3.2))
    for m in local:
        blocks = [s["block"] for s in m["locality"]]
        ax_s.plot(blocks, [s["sigma"] for s in m["locality"]], marker="o", label=m["spec"]["name"])
        ax_a.plot(blocks, [s["alpha"] for s in m["locality"]], marker="o", label=m["spec"]["name"])
    ax_s.set(xlabel="block", ylabel="mean σ (patches)", title="GAug width σ")
    ax_a.set(xlabel="block", ylabel="mean α", title="GAug amplitude α")
    for ax in (ax_s, ax_a):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Learned locality of LocAtViT (larger σ: less local)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
