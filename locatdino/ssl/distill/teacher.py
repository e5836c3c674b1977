"""The frozen teacher of distillation: any backbone ``locatdino.models.create_backbone`` loads,
named ``NAME:FILE`` (``model.teacher``), and its class and patch features on the student's token
grid (docs/pretraining.md, "Distillation from a frozen teacher").

The teacher never trains: its parameters do not require gradients, its forwards run in eval mode
under ``torch.no_grad`` (in bf16 autocast on CUDA, where a ViT-L teacher's forward is the step's
largest cost; fp32 on the CPU, where bf16 is slow) and it is not saved in the run's checkpoints:
every start loads it from its file again, and the checkpoint keeps a fingerprint of its weights,
so a resumed run refuses a file that changed since (:class:`FrozenTeacher`).
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from timm.models import split_model_name_tag
from timm.models.swin_transformer import SwinTransformer
from torch import Tensor, nn

from locatdino.models import create_backbone
from locatdino.models.model_spec import parse_model
from locatdino.models.token_grid import grid_shape, patch_size
from locatdino.ssl.objective.final_tokens import FinalTokens


def parse_teacher(text: str) -> tuple[str, str]:
    """``(NAME, FILE)`` of ``model.teacher`` ``NAME:FILE`` (the evaluations' ``--model`` grammar
    without a label: split at the first ``:``); ``ValueError`` in one line for anything else,
    a name without weights included (a random teacher teaches nothing)."""
    try:
        label, name, checkpoint = parse_model(text)
    except ValueError:
        label, name, checkpoint = None, "", None
    if label is not None or not name or checkpoint is None:
        raise ValueError(
            f"model.teacher {text!r}: expected NAME:FILE, a timm / LocAtViT model and its weights "
            "(e.g. vit_large_patch16_dinov3:dinov3_vitl16.pth or vit_tiny_patch16_224:runs/dino/checkpoints/last.ckpt)"
        )
    return name, checkpoint


def patch_token_problem(model: nn.Module) -> str | None:
    """Why ``model``'s features cannot be matched patch by patch (``None``: they can). The
    student's tokens are a ViT's: the patch tokens after the final norm (``norm``, prefix tokens
    ``num_prefix_tokens`` dropped) on the grid of its patch (:func:`~locatdino.models.token_grid.patch_size`)."""
    if isinstance(model, SwinTransformer):
        return "a Swin has no patch tokens after a final norm (its features are a stage's map)"
    try:
        patch_size(model)
        has_patch = True
    except ValueError:
        has_patch = False
    missing = [
        what
        for what, present in (
            ("patch size", has_patch),
            ("norm", isinstance(getattr(model, "norm", None), nn.Module)),
            ("num_prefix_tokens", isinstance(getattr(model, "num_prefix_tokens", None), int)),
        )
        if not present
    ]
    if missing:
        return f"{type(model).__name__} has no patch tokens (no {', '.join(missing)}: not a timm ViT)"
    return None


def match_grid(patches: Tensor, grid: tuple[int, int], target: tuple[int, int]) -> Tensor:
    """Patch features ``[B, h·w, D]`` on ``grid`` ``(h, w)`` resampled to ``target`` ``(h', w')``:
    bilinear on the ``[B, D, h, w]`` token map, ``align_corners=False``.

    Why the teacher's grid goes to the student's and not the other way (lightly-train resamples
    the student's): every student token then gets a target of its own, the loss counts the
    student's tokens whatever the teacher's patch, and the student's features are never smoothed
    by a resampling before the loss sees them. Why on the token map rather than by feeding the
    teacher another image size: the teacher keeps its own patch resolution (its features at
    another input size are other features, and cost more), and a 14 px teacher patch and a 16 px
    student patch cover the same image, so the two maps differ by a scale only. Why bilinear:
    the student's token centres fall between the teacher's (16 → 14 tokens), and a token is the
    feature of its patch's centre (``align_corners=False`` places them so, as image resizing does);
    nearest would copy one neighbour and shift the target by up to half a teacher patch."""
    if tuple(grid) == tuple(target):
        return patches
    maps = patches.transpose(1, 2).unflatten(-1, tuple(grid))
    maps = F.interpolate(maps, size=tuple(target), mode="bilinear", align_corners=False)
    return maps.flatten(2).transpose(1, 2)


def weights_fingerprint(module: nn.Module) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of ``module``'s state: the same weights
    give the same text on any machine (it reads the values, not the file)."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype, 0-d too
    return digest.hexdigest()


class FrozenTeacher(nn.Module):
    """The teacher backbone of ``model.teacher`` and its features of the student's crops.

    Args:
        text: ``NAME:FILE`` (:func:`parse_teacher`); the file in any format ``create_backbone``
            reads (a release, a ``fit`` checkpoint's EMA teacher, an export); a file of another
            architecture than NAME is refused by the loader, in one line.
        image_size: the side the teacher sees the crops at (``None``: the crops' own side).
            A side its patch does not divide becomes the nearest multiple (halves up; resized
            bilinearly, antialiased), at least one patch.

    ``ValueError`` in one line naming ``model.teacher`` for a model without patch tokens
    (checked on the meta device, before the weights are read) and for weights that do not load.
    """

    def __init__(self, text: str, image_size: int | None = None) -> None:
        super().__init__()
        name, path = parse_teacher(text)
        try:
            with torch.device("meta"):  # the architecture only (a pretrained tag names weights): no memory
                probe = create_backbone(split_model_name_tag(name)[0])
        except (TypeError, RuntimeError, AssertionError) as err:  # timm's: not a backbone with patch tokens
            raise ValueError(
                f"model.teacher {text}: {name} is not a backbone with patch tokens ({str(err).splitlines()[0]})"
            ) from None
        except ValueError as err:
            raise ValueError(f"model.teacher {text}: {err}") from None
        if problem := patch_token_problem(probe):
            raise ValueError(f"model.teacher {text}: {problem}: distillation matches the student's patch tokens")
        try:
            self.backbone = create_backbone(name, path, drop_path_rate=0.0)
        except ValueError as err:  # the loader's line names the file: said once
            raise ValueError(f"model.teacher {text}: {str(err).removeprefix(f'{path}: ')}") from None
        self.backbone.requires_grad_(
            False
        )  # (eval mode in forward: a module in eval mode at fit's start draws a warning)
        self.image_size = image_size
        self.embed_dim = int(self.backbone.num_features)
        self._tokens = FinalTokens(self.backbone)
        self._fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """:func:`weights_fingerprint` of the teacher (computed once: it never changes)."""
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.backbone)
        return self._fingerprint

    def input_side(self, side: int) -> int:
        """The side the teacher sees a crop of ``side`` px at (see the class docstring)."""
        patch = patch_size(self.backbone)[0]
        wanted = self.image_size or side
        return max(int(wanted / patch + 0.5), 1) * patch  # halves round up

    def forward(self, images: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Class features ``[B, C]`` and patch features ``[B, h·w, C]`` on the student's token
        ``grid`` ``(h, w)`` of ``images`` ``[B, 3, H, W]`` (the student's crops), fp32, no graph."""
        h, w = self.input_side(images.shape[-2]), self.input_side(images.shape[-1])
        if tuple(images.shape[-2:]) != (h, w):
            images = F.interpolate(images, size=(h, w), mode="bilinear", antialias=True)
        # eval mode for its forwards: Lightning's train() at the start of fit flips every module back
        self.backbone.eval()
        # bf16 on CUDA only; on the CPU also off inside a bf16-mixed run's autocast (slow there)
        autocast = torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=images.is_cuda)
        with torch.no_grad(), autocast:
            cls, patches = self._tokens(self.backbone, images)
        own = grid_shape((h, w), patch_size(self.backbone), False)
        return cls.float(), match_grid(patches.float(), own, grid)
