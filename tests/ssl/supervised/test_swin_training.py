"""Swin backbones in pretraining: the supervised recipe trains a LocAtSwin; DINO and iBOT refuse Swin."""

import pytest
import torch
from ssl_helpers import TINY_MODEL, batches_loader, tiny_trainer

from locatdino.common.errors import UserError
from locatdino.models.swin import LocAtSwin
from locatdino.ssl import DINOModule, SupervisedModule
from locatdino.ssl.ibot.module import IBOTModule
from tests.models.tiny import TINY_SWIN

SWIN_64 = {**TINY_SWIN, "img_size": 64}  # stages of 16, 8, 4, 2 tokens per side, windows of 4, 4, 4, 2


def test_supervised_recipe_trains_a_locatswin_gaug_included(tmp_path):
    torch.manual_seed(0)
    m = SupervisedModule(
        backbone="locatswin_tiny",
        backbone_kwargs=SWIN_64,
        num_classes=4,
        batch_size=8,
        warmup_epochs=0.0,
        lr=0.05,
        mixup_alpha=0,
        cutmix_alpha=0,
        label_smoothing=0.0,
        drop_path_rate=0.0,
    )
    assert isinstance(m.classifier.backbone, LocAtSwin) and m.classifier.head.in_features == 128
    g = torch.Generator().manual_seed(0)
    batch = {"image": torch.randn(8, 3, 64, 64, generator=g), "target": torch.randint(0, 4, (8,), generator=g)}
    gaug = {n: p.detach().clone() for n, p in m.named_parameters() if ".attn.gaug." in n}
    assert len(gaug) == 4 * 8

    def loss() -> float:
        with torch.no_grad():
            value = float(m.criterion(m.eval()(batch["image"]), batch["target"]))
        m.train()
        return value

    before = loss()
    tiny_trainer(tmp_path, max_steps=10).fit(m, batches_loader([batch] * 10))
    assert loss() < 0.7 * before
    trained = dict(m.named_parameters())
    assert all(not torch.equal(trained[n], p) for n, p in gaug.items())  # GAug learns in every block


@pytest.mark.parametrize("objective", [DINOModule, IBOTModule])
def test_dino_and_ibot_refuse_a_swin_in_one_line(objective):
    kwargs = {**TINY_MODEL, "backbone_kwargs": SWIN_64}
    with pytest.raises(UserError, match=r"^model.backbone locatswin_tiny: DINO and iBOT pretrain ViTs") as err:
        objective(backbone="locatswin_tiny", batch_size=4, **kwargs)
    assert "\n" not in str(err.value)
