"""Helpers of the Hummingbird tests: an oracle encoder, a mask-as-image dataset, a tiny ViT and a
minimal LightningModule with an ``eval_backbone`` (importable from subprocesses too)."""

import lightning.pytorch as pl
import numpy as np
import timm
import torch
import torch.nn.functional as F
from PIL import Image


def tiny_vit_model():
    """ViT with 8 px patches, width 64, 2 blocks: fast on CPU at 32-96 px."""
    torch.manual_seed(0)
    return timm.create_model(
        "vit_small_patch16_224",
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=2,
        num_classes=0,
        dynamic_img_size=True,
        pretrained=False,
    ).eval()


class MaskAsImage:
    """A segmentation set whose image *is* its mask (red = 25 x class), so an oracle encoder can
    read the labels back; green marks the mean-colour canvas of zoom-out crops."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.num_classes, self.ignore_index = dataset.num_classes, dataset.ignore_index
        self.class_names = dataset.class_names

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        _, mask = self.dataset[i]
        rgb = np.zeros(mask.shape + (3,), np.uint8)
        rgb[..., 0] = mask.astype(np.uint8) * 25
        return Image.fromarray(rgb), mask


class OracleEncoder:
    """Feature = one-hot of the patch's majority class (the encoder interface of hummingbird())."""

    def __init__(self, patch_size, num_classes, dim=16):
        self.patch_size, self.num_classes, self.dim = patch_size, num_classes, dim

    def grid(self, size):
        return size // self.patch_size

    def __call__(self, images):
        cls = (images[:, 0].float() / 25).round().long().clamp(0, self.num_classes - 1)
        cls[images[:, 1] > 58] = self.dim - 1  # canvas
        fractions = F.avg_pool2d(F.one_hot(cls, self.dim).permute(0, 3, 1, 2).float(), self.patch_size)
        return F.one_hot(fractions.argmax(1), self.dim).float()


class TinyDINOLike(pl.LightningModule):
    """Just what the monitor needs: an ``eval_backbone`` and a training loop."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone.requires_grad_(False)
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.teacher_modes = []

    @property
    def eval_backbone(self):
        return self.backbone

    def training_step(self, batch, batch_idx):
        self.teacher_modes.append(self.backbone.training)
        return (self.weight * batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD([self.weight], lr=0.1)


class NoisyLayout:
    """A toy segmentation split with a layout: class 0 above, 1 below a random horizon, a random
    block of class 2; images are uniform noise (no two patches alike: k-NN has no ties)."""

    num_classes, ignore_index, class_names = 3, None, ["sky", "ground", "object"]

    def __init__(self, count, seed, size=32):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
        self.masks = []
        for _ in range(count):
            mask = np.zeros((size, size), np.uint8)
            mask[rng.integers(size // 4, 3 * size // 4) :] = 1
            top, left = rng.integers(0, size - 8, 2)
            mask[top : top + rng.integers(3, 9), left : left + rng.integers(3, 9)] = 2
            self.masks.append(mask)

    def __len__(self):
        return len(self.masks)

    def __getitem__(self, i):
        return Image.fromarray(self.images[i]), self.masks[i]
