"""The patch grid of the current input, handed from the patch embedding to every GAug layer.

timm never passes the patch grid to an attention layer (its blocks call ``attn(x)`` with the
token sequence only), yet GAug needs the grid ``(h, w)`` of the *actual* input on every forward:
DINO mixes 224 px and 96 px crops in one step and segmentation runs at 448-1024 px. A token
count alone does not fix it (14×16 and 16×14 both give 224 patches), and the number of prefix
tokens (class token, registers) is a property of the model, not of the attention layer.

Design: one :class:`PatchGrid` module per model, ``model.patch_embed.patch_grid``, fed by a
forward pre-hook on ``model.patch_embed`` (the one module every timm forward path runs first:
``forward``, ``forward_features``, ``forward_intermediates``) and referenced by every GAug layer.
It reads the image size (Python ints, no host sync), validates it and records the grid under the
sequence length it produces. Attention layers look the grid up by their own sequence length, so:

- recomputation under gradient checkpointing, which happens during backward after later
  forwards (e.g. student global crops, then local crops), still finds the right grid;
- ``copy.deepcopy(model)`` (DINO's teacher) gets its own record, because the hook and the
  attention layers share one object, which deepcopy's memo keeps shared inside the copy;
- ``torch.compile`` traces the hook and records the grid as Python ints (static shapes);
- an FX graph (timm's ``create_feature_extractor``) keeps ``patch_embed.patch_grid`` and the GAug
  layers as leaf modules, so the grid is recorded and read when the graph runs;
- TorchScript copies the shared module into every holder but shares tensors: a scripted model
  passes the latest grid through one small tensor instead of the Python dict.
"""

from __future__ import annotations

import torch
from timm.layers import register_notrace_module
from torch import nn

from locatdino.models.token_grid import grid_shape, pads_images, patch_size

_MAX_GRIDS = 16  # recent grids kept; a training step uses 2-3 resolutions


@register_notrace_module  # an FX leaf: records at run time, in the traced graph, not while tracing
class PatchGrid(nn.Module):
    """Records the patch grid of each input of ``patch_embed`` (its forward pre-hook calls it).

    A parameter-free submodule of ``patch_embed`` (``patch_embed.patch_grid``), shared by every
    GAug layer. An ``nn.Module`` so that FX keeps it as a node of a traced graph (``_is_impure``:
    dead-code elimination keeps it although nothing reads its output).

    Args:
        num_prefix_tokens: class + register tokens the model puts before the patch tokens.
        patch_size: ``(ph, pw)`` of the patch embedding, for the input-size check.
        dynamic_img_pad: whether the patch embedding pads inputs to a multiple of the patch.
    """

    _is_impure = True

    def __init__(self, num_prefix_tokens: int, patch_size: tuple[int, int], dynamic_img_pad: bool) -> None:
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.patch_size = patch_size
        self.dynamic_img_pad = dynamic_img_pad
        self._grids: dict[int, tuple[int, int]] = {}
        # TorchScript copies this module into every layer holding it, but shares a tensor: the
        # scripted model passes the latest (sequence length, h, w) through this one
        self._scripted_latest = torch.zeros(3, dtype=torch.long)

    def extra_repr(self) -> str:
        return f"num_prefix_tokens={self.num_prefix_tokens}, patch_size={self.patch_size}"

    def forward(self, image: torch.Tensor) -> None:
        height, width = image.shape[-2:]
        grid = grid_shape((height, width), self.patch_size, self.dynamic_img_pad)
        if torch.jit.is_scripting():
            self._scripted_latest[0] = grid[0] * grid[1] + self.num_prefix_tokens
            self._scripted_latest[1], self._scripted_latest[2] = grid[0], grid[1]
        else:
            self.record(grid)

    def record(self, grid: tuple[int, int]) -> None:
        """Remember ``grid`` as the latest one with its sequence length."""
        seq_len = grid[0] * grid[1] + self.num_prefix_tokens
        self._grids.pop(seq_len, None)  # re-insert at the end: newest wins, oldest evicted
        self._grids[seq_len] = (int(grid[0]), int(grid[1]))
        if len(self._grids) > _MAX_GRIDS:
            del self._grids[next(iter(self._grids))]

    def lookup(self, seq_len: int) -> tuple[int, int]:
        """The grid ``(h, w)`` of the latest input whose token sequence has ``seq_len`` tokens."""
        if torch.jit.is_scripting():  # no gradient checkpointing there: the latest input's grid
            latest: list[int] = self._scripted_latest.tolist()
            if latest[0] != seq_len:
                raise RuntimeError("GAug attention got another token count than the input of patch_embed")
            return latest[1], latest[2]
        grid = self._grids.get(seq_len)
        if grid is None:
            seen = ", ".join(f"{n} tokens → {g[0]}×{g[1]}" for n, g in self._grids.items()) or "none"
            raise RuntimeError(
                f"GAug attention got {seq_len} tokens but no input with that many patch + "
                f"{self.num_prefix_tokens} prefix tokens went through patch_embed (seen: {seen}); "
                "GAug needs every patch token of a full grid (no patch dropout or token pruning)"
            )
        return grid


def _record_patch_grid(patch_embed: nn.Module, args: tuple[torch.Tensor]) -> None:
    """Forward pre-hook of ``patch_embed``: hand the input to its :class:`PatchGrid`."""
    patch_embed.patch_grid(args[0])


def install_patch_grid(model: nn.Module) -> PatchGrid:
    """Give ``model.patch_embed`` a :class:`PatchGrid` and the pre-hook that feeds it (once);
    return it.

    ``model`` is a timm ``VisionTransformer``. Calling it again returns the existing record.
    """
    patch_embed = model.patch_embed
    if isinstance(getattr(patch_embed, "patch_grid", None), PatchGrid):
        return patch_embed.patch_grid
    patch_embed.patch_grid = PatchGrid(model.num_prefix_tokens, patch_size(model), pads_images(model))
    patch_embed.register_forward_pre_hook(_record_patch_grid)
    return patch_embed.patch_grid
