"""``ShardDataModule(augment_on="gpu")``: workers decode, the batch hook augments (CPU tensors here)."""

from collections import Counter

import pytest
import torch
from jsonargparse import ArgumentParser

from locatdino.data import MultiCropTransform, ShardDataModule
from locatdino.data.shards.stream import ShardLoader, ShardStream
from tests.data.data_fixtures import id_of

SMALL = MultiCropTransform(global_crop_size=32, local_crop_size=16, num_local_crops=2)


def test_two_ranks_decode_disjoint_samples_that_cover_the_shards(id_shards):
    """The decoded-image stream splits shards over ranks and workers as the CPU path does."""
    dm = ShardDataModule(id_shards, batch_size=4, multicrop=SMALL, augment_on="gpu", decoded_size=32)
    seen = Counter()
    for rank in range(2):
        stream = ShardStream(
            id_shards, dm.train_transform(), 4, rank=rank, world_size=2, shuffle_buffer=8, **dm.stream_options()
        )
        for batch in ShardLoader(stream, num_workers=2):
            assert batch["images"].dtype == torch.uint8 and batch["images"].shape[1:] == (3, 32, 32)
            assert (batch["sizes"] == torch.tensor([6, 8])).all()  # the id images are 8 x 6
            seen.update(id_of(image[:, 0, 0]) for image in batch["images"])
    assert sorted(seen) == list(range(30)) and set(seen.values()) == {1}


def test_the_batch_hook_augments_and_a_resumed_module_continues_the_draws(tmp_path):
    dm = ShardDataModule(
        str(tmp_path / "s"),
        batch_size=4,
        num_workers=0,
        multicrop=SMALL,
        synthetic=8,
        synthetic_size=40,
        augment_on="gpu",
    )
    dm.prepare_data()
    dm.setup("fit")
    raw = next(iter(dm.train_dataloader()))
    assert dm.decoded_size == 64  # 32 / sqrt(0.4) = 50.6 -> 64
    out = [dm.on_after_batch_transfer(dict(raw), 0) for _ in range(3)]
    assert out[0]["global"].shape == (2, 4, 3, 32, 32) and out[0]["local"].shape == (2, 4, 3, 16, 16)
    assert out[0]["skipped"].item() == 0 and "images" not in out[0]
    assert not torch.equal(out[0]["global"], out[1]["global"])  # a new draw for every batch
    state = dm.state_dict()
    assert state == {"epoch": 1, "augmented_batches": 3}

    resumed = ShardDataModule(str(tmp_path / "s"), batch_size=4, num_workers=0, multicrop=SMALL, augment_on="gpu")
    resumed.load_state_dict({"epoch": 1, "augmented_batches": 2})  # a checkpoint taken after two batches
    again = resumed.on_after_batch_transfer(dict(raw), 0)
    assert torch.equal(again["global"], out[2]["global"]) and torch.equal(again["local"], out[2]["local"])
    assert resumed.state_dict()["augmented_batches"] == 3


def test_the_cpu_path_is_the_default_and_leaves_batches_alone(tmp_path):
    dm = ShardDataModule(str(tmp_path), multicrop=SMALL)
    batch = {"global": torch.zeros(2, 1, 3, 32, 32)}
    assert dm.augment_on == "cpu" and dm.on_after_batch_transfer(batch, 0) is batch
    assert dm.train_transform() is SMALL and dm.stream_options() == {} and dm.state_dict() == {"epoch": 0}


def test_augment_on_from_yaml_and_bad_values():
    parser = ArgumentParser()
    parser.add_class_arguments(ShardDataModule, "data")
    dm = parser.instantiate(parser.parse_args(["--data.augment_on", "gpu", "--data.decoded_size", "256"])).data
    assert dm.augment_on == "gpu" and dm.decoded_size == 256
    with pytest.raises(ValueError, match="augment_on must be 'cpu' or 'gpu', got 'tpu'"):
        ShardDataModule(augment_on="tpu")


@pytest.mark.parametrize(
    "size, message",
    [
        (
            "8",
            "decoded_size 8 px is smaller than the largest crop (multicrop.global_crop_size 32 px): give at least 32, "
            "or leave it null for the default 64 px",
        ),
        ("0", "decoded_size 0 px is smaller than the largest crop (multicrop.global_crop_size 32 px)"),
    ],
)
def test_a_decoded_size_below_the_largest_crop_is_refused_by_fit(tmp_path, capsys, size, message):
    """``decoded_size 8`` for 32 px crops was accepted (every crop upsampled from 8 px); ``0`` was
    silently replaced by the default."""
    from locatdino import cli
    from tests.ssl.ssl_helpers import tiny_overrides

    status = cli.main(
        ["fit", *tiny_overrides(tmp_path), "--data.init_args.augment_on", "gpu", "--data.init_args.decoded_size", size]
    )
    err = capsys.readouterr().err
    assert status == 1 and err.startswith(f"locatdino fit: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "shards").exists() and not (tmp_path / "run" / "checkpoints").exists()
    big_local = MultiCropTransform(global_crop_size=32, local_crop_size=48, num_local_crops=2)
    with pytest.raises(ValueError, match=r"decoded_size 40 px .* \(multicrop.local_crop_size 48 px\)"):
        ShardDataModule(str(tmp_path), multicrop=big_local, augment_on="gpu", decoded_size=40)
    assert ShardDataModule(str(tmp_path), multicrop=big_local, augment_on="gpu", decoded_size=48).decoded_size == 48
