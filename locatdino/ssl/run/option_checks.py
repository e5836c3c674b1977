"""The values ``locatdino fit`` accepts for the objectives' numeric options, checked on the merged
config before anything is built (called by :func:`locatdino.ssl.run.fit_checks.check_fit_config`).

jsonargparse checks types, not ranges: a temperature of 0 or below, a negative loss weight, a
momentum above 1 or 0 prototypes are well-typed and fail late (a NaN loss at step 0, with advice
that does not apply) or never (iBOT's ``patch_out_dim 0`` used to become ``out_dim``; a
``mask_min_patches`` no block of the token grid can hold masks next to nothing: plain DINO under
iBOT's name). Each option's range is declared once, for the objective class that introduces it (a
subclass inherits its parents': IBOTModule → DINOModule → PretrainingObjective); a value outside it
is one :class:`~locatdino.common.errors.UserError` naming ``model.<option>`` and the value, as the
``model.lr`` check does.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Any

from jsonargparse import Namespace
from torch import nn

from locatdino.common.errors import UserError
from locatdino.models.token_grid import token_grid
from locatdino.ssl.dino.module import DINOModule
from locatdino.ssl.distill.module import DistillModule
from locatdino.ssl.ibot.module import IBOTModule
from locatdino.ssl.objective.base import PretrainingObjective
from locatdino.ssl.supervised.module import SupervisedModule


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (strict where ``*_open``; ``None``: unbounded), said as ``text``."""

    text: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below


POSITIVE = Range("a positive number", low=0, low_open=True)
NON_NEGATIVE = Range("a number >= 0", low=0)
AT_LEAST_ONE = Range("at least 1", low=1)
UNIT = Range("in [0, 1]", low=0, high=1)

# option -> range, per class that introduces the option (``None`` values mean "off" and are not checked)
RANGES: dict[type, dict[str, Range]] = {
    PretrainingObjective: {
        "drop_path_rate": Range("in [0, 1)", low=0, high=1, high_open=True),
        "weight_decay": NON_NEGATIVE,
        "min_lr": NON_NEGATIVE,
        "warmup_epochs": NON_NEGATIVE,
    },
    DINOModule: {
        "out_dim": AT_LEAST_ONE,
        "hidden_dim": AT_LEAST_ONE,
        "bottleneck_dim": AT_LEAST_ONE,
        "head_layers": AT_LEAST_ONE,
        "student_temp": POSITIVE,
        "teacher_temp": POSITIVE,
        "warmup_teacher_temp": POSITIVE,
        "warmup_teacher_temp_epochs": NON_NEGATIVE,
        "center_momentum": UNIT,
        "weight_decay_end": NON_NEGATIVE,
        "momentum_teacher": UNIT,
        "momentum_teacher_end": UNIT,
        "clip_grad": NON_NEGATIVE,
        "freeze_last_layer": NON_NEGATIVE,
    },
    IBOTModule: {
        "mask_probability": UNIT,
        "mask_min_patches": AT_LEAST_ONE,
        "mask_aspect_ratio": Range("in (0, 1]", low=0, high=1, low_open=True),
        "patch_out_dim": AT_LEAST_ONE,
        "teacher_patch_temp": POSITIVE,
        "warmup_teacher_patch_temp": POSITIVE,
        "patch_center_momentum": UNIT,
        "dino_loss_weight": NON_NEGATIVE,
        "ibot_loss_weight": NON_NEGATIVE,
        "koleo_loss_weight": NON_NEGATIVE,
    },
    DistillModule: {
        "teacher_image_size": AT_LEAST_ONE,
        "distill_loss_weight": NON_NEGATIVE,
        "distill_patch_weight": NON_NEGATIVE,
        "dino_loss_weight": NON_NEGATIVE,
    },
    SupervisedModule: {
        "num_classes": AT_LEAST_ONE,
        "warmup_lr": NON_NEGATIVE,
        "mixup_alpha": NON_NEGATIVE,
        "cutmix_alpha": NON_NEGATIVE,
        "mixup_prob": UNIT,
        "mixup_switch_prob": UNIT,
        "label_smoothing": Range("in [0, 1)", low=0, high=1, high_open=True),
        "bce_target_thresh": UNIT,
    },
}


def objective_class(class_path: str | None) -> type | None:
    """The class ``model.class_path`` names (``locatdino.ssl.IBOTModule``); ``None`` when it
    cannot be imported (an objective of an older or newer locatdino)."""
    module, _, name = (class_path or "").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def check_objective_options(model: Namespace, data: Namespace, backbone: nn.Module) -> None:
    """:class:`UserError` for the first option of ``model`` (the ``model`` group: ``class_path``
    and ``init_args``) outside its range, then for iBOT settings that contradict each other or the
    global crops of ``data`` (``data.init_args``) on ``backbone``'s patch grid, and for distillation
    weights that learn nothing."""
    cls = objective_class(model.get("class_path")) or PretrainingObjective
    options = model.get("init_args") or Namespace()
    for owner in cls.__mro__:
        for key, allowed in RANGES.get(owner, {}).items():
            value = options.get(key)
            if value is not None and not allowed.holds(value):
                raise UserError(f"model.{key}: must be {allowed.text}, got {value}")
    if issubclass(cls, IBOTModule):
        _check_ibot(options, data, backbone)
    if issubclass(cls, DistillModule) and options.get("distill_loss_weight") == 0 == options.get("dino_loss_weight"):
        raise UserError(
            "model.distill_loss_weight and model.dino_loss_weight: both 0, nothing would be learned "
            "(give either a positive weight)"
        )


def _check_ibot(options: Namespace, data: Namespace, backbone: nn.Module) -> None:
    """Loss weights and Sinkhorn iterations of an iBOT config, then its masks (:func:`_check_masks`)."""
    if options.get("dino_loss_weight") == 0 and options.get("ibot_loss_weight") == 0:
        raise UserError(
            "model.dino_loss_weight and model.ibot_loss_weight: both 0, nothing would be learned "
            "(give either a positive weight)"
        )
    iterations = options.get("sinkhorn_iterations")
    if options.get("patch_centering") == "sinkhorn_knopp" and iterations is not None and iterations < 1:
        raise UserError(
            f"model.sinkhorn_iterations: must be at least 1 with model.patch_centering sinkhorn_knopp, got {iterations}"
        )
    low, high = options.get("mask_ratio") or inspect.signature(IBOTModule).parameters["mask_ratio"].default
    if not 0 <= low <= high <= 1:
        raise UserError(f"model.mask_ratio: must be [low, high] with 0 <= low <= high <= 1, got {[low, high]}")
    multicrop = data.get("multicrop")
    if multicrop is not None and multicrop.get("global_crop_size") is not None and options.get("mask_probability"):
        _check_masks(options, high, data, multicrop, backbone)


def _check_masks(options: Namespace, high: float, data: Namespace, multicrop: Namespace, backbone: nn.Module) -> None:
    """Masks that would (almost) never be drawn: no crop of a step masked, a masked share (at most
    ``high``, mask_ratio's) below one patch, a smallest block no block of the global crops' token
    grid can hold."""
    probability = options.mask_probability
    crops = multicrop.get("num_global_crops", 2) * data.get("batch_size", 1)
    if int(crops * probability) == 0:
        raise UserError(
            f"model.mask_probability: {probability} of the {crops} global crops of a step (per rank) "
            f"masks none of them; use at least {1 / crops:.3g} or a larger data.init_args.batch_size"
        )
    size = multicrop.global_crop_size
    h, w = token_grid(backbone, (size, size))
    if int(h * w * high) == 0:
        raise UserError(
            f"model.mask_ratio: its high {high} of the {h * w} tokens of a {size} px global crop is less "
            "than one patch: no patch would be masked"
        )
    # a block is smaller than the grid on both sides and covers at most a crop's masked share
    largest = min((h - 1) * (w - 1), int(h * w * high))
    min_patches = options.get("mask_min_patches")
    if min_patches is not None and min_patches > largest:
        raise UserError(
            f"model.mask_min_patches: {min_patches} patches do not fit one block on the {h} x {w} token "
            f"grid of the {size} px global crops (at most {largest}: blocks are smaller than the grid "
            f"and than mask_ratio's high {high} of its {h * w} tokens); use at most {largest}"
        )
