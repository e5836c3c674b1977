"""``compare`` with a DINOv3 release and a LocAt RoPE ViT: the report names each file and how its
tokens are placed at the evaluation grid (RoPE: nothing resampled), beside a DINO ViT's rule."""

import json

import pytest
import timm
import torch

from locatdino.evaluation.compare import cli as compare_cli
from tests.models.checkpoints.dinov3_reference import release_weights


@pytest.mark.slow
def test_compare_names_the_dinov3_and_locat_rope_files_and_their_rule(tmp_path):
    release = tmp_path / "dinov3_vits16_pretrain_lvd1689m.pth"
    torch.save(release_weights(384, 12, 6, seed=0), release)  # ViT-S/16: compare builds the names as they are
    torch.manual_seed(0)
    locat = tmp_path / "locat_rope.pth"
    torch.save(timm.create_model("locatvit_tiny_rope_mixed", num_classes=0).state_dict(), locat)
    dino = tmp_path / "dino_vit.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), dino)
    out = tmp_path / "cmp"
    models = [f"dinov3=vit_small_patch16_dinov3_qkvb:{release}", f"rope=locatvit_tiny_rope_mixed:{locat}"]
    models.append(f"dino=vit_tiny_patch16_224:{dino}")
    argv = [arg for model in models for arg in ("--model", model)]
    argv += ["--num-train", "4", "--num-val", "2", "--scene-size", "32", "--input-size", "32", "--k", "3"]
    argv += ["--workers", "0", "--no-progress", "--figure-images", "1", "--batch-size", "4", "--no-linprobe"]
    assert compare_cli.main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert [m["pos_embed"] for m in report["models"]] == ["RoPE", "RoPE", "dino"]
    md = (out / "report.md").read_text()
    assert f"| dinov3 | vit_small_patch16_dinov3_qkvb | {release} (pos-embed RoPE) |" in md
    assert f"| rope | locatvit_tiny_rope_mixed | {locat} (pos-embed RoPE) |" in md
    assert f"| dino | vit_tiny_patch16_224 | {dino} (pos-embed dino) |" in md
