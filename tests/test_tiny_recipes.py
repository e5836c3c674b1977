"""The CPU recipes (configs/dino_tiny_*.yaml) are what their headers claim: the token grid per global
and local crop, measured by running the recipe's backbone on the recipe's own crops, and one
recipe for both backbones (only the backbone and the output folder differ)."""

import re

import numpy as np
import pytest
import torch
import yaml

from locatdino.data import MultiCropTransform
from locatdino.data.scenes import render_scene
from locatdino.models import create_backbone

from tests.ssl.ssl_helpers import ROOT

RECIPES = ["dino_tiny_vit.yaml", "dino_tiny_locatvit.yaml"]
# e.g. "8 x 8 tokens per 64 px global crop, 4 x 4 per 32 px local crop"
CLAIM = re.compile(r"(\d+) x (\d+) tokens per (\d+) px global crop, (\d+) x (\d+) per (\d+) px local crop")


def load(name: str) -> tuple[dict, str]:
    text = (ROOT / "configs" / name).read_text()
    return yaml.safe_load(text), text


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_token_grid_is_what_its_header_claims(name):
    recipe, text = load(name)
    claim = CLAIM.search(text)
    assert claim, f"{name}: the header states no token grid"
    gh, gw, g_px, lh, lw, l_px = map(int, claim.groups())
    crops = MultiCropTransform(**recipe["data"]["init_args"]["multicrop"])
    model = create_backbone(recipe["model"]["backbone"], **recipe["model"]["backbone_kwargs"]).eval()
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


def test_both_backbones_share_one_recipe():
    (vit, vit_text), (loc, loc_text) = load(RECIPES[0]), load(RECIPES[1])
    assert vit["model"].pop("backbone") == "vit_tiny_patch16_224"
    assert loc["model"].pop("backbone") == "locatvit_tiny"
    assert vit["trainer"].pop("default_root_dir") != loc["trainer"].pop("default_root_dir")
    assert vit == loc
    assert CLAIM.search(vit_text).group(0) == CLAIM.search(loc_text).group(0)
