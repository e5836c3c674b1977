import copy
import os
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision
from ssl_helpers import LossRecorder, batches_loader, random_batch, resumed_losses, tiny_module, tiny_trainer


def test_student_teacher_layout_and_frozen_teacher():
    torch.manual_seed(0)
    m = tiny_module()
    keys = m.state_dict().keys()
    for prefix in ("student.backbone.", "student.head.", "teacher.backbone.", "teacher.head."):
        assert any(k.startswith(prefix) for k in keys)
    assert "dino_loss.center" in keys
    assert not any(p.requires_grad for p in m.teacher.parameters())
    for (ns, s), (nt, t) in zip(m.student.state_dict().items(), m.teacher.state_dict().items()):
        assert ns == nt and torch.equal(s, t)
    # drop-path on the student only
    assert m.student["backbone"].blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
    assert isinstance(m.teacher["backbone"].blocks[-1].drop_path1, torch.nn.Identity)
    assert m.eval_backbone is m.teacher["backbone"]
    x = torch.randn(2, 3, 32, 32)
    emb = m.eval_backbone(x)
    tokens = m.eval_backbone.forward_features(x)
    torch.testing.assert_close(emb, tokens[:, 0])  # class token after the final norm
    assert m(x).shape == (2, 64)


def test_branch_forward_batches_each_resolution_like_per_view_calls():
    torch.manual_seed(0)
    m = tiny_module(drop_path_rate=0.0).eval()
    b = random_batch(batch=3, v_g=2, v_l=3)
    out = m.forward_branch(m.student, [b["global"], b["local"]])
    assert out.shape == (5, 3, 128)
    views = list(b["global"]) + list(b["local"])
    for v, x in enumerate(views):
        torch.testing.assert_close(out[v], m.student["head"](m.student["backbone"](x)), rtol=1e-4, atol=1e-5)


def test_one_step_ema_center_schedules_param_groups_and_frozen_last_layer():
    torch.manual_seed(0)
    m = tiny_module(warmup_epochs=0.0, freeze_last_layer=1.0)
    batch = random_batch(batch=4)
    s0 = copy.deepcopy(m.student.state_dict())
    with torch.no_grad():
        teacher_out = m.forward_branch(m.teacher, [batch["global"]])
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(m, batches_loader([batch, batch]))  # 2 batches per epoch: step 0 is in epoch 0

    values = m.schedules.at(0)
    mom = values["teacher_momentum"]
    s1 = m.student.state_dict()
    for name, t in m.teacher.state_dict().items():
        torch.testing.assert_close(t, mom * s0[name] + (1 - mom) * s1[name])
    torch.testing.assert_close(m.dino_loss.center, 0.1 * teacher_out.reshape(-1, 128).mean(0))
    # last layer frozen during the first epoch, the rest moved
    last = "head.last_layer.parametrizations.weight.original1"
    assert torch.equal(s1[last], s0[last])
    assert not torch.equal(s1["head.mlp.0.weight"], s0["head.mlp.0.weight"])
    # lr from the batch-size rule, weight decay on matrices only
    opt = trainer.optimizers[0]
    assert all(g["lr"] == values["lr"] == pytest.approx(5e-4 * 4 / 256) for g in opt.param_groups)
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    for name, p in m.student.named_parameters():
        if not p.requires_grad:
            assert id(p) not in by_param  # the frozen weight-norm gain (norm_last_layer)
            continue
        wd = by_param[id(p)]["weight_decay"]
        assert wd == (0.0 if p.ndim <= 1 or name.endswith(".bias") else values["weight_decay"]), name


def test_last_layer_trains_after_freeze():
    torch.manual_seed(0)
    m = tiny_module(freeze_last_layer=0.0, warmup_epochs=0.0)
    s0 = copy.deepcopy(m.student.state_dict())
    tiny_trainer(max_steps=1).fit(m, batches_loader([random_batch()]))
    last = "head.last_layer.parametrizations.weight.original1"
    assert not torch.equal(m.student.state_dict()[last], s0[last])


def _nan_batches():
    bad = random_batch(seed=2)
    bad["global"][0, 0] = float("nan")
    return [random_batch(seed=0), random_batch(seed=1), bad]


def test_nonfinite_loss_stops_with_message_and_keeps_last_checkpoint(tmp_path):
    torch.manual_seed(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = tiny_trainer(max_steps=3, enable_checkpointing=True, callbacks=[ckpt])
    with pytest.raises(FloatingPointError, match=r"not finite at step 2, .*here nan.*last\.ckpt"):
        trainer.fit(tiny_module(), batches_loader(_nan_batches()))
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert state["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())


class _Snapshot(pl.Callback):
    def on_train_batch_start(self, trainer, m, batch, batch_idx):
        self.before = copy.deepcopy(m.state_dict())

    def on_train_batch_end(self, trainer, m, outputs, batch, batch_idx):
        if batch_idx == 2:
            self.changed = [k for k, v in m.state_dict().items() if not torch.equal(v, self.before[k])]


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "16-mixed"])
def test_nonfinite_loss_skip_leaves_every_weight_and_the_center_alone(fp16):
    torch.manual_seed(0)
    snap = _Snapshot()
    plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", 2.0**4))] if fp16 else None
    trainer = tiny_trainer(max_steps=3, callbacks=[snap], plugins=plugins)
    with pytest.warns(UserWarning, match="skipping the step"):
        trainer.fit(tiny_module(on_nonfinite="skip", warmup_epochs=0.0), batches_loader(_nan_batches()))
    assert snap.changed == []  # no weight, teacher, centre or optimizer-visible change
    assert trainer.callback_metrics["train/skipped_steps"] == 1


def test_a_skipped_step_logs_nan_never_the_previous_steps_values(tmp_path):
    """metrics.csv once repeated step 1's loss, lr and entropy in the row of the skipped step 2:
    the row now holds NaN as its loss and entropy, its own lr, and the skipped-step count."""
    import csv
    import math

    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    logger = CSVLogger(tmp_path, name="logs")
    module = tiny_module(on_nonfinite="skip", warmup_epochs=1.0)  # the lr rises every step
    trainer = tiny_trainer(max_steps=4, logger=logger)
    with pytest.warns(UserWarning, match="skipping the step"):
        trainer.fit(module, batches_loader(_nan_batches() + [random_batch(seed=3)]))
    with open(f"{logger.log_dir}/metrics.csv") as f:
        rows = {int(r["step"]): r for r in csv.DictReader(f) if r["train/loss"]}
    assert sorted(rows) == [0, 1, 2, 3]
    assert math.isnan(float(rows[2]["train/loss"])) and math.isnan(float(rows[2]["teacher/entropy"]))
    assert [float(rows[i]["train/lr"]) for i in range(4)] == pytest.approx(module.schedules.lr[:4].tolist())
    assert len({rows[i]["train/lr"] for i in range(4)}) == 4
    assert [rows[i]["train/skipped_steps"] for i in range(4)] == ["", "", "1.0", "1.0"]
    assert all(math.isfinite(float(rows[i]["train/loss"])) for i in (0, 1, 3))


def test_16_mixed_clips_unscaled_gradients(monkeypatch):
    """Under a grad scaler (here 2**4) clipping must see the true gradients: those of fp32."""
    import locatdino.ssl.dino.module as dino_module

    seen, original = [], dino_module.clip_grad_per_tensor_

    def recording_clip(params, max_norm, sharded=False):
        norms = original(params, max_norm, sharded)
        seen.append(norms.max().item())
        return norms

    monkeypatch.setattr(dino_module, "clip_grad_per_tensor_", recording_clip)
    for plugin in [None, MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", 2.0**4))]:
        torch.manual_seed(0)
        trainer = tiny_trainer(max_steps=1, plugins=[plugin] if plugin else None)
        trainer.fit(tiny_module(), batches_loader([random_batch()]))
    fp32, fp16 = seen
    assert fp16 == pytest.approx(fp32, rel=0.05) and fp32 > 3.0  # and large enough to be clipped


def test_bf16_mixed_steps():
    torch.manual_seed(0)
    trainer = tiny_trainer(max_steps=2, precision="bf16-mixed")
    trainer.fit(tiny_module(), batches_loader([random_batch(seed=0), random_batch(seed=1)]))
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def scene_loader(num_images=64, batch_size=16):
    from locatdino.data import MultiCropTransform, ScenesSegmentation, collate_multicrop

    scenes = ScenesSegmentation(num_images, size=64)
    crops = MultiCropTransform(
        global_crop_size=32, local_crop_size=16, num_local_crops=2, color_jitter_prob=0.3, grayscale_prob=0.0
    )
    dataset = [crops(scenes[i][0]) for i in range(num_images)]
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_multicrop)


@pytest.mark.slow
@mock.patch.dict(os.environ)  # seed_everything writes PL_GLOBAL_SEED: kept inside this test
@pytest.mark.parametrize("backbone", ["vit_tiny_patch16_224", "locatvit_tiny_patch16_224"])
def test_twenty_steps_on_scenes_lower_the_loss(backbone):
    """Teacher and centre held fixed (momentum 1): a plain optimisation problem, the student must
    learn to predict the teacher's targets from every other crop, so the loss has to fall. (With
    moving targets the loss of a 20-step DINO run first falls, then rises as the centre catches
    up: configs/dino_tiny_cpu.yaml shows those dynamics.)"""
    pl.seed_everything(0)
    rec = LossRecorder()
    m = tiny_module(
        backbone=backbone,
        batch_size=16,
        lr=5e-3,
        warmup_epochs=0.25,
        freeze_last_layer=0.0,
        momentum_teacher=1.0,
        center_momentum=1.0,
    )
    teacher0 = copy.deepcopy(m.teacher.state_dict())
    tiny_trainer(max_steps=20, callbacks=[rec]).fit(m, scene_loader())
    first, last = sum(rec.losses[:5]) / 5, sum(rec.losses[-5:]) / 5
    assert len(rec.losses) == 20
    assert last < first - 0.4, rec.losses
    assert all(torch.equal(v, teacher0[k]) for k, v in m.teacher.state_dict().items())


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    """Stop after step 3, resume from last.ckpt: steps 4-6 give the losses of an uninterrupted run.

    Steps 4-6 depend on the restored optimizer moments, schedules (warm-up, last-layer freeze and
    teacher temperature all change within them), teacher, center and step counter. Drop-path is
    off: RNG streams are not part of a checkpoint.
    """
    kwargs = dict(
        drop_path_rate=0.0,
        warmup_epochs=1.0,
        freeze_last_layer=1.0,
        warmup_teacher_temp_epochs=2.0,
        teacher_temp=0.07,
        lr=5e-2,
    )
    whole, first, second, trainer = resumed_losses(
        tmp_path, lambda: tiny_module(**kwargs), random_batch(batch=4, seed=3)
    )
    assert first == whole[:3]
    assert second == pytest.approx(whole[3:], rel=1e-6, abs=0)
    assert trainer.global_step == 6
    assert len(set(whole)) == 6  # the steps really differ


def test_no_weight_decay_on_1d_params_of_checkpoint_wrapped_blocks():
    """Lightning's ``activation_checkpointing`` inserts ``_checkpoint_wrapped_module.`` into the
    parameter names of every block: biases and norms there must still get no weight decay."""
    from timm.models.vision_transformer import Block
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    torch.manual_seed(0)
    m = tiny_module(warmup_epochs=0.0)
    for branch in (m.student, m.teacher):
        apply_activation_checkpointing(branch["backbone"], check_fn=lambda module: isinstance(module, Block))
    names = [n for n, _ in m.student.named_parameters()]
    assert sum("_checkpoint_wrapped_module." in n for n in names) == 2 * 12  # 12 tensors per block
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(m, batches_loader([random_batch()]))
    decay = {id(p) for g in trainer.optimizers[0].param_groups if g["weight_decay"] > 0 for p in g["params"]}
    decayed = sorted(n for n, p in m.student.named_parameters() if id(p) in decay)
    # per block qkv, proj, fc1, fc2; cls token, pos embed, patch embedding (as in the reference:
    # only biases and 1-D tensors are exempt); the head's 3 MLP layers and last layer
    assert len(decayed) == 2 * 4 + 3 + 3 + 1, decayed
    assert all(p.ndim > 1 for n, p in m.student.named_parameters() if id(p) in decay), decayed


@pytest.mark.parametrize("bad_index", [0, 1], ids=["first", "second"])
def test_skip_is_sticky_over_the_micro_batches_of_one_step(bad_index):
    """Accumulating 2 micro-batches, one non-finite: the whole optimizer step is skipped (no
    weight, teacher or centre change, also from the finite micro-batch), the next step trains."""
    torch.manual_seed(0)
    m = tiny_module(on_nonfinite="skip", warmup_epochs=0.0, freeze_last_layer=0.0)
    before = copy.deepcopy(m.state_dict())
    after_first = {}

    class AfterFirstStep(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                after_first.update(copy.deepcopy(module.state_dict()))

    bad = random_batch(seed=2)
    bad["global"][0, 0] = float("nan")
    trainer = tiny_trainer(max_steps=2, accumulate_grad_batches=2, callbacks=[AfterFirstStep()])
    with pytest.warns(UserWarning, match="skipping the step"):
        first_step = [random_batch(seed=1)]
        first_step.insert(bad_index, bad)
        trainer.fit(m, batches_loader([*first_step, random_batch(seed=3), random_batch(seed=4)]))
    assert [k for k, v in after_first.items() if not torch.equal(v, before[k])] == []
    assert m._skipped_steps == 1 and trainer.global_step == 2
    after = m.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert not torch.equal(after["student.head.mlp.0.weight"], before["student.head.mlp.0.weight"])
    assert not torch.equal(after["teacher.head.mlp.0.weight"], before["teacher.head.mlp.0.weight"])
    assert not torch.equal(after["dino_loss.center"], before["dino_loss.center"])


def test_log_every_n_steps_zero_logs_no_schedules_or_entropies():
    """Lightning allows ``log_every_n_steps=0`` (never log to the logger)."""
    torch.manual_seed(0)
    m = tiny_module()
    trainer = tiny_trainer(max_steps=2, log_every_n_steps=0)
    trainer.fit(m, batches_loader([random_batch(seed=0), random_batch(seed=1)]))
    assert trainer.global_step == 2 and "train/loss" in trainer.callback_metrics
    assert "teacher/entropy" not in trainer.callback_metrics and m.entropies_logged_at is None


class _Gradients(pl.Callback):
    """The student's gradients at every optimizer step (before clipping), by parameter name."""

    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.steps.append({n: p.grad.clone() for n, p in module.student.named_parameters() if p.grad is not None})


def test_gradient_accumulation_equals_one_larger_batch():
    """2 × 4 images with accumulate_grad_batches=2 = 1 × 8 images, in fp64 over two optimizer
    steps: the same gradients, centre, student and teacher (docs/pretraining.md). Every micro-batch's targets
    use the centre from before the step, which moves once per step by the mean over both."""
    # local crops at the global size: timm resamples pos_embed for other sizes in fp32
    quarters = [random_batch(batch=4, local_size=32, seed=s) for s in range(4)]
    doubled = [{k: torch.cat([a[k], b[k]], dim=1) for k in a} for a, b in (quarters[:2], quarters[2:])]
    runs = []
    for batches, accumulate, batch_size in [(quarters, 2, 4), (doubled, 1, 8)]:
        torch.manual_seed(0)
        m = tiny_module(drop_path_rate=0.0, warmup_epochs=0.0, freeze_last_layer=0.0, batch_size=batch_size)
        grads = _Gradients()
        trainer = tiny_trainer(max_steps=2, accumulate_grad_batches=accumulate, precision="64-true", callbacks=[grads])
        trainer.fit(m, batches_loader(batches))
        assert trainer.global_step == 2 and m._steps_per_epoch == 2 and m.dino_loss.center.dtype == torch.float64
        runs.append((grads.steps, m.state_dict()))
    (grads_acc, state_acc), (grads_big, state_big) = runs
    assert len(grads_acc) == len(grads_big) == 2 and grads_acc[0].keys() == grads_big[0].keys()
    for step_acc, step_big in zip(grads_acc, grads_big):
        for name, grad in step_acc.items():
            torch.testing.assert_close(grad, step_big[name], rtol=1e-9, atol=1e-13, msg=name)
    assert state_acc.keys() == state_big.keys()
    for name, value in state_acc.items():
        torch.testing.assert_close(value, state_big[name], rtol=1e-9, atol=1e-13, msg=name)
    assert state_acc["dino_loss.center"].abs().max() > 1e-3  # the centre did move


def test_steps_per_epoch_counts_a_last_partial_accumulation():
    """5 batches with accumulate_grad_batches=2: Lightning steps 3 times per epoch (ceil)."""
    torch.manual_seed(0)
    m = tiny_module(warmup_epochs=1.0)
    trainer = tiny_trainer(max_epochs=1, max_steps=-1, accumulate_grad_batches=2)
    trainer.fit(m, batches_loader([random_batch(seed=s) for s in range(5)]))
    assert trainer.global_step == 3 and m._steps_per_epoch == 3 and len(m.schedules) == 3
