"""The CPU recipe (configs/dino_tiny_cpu.yaml) is what its header claims: the token grid per global
and local crop, measured by running each of its two backbones (its own ViT and the
``--model.backbone`` switch to LocAtViT) on the recipe's own crops; and the switch changes only the
attention (GAug) and the pooling (PRR), never a shape the recipe's kwargs set."""

import re

import numpy as np
import pytest
import torch
import yaml

from locatdino.data import MultiCropTransform
from locatdino.data.scenes import render_scene
from locatdino.models import create_backbone
from tests.ssl.ssl_helpers import ROOT

RECIPE = "dino_tiny_cpu.yaml"
TINY_RECIPES = ["dino_tiny_cpu.yaml", "ibot_tiny_cpu.yaml", "sup_tiny_cpu.yaml", "distill_tiny_cpu.yaml"]
LOCATVIT = "locatvit_tiny_patch8_224"  # the switch the recipes' headers show
# e.g. "8 x 8 tokens per 64 px global crop, 4 x 4 per 32 px local crop"
CLAIM = re.compile(r"(\d+) x (\d+) tokens per (\d+) px global crop, (\d+) x (\d+) per (\d+) px local crop")


def load(name: str) -> tuple[dict, str]:
    text = (ROOT / "configs" / name).read_text()
    return yaml.safe_load(text), text


def model_args(recipe: dict) -> dict:
    return recipe["model"].get("init_args", recipe["model"])


@pytest.mark.parametrize("backbone", [None, LOCATVIT])
def test_recipe_token_grid_is_what_its_header_claims(backbone):
    recipe, text = load(RECIPE)
    claim = CLAIM.search(text)
    assert claim, f"{RECIPE}: the header states no token grid"
    gh, gw, g_px, lh, lw, l_px = map(int, claim.groups())
    crops = MultiCropTransform(**recipe["data"]["init_args"]["multicrop"])
    model = create_backbone(backbone or recipe["model"]["backbone"], **recipe["model"]["backbone_kwargs"]).eval()
    torch.manual_seed(0)
    views = crops(render_scene(np.random.default_rng(0), recipe["data"]["init_args"]["synthetic_size"])[0])
    n_global = crops.num_global_crops
    assert [tuple(v.shape[-2:]) for v in views] == [(g_px, g_px)] * n_global + [(l_px, l_px)] * crops.num_local_crops
    with torch.no_grad():
        tokens = [model.forward_features(v[None]).shape[1] - model.num_prefix_tokens for v in views]
    assert tokens == [gh * gw] * n_global + [lh * lw] * crops.num_local_crops
    # the online monitor evaluates at the grid the global crops train at
    monitor = next(c for c in recipe["trainer"]["callbacks"] if c["class_path"].endswith("HummingbirdMonitor"))
    with torch.no_grad():
        grid = model.forward_features(torch.zeros(1, 3, *(2 * [monitor["init_args"]["input_size"]])))
    assert grid.shape[1] - model.num_prefix_tokens == gh * gw


@pytest.mark.parametrize("name", TINY_RECIPES)
def test_the_locatvit_switch_adds_only_gaug_to_the_recipes_vit(name):
    """``--model.backbone locatvit_tiny_patch8_224`` on the recipe's kwargs: every parameter of the
    recipe's ViT-T/8 with the same shape, plus GAug's; PRR pooling; the header shows the switch."""
    recipe, text = load(name)
    args = model_args(recipe)
    assert f"--config configs/{name} --model.backbone {LOCATVIT}" in text
    with torch.device("meta"):
        vit = create_backbone(args["backbone"], **args["backbone_kwargs"])
        locat = create_backbone(LOCATVIT, **args["backbone_kwargs"])
    shapes = {k: p.shape for k, p in vit.named_parameters()}
    extra = {k: p.shape for k, p in locat.named_parameters() if k not in shapes}
    assert {k: p.shape for k, p in locat.named_parameters() if k in shapes} == shapes
    assert extra and all(".attn.gaug." in k for k in extra)
    assert locat.global_pool == "prr" and vit.global_pool != "prr"
    assert vit.patch_embed.patch_size == locat.patch_embed.patch_size == (8, 8)
