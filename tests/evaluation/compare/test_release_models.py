"""``compare`` on DINOv2 releases as users hold them: the torch hub ``.pth`` and a Hugging Face folder, by the
timm DINOv2 names, at an input size that is a multiple of 14; the report names each file and rule."""

import json

import pytest
import torch
from safetensors.torch import save_file

from locatdino.evaluation.compare import cli as compare_cli
from tests.models.checkpoints.dinov2_reference import release_weights
from tests.models.checkpoints.test_hugging_face import _published_dinov2_keys


@pytest.mark.slow
def test_compare_a_dinov2_release_and_a_hugging_face_folder(tmp_path):
    release = tmp_path / "dinov2_vits14_pretrain.pth"
    weights = release_weights(384, 12, seed=0)  # ViT-S/14's geometry: the timm name fits
    torch.save(weights, release)
    folder = tmp_path / "dinov2-with-registers-small"
    folder.mkdir()
    save_file(_published_dinov2_keys(release_weights(384, 12, registers=4, seed=1)), folder / "model.safetensors")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "dinov2_with_registers",
                "hidden_size": 384,
                "num_hidden_layers": 12,
                "num_attention_heads": 6,
                "patch_size": 14,
                "image_size": 518,
                "num_register_tokens": 4,
            }
        )
    )
    out = tmp_path / "cmp"
    argv = [
        "--model",
        f"dinov2=vit_small_patch14_dinov2:{release}",
        "--model",
        f"reg=vit_small_patch14_reg4_dinov2:{folder}",
        "--num-train",
        "4",
        "--num-val",
        "2",
        "--scene-size",
        "42",
        "--input-size",
        "42",
        "--k",
        "3",
        "--workers",
        "0",
        "--no-progress",
        "--figure-images",
        "1",
        "--batch-size",
        "4",
        "--no-linprobe",
        "--out",
        str(out),
    ]
    assert compare_cli.main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    dinov2, reg = report["models"]
    assert (dinov2["pos_embed"], reg["pos_embed"]) == ("dino", "timm")
    # every weight of the release but iBOT's mask token; the registers' model: 4 tokens, 1 position less
    assert dinov2["parameters"] == sum(v.numel() for k, v in weights.items() if k != "mask_token") == 22_056_192
    assert reg["parameters"] == dinov2["parameters"] + 4 * 384 - 384
    assert 0 <= dinov2["hbird"]["miou"] <= 100 and 0 <= reg["hbird"]["miou"] <= 100
    md = (out / "report.md").read_text()
    assert f"| dinov2 | vit_small_patch14_dinov2 | {release} (pos-embed dino) |" in md
    assert f"| reg | vit_small_patch14_reg4_dinov2 | {folder} (pos-embed timm) |" in md
