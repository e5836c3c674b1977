"""benchmarks/studies/gpu_gram_distill.py on the CPU: each arm's module (its recipe, the Gram block
scaled to the run, the distillation teacher) and its random init, the saved dino arm loading back as
the distill arm's teacher at both sizes, a bad --teacher refused before any work, and the whole
study at toy size (--dry-run) end to end."""

import csv
import json
import math
from pathlib import Path

import pytest
import timm
import torch

from benchmarks.studies import gpu_gram_distill as study
from benchmarks.studies import gpu_study
from benchmarks.studies.gram_arms import ARMS, PAIRS, gram_block
from locatdino.data import MultiCropTransform, collate_multicrop
from locatdino.models import GAugAttention
from locatdino.ssl import DINOModule, DistillModule
from locatdino.ssl.distill.teacher import FrozenTeacher
from tests.benchmarks.study_process import run_module


def test_each_arm_gets_its_recipes_objective_and_the_gram_block_scaled_to_its_length():
    """The Gram arms: Gram teacher at the middle step, refreshed every quarter from 3/4 on (300 steps:
    150, 75, 225, loss weight left at DINOv3's 1.0); distill its teacher; the others nothing."""
    assert {arm: study.arm_objective(arm) for arm in ARMS} == {
        "dino": "dino",
        "dino_gram": "dino",
        "locat": "dino",
        "locat_gram": "dino",
        "distill": "distill",
    }
    gram = {"gram": {"it_load_ema_teacher": 150, "update_frequency": 75, "it_first_update": 225}}
    options = {arm: study.arm_options(arm, "vit:t.pth")(300) for arm in ARMS}
    assert options == {
        "dino": {},
        "dino_gram": gram,
        "locat": {},
        "locat_gram": gram,
        "distill": {"teacher": "vit:t.pth"},
    }


def test_distill_brings_its_teacher_arm_unless_a_teacher_is_given():
    assert study.arms_to_run(["distill"], None) == ["dino", "distill"]
    assert study.arms_to_run(["distill"], "vit_small_patch16_224:release.pth") == ["distill"]
    assert study.arms_to_run(["locat_gram", "distill", "dino"], None) == ["dino", "locat_gram", "distill"]


@pytest.mark.parametrize(
    "size, vit", [(study.TOY, study.TOY_VIT), (gpu_study.Size(), gpu_study.BACKBONES["vit"])], ids=["dry-run", "study"]
)
def test_the_saved_dino_arm_loads_back_as_the_distill_teacher(tmp_path, size, vit):
    """NAME:FILE carries no depth or width: the name each size saves with must build the dino arm's
    shape (the file giving patch 8 and the image size), with its weights unchanged."""
    model = gpu_study.random_backbone("vit", size, seed=1)
    teacher = FrozenTeacher(study.save_backbone(model, tmp_path / "t.pth", vit)).backbone
    assert teacher.patch_embed.patch_size == model.patch_embed.patch_size == (8, 8)
    saved, loaded = model.state_dict(), teacher.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(v, saved[k]) for k, v in loaded.items())


@pytest.mark.parametrize("arm", list(ARMS))
def test_every_arm_starts_from_the_scored_random_init(tmp_path, arm):
    backbone, _, gram = ARMS[arm]
    teacher = study.save_backbone(
        timm.create_model(study.TOY_VIT, img_size=32, patch_size=8), tmp_path / "t.pth", study.TOY_VIT
    )
    options = study.arm_options(arm, teacher)(8)
    module = gpu_study.build_module(study.arm_objective(arm), backbone, study.TOY, 3, **options)
    assert type(module) is (DistillModule if arm == "distill" else DINOModule)
    assert (module.gram is not None) == gram
    state = gpu_study.random_backbone(backbone, study.TOY, seed=3).state_dict()
    start = module.student["backbone"].state_dict()
    assert start.keys() == state.keys() and all(torch.equal(v, state[k]) for k, v in start.items())


def test_a_bad_teacher_is_refused_in_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(GAugAttention, "gaug_path", GAugAttention.gaug_path)  # main sets it: restored after
    out = tmp_path / "out"
    missing = tmp_path / "missing.pth"
    assert study.main(["--dry-run", "--out", str(out), "--teacher", f"vit_small_patch16_224:{missing}"]) == 1
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("gpu_gram_distill: --teacher") and str(missing) in printed[0]
    assert not out.exists()


def _finite_column(path: Path, column: str) -> list[float]:
    with path.open() as f:
        values = [float(r[column]) for r in csv.DictReader(f) if r.get(column)]
    return [v for v in values if math.isfinite(v)]


@pytest.mark.slow
def test_the_dry_run_end_to_end(tmp_path):
    """Every arm trained to its schedule's end and scored, the Gram arms with their Gram loss, the
    distill arm with its loss, the pairs of arms compared; finite numbers, no checkpoint left. With
    ``--augment-on gpu`` (the default where CUDA is): the loader batches uint8 scenes and the
    multi-crop runs on the training device (here CPU tensors), for DINO and distillation alike."""
    out = tmp_path / "study"
    args = ["--dry-run", "--deadline", "5", "--augment-on", "gpu", "--out", str(out)]
    run_module("benchmarks.studies.gpu_gram_distill", *args)
    results = json.loads((out / "results.json").read_text())
    assert results["augment_on"] == "gpu"
    rows = results["rows"]
    assert [(r["backbone"], r["objective"]) for r in rows[:2]] == [("vit", "random init"), ("locatvit", "random init")]
    trained = rows[2:]
    assert [r["run"] for r in trained] == list(ARMS) and set(results["measured"]) == set(ARMS)
    assert [r["backbone"] for r in trained] == [ARMS[arm][0] for arm in ARMS]
    assert [r["objective"] for r in trained][-1] == "distill (of the dino arm)"
    for r in trained:  # the Gram block at the run's own length
        assert r.get("options", {}).get("gram") == (gram_block(r["steps"]) if ARMS[r["run"]][2] else None)
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("hbird", "linprobe")), r
    for r in trained:
        assert r["steps"] >= study.TOY.min_steps
        for protocol in ("hbird", "linprobe"):
            d = r[f"{protocol}_delta"]
            assert all(map(math.isfinite, d.values())) and d["low"] <= d["delta"] <= d["high"]
        metrics = out / "logs" / r["run"] / "metrics.csv"
        assert len(_finite_column(metrics, "train/loss")) == r["steps"]
    for arm in ("dino_gram", "locat_gram"):
        assert _finite_column(out / "logs" / arm / "metrics.csv", "train/gram_loss")
    assert _finite_column(out / "logs" / "distill" / "metrics.csv", "train/distill_loss")
    expected = [label for label, _, b in PAIRS if b != "random"]
    assert [p["label"] for p in results["pairs"]] == expected
    for p in results["pairs"]:
        assert all(math.isfinite(v) for protocol in ("hbird", "linprobe") for v in p[f"{protocol}_delta"].values())
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 2 + 7 + 3 + len(expected)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".ckpt", ".pth")]


def test_the_distill_recipes_crops_on_the_device_have_the_loaders_layout():
    """On CUDA the distill arm's multi-crop runs on the device (``--augment-on gpu``): its recipe's
    two global crops and no local crop, batched as the CPU loader's collate batches them."""
    multicrop = MultiCropTransform(**gpu_study.recipe("distill", "locatvit")["data"]["init_args"]["multicrop"])
    images = torch.randint(0, 256, (2, 3, 96, 96), dtype=torch.uint8)
    device_batch = gpu_study.DeviceMultiCrop(None, multicrop, seed=0).on_after_batch_transfer(images, 0)
    cpu_batch = collate_multicrop([multicrop(image) for image in images])
    assert {k: v.shape for k, v in device_batch.items()} == {k: v.shape for k, v in cpu_batch.items()}
    assert device_batch["global"].shape == (2, 2, 3, 64, 64)
