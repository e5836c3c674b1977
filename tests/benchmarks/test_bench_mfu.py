"""benchmarks/speed/mfu.py: the FLOP count behind its MFU, against hand counts (no timing)."""

import timm
import torch

from benchmarks.speed import mfu as bench_mfu


def test_a_linear_layer_costs_2_bio_forward_and_4_bio_backward():
    layer = torch.nn.Linear(12, 5)
    x = torch.randn(7, 12, requires_grad=True)
    assert bench_mfu.count_flops(lambda: layer(x)) == 2 * 7 * 12 * 5
    assert bench_mfu.count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * 7 * 12 * 5  # + grad x, grad W


def test_a_tiny_vit_forward_matches_the_hand_count():
    """Patch embedding, and per block qkv, q·kᵀ, attention·v, projection and the 4x MLP; the
    CPU's fused attention is counted (torch's counter knows only the CUDA kernels)."""
    b, img, p, d, depth = 2, 32, 8, 16, 2
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=img, patch_size=p, embed_dim=d, depth=depth, num_heads=2, num_classes=0
    ).eval()
    x = torch.randn(b, 3, img, img)
    patches = (img // p) ** 2
    n = patches + 1  # + class token
    embed = 2 * b * patches * (3 * p * p) * d
    block = 2 * b * n * d * 3 * d + 2 * (2 * b * n * n * d) + 2 * b * n * d * d + 2 * (2 * b * n * d * 4 * d)
    assert bench_mfu.count_flops(lambda: model(x)) == embed + depth * block


def test_model_flops_of_the_dino_step_are_what_one_step_computes():
    """Teacher forward + 3 x student forward = every FLOP counted in one whole step (toy size, CPU),
    but the input gradient of the patch embedding, which nobody asks for."""
    step = bench_mfu.DinoStep.of("vit_small_patch16_224", 2, bench_mfu.TOY, torch.device("cpu"))
    g, loc = step.crops
    patches = (
        g.shape[0] * g.shape[1] * (g.shape[-1] // 16) ** 2 + loc.shape[0] * loc.shape[1] * (loc.shape[-1] // 16) ** 2
    )
    conv_input_grad = 2 * patches * 3 * 16 * 16 * 64
    assert bench_mfu.count_flops(step) == step.model_flops() - conv_input_grad
