"""Gram anchoring in the DINO and iBOT objectives: the options and their refusals, the weight
schedule, the Gram teacher (frozen, loaded and refreshed at exactly the configured steps, from a
file of the run's architecture only, at twice the resolution), the logged loss, and resume."""

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from ssl_helpers import TINY_MODEL, batches_loader, random_batch, resumed_losses, tiny_module, tiny_trainer

from locatdino.ssl import GramLoss, IBOTModule
from locatdino.ssl.objective.gram_anchor import GramAnchor, GramOptions
from locatdino.ssl.objective.schedules import warmup_cosine_hold_schedule


class Recorder(pl.Callback):
    """Per step: whether the Gram loss was logged, and the Gram teacher's first weight after the step."""

    def __init__(self):
        self.logged, self.gram_weights, self.teacher_weights = [], [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.logged.append("train/gram_loss" in trainer.callback_metrics)
        trainer.callback_metrics.pop("train/gram_loss", None)
        self.gram_weights.append(module.gram.teacher["backbone"].patch_embed.proj.weight.detach().clone())
        self.teacher_weights.append(module.teacher["backbone"].patch_embed.proj.weight.detach().clone())


def _fit(module, steps, callbacks=(), **trainer_kw):
    trainer = tiny_trainer(max_steps=steps, callbacks=list(callbacks), **trainer_kw)
    trainer.fit(module, batches_loader([random_batch(seed=i) for i in range(steps)]))
    return trainer


# ---------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "gram, match",
    [
        ({"it_load_ema_teacher": 0, "lossweight": 1}, r"model.gram.lossweight: not a Gram option"),
        ({"it_load_ema_teacher": "0"}, r"model.gram.it_load_ema_teacher: must be int, got '0'"),
        ({"it_load_ema_teacher": 0, "rep_update": 1}, r"model.gram.rep_update: must be bool"),
        ({"it_load_ema_teacher": 0, "loss_weight": -1.0}, r"model.gram.loss_weight: must be a number >= 0"),
        ({"it_load_ema_teacher": 0, "update_frequency": 0}, r"model.gram.update_frequency: must be at least 1"),
        ({}, r"model.gram: nothing loads the Gram teacher"),
        ({"ema_teacher": True}, r"model.gram.rep_update: the EMA teacher is the Gram teacher"),
        ({"ema_teacher": True, "rep_update": False, "ckpt": "x.pth"}, r"model.gram.ckpt: the EMA teacher"),
        ({"ema_teacher": True, "rep_update": False, "teacher_upsample": 2}, r"model.gram.teacher_upsample"),
        ({"it_load_ema_teacher": 0, "remove_neg": True, "remove_only_teacher_neg": True}, r"exclusive"),
        ({"it_load_ema_teacher": 0, "tokens_used": "masked", "img_level": False}, r"DINOModule masks no patches"),
        ({"it_load_ema_teacher": 0, "tokens_used": "masked"}, r"model.gram: tokens_used 'masked' .* img_level false"),
        ({"it_load_ema_teacher": 0, "loss_weight_schedule": {"start": 0, "end": 1}}, r"needs start, peak, end"),
        ({"it_load_ema_teacher": 0, "global_teacher_resize_method": "cubic"}, r"must be one of bicubic"),
    ],
)
def test_bad_options_are_refused_in_one_line_naming_the_key(gram, match):
    with pytest.raises(ValueError, match=match) as err:
        tiny_module(gram=gram)
    assert "\n" not in str(err.value)


def test_a_weight_schedule_or_a_load_step_outside_the_run_is_refused_before_the_first_step():
    long = {"start": 0.0, "peak": 0.0, "end": 2.0, "warmup_epochs": 2, "cosine_epochs": 1}
    module = tiny_module(gram={"it_load_ema_teacher": 0, "loss_weight_schedule": long})
    with pytest.raises(ValueError, match=r"model.gram.loss_weight_schedule: a schedule of 4 warm-up and 2 cosine"):
        _fit(module, 2, max_epochs=1)  # 2 steps per epoch: 6 steps of schedule in a run of 2
    assert module.trainer.global_step == 0
    with pytest.raises(ValueError, match=r"model.gram.it_load_ema_teacher: step 5 is past the run's last step 1"):
        _fit(tiny_module(gram={"it_load_ema_teacher": 5}), 2)


def test_the_weight_schedule_is_dinov3s_linear_warmup_cosine_and_hold():
    got = warmup_cosine_hold_schedule(0.0, 1.0, 2.0, total_steps=10, warmup_steps=3, cosine_steps=4)
    want = [0, 1 / 3, 2 / 3] + [2 + (1 - 2) * (1 + math.cos(math.pi * i / 3)) / 2 for i in range(4)] + [2, 2, 2]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert len(warmup_cosine_hold_schedule(1, 1, 0, 5, 2)) == 5  # the cosine fills the rest


# ---------------------------------------------------------------------- the Gram teacher


def test_gram_teacher_is_frozen_loaded_and_refreshed_at_exactly_the_configured_steps():
    """Loaded before step 1; refreshed after the steps it with it + 1 >= 3 and (it + 1) % 2 == 0
    (3, 5, 7), at most twice (3, 5); never trained."""
    torch.manual_seed(0)
    gram = {"it_load_ema_teacher": 1, "update_frequency": 2, "it_first_update": 3, "max_updates": 2}
    module = tiny_module(warmup_epochs=0.0, gram=gram)  # (no lr warm-up: the teacher moves from step 0)
    gram_params = list(module.gram.teacher.parameters())
    assert gram_params and not any(p.requires_grad for p in gram_params)
    optimized = {id(p) for _, p in module.trained_parameters()}
    assert not optimized & {id(p) for p in gram_params}
    recorder = Recorder()
    teacher_before = module.teacher["backbone"].patch_embed.proj.weight.detach().clone()
    _fit(module, 8, [recorder])

    assert recorder.logged == [False] + [True] * 7  # the Gram term starts with the Gram teacher
    gram_w, teacher_w = recorder.gram_weights, recorder.teacher_weights
    # before step 1: the EMA teacher after step 0
    assert torch.equal(gram_w[1], teacher_w[0]) and torch.equal(gram_w[2], teacher_w[0])
    assert not torch.equal(teacher_w[0], teacher_before)
    # after steps 3 and 5 (and the EMA of that step); not after 7: max_updates
    for step in (3, 4):
        assert torch.equal(gram_w[step], teacher_w[3])
    for step in (5, 6, 7):
        assert torch.equal(gram_w[step], teacher_w[5])
    assert not torch.equal(teacher_w[7], teacher_w[5])
    assert int(module.gram.updates) == 2 and bool(module.gram.loaded_ema)
    assert all(p.grad is None for p in gram_params)


def test_gram_teacher_runs_in_eval_mode_and_the_loss_is_gramloss_of_the_patch_tokens():
    torch.manual_seed(0)
    module = tiny_module(drop_path_rate=0.0, gram={"it_load_ema_teacher": 0, "rep_update": False, "remove_neg": True})
    module.train()
    assert module.gram.teacher.training  # Lightning's train() reaches it ...
    crops = random_batch()["global"].flatten(0, 1)
    module.gram.copy_from(module.teacher["backbone"])
    with torch.no_grad():
        module.gram.teacher["backbone"].patch_embed.proj.weight.mul_(1.5)  # a Gram teacher unlike the student
        student = module.student["backbone"].forward_features(crops)[:, 1:]
        teacher = module.gram.teacher["backbone"].forward_features(crops)[:, 1:]
    got = module.gram(crops, student)
    assert not module.gram.teacher.training  # ... but its forwards run in eval mode
    want = GramLoss(remove_neg=True)(student, teacher)
    assert got.item() > 0 and torch.allclose(got, want, rtol=1e-6)


def test_high_resolution_gram_teacher_sees_twice_the_pixels_resampled_to_the_students_grid():
    torch.manual_seed(0)
    module = tiny_module(gram={"it_load_ema_teacher": 0, "teacher_upsample": 2})
    crops = random_batch(batch=2)["global"].flatten(0, 1)  # 32 px: a 2 x 2 grid of patch 16
    got = module.gram.teacher_patches(crops, (2, 2))
    with torch.no_grad():
        big = F.interpolate(crops, size=(64, 64), mode="bicubic", align_corners=False)
        tokens = module.gram.teacher["backbone"].forward_features(big)[:, 1:]  # [B, 16, D]: 4 x 4
        maps = tokens.transpose(1, 2).reshape(len(crops), -1, 4, 4)
        want = F.interpolate(maps, size=(2, 2), mode="bicubic", align_corners=False).flatten(2).transpose(1, 2)
    assert got.shape == (4, 4, 64)
    torch.testing.assert_close(got, want)


def test_a_gram_teacher_file_loads_when_it_is_the_runs_architecture_and_is_refused_otherwise(tmp_path):
    kwargs = TINY_MODEL["backbone_kwargs"]
    same = timm.create_model("vit_tiny_patch16_224", num_classes=0, **kwargs)
    torch.save(same.state_dict(), tmp_path / "same.pth")
    module = tiny_module(gram={"ckpt": str(tmp_path / "same.pth"), "rep_update": False})
    loaded = module.gram.teacher["backbone"].state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in same.state_dict().items()) and module.gram.active
    wider = timm.create_model("vit_tiny_patch16_224", num_classes=0, **{**kwargs, "embed_dim": 96})
    torch.save(wider.state_dict(), tmp_path / "wider.pth")
    with pytest.raises(ValueError, match=r"model.gram.ckpt .*wider.pth: .*\[96.*vs .*\[64") as err:
        tiny_module(gram={"ckpt": str(tmp_path / "wider.pth")})
    assert "\n" not in str(err.value)


def test_ema_teacher_uses_the_ema_teachers_patch_tokens():
    torch.manual_seed(0)
    module = tiny_module(drop_path_rate=0.0, gram={"ema_teacher": True, "rep_update": False})
    assert module.gram.teacher is None and module.gram.active
    batch = random_batch()
    crops = batch["global"].flatten(0, 1)
    with torch.no_grad():
        module.teacher["backbone"].patch_embed.proj.weight.mul_(1.5)
        student = module.student["backbone"].forward_features(crops)[:, 1:]
        teacher = module.teacher["backbone"].forward_features(crops)[:, 1:]
        dino = tiny_module(drop_path_rate=0.0)
        for branch in ("student", "teacher"):
            getattr(dino, branch).load_state_dict(getattr(module, branch).state_dict())
    module.schedules = dino.schedules = _schedules()
    module.gram.build_schedule(4, 4)
    values = module.schedule_values(0) | {"gram_loss_weight": 0.5}
    step = module.step_losses(batch, values)
    want = GramLoss(remove_neg=False)(student, teacher)
    torch.testing.assert_close(step.parts["gram_loss"], want)
    plain = dino.step_losses(batch, values).loss
    torch.testing.assert_close(step.loss, plain + 0.5 * want)
    torch.testing.assert_close(step.parts["dino_loss"], plain)


def _schedules():
    from locatdino.ssl import DINOSchedules

    return DINOSchedules.build(
        total_steps=4,
        steps_per_epoch=4,
        global_batch=4,
        base_lr=1e-3,
        min_lr=0.0,
        warmup_epochs=0,
        weight_decay=0.0,
        weight_decay_end=0.0,
        momentum_teacher=0.9,
        momentum_teacher_end=1.0,
        teacher_temp=0.04,
        warmup_teacher_temp=0.04,
        warmup_teacher_temp_epochs=0,
    )


def test_ibot_gram_on_the_unmasked_tokens_of_the_masked_student_crops():
    torch.manual_seed(0)
    gram = {"it_load_ema_teacher": 0, "tokens_used": "unmasked", "img_level": False}
    kwargs = {**TINY_MODEL, "backbone_kwargs": {**TINY_MODEL["backbone_kwargs"], "patch_size": 8}}
    module = IBOTModule(backbone="vit_tiny_patch16_224", batch_size=4, mask_probability=1.0, gram=gram, **kwargs)
    recorder = Recorder()
    _fit(module, 2, [recorder])
    assert recorder.logged == [True, True] and isinstance(module.gram, GramAnchor)
    assert GramOptions.parse(gram).tokens_used == "unmasked"


def test_resume_restores_the_gram_teacher_and_continues_exactly(tmp_path):
    gram = {"it_load_ema_teacher": 1, "update_frequency": 2, "it_first_update": 0}
    modules = []

    def build():
        modules.append(tiny_module(drop_path_rate=0.0, warmup_epochs=0.0, lr=5e-2, gram=gram))  # (RNG: not saved)
        return modules[-1]

    whole, first, second, trainer = resumed_losses(tmp_path, build, random_batch(seed=3))
    assert first == whole[:3]
    assert second == pytest.approx(whole[3:], rel=1e-6, abs=0)  # resumed after step 2
    uninterrupted, resumed = modules[0].gram, modules[2].gram
    assert int(resumed.updates) == int(uninterrupted.updates) == 3  # after steps 1, 3, 5
    for a, b in zip(uninterrupted.teacher.parameters(), resumed.teacher.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
