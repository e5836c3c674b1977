"""Linear classification on frozen features: DINO's protocol against an independent implementation
of its ``eval_linear`` loop, and the lr-grid variant against training each lr on its own."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets import ImageFolder

from locatdino.evaluation.lincls.cache import ClassFeatures
from locatdino.evaluation.lincls.features import LinearInput
from locatdino.evaluation.lincls.protocol import (
    LinclsConfig,
    holdout_split,
    linear_classification,
    train_fast,
    train_full,
)
from locatdino.evaluation.lincls.views import RankBatches, SeededViews, train_transform
from locatdino.evaluation.ranks import Ranks
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model

SIZE = 56  # Resize(64) + CenterCrop(56): the reference's 256 / 224 exactly
COLOURS = ((200, 40, 40), (40, 200, 40), (40, 40, 200))


def toy_folder(root, per_class=(6, 2), size=(70, 60), seed=0):
    """ImageNet layout: ``root/{train,val}/<class>/*.png``, each class a noisy colour."""
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "val"), per_class):
        for c, colour in enumerate(COLOURS):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(np.array(colour) + rng.normal(0, 60, (size[1], size[0], 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return root


def reference_features(model, images, n):
    """DINO's ``get_intermediate_layers``: the tokens of the last ``n`` blocks, each through the final
    norm; the linear input is their class tokens concatenated."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
    outputs = []
    for i, block in enumerate(model.blocks):
        x = block(x)
        if i >= len(model.blocks) - n:
            outputs.append(model.norm(x))
    return torch.cat([o[:, 0] for o in outputs], dim=-1)


class EpochViews(torch.utils.data.Dataset):
    """``dataset[i]`` with its transform's draws seeded by ``(seed, epoch, i)`` alone: 64 bits of
    ``SeedSequence([seed, epoch, i])`` (lincls' per-view seed, which no worker or rank changes)."""

    def __init__(self, dataset, seed):
        self.dataset, self.seed, self.epoch = dataset, seed, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        high, low = np.random.SeedSequence([self.seed, self.epoch, i]).generate_state(2, dtype=np.uint32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(high) << 32 | int(low))
            return self.dataset[i]


def reference_eval_linear(model, root, n, epochs, batch, lr, seed):
    """The reference's eval_linear loop, written from its description, on one GPU (its
    ``DistributedSampler`` reshuffled by ``set_epoch``): (trained weight, top-1 %, top-5 %)."""
    normalize = T.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    train = ImageFolder(
        root / "train", T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(), normalize])
    )
    val = ImageFolder(
        root / "val",
        T.Compose(
            [T.Resize(64, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(SIZE), T.ToTensor(), normalize]
        ),
    )
    torch.manual_seed(seed)
    linear = nn.Linear(model.embed_dim * n, len(train.classes))
    linear.weight.data.normal_(mean=0.0, std=0.01)
    linear.bias.data.zero_()
    views = EpochViews(train, seed)
    sampler = DistributedSampler(views, num_replicas=1, rank=0, shuffle=True, seed=seed)  # the reference's, one GPU
    loader = torch.utils.data.DataLoader(views, sampler=sampler, batch_size=batch)
    optimizer = torch.optim.SGD(linear.parameters(), lr * batch / 256, momentum=0.9, weight_decay=0)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs, eta_min=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        views.epoch = epoch
        for images, target in loader:
            with torch.no_grad():
                output = reference_features(model, images, n)
            loss = nn.CrossEntropyLoss()(linear(output), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    images, target = zip(*(val[i] for i in range(len(val))))
    with torch.no_grad():
        logits = linear(reference_features(model, torch.stack(images), n))
    top = logits.topk(3, dim=1).indices == torch.tensor(target)[:, None]
    return linear.weight.detach(), 100 * top[:, 0].float().mean().item(), 100 * top.any(1).float().mean().item()


def test_full_protocol_matches_an_independent_eval_linear(tmp_path):
    root = toy_folder(tmp_path)
    model = tiny_vit_model()
    cfg = LinclsConfig(
        protocol="full", input_size=SIZE, epochs=3, batch_size=4, lr=2.0, last_blocks=2, num_workers=0, progress=False
    )
    train, val = ImageFolder(root / "train"), ImageFolder(root / "val")
    head, skipped = train_full(model, LinearInput(2), train, 3, cfg, torch.device("cpu"))
    weight, top1, top5 = reference_eval_linear(model, root, n=2, epochs=3, batch=4, lr=2.0, seed=0)
    assert skipped == []
    torch.testing.assert_close(head.weight.detach(), weight, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(weight, torch.zeros_like(weight), atol=0.05)  # it trained: not the N(0, 0.01) init
    result = linear_classification(model, train, val, 3, cfg, torch.device("cpu"))
    assert result.top1 == pytest.approx(top1) and top5 == 100.0
    assert result.num_val == 6 and len(result.hits) == 6 and result.hits.mean() * 100 == pytest.approx(top1)
    assert result.lr == 2.0 * 4 / 256 and result.top5 is None is result.top5_interval  # 3 classes: all in the top 5
    low, high = result.top1_interval
    assert low <= result.top1 <= high and high - low > 20  # 6 images: a wide 95 % interval


def blobs(count, dim=8, classes=3, seed=0, spread=1.5):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (classes, dim))
    labels = np.arange(count) % classes
    return (centres[labels] + rng.normal(0, spread, (count, dim))).astype(np.float32), labels


def reference_lr_grid(features, labels, fit_rows, held_rows, lrs, epochs, batch, seed):
    """Each lr trained on its own (the layers initialised in grid order from one seed, the same
    batch order), each scored on the held-out rows: held-out top-1 (%) per lr."""
    torch.manual_seed(seed)
    layers = []
    for _ in lrs:
        layer = nn.Linear(features.shape[1], 3)
        layer.weight.data.normal_(0, 0.01)
        layer.bias.data.zero_()
        layers.append(layer)
    x, y = torch.from_numpy(features), torch.from_numpy(labels)
    steps = epochs * math.ceil(len(fit_rows) / batch)
    held = []
    for layer, lr in zip(layers, lrs):
        optimizer = torch.optim.SGD(layer.parameters(), lr * batch / 256, momentum=0.9, weight_decay=0)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=0)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = fit_rows[torch.randperm(len(fit_rows), generator=generator).numpy()]
            for start in range(0, len(order), batch):
                rows = order[start : start + batch]
                loss = F.cross_entropy(layer(x[rows]), y[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
        with torch.no_grad():
            held.append(100 * (layer(x[held_rows]).argmax(1) == y[held_rows]).float().mean().item())
    return held


def test_fast_variant_picks_the_lr_that_training_each_alone_picks():
    features, labels = blobs(120)
    store = ClassFeatures(len(features), features.shape[1])
    store.put(torch.arange(len(features)), torch.from_numpy(features), torch.from_numpy(labels))
    lrs = (1e-4, 0.1, 3.0)
    cfg = LinclsConfig(protocol="fast", epochs=3, batch_size=16, lr_grid=lrs, holdout=0.25, progress=False)
    fit_rows, held_rows = holdout_split(store.usable(), cfg)
    assert len(held_rows) == 30 and not set(fit_rows) & set(held_rows)
    heads = train_fast(store, fit_rows, 3, cfg, torch.device("cpu"))
    ours = []
    for head in heads:
        with torch.no_grad():
            ours.append(
                100 * (head(torch.from_numpy(features[held_rows])).argmax(1).numpy() == labels[held_rows]).mean()
            )
    reference = reference_lr_grid(features, labels, fit_rows, held_rows, lrs, 3, 16, 0)
    assert ours == pytest.approx(reference, abs=1e-4)
    assert int(np.argmax(ours)) == int(np.argmax(reference)) == 1  # neither end of the grid: a real choice


def test_fast_protocol_scores_the_picked_layer_on_the_validation_images(tmp_path):
    root = toy_folder(tmp_path)
    train, val = ImageFolder(root / "train"), ImageFolder(root / "val")
    cfg = LinclsConfig(
        protocol="fast",
        input_size=SIZE,
        epochs=5,
        batch_size=8,
        lr_grid=(1e-3, 30.0),
        holdout=0.25,
        last_blocks=1,
        avgpool=True,
        num_workers=0,
        progress=False,
    )
    result = linear_classification(tiny_vit_model(), train, val, 3, cfg, torch.device("cpu"))
    table = result.lr_table
    assert [row["base_lr"] for row in table] == [1e-3, 30.0] and result.num_train == 18
    best = max(table, key=lambda row: row["holdout_top1"])
    assert result.lr == best["lr"] and result.top1 == pytest.approx(best["val_top1"])
    assert result.linear_input == {"last_blocks": 1, "avgpool": True, "prr": False}


def test_linear_input_concatenates_class_tokens_then_the_mean_patch_token():
    model = tiny_vit_model()
    images = torch.randn(2, 3, 32, 32)
    x = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    first = model.norm(model.blocks[0](x))
    last = model.norm(model.blocks[1](model.blocks[0](x)))
    with torch.no_grad():
        got = LinearInput(2, avgpool=True)(model, images)
    expected = torch.cat([first[:, 0], last[:, 0], last[:, 1:].mean(1)], dim=-1)
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)
    assert LinearInput.reference(model) == LinearInput(2, False)  # DINO's 4 blocks, capped at the model's 2
    with pytest.raises(ValueError, match="--last-blocks 3: the model has 2 blocks"):
        LinearInput.reference(model, last_blocks=3)


def test_a_training_view_depends_on_seed_epoch_and_image_alone():
    images = [Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 50, 3), np.uint8)) for i in range(3)]
    views = SeededViews([(image, 0) for image in images], train_transform(16), seed=5)
    first = views[(1, 2)][0]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    views[(0, 0)], views[(1, 1)]  # other draws before: the view does not move
    again = views[(1, 2)][0]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left as it was
    torch.testing.assert_close(again, first, rtol=0, atol=0)  # the same process and transform: the same pixels
    assert not torch.equal(views[(0, 2)][0], first)  # another epoch, another crop
    assert not torch.equal(SeededViews(views.dataset, views.transform, seed=6)[(1, 2)][0], first)


def test_rank_batches_cut_one_process_batches_in_its_order():
    one, two = RankBatches(11, 4, 3, Ranks()), [RankBatches(11, 4, 3, Ranks(rank, 2)) for rank in (0, 1)]
    for epoch in (0, 1):
        for sampler in (one, *two):
            sampler.set_epoch(epoch)
        batches = list(one)
        assert [len(b) for b in batches] == [4, 4, 3] and sorted(k for b in batches for k in b) == [
            (epoch, i) for i in range(11)
        ]
        assert batches == [first + second for first, second in zip(*two, strict=True)]
        assert [len(b) for b in two[1]] == [2, 2, 1] and len(two[0]) == len(two[1]) == 3
        order = torch.randperm(11, generator=torch.Generator().manual_seed(3 + epoch)).tolist()  # DistributedSampler's
        assert [i for b in batches for _, i in b] == order
