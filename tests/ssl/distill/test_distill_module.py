"""The distillation objective on tiny networks: its loss is the weighted sum of the class and patch
distances to the frozen teacher's features (computed here from the teacher's own forward), the
teacher never receives a gradient, stays in eval mode and keeps its weights bit for bit, DINO's
loss joins with its weight, checkpoints leave the teacher out and a resume restores the same
state, and a teacher that cannot be matched is refused in one line."""

import math

import lightning.pytorch as pl
import pytest
import timm
import torch
import torch.nn.functional as F
from ssl_helpers import TINY_MODEL, batches_loader, random_batch, resumed_losses, tiny_trainer

from locatdino.ssl import DistillModule
from locatdino.ssl.distill.module import FINGERPRINT_KEY, TEACHER_PREFIX

TEACHER_NAME = "test_vit"  # timm's 6-block, 64-wide test ViT


def save_teacher(path, patch: int = 16, name: str = TEACHER_NAME, seed: int = 0):
    """A random ``name`` ViT at 32 px and ``patch`` saved as a state dict; returns ``NAME:FILE``."""
    torch.manual_seed(seed)
    model = timm.create_model(name, num_classes=0, img_size=32, patch_size=patch)
    torch.save(model.state_dict(), path)
    return f"{name}:{path}"


def student(teacher: str, **overrides) -> DistillModule:
    """A DistillModule on the tests' tiny student (patch 8: a 4 x 4 grid on 32 px crops)."""
    kwargs = {
        **TINY_MODEL,
        "backbone_kwargs": {**TINY_MODEL["backbone_kwargs"], "patch_size": 8},
        "backbone": "vit_tiny_patch16_224",
        "batch_size": 4,
        "teacher": teacher,
        **overrides,
    }
    return DistillModule(**kwargs)


@pytest.fixture
def teacher_spec(tmp_path):
    return save_teacher(tmp_path / "teacher.pth")


def naive_step_loss(module: DistillModule, crops: torch.Tensor) -> float:
    """The distillation loss from scratch: the teacher's class embedding and normed patch tokens
    from its own ``forward_features`` (eval mode), the patch tokens resampled to the student's
    grid, both projected student features, the distance written out."""
    h = module.hparams
    images = crops.flatten(0, 1)
    teacher = module.distill_teacher.backbone
    with torch.no_grad():
        tokens = teacher.forward_features(images)  # [B, 1 + 2·2, 64], after the final norm
        t_cls = teacher.forward_head(tokens, pre_logits=True)
        t_maps = tokens[:, teacher.num_prefix_tokens :].transpose(1, 2).reshape(len(images), -1, 2, 2)
        t_patches = F.interpolate(t_maps, size=(4, 4), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
        s_tokens = module.student["backbone"].forward_features(images)
        s_cls = module.student["backbone"].forward_head(s_tokens, pre_logits=True)
        s_patches = s_tokens[:, 1:]
        proj_cls, proj_patch = module.projection["cls"], module.projection["patch"]

        def distance(s, t):
            if h.distill_distance == "mse":
                return float(((s - t) ** 2).mean())
            cos = (s * t).sum(-1) / (s.norm(dim=-1) * t.norm(dim=-1))
            return float((1 - cos).mean())

        cls_term = distance(proj_cls(s_cls), t_cls)
        patch_term = distance(proj_patch(s_patches), t_patches)
    return h.distill_loss_weight * (cls_term + h.distill_patch_weight * patch_term)


@pytest.mark.parametrize("distance", ["cosine", "mse"])
def test_the_step_loss_is_the_weighted_class_and_patch_distance_to_the_teacher(teacher_spec, distance):
    torch.manual_seed(0)
    module = student(teacher_spec, distill_distance=distance, distill_loss_weight=0.5, distill_patch_weight=2.0)
    module.eval()  # drop path off, so the naive forward sees the same student
    batch = random_batch(seed=1)
    step = module.step_losses(batch, {})
    assert float(step.loss.detach()) == pytest.approx(naive_step_loss(module, batch["global"]), rel=1e-5)
    assert float(step.parts["distill_loss"]) == pytest.approx(
        float(step.parts["distill_cls_loss"]) + 2.0 * float(step.parts["distill_patch_loss"]), rel=1e-6
    )
    assert step.teacher_probs is None and step.center_inputs == []


def test_the_teacher_never_trains_and_keeps_its_weights_bit_for_bit(teacher_spec):
    torch.manual_seed(0)
    module = student(teacher_spec)
    teacher = module.distill_teacher.backbone
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = module.student["backbone"].patch_embed.proj.weight.detach().clone()
    seen = []
    teacher.register_forward_hook(lambda m, args, out: seen.append((m.training, torch.is_grad_enabled(), out.grad_fn)))
    grads = []

    class AfterBackward(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            grads.append([p.grad for p in pl_module.distill_teacher.parameters()])
            trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
            grads.append([id(p) in trained for p in pl_module.distill_teacher.parameters()])

    trainer = tiny_trainer(max_steps=3, callbacks=[AfterBackward()])
    trainer.fit(module, batches_loader([random_batch(seed=i) for i in range(3)]))
    assert len(seen) == 3 and seen == [(False, False, None)] * 3  # eval mode, no graph, every step
    assert all(not p.requires_grad for p in teacher.parameters())
    assert all(g is None for g in grads[0]) and not any(grads[1])  # no gradient, not in the optimizer
    after = teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(student_before, module.student["backbone"].patch_embed.proj.weight)  # the student trained
    projection = {id(p) for p in module.projection.parameters()}
    assert projection <= {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}


def test_on_the_cpu_the_teacher_runs_in_fp32_even_inside_a_bf16_mixed_step(teacher_spec):
    """bf16 autocast is for CUDA only: inside a CPU bf16 autocast (a bf16-mixed run) it is turned off."""
    module = student(teacher_spec)
    dtypes = []
    module.distill_teacher.backbone.blocks[0].attn.qkv.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t_cls, t_patches = module.distill_teacher(torch.randn(2, 3, 32, 32), (4, 4))
    assert dtypes == [torch.float32] and t_cls.dtype == t_patches.dtype == torch.float32


def test_dino_joins_with_its_weight_and_trains_the_head(teacher_spec):
    torch.manual_seed(0)
    off = student(teacher_spec)
    assert not any(p.requires_grad for p in off.student["head"].parameters())  # DINO off: heads frozen
    torch.manual_seed(0)
    module = student(teacher_spec, dino_loss_weight=0.25)
    assert any(p.requires_grad for p in module.student["head"].parameters())  # (a normed last layer's gain is fixed)
    trainer = tiny_trainer(max_steps=1)
    trainer.fit(module, batches_loader([random_batch(seed=0)]))
    logged = trainer.logged_metrics
    total = float(logged["train/distill_loss"]) + 0.25 * float(logged["train/dino_loss"])
    assert float(logged["train/loss"]) == pytest.approx(total, rel=1e-5)
    assert "teacher/entropy" in logged and math.isfinite(float(logged["teacher/entropy"]))


def test_a_teacher_with_another_patch_is_resampled_to_the_students_grid(tmp_path):
    """A patch-4 teacher (8 x 8 tokens on 32 px) under the patch-8 student (4 x 4); a 20 px crop
    the patch-8 teacher does not divide is taken to the nearest multiple, 24 px (3 x 3)."""
    fine = student(save_teacher(tmp_path / "p4.pth", patch=4))
    t_cls, t_patches = fine.distill_teacher(torch.randn(2, 3, 32, 32), (4, 4))
    assert t_cls.shape == (2, 64) and t_patches.shape == (2, 16, 64)
    odd = student(save_teacher(tmp_path / "p8.pth", patch=8), teacher_image_size=20)
    assert odd.distill_teacher.input_side(32) == 24
    seen = []
    odd.distill_teacher.backbone.patch_embed.register_forward_hook(lambda m, a, out: seen.append(tuple(a[0].shape)))
    _, patches = odd.distill_teacher(torch.randn(2, 3, 32, 32), (4, 4))
    assert seen == [(2, 3, 24, 24)] and patches.shape == (2, 16, 64)


def test_checkpoints_leave_the_teacher_out_and_a_resume_restores_the_same_state(teacher_spec, tmp_path):
    modules = []

    def build():
        modules.append(student(teacher_spec, drop_path_rate=0.0, warmup_epochs=0.0, lr=5e-2))  # (RNG: not saved)
        return modules[-1]

    whole, first, second, _ = resumed_losses(tmp_path, build, random_batch(seed=3))
    assert first == whole[:3]
    assert second == pytest.approx(whole[3:], rel=1e-6, abs=0)  # resumed after step 2, from another seed's init
    uninterrupted, resumed = modules[0], modules[2]
    for name, value in uninterrupted.state_dict().items():  # the same state at the end, the teacher's included
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)

    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert not [k for k in saved["state_dict"] if k.startswith(TEACHER_PREFIX)]
    assert {"projection.cls.weight", "projection.patch.weight", "teacher.backbone.cls_token"} <= set(
        saved["state_dict"]
    )
    assert saved[FINGERPRINT_KEY] == uninterrupted.distill_teacher.fingerprint

    save_teacher(tmp_path / "teacher.pth", seed=1)  # the teacher's file changed since
    with pytest.raises(ValueError, match=r"^model.teacher test_vit:.*: not the weights this run was trained with"):
        tiny_trainer(tmp_path, max_steps=8).fit(
            student(teacher_spec), batches_loader([random_batch()]), ckpt_path=str(tmp_path / "last.ckpt")
        )


def test_a_fit_checkpoint_teaches_with_its_ema_teacher(tmp_path):
    """``NAME:last.ckpt`` of a DINO run: the teacher is the run's EMA teacher, not its student."""
    from locatdino.ssl import DINOModule

    torch.manual_seed(0)
    run = DINOModule(**{**TINY_MODEL, "backbone": TEACHER_NAME, "backbone_kwargs": {"img_size": 32}})
    for p in run.student.parameters():  # make the student differ from the EMA teacher
        p.data.add_(1.0)
    ckpt = {"pytorch-lightning_version": "2.5", "state_dict": run.state_dict(), "evaluated_network": "teacher"}
    torch.save(ckpt, tmp_path / "last.ckpt")
    module = student(f"{TEACHER_NAME}:{tmp_path / 'last.ckpt'}")
    loaded, ema = module.distill_teacher.backbone.state_dict(), run.teacher["backbone"].state_dict()
    assert loaded.keys() == ema.keys() and all(torch.equal(loaded[k], ema[k]) for k in ema)


@pytest.mark.parametrize(
    "teacher, match",
    [
        (None, r"^model.teacher: DistillModule needs its frozen teacher, NAME:FILE$"),
        ("test_vit", r"^model.teacher 'test_vit': expected NAME:FILE"),
        (
            "swin_tiny_patch4_window7_224:{file}",
            r"a Swin has no patch tokens after a final norm .*: distillation matches",
        ),
        (
            "test_resnet:{file}",
            r"test_resnet is not a backbone with patch tokens \(ResNet.__init__\(\) got an unexpected",
        ),
        ("vit_tiny_patch16_224:{file}", r"^model.teacher vit_tiny_patch16_224:\S*teacher.pth: .*\b(192|64)\b"),
        ("test_vit:{missing}", r"^model.teacher test_vit:.*missing.pth: "),
    ],
)
def test_a_teacher_that_cannot_be_matched_or_loaded_is_refused_in_one_line(teacher_spec, tmp_path, teacher, match):
    if teacher is not None:
        teacher = teacher.format(file=teacher_spec.split(":", 1)[1], missing=tmp_path / "missing.pth")
    with pytest.raises(ValueError, match=match) as err:
        student(teacher)
    assert "\n" not in str(err.value)


def test_gram_is_not_an_option_of_distillation(teacher_spec):
    with pytest.raises(ValueError, match=r"^model.gram: Gram anchoring is an option of DINO and iBOT"):
        student(teacher_spec, gram={"it_load_ema_teacher": 0})


def test_a_teacher_named_with_its_pretrained_tag_loads_its_file(teacher_spec):
    """``vit_small_patch16_224.dino:FILE`` as users copy it from timm: the tag names the weights
    that FILE holds, so it is no request to download them."""
    name, path = teacher_spec.split(":", 1)
    tagged = student(f"{name}.r160_in1k:{path}").distill_teacher.backbone
    plain = student(teacher_spec).distill_teacher.backbone
    assert tagged.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(tagged.state_dict()[k], v) for k, v in plain.state_dict().items())
