"""Every token after a backbone's final norm, from the same forward that gives its image embedding.

The objectives call ``backbone(x)`` (the call FSDP and ``torch.compile`` wrap) for the class
embedding; iBOT's patch loss and the Gram loss also need the patch tokens of that forward. A
forward hook on ``backbone.norm`` keeps ``forward_features``' output while armed, so no second
forward and no backbone-specific code path is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn


class FinalTokens:
    """While armed, keeps the patch tokens of each output of ``backbone.norm`` (prefix tokens dropped)."""

    def __init__(self, backbone: nn.Module) -> None:
        self.backbone = backbone
        self._kept: list[Tensor] | None = None
        backbone.norm.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._kept is not None:
            self._kept.append(out[:, self.backbone.num_prefix_tokens :])

    @contextmanager
    def kept(self) -> Iterator[list[Tensor]]:
        """The patch tokens ``[B, N, D]`` of every backbone forward inside the block, in call order."""
        kept: list[Tensor] = []
        self._kept = kept
        try:
            yield kept
        finally:
            self._kept = None

    def __call__(self, backbone: nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
        """``backbone(images)`` ``[B, D]`` and the patch tokens ``[B, N, D]`` of the same forward.

        ``backbone`` is the module as the step holds it now: under FSDP or ``torch.compile`` a
        wrapper of the one this hook was put on, and only the wrapper's call gathers the weights."""
        with self.kept() as kept:
            embedding = backbone(images)
        return embedding, kept[-1]
