"""DINOv3 checkpoints load by timm's DINOv3 names and give the official ViT's ``x_norm_clstoken`` /
``x_norm_patchtokens`` at 224 and 448 px: Meta's release ``.pth`` (GELU and SwiGLU MLP), its training
``teacher_checkpoint.pth``, a Hugging Face ``DINOv3ViTModel`` folder and timm-layout files, an
export of a ``fit`` run too. Tiny random weights in the published layouts; the reference forward is
written out in dinov3_reference.py."""

import json

import pytest
import timm
import torch

from locatdino.models import create_backbone
from locatdino.ssl.export import cli as export
from tests.models.checkpoints.dinov2_reference import relative_error
from tests.models.checkpoints.dinov3_reference import dinov3_forward, release_weights, swiglu_hidden

HEADS = 2
# (timm name, release layout, timm geometry of the tiny file)
RELEASES = {
    "vits16": (
        "vit_small_patch16_dinov3_qkvb",
        dict(width=32, depth=2, heads=HEADS),
        dict(embed_dim=32, depth=2, num_heads=HEADS),
    ),
    # ViT-S+/16's SwiGLU MLP (ratio 6, hidden aligned to 8)
    "vits16plus": (
        "vit_small_plus_patch16_dinov3_qkvb",
        dict(width=32, depth=2, heads=HEADS, swiglu=True, ratio=6.0),
        dict(embed_dim=32, depth=2, num_heads=HEADS),
    ),
}
TINY = RELEASES["vits16"][2]


def _images(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))


def _assert_official_tokens(model, weights, sizes=(224, 448)) -> None:
    for size in sizes:
        images = _images(size)
        cls, patches = dinov3_forward(weights, images, HEADS)
        with torch.no_grad():
            tokens = model.forward_features(images)
        assert tokens.shape == (2, 1 + 4 + (size // 16) ** 2, weights["cls_token"].shape[-1])
        assert relative_error(tokens[:, 0], cls) < 1e-4, size
        assert relative_error(tokens[:, 5:], patches) < 1e-4, size


@pytest.mark.parametrize("kind", list(RELEASES))
def test_release_tokens_equal_the_official_forward_at_224_and_448_px(tmp_path, kind):
    name, layout, geometry = RELEASES[kind]
    weights = release_weights(**layout)
    torch.save(weights, tmp_path / f"dinov3_{kind}_pretrain_lvd1689m.pth")
    model = create_backbone(name, tmp_path / f"dinov3_{kind}_pretrain_lvd1689m.pth", **geometry).eval()
    assert model.global_pool == "token" and model.pos_embed_rule == "timm"  # the class token; RoPE, nothing resampled
    if layout.get("swiglu"):
        assert model.blocks[0].mlp.fc1_g.out_features == swiglu_hidden(32, 6.0)
    _assert_official_tokens(model, weights)
    with torch.no_grad():  # the pooled feature the evaluations take is the class token
        assert torch.equal(model(_images(224)), model.forward_features(_images(224))[:, 0])


def test_training_teacher_checkpoint_loads_its_backbone(tmp_path):
    weights = release_weights(32, 2, HEADS, seed=1)
    teacher = {f"backbone.{k}": v for k, v in weights.items()}
    teacher["dino_head.mlp.0.weight"] = torch.zeros(8, 32)
    torch.save({"teacher": teacher}, tmp_path / "teacher_checkpoint.pth")
    model = create_backbone("vit_small_patch16_dinov3_qkvb", tmp_path / "teacher_checkpoint.pth", **TINY).eval()
    _assert_official_tokens(model, weights, sizes=(224,))


def test_hugging_face_folder_and_its_safetensors_give_transformers_tokens(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DINOv3ViTModel"):
        pytest.skip("transformers without DINOv3ViTModel (< 4.56)")
    config = transformers.DINOv3ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=128,
        num_register_tokens=4,
        image_size=224,
        patch_size=16,
    )
    torch.manual_seed(0)
    reference = transformers.DINOv3ViTModel(config).eval()
    with torch.no_grad():
        for p in reference.parameters():  # q / v biases and layer scales count
            p.normal_(0, 0.2)
    reference.save_pretrained(tmp_path / "dinov3-vits16")
    for source in (tmp_path / "dinov3-vits16", tmp_path / "dinov3-vits16" / "model.safetensors"):
        model = create_backbone("vit_small_patch16_dinov3_qkvb", source, **TINY).eval()
        for size in (224, 448):
            with torch.no_grad():
                expected = reference(pixel_values=_images(size)).last_hidden_state
                tokens = model.forward_features(_images(size))
            assert relative_error(tokens[:, 0], expected[:, 0]) < 1e-4
            assert relative_error(tokens[:, 5:], expected[:, 5:]) < 1e-4


def test_hugging_face_config_with_another_rope_base_is_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DINOv3ViTModel"):
        pytest.skip("transformers without DINOv3ViTModel (< 4.56)")
    config = transformers.DINOv3ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=HEADS, intermediate_size=64, num_register_tokens=4
    )
    transformers.DINOv3ViTModel(config).save_pretrained(tmp_path / "m")
    edited = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**edited, "rope_theta": 10000.0}))
    with pytest.raises(ValueError) as err:
        create_backbone("vit_small_patch16_dinov3_qkvb", tmp_path / "m", embed_dim=32, depth=1, num_heads=HEADS)
    assert str(err.value) == (
        f"{tmp_path / 'm' / 'config.json'}: rope_theta 10000.0 but timm's DINOv3 RoPE has base 100 "
        "(does this config.json belong to these weights?)"
    )


def test_a_file_in_timm_keys_loads_with_its_four_registers(tmp_path):
    """Refused before as 'the file has 4 register tokens but vit_small_patch16_dinov3 has 0'."""
    torch.manual_seed(0)
    made = timm.create_model("vit_small_patch16_dinov3", num_classes=0, **TINY).eval()
    torch.save(made.state_dict(), tmp_path / "timm.pth")
    model = create_backbone("vit_small_patch16_dinov3", tmp_path / "timm.pth", **TINY).eval()
    with torch.no_grad():
        assert torch.equal(model.forward_features(_images(64)), made.forward_features(_images(64)))


def test_export_of_a_fit_run_with_a_dinov3_backbone(tmp_path):
    """``export`` of a run that ``fit --model.backbone vit_small_patch16_dinov3`` trained (refused before
    by the register count), loaded back into plain timm."""
    torch.manual_seed(0)
    teacher = create_backbone("vit_small_patch16_dinov3", **TINY).eval()
    with torch.no_grad():
        for p in teacher.parameters():
            p.normal_(0, 0.1)
    state = {f"{branch}.backbone.{k}": v for k, v in teacher.state_dict().items() for branch in ("teacher", "student")}
    hparams = {
        "backbone": "vit_small_patch16_dinov3",
        "backbone_kwargs": TINY,
        "_class_path": "locatdino.ssl.DINOModule",
    }
    ckpt = {"pytorch-lightning_version": "2.5.0", "state_dict": state, "global_step": 3, "evaluated_network": "teacher"}
    torch.save({**ckpt, "hyper_parameters": hparams}, tmp_path / "last.ckpt")
    assert export.main([str(tmp_path / "last.ckpt"), str(tmp_path / "teacher.pth")]) == 0
    plain = timm.create_model("vit_small_patch16_dinov3", num_classes=0, global_pool="token", **TINY).eval()
    plain.load_state_dict(torch.load(tmp_path / "teacher.pth", weights_only=True))
    with torch.no_grad():
        assert torch.equal(plain.forward_features(_images(64)), teacher.forward_features(_images(64)))


def test_q_v_biases_are_refused_by_the_bias_free_name_which_would_be_wrong(tmp_path):
    weights = release_weights(32, 2, HEADS, seed=2)
    torch.save(weights, tmp_path / "dinov3_vits16.pth")
    with pytest.raises(ValueError) as err:
        create_backbone("vit_small_patch16_dinov3", tmp_path / "dinov3_vits16.pth", **TINY)
    assert str(err.value) == (
        f"{tmp_path / 'dinov3_vits16.pth'}: holds non-zero q / v biases (attn.qkv.bias) but vit_small_patch16_dinov3 "
        "has none, so its tokens would differ from DINOv3's: use vit_small_patch16_dinov3_qkvb"
    )
    # what the bias-free model would give: the weights without their q / v biases
    without = {
        k: (v * torch.cat([torch.zeros(32), torch.ones(32), torch.zeros(32)]) if k.endswith("qkv.bias") else v)
        for k, v in weights.items()
    }
    cls, _ = dinov3_forward(weights, _images(224), HEADS)
    wrong_cls, _ = dinov3_forward(without, _images(224), HEADS)
    assert relative_error(wrong_cls, cls) > 1e-3


def test_zero_q_v_biases_load_into_the_bias_free_name(tmp_path):
    """The distilled releases store all-zero q / v biases: the plain name gives the same tokens."""
    weights = release_weights(32, 2, HEADS, qv_bias=False, seed=3)
    torch.save(weights, tmp_path / "dinov3_distilled.pth")
    model = create_backbone("vit_small_patch16_dinov3", tmp_path / "dinov3_distilled.pth", **TINY).eval()
    assert model.blocks[0].attn.q_bias is None
    _assert_official_tokens(model, weights, sizes=(224,))


def test_an_unmasked_k_bias_and_other_rope_periods_are_refused(tmp_path):
    weights = release_weights(32, 1, HEADS, seed=4)
    unmasked = {k: v for k, v in weights.items() if not k.endswith("bias_mask")}
    torch.save(unmasked, tmp_path / "unmasked.pth")
    other = {**weights, "rope_embed.periods": weights["rope_embed.periods"] * 2}
    torch.save(other, tmp_path / "periods.pth")
    one = dict(embed_dim=32, depth=1, num_heads=HEADS)
    with pytest.raises(ValueError, match=r"unmasked.pth: has a non-zero k bias in attn.qkv.bias"):
        create_backbone("vit_small_patch16_dinov3_qkvb", tmp_path / "unmasked.pth", **one)
    with pytest.raises(
        ValueError,
        match=r"periods.pth: rope_embed.periods \[2.0, 6.3246, 20.0\]\.\.\. differ from "
        r"vit_small_patch16_dinov3_qkvb.s RoPE \[1.0, 3.1623, 10.0\]",
    ):
        create_backbone("vit_small_patch16_dinov3_qkvb", tmp_path / "periods.pth", **one)


def test_fit_starts_student_and_teacher_from_a_release(tmp_path):
    """``fit --model.backbone_checkpoint dinov3_….pth``: both backbones hold the release's weights."""
    from locatdino.ssl import DINOModule

    weights = release_weights(32, 2, HEADS, seed=5)
    torch.save(weights, tmp_path / "dinov3_vits16.pth")
    module = DINOModule(
        backbone="vit_small_patch16_dinov3_qkvb",
        backbone_kwargs=TINY,
        backbone_checkpoint=str(tmp_path / "dinov3_vits16.pth"),
        out_dim=16,
        hidden_dim=16,
        bottleneck_dim=8,
    )
    for branch in (module.student, module.teacher):
        backbone = branch["backbone"].eval()
        assert backbone.global_pool == "token"
        _assert_official_tokens(backbone, weights, sizes=(224,))
