"""A file for another model is refused in one line naming the file and what it holds, before any data is
read or output written: a ViT-L DINOv3 release for a ViT-S name, a DINOv3 release under a DINOv2 name,
a DINOv2 release under a DINOv3 name, a Swin Transformer under a ViT name."""

import pytest
import timm
import torch

from locatdino import cli as command_line
from tests.models.checkpoints.dinov2_reference import release_weights as dinov2_release


def hollow_dinov3_release(width: int, depth: int, heads: int) -> dict[str, torch.Tensor]:
    """A DINOv3 release's keys and shapes (GELU MLP, q / v biases), every tensor but the RoPE periods and
    the bias masks one stored value broadcast (stride 0): a ViT-L-sized release in a few kilobytes."""

    def one(*shape: int) -> torch.Tensor:
        return torch.full((1,), 0.5).expand(*shape)

    head_dim = width // heads
    w = {
        "cls_token": one(1, 1, width),
        "storage_tokens": one(1, 4, width),
        "mask_token": one(1, width),
        "patch_embed.proj.weight": one(width, 3, 16, 16),
        "patch_embed.proj.bias": one(width),
        "rope_embed.periods": 100.0 ** (2 * torch.arange(head_dim // 4) / (head_dim // 2)),
        "norm.weight": one(width),
        "norm.bias": one(width),
    }
    for i in range(depth):
        p = f"blocks.{i}."
        w |= {p + f"{n}.{t}": one(width) for n in ("norm1", "norm2") for t in ("weight", "bias")}
        w |= {p + "ls1.gamma": one(width), p + "ls2.gamma": one(width)}
        w |= {p + "attn.qkv.weight": one(3 * width, width), p + "attn.qkv.bias": one(3 * width)}
        w[p + "attn.qkv.bias_mask"] = torch.cat([torch.ones(width), torch.zeros(width), torch.ones(width)])
        w |= {p + "attn.proj.weight": one(width, width), p + "attn.proj.bias": one(width)}
        w |= {p + "mlp.fc1.weight": one(4 * width, width), p + "mlp.fc1.bias": one(4 * width)}
        w |= {p + "mlp.fc2.weight": one(width, 4 * width), p + "mlp.fc2.bias": one(width)}
    return w


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """``{case: (--model value, path, what the line says after 'locatdino hbird: ')}``."""
    tmp = tmp_path_factory.mktemp("families")
    large = tmp / "dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth"
    torch.save(hollow_dinov3_release(1024, 24, 16), large)
    assert large.stat().st_size < 2_000_000  # the broadcast tensors are stored once
    small = tmp / "dinov3_vits16_pretrain_lvd1689m-08c60483.pth"
    torch.save(hollow_dinov3_release(384, 12, 6), small)
    dinov2 = tmp / "dinov2_vits14_pretrain.pth"
    torch.save(dinov2_release(32, 2), dinov2)
    swin = tmp / "swin.pth"
    made = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=16, depths=(1, 1), num_heads=(1, 2))
    torch.save(made.state_dict(), swin)
    return {
        "ViT-L DINOv3 for ViT-S": (
            f"vit_small_patch16_dinov3_qkvb:{large}",
            large,
            f"{large}: holds DINOv3 ViT-L/16 (1024 wide, 24 blocks, 16 heads) weights but "
            "vit_small_patch16_dinov3_qkvb is 384 wide, 12 blocks, 6 heads: use vit_large_patch16_dinov3_qkvb",
        ),
        "DINOv3 under a DINOv2 name": (
            f"vit_small_patch14_dinov2:{small}",
            small,
            f"{small}: holds DINOv3 ViT-S/16 (384 wide, 12 blocks, 6 heads) weights (RoPE, no position embedding) "
            "but vit_small_patch14_dinov2 is a VisionTransformer: use vit_small_patch16_dinov3_qkvb",
        ),
        "DINOv2 under a DINOv3 name": (
            f"vit_small_patch16_dinov3:{dinov2}",
            dinov2,
            f"{dinov2}: holds a ViT (width 32, 2 blocks, /14) with absolute position embeddings (DINO / DINOv2) "
            "but vit_small_patch16_dinov3 is DINOv3's RoPE ViT: name the model the file is for",
        ),
        "Swin under a ViT name": (
            f"vit_small_patch16_224:{swin}",
            swin,
            f"{swin}: holds a Swin Transformer (16 wide, depths 1-1, /4) but vit_small_patch16_224 is a "
            "VisionTransformer: name the Swin model the file is for",
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["ViT-L DINOv3 for ViT-S", "DINOv3 under a DINOv2 name", "DINOv2 under a DINOv3 name", "Swin under a ViT name"],
)
def test_a_file_of_another_model_is_refused_in_one_line_before_work(files, tmp_path, capsys, case):
    model, path, says = files[case]
    argv = ["hbird", "--model", model, "--num-train", "4", "--num-val", "2", "--scene-size", "32"]
    argv += ["--input-size", "32", "--workers", "0", "--no-progress", "--batch-size", "2", "--out", str(tmp_path / "o")]
    assert command_line.main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0] == f"locatdino hbird: {says}", lines[0]
    assert str(path) in lines[0]
    assert list(tmp_path.iterdir()) == []  # no --out
