"""IBOTModule: the step against a crop-by-crop formulation of docs/pretraining.md in fp64, masks, the mask
token, learning on a fixed batch, resume."""

import copy
import os
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from ssl_helpers import (
    TINY_IBOT,
    LossRecorder,
    batches_loader,
    naive_dino_loss,
    random_batch,
    resumed_losses,
    tiny_trainer,
)
from test_koleo_loss import naive_koleo

from locatdino.ssl import IBOTModule


# the tiny DINO model at patch 8: 4 x 4 tokens per 32 px global crop, room for blocks of >= 4 patches
def tiny_ibot(**overrides) -> IBOTModule:
    kwargs = {**TINY_IBOT, "backbone": "vit_tiny_patch16_224", "batch_size": 4, "patch_out_dim": 96, **overrides}
    return IBOTModule(**kwargs)


def reference_forward(backbone, image, mask=None, token=None):
    """One crop through a timm ViT with masked patch embeddings replaced by ``token`` one by one,
    the class token concatenated and the position embedding added by hand (build size: no
    resampling); returns the image embedding and the patch tokens after the final norm."""
    x = backbone.patch_embed(image[None]).reshape(1, -1, backbone.embed_dim).clone()
    if mask is not None:
        for p in torch.nonzero(mask).flatten().tolist():
            x[0, p] = token[0]
    x = torch.cat([backbone.cls_token, x], dim=1) + backbone.pos_embed
    for block in backbone.blocks:
        x = block(x)
    x = backbone.norm(x)
    return backbone.forward_head(x)[0], x[0, 1:]


def reference_step(m, batch, masks, t_temp, tp_temp):
    """docs/pretraining.md's objective of one batch, crop by crop and patch by patch, independent of the
    module's batched code: DINO over cross-view pairs, the masked-patch loss, KoLeo."""
    h = m.hparams
    s_patch_head = m.student["patch_head"] if h.separate_patch_head else m.student["head"]
    t_patch_head = m.teacher["patch_head"] if h.separate_patch_head else m.teacher["head"]
    v_g, b = batch["global"].shape[:2]
    crops = batch["global"].flatten(0, 1)
    s_cls, s_emb, patch_terms = [], [], 0.0
    t_cls = []
    for _c, (image, mask) in enumerate(zip(crops, masks)):
        t_e, t_p = reference_forward(m.teacher["backbone"], image)
        s_e, s_p = reference_forward(m.student["backbone"], image, mask, m.mask_token.token)
        t_cls.append(m.teacher["head"](t_e[None])[0])
        s_cls.append(m.student["head"](s_e[None])[0])
        s_emb.append(s_e)
        n = int(mask.sum())
        for p in torch.nonzero(mask).flatten().tolist():
            target = F.softmax((t_patch_head(t_p[p][None])[0] - m.ibot_loss.center) / tp_temp, dim=-1)
            log_q = F.log_softmax(s_patch_head(s_p[p][None])[0] / h.student_temp, dim=-1)
            patch_terms = patch_terms - (target * log_q).sum() / n
    for image in batch["local"].flatten(0, 1):
        s_cls.append(m.student["head"](m.student["backbone"](image[None]))[0])
    student = torch.stack(s_cls).unflatten(0, (-1, b))
    teacher = torch.stack(t_cls).unflatten(0, (v_g, b))
    dino, _ = naive_dino_loss(student, teacher, m.dino_loss.center, t_temp, h.student_temp)
    ibot = patch_terms / len(crops)
    koleo = sum(naive_koleo(e) for e in torch.stack(s_emb).unflatten(0, (v_g, b)))
    total = h.dino_loss_weight * dino + h.ibot_loss_weight * ibot + h.koleo_loss_weight * koleo
    return total, dino, ibot, koleo


@pytest.mark.parametrize(
    "backbone,separate,koleo",
    [
        ("vit_tiny_patch16_224", True, 0.1),
        ("vit_tiny_patch16_224", False, 0.0),
        ("locatvit_tiny_patch16_224", True, 0.1),
    ],
    ids=["vit-separate-koleo", "vit-shared", "locatvit-separate-koleo"],
)
def test_step_equals_the_crop_by_crop_reference_in_fp64(backbone, separate, koleo):
    torch.manual_seed(0)
    kwargs = dict(patch_out_dim=None) if not separate else {}
    m = tiny_ibot(
        backbone=backbone,
        separate_patch_head=separate,
        koleo_loss_weight=koleo,
        drop_path_rate=0.0,
        ibot_loss_weight=0.7,
        dino_loss_weight=1.3,
        mask_probability=0.75,
        **kwargs,
    ).double()
    with torch.no_grad():  # a teacher, centres and mask token that differ from the defaults
        for p in m.teacher.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        m.dino_loss.center.normal_(0, 0.3)
        m.ibot_loss.center.normal_(0, 0.3)
        m.mask_token.token.normal_(0, 1.0)
    batch = {k: v.double() for k, v in random_batch(batch=3, v_g=2, v_l=2).items()}
    masks = m.draw_masks(6, (4, 4), step=0, micro_batch=0)
    assert masks.sum(1).gt(0).sum() >= 3  # int(6 x 0.75) crops drawn for masking
    values = {"teacher_temp": 0.04, "teacher_patch_temp": 0.06}
    got = m.step_losses(batch, values)
    total, dino, ibot, want_koleo = reference_step(m, batch, masks, 0.04, 0.06)
    tol = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.parts["dino_loss"], dino, **tol)
    torch.testing.assert_close(got.parts["ibot_loss"], ibot, **tol)
    if koleo:
        assert got.parts["koleo_loss"].item() == pytest.approx(want_koleo, rel=1e-12)
    torch.testing.assert_close(got.loss, total.to(got.loss), **tol)
    assert got.parts["ibot_loss"] > 0
    # the centres move by what the step hands them: class logits of the global crops, patch logits at masks
    (dino_fn, t_out), (ibot_fn, t_patch) = got.center_inputs
    assert dino_fn is m.dino_loss and t_out.shape == (2, 3, 128)
    assert ibot_fn is m.ibot_loss and t_patch.shape == (int(masks.sum()), 96 if separate else 128)


def test_unmasked_patch_tokens_are_the_backbones_and_the_token_changes_only_masked_positions():
    torch.manual_seed(0)
    m = tiny_ibot(drop_path_rate=0.0).eval()
    x = torch.randn(2, 3, 32, 32)
    backbone = m.student["backbone"]
    embedding, patches = m.final_tokens("student")(m.student["backbone"], x)
    torch.testing.assert_close(embedding, backbone(x))
    torch.testing.assert_close(patches, backbone.forward_features(x)[:, 1:])
    masks = torch.zeros(2, 16, dtype=torch.bool)
    masks[0, 5] = True
    with torch.no_grad():
        m.mask_token.token.normal_()
    with m.mask_token.masking(masks):
        embedded = backbone.patch_embed(x).reshape(2, 16, -1)
    plain = backbone.patch_embed(x).reshape(2, 16, -1)
    torch.testing.assert_close(embedded[0, 5], m.mask_token.token[0])
    keep = ~masks
    torch.testing.assert_close(embedded[keep], plain[keep])
    with pytest.raises(ValueError, match=r"masks \(2, 9\) do not fit the patch embeddings"):
        with m.mask_token.masking(torch.zeros(2, 9, dtype=torch.bool)):
            backbone(x)


def test_one_step_trains_mask_token_and_patch_head_and_moves_both_centres():
    torch.manual_seed(0)
    m = tiny_ibot(warmup_epochs=0.0, freeze_last_layer=1.0)
    before = copy.deepcopy(m.state_dict())
    tiny_trainer(max_steps=1).fit(m, batches_loader([random_batch(), random_batch(seed=1)]))
    after = m.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert {"mask_token.token", "student.patch_head.mlp.0.weight", "dino_loss.center", "ibot_loss.center"} <= changed
    # both heads' last layers are frozen during the first epoch; the token has no teacher copy
    assert not {k for k in changed if k.startswith("student.") and ".last_layer." in k}
    assert not [k for k in after if "mask_token" in k and k != "mask_token.token"]
    assert m._micro_batch == 0  # reset after the optimizer step


def test_patch_temperature_warms_up_over_the_teacher_warmup():
    torch.manual_seed(0)
    m = tiny_ibot(warmup_teacher_temp_epochs=1.0, warmup_teacher_patch_temp=0.02, teacher_patch_temp=0.08)
    tiny_trainer(max_steps=6).fit(m, batches_loader([random_batch(seed=s) for s in range(3)]))
    temps = [m.schedule_values(s)["teacher_patch_temp"] for s in range(7)]
    assert temps == pytest.approx([0.02, 0.05, 0.08, 0.08, 0.08, 0.08, 0.08])  # 3 steps per epoch


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="mask_ratio must be"):
        tiny_ibot(mask_ratio=(0.5, 0.1))
    with pytest.raises(ValueError, match="patch_out_dim 96 needs separate_patch_head"):
        tiny_ibot(separate_patch_head=False)


@mock.patch.dict(os.environ)  # seed_everything writes PL_GLOBAL_SEED: kept inside this test
def test_steps_on_a_fixed_batch_lower_the_loss():
    """Teacher and both centres held fixed (momentum 1): the student must learn to predict the
    teacher's class and patch targets of one batch, so the loss (DINO + iBOT) falls."""
    pl.seed_everything(0)
    rec = LossRecorder()
    m = tiny_ibot(
        batch_size=8,
        lr=5e-3,
        warmup_epochs=0.0,
        freeze_last_layer=0.0,
        momentum_teacher=1.0,
        center_momentum=1.0,
        patch_center_momentum=1.0,
        drop_path_rate=0.0,
    )
    batch = random_batch(batch=8, seed=4)
    tiny_trainer(max_steps=12, callbacks=[rec]).fit(m, batches_loader([batch] * 12))
    assert len(rec.losses) == 12
    assert sum(rec.losses[-3:]) / 3 < sum(rec.losses[:3]) / 3 - 0.3, rec.losses


def test_resume_replays_masks_and_schedules_exactly(tmp_path):
    """Stop after step 3, resume from last.ckpt with another seed: steps 4-6 give the losses of an
    uninterrupted run. They depend on the masks (drawn from the step, not from state), the mask
    seed (restored from the checkpoint), the patch-temperature warm-up and both centres."""
    kwargs = dict(
        drop_path_rate=0.0,
        warmup_epochs=1.0,
        freeze_last_layer=1.0,
        warmup_teacher_temp_epochs=2.0,
        teacher_temp=0.07,
        warmup_teacher_patch_temp=0.03,
        lr=5e-2,
    )
    # the module's default mask seed is the torch seed at its construction (0, then 1 on resume)
    whole, first, second, trainer = resumed_losses(tmp_path, lambda: tiny_ibot(**kwargs), random_batch(batch=4, seed=3))
    assert first == whole[:3]
    assert second == pytest.approx(whole[3:], rel=1e-6, abs=0)
    assert trainer.global_step == 6 and trainer.lightning_module.mask_seed == 0
    assert len(set(whole)) == 6
