"""Experiment trackers beside ``fit``'s CSV log: Weights & Biases, MLflow, TensorBoard (docs/pretraining.md).

``--trainer.logger`` takes any Lightning logger, or a list of them. Whatever the trackers, ``fit``
keeps its CSV logger first (:func:`with_csv_logger`): ``logs/version_N/metrics.csv`` and
``config.yaml`` stay where resumes, ``curves.png`` and the studies read them. Lightning hands every
logger the same values — the loss terms, the lr / weight-decay / momentum / temperature
schedules, the teacher entropies the collapse warning reads, ``hbird/mIoU`` of the online
Hummingbird monitor — so a tracker shows what ``metrics.csv`` holds. The one figure ``fit``
draws, ``curves.png``, goes to each tracker through its own image API (:func:`log_image`).
No tracker is imported unless a run names it.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.loggers import (
    CSVLogger,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)

CSV_LOGGER = "lightning.pytorch.loggers.CSVLogger"
# Lightning's tracker loggers: the packages each needs (any one of them) and the extra that installs it
TRACKER_PACKAGES = {
    "MLFlowLogger": (("mlflow",), "mlflow"),
    "WandbLogger": (("wandb",), "wandb"),
    "TensorBoardLogger": (("tensorboard", "tensorboardX"), "tensorboard"),
}


def missing_tracker(text: str) -> str | None:
    """One line naming the extra to install when ``text`` (``fit``'s ``trainer.logger``) names a
    tracker logger whose package is not installed: Lightning's class exists, and building it fails
    with jsonargparse's "not a valid subclass of Logger"."""
    for name, (packages, extra) in TRACKER_PACKAGES.items():
        if re.search(rf"\b{name}\b", text) and not any(importlib.util.find_spec(p) for p in packages):
            return (
                f"trainer.logger: {name} needs the {packages[0]} package, which is not installed: "
                f"pip install 'locatdino[{extra}]'"
            )
    return None


def _is_csv(logger: Any) -> bool:
    if isinstance(logger, CSVLogger):
        return True
    return isinstance(logger, Namespace) and str(logger.get("class_path", "")).split(".")[-1] == "CSVLogger"


def with_csv_logger(logger: Any, save_dir: str) -> Any:
    """``trainer.logger`` as configured, with ``fit``'s CSV logger (``<save_dir>/logs``) in front
    unless it holds one: ``None`` becomes the CSV logger alone; ``False`` (no logging) and
    ``True`` (Lightning's default) stay as they are."""
    if isinstance(logger, bool):
        return logger
    csv = Namespace(class_path=CSV_LOGGER, init_args=Namespace(save_dir=save_dir, name="logs"))
    if logger is None:
        return csv
    loggers = logger if isinstance(logger, list) else [logger]
    return logger if any(_is_csv(one) for one in loggers) else [csv, *loggers]


def log_image(logger: Logger, key: str, png: str | os.PathLike, step: int) -> bool:
    """Send the PNG ``png`` to ``logger`` under ``key`` at ``step`` through its image API;
    ``False`` for a logger without one (CSV: the file itself is the record)."""
    if isinstance(logger, WandbLogger):
        logger.log_image(key=key, images=[os.fspath(png)], step=step)
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_artifact(logger.run_id, os.fspath(png))
    elif isinstance(logger, TensorBoardLogger):
        import numpy as np
        from PIL import Image

        with Image.open(png) as image:
            pixels = np.asarray(image.convert("RGB"))
        logger.experiment.add_image(key, pixels, global_step=step, dataformats="HWC")
        logger.experiment.flush()
    else:
        return False
    return True
