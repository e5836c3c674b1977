"""DINOv2 release files (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``) load by the timm DINOv2 names and give
the official ViT's ``x_norm_clstoken`` / ``x_norm_patchtokens`` at 224 and 448 px, each release with
its own position-embedding rule (tiny random weights in the published layout; the reference forward
is written out in dinov2_reference.py)."""

import pytest
import torch
from safetensors.torch import save_file

from locatdino.models import create_backbone
from locatdino.models.checkpoints.mismatch import checkpoint_mismatch
from tests.models.checkpoints.dinov2_reference import dinov2_forward, relative_error, release_weights, swiglu_hidden

# (timm name, release layout, timm geometry of the tiny file)
RELEASES = {
    "plain": ("vit_small_patch14_dinov2", dict(width=32, depth=2), dict(embed_dim=32, depth=2, num_heads=2)),
    "reg4": (
        "vit_small_patch14_reg4_dinov2",
        dict(width=32, depth=2, registers=4),
        dict(embed_dim=32, depth=2, num_heads=2),
    ),
    # ViT-g's SwiGLU MLP, stored by training code with block_chunks=2 as blocks.{chunk}.{i}
    "swiglu-chunked": (
        "vit_giant_patch14_dinov2",
        dict(width=64, depth=4, swiglu=True, chunks=2),
        dict(embed_dim=64, depth=4, num_heads=2, mlp_ratio=2 * swiglu_hidden(64) / 64),
    ),
}


@pytest.fixture(scope="module")
def release_files(tmp_path_factory):
    """``{kind: (path, weights)}``: each release as the torch hub ``.pth`` it is published as."""
    folder = tmp_path_factory.mktemp("dinov2")
    files = {}
    for kind, (_, layout, _) in RELEASES.items():
        weights = release_weights(**layout, seed=len(files))
        torch.save(weights, folder / f"dinov2_{kind}_pretrain.pth")
        files[kind] = (folder / f"dinov2_{kind}_pretrain.pth", weights)
    return files


@pytest.mark.parametrize("kind", list(RELEASES))
def test_release_tokens_equal_the_official_forward_at_224_and_448_px(release_files, kind):
    name, _, geometry = RELEASES[kind]
    path, weights = release_files[kind]
    model = create_backbone(name, path, **geometry).eval()
    assert model.patch_embed.img_size == (518, 518)  # built where the release was trained
    assert model.pos_embed_rule == ("timm" if kind == "reg4" else "dino")  # --pos-embed auto: the release's rule
    registers = 4 if kind == "reg4" else 0
    heads = geometry["num_heads"]
    torch.manual_seed(0)
    for size in (224, 448):
        images = torch.randn(2, 3, size, size)
        cls, patches = dinov2_forward(weights, images, heads)
        with torch.no_grad():
            tokens = model.forward_features(images)
        assert tokens.shape == (2, 1 + registers + (size // 14) ** 2, geometry["embed_dim"])
        assert relative_error(tokens[:, 0], cls) < 1e-4
        assert relative_error(tokens[:, 1 + registers :], patches) < 1e-4


@pytest.mark.parametrize("kind", ["plain", "reg4"])
def test_a_release_rebuilt_at_another_img_size_keeps_its_rule(release_files, kind):
    """``img_size=224`` resamples the release's 37 × 37 position embeddings once, at load, by the
    release's own rule (timm's conversion, which would resample by timm's, gets them at the model's grid)."""
    name, _, geometry = RELEASES[kind]
    path, weights = release_files[kind]
    model = create_backbone(name, path, img_size=224, **geometry).eval()
    assert model.patch_embed.grid_size == (16, 16)
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    cls, patches = dinov2_forward(weights, images, geometry["num_heads"])
    with torch.no_grad():
        tokens = model.forward_features(images)
    skip = 5 if kind == "reg4" else 1
    assert relative_error(tokens[:, 0], cls) < 1e-4
    assert relative_error(tokens[:, skip:], patches) < 1e-4


def test_the_other_rule_would_be_measurably_wrong(release_files):
    """The rules differ at 448 px by far more than the tolerance above, so the check can fail."""
    path, weights = release_files["plain"]
    name, _, geometry = RELEASES["plain"]
    images = torch.randn(1, 3, 448, 448)
    _, patches = dinov2_forward(weights, images, geometry["num_heads"])
    with torch.no_grad():
        other = create_backbone(name, path, pos_embed="timm", **geometry).eval().forward_features(images)
    assert relative_error(other[:, 1:], patches) > 1e-3


def test_a_release_saved_as_safetensors_loads_the_same(release_files, tmp_path):
    path, weights = release_files["reg4"]
    save_file(weights, tmp_path / "dinov2_vits14_reg4.safetensors")
    name, _, geometry = RELEASES["reg4"]
    from_pth = create_backbone(name, path, **geometry).state_dict()
    from_safetensors = create_backbone(name, tmp_path / "dinov2_vits14_reg4.safetensors", **geometry).state_dict()
    assert from_pth.keys() == from_safetensors.keys()
    assert all(torch.equal(from_pth[k], from_safetensors[k]) for k in from_pth)


def test_registers_and_no_registers_name_the_model_to_use(release_files):
    with pytest.raises(ValueError) as err:
        create_backbone("vit_small_patch14_dinov2", release_files["reg4"][0], **RELEASES["plain"][2])
    assert str(err.value) == (
        f"{release_files['reg4'][0]}: the file has 4 register tokens but vit_small_patch14_dinov2 "
        "has 0: use vit_small_patch14_reg4_dinov2"
    )
    with pytest.raises(
        ValueError,
        match=r"has 0 register tokens but vit_small_patch14_reg4_dinov2 has 4: use "
        r"vit_small_patch14_dinov2$",
    ):
        create_backbone("vit_small_patch14_reg4_dinov2", release_files["plain"][0], **RELEASES["reg4"][2])


def test_a_vit_g_release_for_a_vit_s_name_is_named_both_ways():
    """The shapes of the real ViT-g/14 and ViT-S/14 (meta tensors: nothing allocated)."""
    import timm

    with torch.device("meta"):
        giant = timm.create_model("vit_giant_patch14_dinov2", num_classes=0).state_dict()
        small = timm.create_model("vit_small_patch14_dinov2", num_classes=0).state_dict()
    message = checkpoint_mismatch(giant, small)
    assert message.startswith("cls_token: checkpoint [1, 1, 1536] vs model [1, 1, 384]; ")
    assert message.endswith(
        "unexpected blocks.12.norm1.weight, blocks.12.norm1.bias, blocks.12.attn.qkv.weight "
        "(+389 more) — a ViT-g/14 checkpoint for a ViT-S/14 model?"
    )


def test_a_dinov2_teacher_checkpoint_gives_the_chunked_teacher_backbone(release_files, tmp_path):
    """DINOv2 training's ``teacher_checkpoint.pth``: ``{"teacher": {backbone.*, dino_head.*, ibot_head.*}}``."""
    path, weights = release_files["swiglu-chunked"]
    name, _, geometry = RELEASES["swiglu-chunked"]
    torch.save(
        {
            "teacher": {
                **{f"backbone.{k}": v for k, v in weights.items()},
                "dino_head.last_layer.weight_g": torch.ones(8, 1),
                "ibot_head.mlp.0.weight": torch.ones(8, 64),
            }
        },
        tmp_path / "teacher_checkpoint.pth",
    )
    teacher = create_backbone(name, tmp_path / "teacher_checkpoint.pth", **geometry)
    release = create_backbone(name, path, **geometry)
    assert teacher.pos_embed_rule == release.pos_embed_rule == "dino"
    assert all(torch.equal(v, release.state_dict()[k]) for k, v in teacher.state_dict().items())
    with pytest.raises(ValueError, match="holds only the teacher"):
        create_backbone(name, tmp_path / "teacher_checkpoint.pth", which="student", **geometry)
