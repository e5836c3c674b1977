"""The rows of ``compare --baselines`` against naive implementations on a toy split: Hummingbird
on the pixels as a k-NN over hand-cut patches, the position prior as per-place class means, and
both probe columns as the probe's head on hand-made features."""

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.augment import normalize
from locatdino.evaluation.compare.baselines import evaluate_baselines
from locatdino.evaluation.compare.measure import ModelOutcome, ShownImages
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, evaluate_head, train_head
from tests.evaluation.hbird.hbird_fixtures import NoisyLayout
from tests.evaluation.hbird.test_position_prior import TOY, naive_prior_miou

PROBE = dict(input_size=32, iterations=12, batch_size=4, augment="off", num_workers=0, progress=False)


def _miou(confusion):
    union = confusion.sum(0) + confusion.sum(1) - np.diag(confusion)
    return 100 * np.nanmean(np.where(union > 0, np.diag(confusion) / np.maximum(union, 1), np.nan))


def _patches(image, p):
    """``[h·w, 3·p·p]``: each patch of one normalised image, cut out by hand, row-major."""
    x = normalize(torch.from_numpy(np.asarray(image)).permute(2, 0, 1)[None])[0]
    side = x.shape[-1] // p
    return torch.stack(
        [x[:, i * p : (i + 1) * p, j * p : (j + 1) * p].reshape(-1) for i in range(side) for j in range(side)]
    )


def naive_pixel_hummingbird(train, val, p, k, beta):
    """Cosine k-NN over every memory patch, softmax(sim / β) vote of their class fractions."""
    c, side = train.num_classes, train.masks[0].shape[0] // p
    memory = F.normalize(torch.cat([_patches(image, p) for image in train.images]), dim=-1)
    labels = torch.tensor(
        np.stack(
            [
                np.bincount(m[i * p : (i + 1) * p, j * p : (j + 1) * p].ravel(), minlength=c) / p**2
                for m in train.masks
                for i in range(side)
                for j in range(side)
            ]
        )
    )
    confusion = np.zeros((c, c), np.int64)
    for image, mask in zip(val.images, val.masks):
        sims, ids = (F.normalize(_patches(image, p), dim=-1) @ memory.T).topk(k, dim=1)
        scores = (torch.softmax(sims.double() / beta, 1)[..., None] * labels[ids]).sum(1)
        up = F.interpolate(
            scores.T.reshape(1, c, side, side).float(), size=mask.shape, mode="bilinear", align_corners=False
        )
        confusion += np.bincount(
            mask.ravel().astype(int) * c + up.argmax(1)[0].numpy().ravel(), minlength=c * c
        ).reshape(c, c)
    return _miou(confusion)


class HandTokens:
    """The probe's extractor interface on hand-made features: pixels cut by hand, or a one-hot place."""

    patch_size, device, precision = 8, torch.device("cpu"), "fp32"

    def __init__(self, kind):
        self.kind, self.dim = kind, 192 if kind == "pixels" else 16

    def grid(self, size):
        return size // self.patch_size

    def __call__(self, images):
        if self.kind == "position":
            return torch.eye(16).view(1, 4, 4, 16).repeat(len(images), 1, 1, 1)
        cut = [_patches(image.permute(1, 2, 0).numpy(), 8) for image in images]
        return torch.stack(cut).view(len(images), 4, 4, 192)


def test_baseline_rows_match_naive_implementations():
    train, val = NoisyLayout(6, 0), NoisyLayout(3, 1)
    cfg = HummingbirdConfig(**TOY, precision="int8")  # a baseline has no weights: it runs fp32 whatever is asked
    probe = LinearProbeConfig(**PROBE)
    shown = ShownImages.from_split(val, 2, 32)
    pixels, prior = evaluate_baselines(8, train, val, cfg, [Fraction(1, 2), Fraction(1)], shown, probe)
    assert pixels.hbird["miou"] == pytest.approx(naive_pixel_hummingbird(train, val, 8, 5, 0.02), abs=1e-9)
    assert prior.hbird["miou"] == pytest.approx(naive_prior_miou(train, val, 8)[0], abs=1e-9)
    assert pixels.hbird["miou"] != prior.hbird["miou"] and pixels.hbird["search"]["precision"] == "fp32"
    for row, kind in ((pixels, "pixels"), (prior, "position")):
        head, _, _ = train_head(HandTokens(kind), train, probe)
        assert row.linprobe["miou"] == pytest.approx(
            100 * evaluate_head(HandTokens(kind), head, val, probe)[0].compute().miou, abs=1e-9
        )
        assert [p["memory_patches"] for p in row.memory_curve] == [48, 96]  # 1/2 and the full memory
        assert row.visuals["prediction"].shape == (2, 32, 32) and row.visuals["probe_prediction"].shape == (2, 32, 32)
    assert "pca" in pixels.visuals and "pca" not in prior.visuals  # a one-hot place has no colours to show
    # a model's fields, None where a network is needed, with the reason
    fields = set(ModelOutcome(pixels.spec).to_dict())
    for row in (pixels, prior):
        record = row.to_dict()
        assert set(record) == fields and record["parameters"] is None and record["probes"] is None
        assert set(record["not_applicable"]) == {"parameters", "forward", "probes", "locality"}
