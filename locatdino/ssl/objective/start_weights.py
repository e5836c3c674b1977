"""What a new DINO / iBOT run takes from ``model.backbone_checkpoint`` (docs/checkpoints.md).

Continuing pretraining from a release starts from whatever the file holds, and initialises the rest
as a new run does:

- a full DINO training checkpoint (facebookresearch/dino's ``checkpoint.pth``: ``student`` and
  ``teacher``, each ``backbone.*`` and ``head.*``, the student's under DDP's ``module.``; the loss
  centre in ``dino_loss.center``): the student's backbone and head to the student, the teacher's to
  the teacher, the centre to the DINO loss;
- a ``fit`` checkpoint of this project (``student.*``, ``teacher.*``, ``dino_loss.center``): the
  same, for a new run (new schedules, step 0; ``--ckpt_path`` resumes the same run instead);
- any backbone file ``locatdino.models.create_backbone`` reads (a released DINO, DINOv2 or DINOv3
  backbone, a LocAtViT made from one by ``locatify``, an export): the backbone, for the student
  and the teacher alike; heads and centres freshly initialised.

A file without GAug parameters starts a LocAt backbone (``locatvit_*_dinov3`` from a DINOv3 release):
every vanilla weight is taken, GAug keeps its initialisation, as ``locatify`` of the release would.

Every backbone goes through ``create_backbone`` (the one loader: its formats, its conversions and
position-embedding resampling, its one-line refusals). A head in the file loads only into a head of
the same shape, refused in one line otherwise (the run's ``out_dim``, ``hidden_dim``, … differ).
``fit`` prints one line saying what came from the file and what was initialised.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from locatdino.models import create_backbone, extract_backbone, load_checkpoint
from locatdino.models.checkpoints.contents import GAUG
from locatdino.models.checkpoints.mismatch import checkpoint_mismatch

BRANCHES = ("student", "teacher")
# weight norm as torch.nn.utils.weight_norm saved it (the reference DINO code) -> the parametrization
_WEIGHT_NORM = {".weight_g": ".parametrizations.weight.original0", ".weight_v": ".parametrizations.weight.original1"}


@dataclass
class StartWeights:
    """What :func:`load_start_weights` took from ``path`` (a description of the file, module
    names such as ``"backbone"``, ``"head"`` and the loss attributes whose centre it set)."""

    path: str
    kind: str
    modules: list[str] = field(default_factory=list)
    centres: list[str] = field(default_factory=list)
    fresh_gaug: int = 0  # GAug tensors of the backbone the file has not (initialised)


def load_start_weights(module: nn.Module, path: str | os.PathLike) -> StartWeights:
    """Load into ``module`` (a :class:`~locatdino.ssl.DINOModule` whose backbones were built from
    ``path``'s evaluated network) what else ``path`` holds: each branch's own backbone, both heads
    (and any other branch module of the same name) and the DINO loss centre. ``ValueError`` in one
    line naming the file when a part does not fit."""
    source = os.fspath(path)
    ckpt = load_checkpoint(source)
    branches = _branches(ckpt)
    fresh = _fresh_gaug(module.student["backbone"], extract_backbone(ckpt, "teacher", source))
    if branches is None:
        return StartWeights(source, "a backbone", ["backbone"], fresh_gaug=fresh)
    h = module.hparams
    for branch in BRANCHES:  # through the loader: its conversions and position-embedding resampling
        backbone = create_backbone(
            h.backbone, source, which=branch, pos_embed="timm", fresh_gaug=True, **dict(h.backbone_kwargs or {})
        )
        getattr(module, branch)["backbone"].load_state_dict(backbone.state_dict())
    kind = "a fit checkpoint" if "pytorch-lightning_version" in ckpt else "a DINO training checkpoint"
    taken = StartWeights(source, kind, ["backbone"], fresh_gaug=fresh)
    for name in module.student:
        parts = {branch: _part(branches[branch], f"{name}.") for branch in BRANCHES}
        if name == "backbone" or not all(parts.values()):
            continue
        for branch, state in parts.items():
            target = getattr(module, branch)[name]
            mismatch = checkpoint_mismatch(state, target.state_dict())
            if mismatch:
                raise ValueError(
                    f"{source}: the {branch}'s {name} does not fit the run's ({mismatch}): give the "
                    "model the file's head settings (out_dim, hidden_dim, bottleneck_dim, head_layers), "
                    f"or start from its teacher's backbone alone (locatdino export {source} teacher.pth, "
                    "then --model.backbone_checkpoint teacher.pth)"
                )
            target.load_state_dict(state)
        taken.modules.append(name)
    center = branches["center"]
    if center is not None:
        if center.numel() != module.dino_loss.center.numel():
            raise ValueError(
                f"{source}: its DINO loss centre has {center.numel()} prototypes, the run's head "
                f"{module.dino_loss.center.numel()} (model.out_dim)"
            )
        module.dino_loss.center.copy_(center.reshape(module.dino_loss.center.shape))
        taken.centres.append("dino_loss")
    return taken


def _fresh_gaug(backbone: nn.Module, weights: Mapping[str, torch.Tensor]) -> int:
    """How many GAug tensors ``backbone`` has when ``weights`` (the file's backbone) have none."""
    if any(GAUG in k for k in weights):
        return 0
    return sum(GAUG in k for k in backbone.state_dict())


def _branches(ckpt: object) -> dict[str, dict[str, torch.Tensor] | torch.Tensor | None] | None:
    """``{"student": {key: tensor}, "teacher": {...}, "center": tensor or None}`` of a file that
    holds both networks, None for a single backbone."""
    if not isinstance(ckpt, Mapping):
        return None
    if "pytorch-lightning_version" in ckpt:
        state = ckpt.get("state_dict") or {}
        if not any(k.startswith("student.") for k in state):
            return None  # a supervised run: its classifier's backbone alone
        return {**{branch: _part(state, f"{branch}.") for branch in BRANCHES}, "center": state.get("dino_loss.center")}
    if "student" in ckpt and "teacher" in ckpt:
        loss = ckpt.get("dino_loss")
        center = loss.get("center") if isinstance(loss, Mapping) else None
        return {**{branch: _without_ddp(ckpt[branch]) for branch in BRANCHES}, "center": center}
    return None


def _part(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix``, without it, weight norm under its current names."""
    out = {}
    for key, value in state.items():
        if key.startswith(prefix):
            key = key[len(prefix) :]
            for old, new in _WEIGHT_NORM.items():
                key = key[: -len(old)] + new if key.endswith(old) else key
            out[key] = value
    return out


def _without_ddp(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DistributedDataParallel's ``module.`` dropped when every key carries it (DINO's student)."""
    return (
        {k.removeprefix("module."): v for k, v in state.items()}
        if all(k.startswith("module.") for k in state)
        else dict(state)
    )


def start_line(module: nn.Module, taken: StartWeights) -> str:
    """``model.backbone_checkpoint FILE (a DINO training checkpoint): took …; initialised …``: every
    branch module and centred loss of ``module`` is in one list or the other, and so is what the
    optimizer trains outside both branches (iBOT's mask token)."""
    both = " for the student and the teacher" if taken.kind == "a backbone" else " of the student and the teacher"
    modules = [
        f"{name} (every weight but GAug's)" if name == "backbone" and taken.fresh_gaug else name
        for name in taken.modules
    ]
    took = [f"the {' and '.join(modules)}{both}"] + [f"the {name} centre" for name in taken.centres]
    fresh = [f"the {name}s" for name in module.student if name not in taken.modules]
    if taken.fresh_gaug:  # a vanilla release into its LocAt version
        fresh.insert(0, f"GAug's {taken.fresh_gaug} tensors (new in the LocAt version)")
    fresh += [
        f"the {name} centre"
        for name, loss in module.named_children()
        if loss in module.centred_losses() and name not in taken.centres
    ]
    branch_params = {id(p) for p in module.student.parameters()}
    fresh += sorted({f"the {n.split('.')[0]}" for n, p in module.trained_parameters() if id(p) not in branch_params})
    return (
        f"model.backbone_checkpoint {taken.path} ({taken.kind}): took {', '.join(took)}; "
        f"initialised {', '.join(fresh) or 'nothing'}"
    )
