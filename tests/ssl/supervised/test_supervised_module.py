"""SupervisedModule: the recipe from YAML, learning on a fixed batch, Mixup/CutMix targets, resume."""

import json

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from ssl_helpers import ROOT, TINY_MODEL, batches_loader, tiny_trainer
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

from locatdino.ssl import SupervisedModule
from locatdino.ssl.run import cli

NUM_CLASSES = 10


def tiny_supervised(**overrides) -> SupervisedModule:
    kwargs = dict(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=TINY_MODEL["backbone_kwargs"],
        num_classes=NUM_CLASSES,
        batch_size=8,
        warmup_epochs=0.0,
    )
    return SupervisedModule(**{**kwargs, **overrides})


def fixed_batches(n: int, batch: int = 8, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    return [{"image": x, "target": y}] * n


def test_recipe_builds_from_yaml_with_the_supervised_defaults(tmp_path):
    """The class_path picks the objective and the data module; the supervised defaults (DeiT: wd
    0.05, min lr 1e-5) are not overwritten by DINO's values of the same names."""
    built = cli.build_cli(
        [
            "--config",
            str(ROOT / "configs" / "sup_tiny_cpu.yaml"),
            "--model.backbone",
            "locatvit_tiny_patch8_224",
            "--data.init_args.train_urls",
            str(tmp_path / "t"),
            "--data.init_args.val_urls",
            str(tmp_path / "v"),
            "--data.init_args.batch_size",
            "12",
        ],
        run=False,
    )
    model, data = built.model, built.datamodule
    assert type(model).__name__ == "SupervisedModule" and type(data).__name__ == "LabelledShardDataModule"
    assert model.hparams.batch_size == data.batch_size == 12
    assert model.hparams.weight_decay == 0.05 and model.hparams.min_lr == 1e-5 and model.hparams.lr == 0.0005
    assert model.classifier.backbone.global_pool == "prr" and model.classifier.head.out_features == NUM_CLASSES
    # the tiny recipe drops DeiT's regularisers: label smoothing only, no Mixup/CutMix, no RandAugment
    assert isinstance(model.criterion, LabelSmoothingCrossEntropy) and model.mixup is None
    assert data.transform.input_size == 64 and data.transform.auto_augment is None and data.transform.re_prob == 0
    assert data.num_workers == 1 and data.resampled is False  # the recipe's over default.yaml's


def test_a_dino_recipe_still_builds_dino():
    built = cli.build_cli(
        [
            "--config",
            str(ROOT / "configs" / "dino_tiny_cpu.yaml"),
            "--model.lr",
            "0.003",
            "--data.init_args.synthetic",
            "8",
        ],
        run=False,
    )
    assert type(built.model).__name__ == "DINOModule" and built.model.hparams.lr == 0.003


def test_the_default_recipe_is_deit_with_mixup():
    assert isinstance(tiny_supervised().criterion, SoftTargetCrossEntropy) and tiny_supervised().mixup is not None


def test_multilabel_targets_use_timm_bce():
    assert isinstance(tiny_supervised(bce_loss=True, mixup_alpha=0, cutmix_alpha=0).criterion, BinaryCrossEntropy)


@pytest.mark.slow
def test_a_few_steps_lower_the_loss_on_a_fixed_batch(tmp_path):
    torch.manual_seed(0)
    m = tiny_supervised(mixup_alpha=0, cutmix_alpha=0, label_smoothing=0.0, lr=0.05, drop_path_rate=0.0)
    batch = fixed_batches(1)[0]

    def loss() -> float:
        with torch.no_grad():
            value = float(m.criterion(m.eval()(batch["image"]), batch["target"]))
        m.train()
        return value

    before = loss()
    tiny_trainer(tmp_path, max_steps=12).fit(m, batches_loader(fixed_batches(12)))
    assert loss() < 0.7 * before


def test_mixup_and_cutmix_produce_soft_targets():
    """Mixup: every target is λ·onehot(y) + (1−λ)·onehot(flip(y)), smoothed, and the images are the
    same mix. CutMix: each pixel comes from the image or its flipped partner, and the target weight
    of the own label is the share of own pixels."""
    torch.manual_seed(0)
    x = torch.rand(8, 3, 32, 32)
    y = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    s = 0.1
    mixup = tiny_supervised(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=s).mixup
    mixed, target = mixup(x.clone(), y)
    assert target.shape == (8, NUM_CLASSES) and torch.allclose(target.sum(1), torch.ones(8))
    lam = float(((mixed - x.flip(0)) / (x - x.flip(0))).median())
    onehot = torch.nn.functional.one_hot(y, NUM_CLASSES).float() * (1 - s) + s / NUM_CLASSES
    assert torch.allclose(mixed, lam * x + (1 - lam) * x.flip(0), atol=1e-5)
    assert torch.allclose(target, lam * onehot + (1 - lam) * onehot.flip(0), atol=1e-5)
    assert 0 < target.max() < 1  # soft

    cutmix = tiny_supervised(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0).mixup
    torch.manual_seed(1)
    mixed, target = cutmix(x.clone(), y)
    own = (mixed == x).all(1)  # [B, H, W]
    assert ((mixed == x).all(1) | (mixed == x.flip(0)).all(1)).all()
    share = own.float().mean((1, 2))
    assert torch.allclose(target[torch.arange(8), y], share, atol=1e-5)


class _LrLog(Callback):
    def __init__(self):
        self.lrs: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


class _StopAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.mark.slow
def test_resume_continues_the_schedule(tmp_path):
    """Interrupted at step 3 of 8 and resumed: the lr of every later step equals the uninterrupted
    run's (timm's warm-up + cosine, stepped by the optimizer-step count)."""

    def run(max_steps: int, *callbacks, ckpt_path=None, root=tmp_path):
        torch.manual_seed(0)
        m = tiny_supervised(warmup_epochs=1.0, mixup_alpha=0, cutmix_alpha=0, lr=0.5)  # peak 7.8e-3 at batch 8
        log = _LrLog()
        trainer = tiny_trainer(
            root, max_steps=max_steps, max_epochs=-1, callbacks=[log, *callbacks], enable_checkpointing=True
        )
        trainer.fit(m, batches_loader(fixed_batches(4)), ckpt_path=ckpt_path)
        return log.lrs

    full = run(8)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    run(8, saver, _StopAt(3))
    resumed = run(8, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt"))
    assert sorted(resumed) == [3, 4, 5, 6, 7]
    assert all(resumed[s] == pytest.approx(full[s], rel=1e-9) for s in resumed)
    assert full[0] < full[3] and full[7] < full[4]  # warm-up (4 steps = 1 epoch), then decay


@pytest.mark.slow
def test_export_of_a_supervised_checkpoint_loads_into_hbird(tmp_path, capsys):
    """``export`` writes the classifier's backbone (the evaluated network) without the linear
    head; ``locatdino hbird`` runs on it."""
    from locatdino import cli as locatdino_cli
    from locatdino.ssl.export.cli import export_backbone

    torch.manual_seed(0)
    m = tiny_supervised(mixup_alpha=0, cutmix_alpha=0, backbone_kwargs={"img_size": 32})  # a timm ViT-T
    trainer = tiny_trainer(tmp_path, max_steps=2, enable_checkpointing=True)
    trainer.fit(m, batches_loader(fixed_batches(2)))
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    out = tmp_path / "backbone.pth"
    assert "classifier" in export_backbone(ckpt, out)
    state = torch.load(out, weights_only=True)
    assert not any(k.startswith("head") for k in state)
    assert torch.equal(state["blocks.1.mlp.fc2.weight"], m.classifier.backbone.blocks[1].mlp.fc2.weight)
    capsys.readouterr()
    assert (
        locatdino_cli.main(
            [
                "hbird",
                "--model",
                f"vit_tiny_patch16_224:{out}",
                "--num-train",
                "4",
                "--num-val",
                "2",
                "--scene-size",
                "32",
                "--input-size",
                "32",
                "--k",
                "5",
                "--precision",
                "fp32",
                "--out",
                str(tmp_path / "hb"),
            ]
        )
        == 0
    )
    (result,) = json.loads((tmp_path / "hb" / "results.json").read_text())["models"]
    assert 0 <= result["miou"] <= 100


def test_labels_the_classifier_or_loss_cannot_take_are_one_line():
    from types import SimpleNamespace

    from locatdino.common.errors import UserError

    def setup(m, num_classes, multilabel):
        m._trainer = SimpleNamespace(datamodule=SimpleNamespace(num_classes=num_classes, multilabel=multilabel))
        m.setup("fit")

    with pytest.raises(UserError, match="num_classes: 10, but the shards' index.json lists 1000 classes"):
        setup(tiny_supervised(), 1000, False)
    with pytest.raises(UserError, match="multi-label targets need model.init_args.bce_loss true"):
        setup(tiny_supervised(bce_loss=True), NUM_CLASSES, True)  # Mixup still on
    setup(tiny_supervised(bce_loss=True, mixup_alpha=0, cutmix_alpha=0), NUM_CLASSES, True)


def test_an_input_size_the_patch_does_not_divide_is_one_line(tmp_path, capsys):
    status = cli.main(
        [
            "--config",
            str(ROOT / "configs" / "sup_tiny_cpu.yaml"),
            "--data.init_args.transform.input_size",
            "60",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
        ]
    )
    assert status == 1 and capsys.readouterr().err.strip() == (
        "locatdino fit: data.init_args.transform.input_size: 60 px is not a multiple of the patch size 8 of "
        "vit_tiny_patch16_224 (use 56 or 64)"
    )
    assert not (tmp_path / "run").exists()
