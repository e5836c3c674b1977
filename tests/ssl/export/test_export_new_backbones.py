"""``export`` of runs with the newer backbones in all three formats: a LocAt RoPE ViT
(``locatvit_tiny_rope_mixed``), a LocAtSwin (``locatswin_tiny``) and DINOv3's architecture, each file
giving the run's teacher tokens back (through ``create_backbone`` for ``.pth``, timm for the others);
a vanilla DINOv3 run's ``.pth`` loads into plain timm ``strict=True``."""

import json

import pytest
import timm
import torch
from test_export_formats import fit_checkpoint

from locatdino.ssl.export import cli as export
from tests.models.tiny import TINY_SWIN

RUNS = {  # name: (backbone_kwargs, image size)
    "locatvit_tiny_rope_mixed": (dict(img_size=32, depth=2, embed_dim=64, num_heads=2), 32),
    "locatswin_tiny": (TINY_SWIN, 56),
    "vit_small_patch16_dinov3": (dict(img_size=32, depth=2, embed_dim=64, num_heads=2), 32),
    "locatvit_small_patch16_dinov3": (dict(img_size=32, depth=2, embed_dim=64, num_heads=2), 32),
}


def _images(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))


@pytest.mark.parametrize("name", list(RUNS))
def test_every_format_gives_the_run_s_tokens(tmp_path, name, capsys):
    from locatdino.models import create_backbone

    kwargs, size = RUNS[name]
    ckpt, teacher = fit_checkpoint(tmp_path / "run", name, kwargs=kwargs)
    with torch.no_grad():
        tokens, pooled = teacher.forward_features(_images(size)), teacher(_images(size))
    pth, sft, hub = tmp_path / "teacher.pth", tmp_path / "teacher.safetensors", tmp_path / "hub"
    for out, fmt in ((pth, "pth"), (sft, "safetensors"), (hub, "hf-hub")):
        assert export.main([str(ckpt), str(out), "--format", fmt]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "teacher.config.json").read_text())
    models = {
        "pth": create_backbone(name, pth, **kwargs),  # the geometry: a RoPE or Swin file has no grid
        "safetensors": timm.create_model(
            config["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=str(sft)), **config["model_args"]
        ),
        "hf-hub": timm.create_model(f"local-dir:{hub}", pretrained=True),
    }
    for fmt, model in models.items():
        with torch.no_grad():
            model.eval()
            torch.testing.assert_close(model.forward_features(_images(size)), tokens, rtol=0, atol=0, msg=fmt)
            torch.testing.assert_close(model(_images(size)), pooled, rtol=0, atol=0, msg=fmt)


def test_a_vanilla_dinov3_run_exports_into_plain_timm(tmp_path):
    kwargs, size = RUNS["vit_small_patch16_dinov3"]
    ckpt, teacher = fit_checkpoint(tmp_path / "run", "vit_small_patch16_dinov3", kwargs=kwargs)
    assert export.main([str(ckpt), str(tmp_path / "teacher.pth")]) == 0
    plain = timm.create_model("vit_small_patch16_dinov3", num_classes=0, global_pool="token", **kwargs).eval()
    plain.load_state_dict(torch.load(tmp_path / "teacher.pth", weights_only=True), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(
            plain.forward_features(_images(size)), teacher.forward_features(_images(size)), rtol=0, atol=0
        )
        torch.testing.assert_close(plain(_images(size)), teacher(_images(size)), rtol=0, atol=0)
