"""A backbone's patch size and the token grid of an image, read here and nowhere else (a command
that refuses an ``--input-size`` still says so in its own words, naming its option and model).

Every evaluation, check and figure needs the patch of a backbone (is ``--input-size`` a multiple
of it? how many tokens per side?) and the grid of tokens an image becomes. timm keeps both on
``model.patch_embed`` (``patch_size`` as ``(h, w)``, ``dynamic_feat_size``, ``dynamic_img_pad``),
the network-free baselines (``locatdino.models.baselines``) as one ``patch_size`` int; reading
them in one place keeps the rule for padded inputs (the grid rounds up) and the error for
unpadded ones (a side must be a multiple of the patch) the same everywhere.
"""

from __future__ import annotations

from timm.models.swin_transformer import SwinTransformer
from torch import nn


def patch_size(model: nn.Module) -> tuple[int, int]:
    """``(h, w)`` px of one patch of ``model``: a timm ViT's ``patch_embed.patch_size`` or a
    baseline's ``patch_size``; ``ValueError`` for a model that has neither. A timm Swin's patch is
    one token of its last stage, whose map the evaluations read (``patch_embed`` × 2 per merge: 32 px)."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if isinstance(model, SwinTransformer):
        merges = 2 ** (len(model.layers) - 1)
        return int(patch[0]) * merges, int(patch[1]) * merges
    if patch is None:
        patch = getattr(model, "patch_size", None)
    if patch is None:
        raise ValueError(f"{type(model).__name__} has no patch_embed.patch_size: not a timm ViT?")
    return (int(patch[0]), int(patch[1])) if isinstance(patch, (tuple, list)) else (int(patch), int(patch))


def pads_images(model: nn.Module) -> bool:
    """Whether ``model`` pads an image to a multiple of its patch (timm's ``dynamic_img_pad``)."""
    return bool(getattr(getattr(model, "patch_embed", None), "dynamic_img_pad", False))


def token_grid(model: nn.Module, image_hw: tuple[int, int]) -> tuple[int, int]:
    """``(h, w)`` tokens of an image of ``image_hw`` px through ``model`` (``ValueError`` when a side
    is not a multiple of the patch and the model does not pad)."""
    return grid_shape((int(image_hw[0]), int(image_hw[1])), patch_size(model), pads_images(model))


def grid_shape(size: tuple[int, int], patch: tuple[int, int], dynamic_img_pad: bool) -> tuple[int, int]:
    """The token grid of an image of ``size`` px in patches of ``patch`` px: padded inputs round
    up (timm's ``dynamic_feat_size``); others must be multiples (:func:`check_image_size`)."""
    check_image_size(size, patch, dynamic_img_pad)
    if dynamic_img_pad:
        return -(-size[0] // patch[0]), -(-size[1] // patch[1])
    return size[0] // patch[0], size[1] // patch[1]


def check_image_size(size: tuple[int, int], patch_size: tuple[int, int], dynamic_img_pad: bool) -> None:
    """Raise a one-line error if an image side is not a multiple of the patch size."""
    if dynamic_img_pad:
        return
    if size[0] % patch_size[0] or size[1] % patch_size[1]:
        raise ValueError(
            f"input image {size[0]}×{size[1]} px is not a multiple of the patch size "
            f"{patch_size[0]}×{patch_size[1]}: resize or crop it, or build the model with "
            "dynamic_img_pad=True"
        )


def fitting_sizes(size: int, patch: int) -> str:
    """The sizes nearest ``size`` that ``patch`` divides, for an error's hint: ``"48 or 64"``
    (``"16"`` below one patch)."""
    below = size // patch * patch
    return f"{below} or {below + patch}" if below else str(patch)
