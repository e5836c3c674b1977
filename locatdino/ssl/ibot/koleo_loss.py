"""The KoLeo regulariser (Sablayrolles et al., ICLR 2019; DINOv2 §4; docs/pretraining.md).

The Kozachenko–Leonenko differential-entropy estimator, up to constants: minimising
``−mean_i log d_i``, with ``d_i`` the distance of embedding ``i`` to its nearest neighbour in the
batch, spreads the batch's embeddings uniformly over the sphere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from locatdino.ssl.dino.loss import at_least_fp32


class KoLeoLoss(nn.Module):
    """``−mean_i log(‖x_i − x_nn(i)‖ + eps)`` on L2-normalised ``x`` ``[B, D]`` (``B >= 2``).

    The neighbour is chosen without gradient (the most similar other row); the gradient flows
    through the distance to it. As in DINOv2, the batch is this rank's (no gathering over ranks).
    """

    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"KoLeoLoss: need embeddings [B, D] with B >= 2, got {tuple(x.shape)}")
        x = F.normalize(at_least_fp32(x), dim=-1, eps=self.eps)
        with torch.no_grad():
            similarity = x @ x.T
            similarity.fill_diagonal_(-torch.inf)
            nearest = similarity.argmax(-1)
        distance = (x - x[nearest]).norm(dim=-1)
        return -torch.log(distance + self.eps).mean()
