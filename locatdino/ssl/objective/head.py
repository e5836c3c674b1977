"""The DINO projection head (Caron et al., ICCV 2021, §3.1 and App.; docs/pretraining.md)."""

from __future__ import annotations

import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm


class DINOHead(nn.Module):
    """MLP ``in → hidden → … → bottleneck``, L2 normalisation, weight-normalised ``bottleneck → K``.

    ``nlayers`` counts the MLP's linear layers (3: in → 2048 → 2048 → 256, GELU, no BN by default).
    The last layer ``w = g · v / ‖v‖`` uses PyTorch's current parametrization, so its parameters are
    ``last_layer.parametrizations.weight.original0`` (``g``, ``[K, 1]``) and ``.original1``
    (``v``, ``[K, bottleneck]``). ``g`` starts at 1 and with ``norm_last_layer`` stays frozen there,
    which the reference finds stabilises training (it sets it to False for ViT-S/16).

    Shapes: ``forward([N, in_dim]) -> [N, out_dim]``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int = 65536,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__()
        if nlayers < 1:
            raise ValueError(f"DINOHead: nlayers must be >= 1, got {nlayers}")
        dims = [in_dim] + [hidden_dim] * (nlayers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(d_in, d_out))
            if i < nlayers - 1:
                layers += [nn.BatchNorm1d(d_out)] if use_bn else []
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        self.mlp.apply(_init_linear)
        # The last layer keeps nn.Linear's default init, as in the reference.
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        gain = self.last_layer.parametrizations.weight.original0
        gain.data.fill_(1.0)
        gain.requires_grad_(not norm_last_layer)

    def forward(self, x: Tensor) -> Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x)


def _init_linear(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
