"""The config digest the ranks compare and the line naming the first difference (the end-to-end
stop of two nodes launched with different settings is in tests/multinode/test_launch_mistakes.py)."""

from jsonargparse import Namespace

from locatdino.ssl.run.rank_agreement import config_digest, first_difference, flat_config


def config(lr: float, config_file: str = "configs/a.yaml") -> Namespace:
    return Namespace(
        config=[config_file],
        model=Namespace(class_path="locatdino.ssl.DINOModule", init_args=Namespace(lr=lr, mask_ratio=(0.1, 0.5))),
        trainer=Namespace(max_steps=10),
    )


def test_the_digest_follows_the_settings_not_the_config_file_names():
    flat = flat_config(config(0.002))
    assert flat == {
        "model.class_path": '"locatdino.ssl.DINOModule"',
        "model.init_args.lr": "0.002",
        "model.init_args.mask_ratio": "[0.1, 0.5]",
        "trainer.max_steps": "10",
    }
    assert config_digest(flat) == config_digest(flat_config(config(0.002, "/elsewhere/copy.yaml")))
    assert config_digest(flat) != config_digest(flat_config(config(0.5)))
    assert len(config_digest(flat)) == 64


def test_the_first_differing_key_is_named_with_both_values():
    same, other = flat_config(config(0.002)), flat_config(config(0.5))
    assert first_difference([same, same]) is None
    assert first_difference([same, same, other]) == "model.init_args.lr is 0.002 on rank 0, 0.5 on rank 2"
    extra = {**same, "trainer.devices": "2"}
    assert first_difference([same, extra]) == "trainer.devices is not set on rank 0, 2 on rank 1"
