"""Gram anchoring: the Gram teacher, when it is loaded and refreshed, and its loss term (DINOv3,
Siméoni et al. 2025, §4; facebookresearch/dinov3 ``dinov3/train/ssl_meta_arch.py`` and
``train.py``; docs/pretraining.md, "Gram anchoring").

The option block ``model.gram`` of the DINO and iBOT objectives (:class:`GramOptions`, DINOv3's
``gram.*`` keys) switches it on. The Gram teacher is a frozen copy of the backbone: loaded from a
file (``ckpt``) and/or copied from the EMA teacher before step ``it_load_ema_teacher``, re-copied
after every ``update_frequency``-th step from ``it_first_update`` on (``rep_update``, at most
``max_updates`` times), or the EMA teacher itself (``ema_teacher``). It never trains, runs in
eval mode and is saved in the run's checkpoints with whether it was loaded and how often refreshed, so
a resumed run continues with the same Gram teacher.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from locatdino.models.checkpoints.mismatch import checkpoint_mismatch
from locatdino.models.token_grid import token_grid
from locatdino.ssl.objective.final_tokens import FinalTokens
from locatdino.ssl.objective.gram_loss import TOKENS_USED, GramLoss
from locatdino.ssl.objective.schedules import warmup_cosine_hold_schedule
from locatdino.ssl.objective.teacher_update import update_teacher

_NUMBER = (int, float)
_RESIZE_MODES = ("bicubic", "bilinear", "nearest", "area")
_SCHEDULE_KEYS = {"start", "peak", "end", "warmup_epochs"}  # and, optionally, cosine_epochs


@dataclass(frozen=True)
class GramOptions:
    """``model.gram``: DINOv3's ``gram.*`` settings (its defaults, but ``img_level`` that of its Gram
    anchoring recipe ``dinov3_vit7b16_gram_anchor.yaml``), steps counted in optimizer steps.

    Attributes:
        loss_weight: weight of the Gram term in the total loss.
        loss_weight_schedule: ``{start, peak, end, warmup_epochs[, cosine_epochs]}``: a linear
            warm-up, a cosine and a constant end instead of ``loss_weight`` (DINOv3's recipe:
            0 → 2 after 1000 epochs of 1000 steps); epochs of this run's steps.
        ema_teacher: the EMA teacher is the Gram teacher (no copy; exclusive with ``ckpt``,
            ``rep_update`` and ``teacher_upsample``).
        ckpt: file to load the Gram teacher from (any backbone file ``create_backbone`` reads, a
            ``fit`` or DINO checkpoint's teacher): the run's architecture.
        it_load_ema_teacher: before this step the EMA teacher is copied into the Gram teacher
            (-1: never); without ``ckpt`` the Gram term starts there.
        rep_update: re-copy the EMA teacher after every ``update_frequency``-th step from
            ``it_first_update`` on.
        update_frequency: steps between refreshes.
        it_first_update: no refresh before this step.
        max_updates: at most this many refreshes (``None``: no limit).
        normalized, img_level, remove_neg, remove_only_teacher_neg, tokens_used: :class:`GramLoss`'s
            ``apply_norm``, ``img_level``, ``remove_neg``, ``remove_only_teacher_neg``, ``tokens_used``.
        teacher_upsample: the Gram teacher sees the global crops upsampled this many times
            (bicubic; DINOv3's high-resolution Gram teacher: 256 px crops at 512 px, 2) and its
            patch features are resampled back to the student's grid.
        global_teacher_resize_method: ``F.interpolate`` mode of that resampling.
        global_teacher_resize_antialias: antialiasing of that resampling.
    """

    loss_weight: float = 1.0
    loss_weight_schedule: Mapping[str, float] | None = None
    ema_teacher: bool = False
    ckpt: str | None = None
    it_load_ema_teacher: int = -1
    rep_update: bool = True
    update_frequency: int = 50000
    it_first_update: int = 0
    max_updates: int | None = None
    normalized: bool = True
    img_level: bool = True
    remove_neg: bool = False
    remove_only_teacher_neg: bool = False
    tokens_used: str = "all"
    teacher_upsample: int = 1
    global_teacher_resize_method: str = "bicubic"
    global_teacher_resize_antialias: bool = False

    @classmethod
    def parse(cls, given: Mapping[str, Any]) -> GramOptions:
        """The options of the ``model.gram`` mapping; ``ValueError`` in one line naming
        ``model.gram.<key>`` for an unknown key, a value of the wrong type or out of range, and
        for settings that contradict each other."""
        if not isinstance(given, Mapping):
            raise ValueError(f"model.gram: must be a mapping of Gram options, got {given!r}")
        known = {f.name for f in fields(cls)}
        for key, value in given.items():
            if key not in known:
                raise ValueError(f"model.gram.{key}: not a Gram option (options: {', '.join(sorted(known))})")
            _check_type(key, value, _TYPES[key])
        options = cls(**given)
        options._check()
        return options

    def _check(self) -> None:
        def bad(key: str, text: str) -> ValueError:
            return ValueError(f"model.gram.{key}: {text}, got {getattr(self, key)!r}")

        if not math.isfinite(self.loss_weight) or self.loss_weight < 0:
            raise bad("loss_weight", "must be a number >= 0")
        for key in ("update_frequency", "teacher_upsample"):
            if getattr(self, key) < 1:
                raise bad(key, "must be at least 1")
        if self.it_first_update < 0:
            raise bad("it_first_update", "must be >= 0")
        if self.max_updates is not None and self.max_updates < 0:
            raise bad("max_updates", "must be >= 0 (or null: no limit)")
        if self.tokens_used not in TOKENS_USED:
            raise bad("tokens_used", f"must be one of {', '.join(TOKENS_USED)}")
        if self.global_teacher_resize_method not in _RESIZE_MODES:
            raise bad("global_teacher_resize_method", f"must be one of {', '.join(_RESIZE_MODES)}")
        if self.loss_weight_schedule is not None:
            _check_schedule(self.loss_weight_schedule)
        if self.ema_teacher:
            for key, off in (("ckpt", None), ("rep_update", False), ("teacher_upsample", 1)):
                if getattr(self, key) != off:
                    raise bad(key, f"the EMA teacher is the Gram teacher (ema_teacher true): set {key} {off}")
        elif self.ckpt is None and self.it_load_ema_teacher < 0:
            raise ValueError(
                "model.gram: nothing loads the Gram teacher: give model.gram.ckpt (a file), "
                "model.gram.it_load_ema_teacher (a step) or model.gram.ema_teacher true"
            )
        try:  # the loss's own rules (remove_neg / remove_only_teacher_neg, tokens_used / img_level)
            self.loss()
        except ValueError as err:
            raise ValueError(f"model.gram: {str(err).removeprefix('GramLoss: ')}") from None

    def loss(self) -> GramLoss:
        return GramLoss(
            self.normalized, self.img_level, self.remove_neg, self.remove_only_teacher_neg, self.tokens_used
        )


_TYPES: dict[str, tuple[type, ...]] = {
    **{f.name: (bool,) for f in fields(GramOptions) if isinstance(f.default, bool)},
    **{k: (int,) for k in ("it_load_ema_teacher", "update_frequency", "it_first_update", "teacher_upsample")},
    "loss_weight": _NUMBER,
    "loss_weight_schedule": (Mapping, type(None)),
    "ckpt": (str, type(None)),
    "max_updates": (int, type(None)),
    "tokens_used": (str,),
    "global_teacher_resize_method": (str,),
}


def _check_type(key: str, value: Any, types: tuple[type, ...]) -> None:
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ValueError(f"model.gram.{key}: must be {names}, got {value!r}")


def _check_schedule(schedule: Mapping[str, Any]) -> None:
    keys = set(schedule)
    if not _SCHEDULE_KEYS <= keys <= _SCHEDULE_KEYS | {"cosine_epochs"}:
        raise ValueError(
            f"model.gram.loss_weight_schedule: needs start, peak, end, warmup_epochs (and optionally "
            f"cosine_epochs), got {sorted(keys)}"
        )
    for key, value in schedule.items():
        if isinstance(value, bool) or not isinstance(value, _NUMBER) or not math.isfinite(value) or value < 0:
            raise ValueError(f"model.gram.loss_weight_schedule.{key}: must be a number >= 0, got {value!r}")


class GramAnchor(nn.Module):
    """The Gram teacher of a run and the Gram term of its loss (see the module docstring).

    Args:
        options: the run's ``model.gram``.
        build: builds a backbone of the run's architecture, without weights (``None``) or from a file.
        reference: the run's EMA teacher backbone: the architecture a ``ckpt`` must have.
    """

    def __init__(self, options: GramOptions, build: Callable[[str | None], nn.Module], reference: nn.Module) -> None:
        super().__init__()
        self.options = options
        self.loss = options.loss()
        self.teacher: nn.ModuleDict | None = None
        self._tokens: FinalTokens | None = None
        if not options.ema_teacher:
            self.teacher = nn.ModuleDict({"backbone": build(None)})
            if options.ckpt is not None:
                self.teacher["backbone"].load_state_dict(_gram_teacher_state(options.ckpt, build, reference))
            self.teacher.requires_grad_(False)
            self._tokens = FinalTokens(self.teacher["backbone"])
        # saved with the run: whether the Gram teacher holds weights, whether it_load_ema_teacher's
        # copy was made, how many refreshes were
        self.register_buffer("initialized", torch.tensor(options.ema_teacher or options.ckpt is not None))
        self.register_buffer("loaded_ema", torch.tensor(False))
        self.register_buffer("updates", torch.tensor(0))
        self._weights: np.ndarray | None = None

    # ------------------------------------------------------------------ schedule

    def build_schedule(self, total_steps: int, steps_per_epoch: int) -> None:
        """The per-step loss weights of a run of ``total_steps``; ``ValueError`` in one line when
        the weight schedule or the step the Gram teacher is loaded at lies outside the run."""
        o = self.options
        if not o.ema_teacher and o.ckpt is None and o.it_load_ema_teacher >= total_steps:
            raise ValueError(
                f"model.gram.it_load_ema_teacher: step {o.it_load_ema_teacher} is past the run's last step "
                f"{total_steps - 1}: the Gram teacher would never be loaded"
            )
        if o.loss_weight_schedule is None:
            self._weights = np.full(total_steps, o.loss_weight)
            return
        s = o.loss_weight_schedule
        warmup = int(round(s["warmup_epochs"] * steps_per_epoch))
        cosine = None if "cosine_epochs" not in s else int(round(s["cosine_epochs"] * steps_per_epoch))
        try:
            self._weights = warmup_cosine_hold_schedule(s["start"], s["peak"], s["end"], total_steps, warmup, cosine)
        except ValueError as err:
            raise ValueError(
                f"model.gram.loss_weight_schedule: {err} ({steps_per_epoch} steps per epoch): shorten it "
                "or lengthen the run"
            ) from None

    def weight(self, step: int) -> float:
        """The Gram term's weight at optimizer step ``step``."""
        return float(self._weights[min(max(step, 0), len(self._weights) - 1)])

    # ------------------------------------------------------------------ Gram teacher

    @property
    def active(self) -> bool:
        """Whether the Gram teacher holds weights (the Gram term is off until it does)."""
        return bool(self.initialized)

    @torch.no_grad()
    def copy_from(self, ema_backbone: nn.Module) -> None:
        """Gram teacher ← EMA teacher (parameters and floating buffers)."""
        gram = self.teacher["backbone"]
        update_teacher(ema_backbone.parameters(), gram.parameters(), 0.0)
        for mine, theirs in zip(gram.buffers(), ema_backbone.buffers()):
            if mine.is_floating_point():
                mine.copy_(theirs)
        self.initialized.fill_(True)

    def before_step(self, step: int, ema_backbone: nn.Module) -> None:
        """Copy the EMA teacher in before step ``it_load_ema_teacher`` (once)."""
        o = self.options
        if self.teacher is not None and 0 <= o.it_load_ema_teacher <= step and not bool(self.loaded_ema):
            self.copy_from(ema_backbone)
            self.loaded_ema.fill_(True)

    def after_step(self, step: int, ema_backbone: nn.Module) -> None:
        """After optimizer step ``step`` (and the EMA), DINOv3's refresh rule: ``rep_update``, step
        ``step + 1`` from ``it_first_update`` on and a multiple of ``update_frequency``, fewer than
        ``max_updates`` refreshes so far."""
        o = self.options
        due = o.rep_update and step + 1 >= o.it_first_update and (step + 1) % o.update_frequency == 0
        if self.teacher is not None and due and (o.max_updates is None or int(self.updates) < o.max_updates):
            self.copy_from(ema_backbone)
            self.updates += 1

    def teacher_patches(self, images: Tensor, grid: tuple[int, int]) -> Tensor:
        """The Gram teacher's patch features ``[B, h·w, D]`` of ``images`` ``[B, 3, H, W]``, on the
        student's token ``grid`` ``(h, w)``: at ``teacher_upsample`` × the resolution, resampled back."""
        o = self.options
        if o.teacher_upsample != 1:
            images = F.interpolate(images, scale_factor=o.teacher_upsample, mode="bicubic", align_corners=False)
        # eval mode for its forwards only: Lightning's train() would flip it back, and a module left in
        # eval mode at the start of fit draws its warning about modules in eval mode
        self.teacher.eval()
        with torch.no_grad():
            _, patches = self._tokens(self.teacher["backbone"], images)
            own = token_grid(self.teacher["backbone"], tuple(images.shape[-2:]))
            if own != grid:
                maps = patches.transpose(1, 2).unflatten(-1, own)  # [B, D, h', w']
                maps = F.interpolate(
                    maps,
                    size=grid,
                    mode=o.global_teacher_resize_method,
                    antialias=o.global_teacher_resize_antialias,
                    **({} if o.global_teacher_resize_method in ("nearest", "area") else {"align_corners": False}),
                )
                patches = maps.flatten(2).transpose(1, 2)
        return patches

    def forward(
        self, images: Tensor, student_patches: Tensor, ema_patches: Tensor | None = None, masks: Tensor | None = None
    ) -> Tensor:
        """The Gram loss of the student's patch features ``[B, N, D]`` of the global crops ``images``
        ``[B, 3, H, W]`` against the Gram teacher's (``ema_patches``, the EMA teacher's of the same
        crops, with ``ema_teacher``); ``masks`` ``[B, N]``: iBOT's, for ``tokens_used``."""
        if self.teacher is None:
            target = ema_patches
        else:
            target = self.teacher_patches(images, token_grid(self.teacher["backbone"], tuple(images.shape[-2:])))
        return self.loss(student_patches, target.detach(), masks=masks)


def _gram_teacher_state(path: str, build: Callable[[str | None], nn.Module], reference: nn.Module) -> dict[str, Tensor]:
    """The state dict of the Gram teacher in ``path``; ``ValueError`` in one line naming the file
    when it is not the run's architecture (``reference``'s: refreshing it from the EMA teacher
    pairs their tensors)."""
    try:
        state = build(path).state_dict()
    except ValueError as err:
        raise ValueError(f"model.gram.ckpt {path}: {err}") from None
    mismatch = checkpoint_mismatch(state, reference.state_dict())
    if mismatch:
        raise ValueError(f"model.gram.ckpt {path}: not the run's backbone ({mismatch})")
    return state
