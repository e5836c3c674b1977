"""``linprobe --variant dinov2 | dinov2-ms`` (docs/evaluation.md): DINOv2's head, block tokens, schedule
and multi-scale + flip merge against independent implementations written here, and the command on the scenes."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from locatdino import cli
from locatdino.common.errors import UserError
from locatdino.evaluation.linprobe.dinov2_head import BatchNormLinearHead, BlockTokens, check_blocks
from locatdino.evaluation.linprobe.dinov2_protocol import SETTINGS, parse_variant_args, poly_warmup, sliding_stride
from locatdino.evaluation.linprobe.multiscale import merge_views, scaled_size, slide_logits, windows
from locatdino.evaluation.linprobe.one_cycle import probe_optimizer
from tests.evaluation.results_schema import valid_results
from tests.models.tiny import TINY, TINY_SWIN


def _vit(depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_small_patch16_224", patch_size=8, embed_dim=32, depth=depth, num_heads=2, dynamic_img_size=True
    ).eval()


def test_head_is_batchnorm_then_a_1x1_conv_in_training_and_in_evaluation():
    torch.manual_seed(0)
    head = BatchNormLinearHead(12, 5)
    assert head.classifier.bias.abs().sum() == 0 and 0.005 < head.classifier.weight.std() < 0.015  # N(0, 0.01)
    with torch.no_grad():
        head.norm.weight.uniform_(0.5, 1.5), head.norm.bias.uniform_(-0.5, 0.5), head.classifier.bias.normal_()
    x = torch.randn(4, 12, 3, 5) * 2 + 1
    w, b = head.classifier.weight[:, :, 0, 0], head.classifier.bias.view(1, -1, 1, 1)
    gamma, beta = head.norm.weight.view(1, -1, 1, 1), head.norm.bias.view(1, -1, 1, 1)

    def classify(normed):
        return torch.einsum("oc,bchw->bohw", w, normed * gamma + beta) + b

    # training: each channel normalised over the batch and every position, with the biased variance
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = ((x - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
    head.train()
    torch.testing.assert_close(head(x), classify((x - mean) / torch.sqrt(var + 1e-5)), atol=1e-5, rtol=1e-5)
    # evaluation: the running statistics (momentum 0.1 from 0 / 1, unbiased variance), one image at a time alike
    n = x.numel() // 12
    running_mean, running_var = 0.1 * mean, 0.9 + 0.1 * var * n / (n - 1)
    head.eval()
    expected = classify((x - running_mean) / torch.sqrt(running_var + 1e-5))
    torch.testing.assert_close(head(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(head(x[:1]), expected[:1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        head(x, (7, 9)),
        F.interpolate(expected, size=(7, 9), mode="bilinear", align_corners=False),
        atol=1e-5,
        rtol=1e-5,
    )


def _naive_blocks(model, images, indices, norm=True):
    """Every block run by hand; the chosen blocks' patch tokens, each through the final norm."""
    x = (images.float() / 255 - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor(
        [0.229, 0.224, 0.225]
    ).view(1, 3, 1, 1)
    tokens = model._pos_embed(model.patch_embed(x))
    kept = []
    for i, block in enumerate(model.blocks):
        tokens = block(tokens)
        if i in indices:
            kept.append((model.norm(tokens) if norm else tokens)[:, model.num_prefix_tokens :])
    return kept


def test_last_four_blocks_are_concatenated_earliest_first_through_the_final_norm():
    model = _vit(depth=6)
    images = torch.randint(0, 256, (2, 3, 24, 32), dtype=torch.uint8)
    out = BlockTokens(model, blocks=4)(images)
    assert out.shape == (2, 3, 4, 4 * 32)
    kept = _naive_blocks(model, images, {2, 3, 4, 5})
    expected = torch.cat(kept, dim=-1).reshape(2, 3, 4, 128)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, torch.cat(kept[::-1], dim=-1).reshape(2, 3, 4, 128), atol=1e-3)  # order told apart
    # one block, up to --layer -2, without the norm when asked
    one = BlockTokens(model, blocks=1, layer=-2, norm=False)(images)
    torch.testing.assert_close(one, _naive_blocks(model, images, {4}, norm=False)[0].reshape(2, 3, 4, 32))
    lin = BlockTokens(model, blocks=1)(images)
    torch.testing.assert_close(lin, kept[-1].reshape(2, 3, 4, 32), atol=1e-5, rtol=1e-5)


def test_a_swin_or_too_few_blocks_are_refused_in_one_line():
    swin = timm.create_model("swin_tiny_patch4_window7_224", **TINY_SWIN)
    with pytest.raises(UserError, match=r"^--variant dinov2 trains on a ViT's per-block patch tokens: sw is a "):
        check_blocks(swin, "sw", "dinov2", 1, -1)
    two = timm.create_model("vit_small_patch16_224", **TINY)
    with pytest.raises(UserError, match=r"^--variant dinov2-ms takes the last 4 blocks up to --layer -1, but t has "):
        check_blocks(two, "t", "dinov2-ms", 4, -1)
    check_blocks(two, "t", "dinov2", 1, -1)  # the last block alone is there


def _naive_merge(views, size):
    """Each view un-flipped by reversed column indices, resized by torch, soft-maxed by hand, averaged."""
    total = 0
    for logits, flipped in views:
        if flipped:
            logits = logits[..., torch.arange(logits.shape[-1] - 1, -1, -1)]
        up = F.interpolate(logits[None], size=size, mode="bilinear", align_corners=False)[0]
        e = torch.exp(up - up.max(0, keepdim=True).values)
        total = total + e / e.sum(0, keepdim=True)
    return total / len(views)


def test_views_are_unflipped_resized_to_the_label_and_their_probabilities_averaged():
    torch.manual_seed(0)
    views = [(torch.randn(4, 5, 7) * 3, False), (torch.randn(4, 5, 7) * 3, True), (torch.randn(4, 9, 12) * 3, True)]
    merged = merge_views(views, (11, 13))
    torch.testing.assert_close(merged, _naive_merge(views, (11, 13)), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(merged.sum(0), torch.ones(11, 13))
    # averaging logits instead of probabilities picks other classes somewhere: the test can tell them apart
    logit_mean = sum(F.interpolate((v.flip(-1) if f else v)[None], size=(11, 13), mode="bilinear")[0] for v, f in views)
    assert (logit_mean.argmax(0) != merged.argmax(0)).any()
    assert not torch.allclose(merge_views(views[1:2], (5, 7)), merge_views([(views[1][0], False)], (5, 7)))


def test_sliding_windows_average_the_overlaps_as_mmsegmentation():
    # 2 × 3 windows of 8 over 12 × 20 with stride 5: rows at 0 and 4 (the last flush), columns at 0, 5, 10, 12
    assert windows(12, 20, 8, 5) == [(t, x, t + 8, x + 8) for t in (0, 4) for x in (0, 5, 10, 12)]
    assert windows(6, 20, 8, 5)[0] == (0, 0, 6, 8)  # a side shorter than the window is taken whole
    image = torch.randint(0, 256, (3, 12, 20), dtype=torch.uint8)
    calls = []

    def predict(batch):  # logits that depend on which window saw the pixel: a window's own mean
        calls.append(tuple(batch.shape))
        mean = batch.float().mean(dim=(1, 2, 3), keepdim=True)
        return torch.cat([batch[:, :1].float() + mean, -mean.expand(-1, 1, *batch.shape[-2:])], dim=1)

    got = slide_logits(predict, image, crop=8, stride=5, patch=4, num_classes=2, batch_size=3)
    assert calls == [(3, 3, 8, 8), (3, 3, 8, 8), (2, 3, 8, 8)]
    expected = torch.zeros(2, 12, 20)
    for i in range(12):
        for j in range(20):
            seen = [(t, x) for t in (0, 4) for x in (0, 5, 10, 12) if t <= i < t + 8 and x <= j < x + 8]
            means = [image[:, t : t + 8, x : x + 8].float().mean() for t, x in seen]
            expected[0, i, j] = image[0, i, j].float() + sum(means) / len(means)
            expected[1, i, j] = -sum(means) / len(means)
    torch.testing.assert_close(got, expected)
    # a window that is not whole patches is padded with the mean colour and cropped back
    small = slide_logits(predict, image[:, :6, :7], crop=8, stride=5, patch=4, num_classes=2)
    assert calls[-1] == (1, 3, 8, 8) and small.shape == (2, 6, 7)


def test_scales_truncate_the_short_side_and_bound_the_long_side_only_at_one_scale():
    ms = SETTINGS["dinov2-ms"]
    sides = [scaled_size(512, 683, 640, r, ms.long_to_short) for r in ms.scales]
    assert sides == [(640, 854), (844, 1126), (1107, 1477), (1459, 1946), (1920, 2561)]
    assert scaled_size(100, 1000, 512, 1.0, SETTINGS["dinov2"].long_to_short) == (205, 2048)  # 4 × 512 long side
    assert sliding_stride(512) == 341 and sliding_stride(640) == 426


def _mmcv_poly_warmup_lr(step, total, lr, warmup=1500, ratio=1e-6):
    regular = lr * (1 - step / total)
    if step >= warmup:
        return regular
    k = (1 - step / warmup) * (1 - ratio)
    return regular * (1 - k)


def test_poly_schedule_with_linear_warmup_as_mmcv():
    optimizer = probe_optimizer([torch.nn.Parameter(torch.zeros(1))], 1e-3, 1e-4)
    schedule = poly_warmup(optimizer, 40_000)
    seen = {}
    optimizer.step()
    for step in range(3001):
        if step in (0, 1, 750, 1499, 1500, 1501, 3000):
            seen[step] = optimizer.param_groups[0]["lr"]
        schedule.step()
    for step, value in seen.items():
        assert value == pytest.approx(_mmcv_poly_warmup_lr(step, 40_000, 1e-3), rel=1e-9, abs=1e-15), step
    assert seen[0] == pytest.approx(1e-9) and optimizer.param_groups[0]["weight_decay"] == 1e-4


SMALL = [
    "--dataset", "scenes", "--num-train", "6", "--num-val", "3", "--scene-size", "32", "--input-size", "32",
    "--iters", "6", "--train-batch-size", "4", "--precision", "fp32", "--workers", "0", "--no-progress",
]  # fmt: skip


def test_the_variant_sets_dinov2s_defaults_and_options_beside_it_win():
    from locatdino.evaluation.linprobe import cli as probe_cli

    parser = probe_cli._parser()
    args = parse_variant_args(parser, ["--model", "m", "--variant", "dinov2-ms"])
    assert (args.iters, args.train_batch_size, args.lr, args.weight_decay, args.norm, args.input_size) == (
        40_000,
        16,
        1e-3,
        1e-4,
        True,
        640,
    )
    args = parse_variant_args(probe_cli._parser(), ["--model", "m", "--variant", "dinov2", "--no-norm", "--iters", "9"])
    assert (args.iters, args.norm, args.input_size) == (9, False, 512)
    paper = parse_variant_args(probe_cli._parser(), ["--model", "m"])
    assert (paper.variant, paper.iters, paper.train_batch_size, paper.weight_decay, paper.norm) == (
        "paper",
        20_000,
        32,
        0.01,
        False,
    )


@pytest.mark.parametrize("variant", ["dinov2", "dinov2-ms"])
def test_linprobe_variant_runs_on_the_scenes_and_reports_it(tmp_path, capsys, variant):
    out = tmp_path / "out"
    assert (
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--variant", variant, "--out", str(out), *SMALL]) == 0
    )
    table = capsys.readouterr().out
    assert f"| vit_tiny_patch16_224 | {variant} |" in table
    (result,) = valid_results(out / "results.json", "linprobe")["models"]
    assert result["config"]["variant"] == variant and result["config"]["norm"] is True
    assert result["config"]["weight_decay"] == 1e-4 and result["iterations"] == 6
    assert 0 <= result["miou"] <= 100 and 0 <= result["single_scale_miou"] <= 100
    if variant == "dinov2":  # one scale, no flip: the merged prediction is the one-scale one
        assert result["miou"] == pytest.approx(result["single_scale_miou"])
    assert f"protocol {variant};" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "model, message",
    [
        ("swin", "--variant dinov2-ms trains on a ViT's per-block patch tokens: swin_t is a SwinTransformer"),
        ("vit2", "--variant dinov2-ms takes the last 4 blocks up to --layer -1, but vit_2 has only 2 blocks there"),
    ],
)
def test_models_the_variant_cannot_use_are_refused_in_one_line(tmp_path, capsys, monkeypatch, model, message):
    from locatdino.evaluation import runner
    from locatdino.evaluation.linprobe import cli as probe_cli

    built = {"swin": lambda: timm.create_model("swin_tiny_patch4_window7_224", **TINY_SWIN), "vit2": lambda: _vit(2)}
    monkeypatch.setattr(runner, "load_backbones", lambda *a, **k: [built[model]()])
    monkeypatch.setattr(probe_cli, "linear_probe", lambda *a, **k: pytest.fail("probed a model the variant refuses"))
    name = {"swin": "swin_t", "vit2": "vit_2"}[model]
    out = tmp_path / "out"
    argv = ["linprobe", "--model", f"{name}=vit_tiny_patch16_224", "--variant", "dinov2-ms", "--out", str(out)]
    assert cli.main([*argv, *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not out.exists()


def test_prr_with_the_variant_is_refused_before_any_model(tmp_path, monkeypatch):
    from locatdino.evaluation import runner

    monkeypatch.setattr(runner, "load_backbones", lambda *a, **k: pytest.fail("built a model first"))
    argv = ["linprobe", "--model", "vit_tiny_patch16_224", "--variant", "dinov2", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match=r"^locatdino linprobe: --prr is not part of --variant dinov2 \(DINOv2 "):
        cli.main([*argv, *SMALL, "--prr"])


class _Pictures:
    """Two small non-square RGB pictures with 4-class masks (255: void), as a dataset reads them."""

    num_classes, ignore_index = 4, 255

    def __init__(self):
        from PIL import Image

        gen = torch.Generator().manual_seed(3)
        self.items = []
        for h, w in ((30, 45), (40, 26)):
            rgb = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()
            mask = torch.randint(0, 5, (h, w), generator=gen)
            mask[mask == 4] = 255
            self.items.append((Image.fromarray(rgb), Image.fromarray(mask.to(torch.uint8).numpy())))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _predict(batch):
    """Logits that change when the image is mirrored: colour channels plus a left-to-right ramp."""
    x = batch.float() / 255
    ramp = torch.arange(batch.shape[-1], dtype=torch.float32) / batch.shape[-1]
    return torch.stack([x[:, 0], x[:, 1] + ramp, x[:, 2] - ramp, x.mean(1) * 1.5], dim=1)


def test_evaluation_equals_an_independent_multiscale_flip_evaluation():
    """The whole evaluation (resize per scale, flip, sliding windows, un-flip, label-size softmax
    average, arg-max, confusion) against the same steps written out here (windows of whole
    patches: 16 px windows over short sides 16 and 24, patch 8)."""
    import numpy as np
    import torchvision.transforms.v2.functional as TF
    from torchvision.transforms import InterpolationMode

    from locatdino.evaluation.linprobe.multiscale import evaluate_views

    data, scales = _Pictures(), (1.0, 1.5)
    merged, single, skipped = evaluate_views(
        _predict, data, crop=16, stride=10, patch=8, scales=scales, flip=True, long_to_short=math.inf, num_workers=0
    )
    expected_merged, expected_single = np.zeros((4, 4), np.int64), np.zeros((4, 4), np.int64)
    for image, mask in data.items:
        image = torch.from_numpy(np.array(image)).permute(2, 0, 1)
        mask = torch.from_numpy(np.array(mask)).long()
        height, width = mask.shape
        probs = []
        for r in scales:
            f = int(16 * r) / min(height, width)
            scaled = TF.resize(
                image, [int(height * f + 0.5), int(width * f + 0.5)], InterpolationMode.BILINEAR, antialias=False
            )
            for flipped in (False, True):
                view = scaled.flip(-1) if flipped else scaled
                h, w = view.shape[-2:]
                total, count = torch.zeros(4, h, w), torch.zeros(h, w)
                for top in {min(i * 10, h - 16) for i in range((h - 16 + 9) // 10 + 1)}:
                    for left in {min(j * 10, w - 16) for j in range((w - 16 + 9) // 10 + 1)}:
                        total[:, top : top + 16, left : left + 16] += _predict(
                            view[None, :, top : top + 16, left : left + 16]
                        )[0]
                        count[top : top + 16, left : left + 16] += 1
                logits = total / count
                logits = logits.flip(-1) if flipped else logits
                up = F.interpolate(logits[None], size=(height, width), mode="bilinear", align_corners=False)[0]
                probs.append(torch.softmax(up, 0))
        for expected, chosen in ((expected_merged, probs), (expected_single, probs[:1])):
            pred = torch.stack(chosen).mean(0).argmax(0)
            keep = mask != 255
            np.add.at(expected, (mask[keep].numpy(), pred[keep].numpy()), 1)
    assert skipped == 0 and merged.matrix.sum() > 0
    np.testing.assert_array_equal(merged.matrix.numpy(), expected_merged)
    np.testing.assert_array_equal(single.matrix.numpy(), expected_single)
    assert not np.array_equal(expected_merged, expected_single)  # the flips and scales change predictions


def test_the_ms_training_resize_has_no_long_side_bound():
    """A 32 × 512 strip at crop 32, scale ratio 1: the paper's (2048, 512)-style bound (long side ≤ 4 × 128)
    shrinks it to 8 × 128 and pads the crop with ignored rows; DINOv2's "+ms" keeps it 32 px high."""
    from locatdino.evaluation.linprobe.dinov2_protocol import probe_augmentation
    from locatdino.evaluation.linprobe.transforms import IGNORE

    image = torch.randint(0, 256, (3, 32, 512), dtype=torch.uint8)
    target = torch.zeros(32, 512, dtype=torch.int32)
    target[:, 256:] = 1
    for variant, ignored in (("paper", 24 * 32), ("dinov2", 24 * 32), ("dinov2-ms", 0)):
        augmentation = probe_augmentation(variant, 32)
        assert augmentation.ratio == {"dinov2-ms": (1.0, 3.0)}.get(variant, (0.5, 2.0))
        fixed = type(augmentation)(32, ratio=(1.0, 1.0), long_to_short=augmentation.long_to_short, photometric=False)
        _, crop = fixed(image, target, torch.Generator().manual_seed(0))
        assert crop.shape == (32, 32) and int((crop == IGNORE).sum()) == ignored, variant
