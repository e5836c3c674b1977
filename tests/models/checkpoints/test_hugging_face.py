"""Hugging Face transformers files — ``Dinov2Model`` (with and without registers, SwiGLU) and ``ViTModel`` —
as ``model.safetensors`` / ``pytorch_model.bin``, alone or in their folder with ``config.json``: the
tokens of the loaded backbone equal transformers' own at the native grid (when transformers is
installed) and the written-out DINOv2 forward (files made from a key map of the published layout)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from locatdino.models import create_backbone
from tests.models.checkpoints.dinov2_reference import dinov2_forward, relative_error, release_weights, swiglu_hidden

SMALL = dict(embed_dim=32, depth=2, num_heads=2)


# --- files written by transformers' save_pretrained ------------------------------------------------------------


def _transformers_model(kind: str):
    """A small transformers model with every weight random (layer scale and norms included)."""
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    if kind == "vit":
        model = transformers.ViTModel(
            transformers.ViTConfig(**common, intermediate_size=128, image_size=32, patch_size=8, layer_norm_eps=1e-12)
        )
    elif kind == "dinov2-registers":
        model = transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**common, image_size=56, patch_size=14, num_register_tokens=4)
        )
    else:
        model = transformers.Dinov2Model(
            transformers.Dinov2Config(**common, image_size=56, patch_size=14, use_swiglu_ffn=kind == "dinov2-swiglu")
        )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.2).add_(1.0 if ("norm" in name and name.endswith("weight")) or "lambda" in name else 0.0)
    return model.eval()


TRANSFORMERS = {  # kind: (timm name, extra geometry, image size)
    "dinov2": ("vit_small_patch14_dinov2", {}, 56),
    "dinov2-registers": ("vit_small_patch14_reg4_dinov2", {}, 56),
    "dinov2-swiglu": ("vit_giant_patch14_dinov2", dict(mlp_ratio=2 * swiglu_hidden(32) / 32), 56),
    "vit": ("vit_small_patch16_224", {}, 32),
}


@pytest.mark.parametrize("kind", list(TRANSFORMERS))
def test_save_pretrained_folder_and_its_files_give_transformers_tokens(kind, tmp_path):
    reference = _transformers_model(kind)
    reference.save_pretrained(tmp_path / "repo")
    name, extra, size = TRANSFORMERS[kind]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tmp_path / "repo" / "model.safetensors", alone / "model.safetensors")
    # the published layout as a pickle (transformers' in-memory key names are not what it saves)
    torch.save(load_file(tmp_path / "repo" / "model.safetensors"), tmp_path / "pytorch_model.bin")
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = reference(pixel_values=images).last_hidden_state
    for checkpoint in (
        tmp_path / "repo",
        tmp_path / "repo" / "model.safetensors",
        alone / "model.safetensors",
        tmp_path / "pytorch_model.bin",
    ):
        model = create_backbone(name, checkpoint, **SMALL, **extra).eval()
        assert model.patch_embed.img_size == (size, size)
        assert model.pos_embed_rule == ("timm" if kind == "dinov2-registers" else "dino")
        with torch.no_grad():
            tokens = model.forward_features(images)
        assert tokens.shape == expected.shape
        # the ViTModel's LayerNorm eps is 1e-12, timm's 1e-6: the one allowed difference
        assert relative_error(tokens, expected) < 1e-4, checkpoint


# --- files written from the published key layout --------------------------------------------------------------


def _published_dinov2_keys(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Release keys → the Dinov2Model keys of facebook/dinov2-* (q, k, v stored apart)."""
    out = {
        "embeddings.cls_token": w["cls_token"],
        "embeddings.mask_token": w["mask_token"],
        "embeddings.position_embeddings": w["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": w["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": w["patch_embed.proj.bias"],
        "layernorm.weight": w["norm.weight"],
        "layernorm.bias": w["norm.bias"],
    }
    if "register_tokens" in w:
        out["embeddings.register_tokens"] = w["register_tokens"]
    depth = len([k for k in w if k.endswith("norm1.weight")])
    names = {
        "norm1": "norm1",
        "norm2": "norm2",
        "attn.proj": "attention.output.dense",
        "mlp.fc1": "mlp.fc1",
        "mlp.fc2": "mlp.fc2",
        "mlp.w12": "mlp.weights_in",
        "mlp.w3": "mlp.weights_out",
    }
    for i in range(depth):
        src, dst = f"blocks.{i}.", f"encoder.layer.{i}."
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                if f"{src}{ours}.{part}" in w:
                    out[f"{dst}{theirs}.{part}"] = w[f"{src}{ours}.{part}"]
        for part in ("weight", "bias"):
            q, k, v = w[f"{src}attn.qkv.{part}"].chunk(3)
            out.update(
                {
                    f"{dst}attention.attention.query.{part}": q,
                    f"{dst}attention.attention.key.{part}": k,
                    f"{dst}attention.attention.value.{part}": v,
                }
            )
        out[f"{dst}layer_scale1.lambda1"] = w[f"{src}ls1.gamma"]
        out[f"{dst}layer_scale2.lambda1"] = w[f"{src}ls2.gamma"]
    return out


def _published_vit_keys(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DINO v1 ViT (release keys, no layer scale) → the ViTModel keys of facebook/dino-vit*, with its pooler."""
    hf = _published_dinov2_keys(w)
    out = {}
    for key, value in hf.items():
        if "layer_scale" in key or "mask_token" in key:
            continue
        key = (
            key.replace(".norm1.", ".layernorm_before.")
            .replace(".norm2.", ".layernorm_after.")
            .replace(".mlp.fc1.", ".intermediate.dense.")
            .replace(".mlp.fc2.", ".output.dense.")
        )
        out[key] = value
    width = w["cls_token"].shape[-1]
    return {**out, "pooler.dense.weight": torch.zeros(width, width), "pooler.dense.bias": torch.zeros(width)}


@pytest.mark.parametrize("registers,swiglu", [(0, False), (4, False), (0, True)])
def test_a_dinov2_model_file_equals_the_official_forward(tmp_path, registers, swiglu):
    weights = release_weights(32, 2, registers=registers, swiglu=swiglu, seed=3)
    save_file(_published_dinov2_keys(weights), tmp_path / "model.safetensors")
    name = (
        "vit_giant_patch14_dinov2"
        if swiglu
        else ("vit_small_patch14_reg4_dinov2" if registers else "vit_small_patch14_dinov2")
    )
    extra = dict(mlp_ratio=2 * swiglu_hidden(32) / 32) if swiglu else {}
    model = create_backbone(name, tmp_path / "model.safetensors", **SMALL, **extra).eval()
    images = torch.randn(1, 3, 224, 224)
    cls, patches = dinov2_forward(weights, images, heads=2)
    with torch.no_grad():
        tokens = model.forward_features(images)
    assert relative_error(tokens[:, 0], cls) < 1e-4 and relative_error(tokens[:, 1 + registers :], patches) < 1e-4


def test_a_task_model_file_gives_its_backbone(tmp_path):
    """Dinov2ForImageClassification: the backbone under ``dinov2.``, a classifier beside it."""
    hf = _published_dinov2_keys(release_weights(32, 2, seed=6))
    save_file(hf, tmp_path / "base.safetensors")
    save_file(
        {
            **{f"dinov2.{k}": v for k, v in hf.items()},
            "classifier.weight": torch.zeros(10, 64),
            "classifier.bias": torch.zeros(10),
        },
        tmp_path / "task.safetensors",
    )
    base = create_backbone("vit_small_patch14_dinov2", tmp_path / "base.safetensors", **SMALL).state_dict()
    task = create_backbone("vit_small_patch14_dinov2", tmp_path / "task.safetensors", **SMALL).state_dict()
    assert base.keys() == task.keys() and all(torch.equal(base[k], task[k]) for k in base)


def test_a_vit_model_file_equals_the_dino_v1_forward(tmp_path):
    weights = release_weights(32, 2, seed=4)
    for i in range(2):  # DINO v1 has no layer scale: the reference forward with gammas of 1
        weights[f"blocks.{i}.ls1.gamma"] = weights[f"blocks.{i}.ls2.gamma"] = torch.ones(32)
    torch.save(_published_vit_keys(weights), tmp_path / "pytorch_model.bin")
    model = create_backbone("vit_small_patch16_224", tmp_path / "pytorch_model.bin", **SMALL).eval()
    assert model.patch_embed.patch_size == (14, 14) and model.pos_embed_rule == "dino"
    images = torch.randn(1, 3, 518, 518)  # the native grid
    cls, patches = dinov2_forward(weights, images, heads=2, eps=1e-12)
    with torch.no_grad():
        tokens = model.forward_features(images)
    assert relative_error(tokens[:, 0], cls) < 1e-4 and relative_error(tokens[:, 1:], patches) < 1e-4


# --- config.json ---------------------------------------------------------------------------------------------

DINOV2_CONFIG = dict(
    model_type="dinov2",
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    patch_size=14,
    image_size=518,
    mlp_ratio=4,
    use_swiglu_ffn=False,
    layer_norm_eps=1e-6,
)


@pytest.mark.parametrize(
    "change,says",
    [
        ({}, None),
        ({"hidden_size": 384}, "hidden_size 384 but the weights are 32 wide"),
        ({"num_hidden_layers": 12}, "num_hidden_layers 12 but the weights have 2 layers"),
        ({"image_size": 224}, "image_size 224 but the weights' position embeddings are for 518 px"),
        (
            {"model_type": "dinov2_with_registers", "num_register_tokens": 4},
            "num_register_tokens 4 but the weights have 0 register tokens",
        ),
        ({"use_swiglu_ffn": True}, "use_swiglu_ffn true but the weights' MLP is fc1/fc2"),
        ({"model_type": "vit"}, "model_type 'vit' but the weights are a Dinov2Model"),
        ({"num_attention_heads": 6}, "num_attention_heads 6 but the model has 2 heads"),
    ],
)
def test_a_config_that_disagrees_with_the_weights_is_refused(tmp_path, change, says):
    save_file(_published_dinov2_keys(release_weights(32, 2, seed=5)), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**DINOV2_CONFIG, **change}))
    for checkpoint in (tmp_path, tmp_path / "model.safetensors"):
        if says is None:
            assert create_backbone("vit_small_patch14_dinov2", checkpoint, **SMALL).pos_embed_rule == "dino"
            continue
        with pytest.raises(ValueError) as err:
            create_backbone("vit_small_patch14_dinov2", checkpoint, **SMALL)
        assert str(err.value).startswith(f"{tmp_path / 'config.json'}: {says}") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key,value,says",
    [
        (
            "hidden_act",
            "relu",
            'hidden_act "relu" but the model\'s MLP computes gelu (pass a model with that activation)',
        ),
        ("hidden_act", "gelu_new", 'hidden_act "gelu_new" but the model\'s MLP computes gelu'),
        ("qkv_bias", False, "qkv_bias false but the model's attention has q, k, v bias"),
        ("layer_norm_eps", 1e-2, "layer_norm_eps 0.01 but the model's LayerNorm ε is 1e-06"),
    ],
)
def test_a_config_setting_the_model_does_not_compute_is_refused(tmp_path, key, value, says):
    """transformers builds its activation, q, k, v biases and LayerNorm ε from config.json; the
    weights alone loaded as they are would compute another network than transformers' own."""
    transformers = pytest.importorskip("transformers")
    _transformers_model("vit").save_pretrained(tmp_path / "repo")
    config = json.loads((tmp_path / "repo" / "config.json").read_text())
    (tmp_path / "repo" / "config.json").write_text(json.dumps({**config, key: value}))
    reference = transformers.ViTModel.from_pretrained(tmp_path / "repo").eval()  # its own reading of it
    assert getattr(reference.config, key) == value
    (tmp_path / "alone").mkdir()
    shutil.copy(tmp_path / "repo" / "model.safetensors", tmp_path / "alone" / "model.safetensors")
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(pixel_values=images).last_hidden_state
        ignored = create_backbone("vit_small_patch16_224", tmp_path / "alone", **SMALL).eval().forward_features(images)
    # the setting matters: ignoring it is a wrong result (measured: the tanh GELU 1.6e-4 relative, an ε
    # of 1e-2 1.6e-2, no q, k, v bias 0.24, ReLU 0.12; an ε of 1e-12 instead of 1e-6 stays < 1e-4 above)
    assert relative_error(ignored, expected) > 5e-5
    with pytest.raises(ValueError) as err:
        create_backbone("vit_small_patch16_224", tmp_path / "repo", **SMALL)
    assert str(err.value).startswith(f"{tmp_path / 'repo' / 'config.json'}: {says}"), str(err.value)
    assert "\n" not in str(err.value)


def test_settings_the_model_computes_are_accepted(tmp_path):
    """gelu_python is the exact GELU timm computes; a SwiGLU Dinov2Model ignores hidden_act (it
    always computes SiLU); an ε of 1e-12 is within 1e-6 of timm's."""
    save_file(_published_dinov2_keys(release_weights(32, 2, seed=5)), tmp_path / "model.safetensors")
    for change in ({"hidden_act": "gelu_python"}, {"layer_norm_eps": 1e-12}, {"qkv_bias": True}):
        (tmp_path / "config.json").write_text(json.dumps({**DINOV2_CONFIG, **change}))
        assert create_backbone("vit_small_patch14_dinov2", tmp_path, **SMALL).pos_embed_rule == "dino"
    (tmp_path / "config.json").write_text(json.dumps({**DINOV2_CONFIG, "hidden_act": "no_such_activation"}))
    with pytest.raises(ValueError, match=r'config.json: hidden_act "no_such_activation" is not an activation'):
        create_backbone("vit_small_patch14_dinov2", tmp_path, **SMALL)
    weights = release_weights(32, 2, swiglu=True, seed=5)
    save_file(_published_dinov2_keys(weights), tmp_path / "model.safetensors")
    config = {**DINOV2_CONFIG, "use_swiglu_ffn": True, "hidden_act": "relu"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    create_backbone("vit_giant_patch14_dinov2", tmp_path, **SMALL, mlp_ratio=2 * swiglu_hidden(32) / 32)


def test_a_folder_without_weights_says_what_it_needs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DINOV2_CONFIG))
    with pytest.raises(ValueError, match=r"is a folder without model.safetensors or pytorch_model.bin"):
        create_backbone("vit_small_patch14_dinov2", tmp_path, **SMALL)
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds a sharded checkpoint \(model.safetensors.index.json\)"):
        create_backbone("vit_small_patch14_dinov2", tmp_path, **SMALL)


def test_a_folder_is_recorded_by_its_weights_file(tmp_path):
    from locatdino.evaluation.provenance import checkpoint_record, file_sha256

    save_file({"w": torch.ones(3)}, tmp_path / "model.safetensors")
    record = checkpoint_record(tmp_path)
    assert record == {
        "path": str(tmp_path),
        "file": str(tmp_path / "model.safetensors"),
        "bytes": (tmp_path / "model.safetensors").stat().st_size,
        "sha256": file_sha256(tmp_path / "model.safetensors"),
    }


def test_transformers_is_never_imported_by_the_package():
    import ast
    from pathlib import Path

    import locatdino

    for path in Path(locatdino.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            assert not any(n.split(".")[0] == "transformers" for n in names), path
