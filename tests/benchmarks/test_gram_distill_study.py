"""benchmarks/studies/gram_distill.py without training: each arm's fit arguments (the Gram block of
the DINO recipe's comment at 80 steps, the distill arm's teacher the DINO arm's export of the same
seed), the pairs of its table, and the random init it scores is the network a run starts from."""

import json
import re
from pathlib import Path

import timm
import torch

from benchmarks.studies import gram_distill
from locatdino.models import create_backbone
from locatdino.ssl import DistillModule

ROOT = Path(__file__).resolve().parents[2]


def test_the_gram_arms_use_the_dino_recipes_commented_block_at_80_steps():
    """configs/dino_tiny_cpu.yaml's comment: from step 40, refreshed every 20 from 60 on."""
    comment = re.search(r"--model\.gram '(\{.*?\})'", (ROOT / "configs" / "dino_tiny_cpu.yaml").read_text())
    assert gram_distill.gram_flags(80) == ["--model.gram", json.dumps(json.loads(comment.group(1)))]
    assert json.loads(gram_distill.gram_flags(4)[1]) == {
        "it_load_ema_teacher": 2,
        "update_frequency": 1,
        "it_first_update": 3,
    }


def test_each_arm_trains_its_backbone_with_its_recipe_and_the_same_budget(tmp_path):
    for arm, (backbone, recipe, gram) in gram_distill.ARMS.items():
        argv = gram_distill.arm_argv(arm, 2, 80, tmp_path)
        flags = dict(zip(argv[::2], argv[1::2]))
        assert flags["--config"].endswith(f"configs/{recipe}.yaml") and flags["--seed_everything"] == "2"
        assert flags["--model.backbone"] == gram_distill.BACKBONES[backbone] and flags["--trainer.max_steps"] == "80"
        assert flags["--trainer.default_root_dir"] == str(tmp_path / arm / "seed2")
        assert ("--model.gram" in flags) == gram
    teacher = dict(zip(*[iter(gram_distill.arm_argv("distill", 2, 80, tmp_path))] * 2))["--model.teacher"]
    assert teacher == f"vit_tiny_patch16_224:{tmp_path / 'dino' / 'seed2' / 'backbone.pth'}"
    assert {a for _, a, b in gram_distill.PAIRS} | {b for _, a, b in gram_distill.PAIRS} <= {
        *gram_distill.ARMS,
        "random",
    }


def test_the_distill_arm_starts_from_the_scored_random_init(tmp_path):
    kwargs = gram_distill.backbone_kwargs("distill")
    torch.manual_seed(0)
    torch.save(timm.create_model("test_vit", num_classes=0, img_size=64).state_dict(), tmp_path / "t.pth")
    torch.manual_seed(3)
    module = DistillModule(
        backbone="locatvit_tiny_patch8_224",
        backbone_kwargs=kwargs,
        teacher=f"test_vit:{tmp_path / 't.pth'}",
        out_dim=16,
    )
    torch.manual_seed(3)
    random = create_backbone("locatvit_tiny_patch8_224", **kwargs).state_dict()
    start = module.student["backbone"].state_dict()
    assert start.keys() == random.keys() and all(torch.equal(v, random[k]) for k, v in start.items())
