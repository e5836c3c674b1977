import json

import lightning as L
import pytest
import torch
import webdataset as wds
from jsonargparse import ArgumentParser

from locatdino.data import MultiCropTransform, ShardDataModule, SkippedSamplesLogger
from tests.data.data_fixtures import id_image, png_bytes

SMALL = MultiCropTransform(global_crop_size=32, local_crop_size=16, num_local_crops=2)


def test_prepare_data_writes_scenes_once_and_ranks_get_fixed_lengths(tmp_path):
    folder = tmp_path / "scenes"
    dm = ShardDataModule(str(folder), batch_size=4, num_workers=0, multicrop=SMALL, synthetic=12, synthetic_size=32)
    dm.prepare_data()
    index = json.loads((folder / "index.json").read_text())
    assert index["num_samples"] == 12 and index["num_shards"] >= 2
    stamp = (folder / "index.json").stat().st_mtime_ns
    dm.prepare_data()  # shards exist: nothing rewritten
    assert (folder / "index.json").stat().st_mtime_ns == stamp
    assert [len(dm.build_stream(r, 2)) for r in range(2)] == [1, 1]  # 12 // (4 x 2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert batches[0]["global"].shape == (2, 4, 3, 32, 32) and batches[0]["local"].shape == (2, 4, 3, 16, 16)
    assert batches[0]["skipped"].item() == 0 and batches[0]["skipped_keys"] == []
    assert dm.state_dict() == {"epoch": 1}
    resumed = ShardDataModule(str(folder), batch_size=4, num_workers=0, batches_per_epoch=5)
    resumed.load_state_dict({"epoch": 7})
    stream = resumed.build_stream()
    assert stream.epoch == 7 and len(stream) == 5


def test_synthetic_needs_a_directory(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        ShardDataModule(str(tmp_path / "x-*.tar"), synthetic=4).prepare_data()


def test_yaml_style_configuration_of_the_nested_multicrop():
    parser = ArgumentParser()
    parser.add_class_arguments(ShardDataModule, "data")
    cfg = parser.parse_args(
        [
            "--data.train_urls",
            "s/",
            "--data.multicrop.num_local_crops",
            "3",
            "--data.multicrop.local_crop_scale",
            "[0.1, 0.3]",
        ]
    )
    dm = parser.instantiate(cfg).data
    assert dm.multicrop.num_local_crops == 3 and dm.multicrop.local_crop_scale == (0.1, 0.3)
    assert dm.multicrop.global_crop_size == 224


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch["global"].mean()).sum() + self.w.square().sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.slow
def test_skipped_samples_logger_counts_and_names_bad_samples(tmp_path, caplog):
    """Every skip up to the cap is named, even a repeat with identical text (which Python's warnings
    would show once), then one line at the cap and a summary at the end."""
    path = tmp_path / "bad.tar"
    with wds.TarWriter(str(path)) as w:
        for i in range(12):
            sample = {"png": png_bytes(id_image(i))} if i not in (2, 7) else {"jpg": b"broken"}
            w.write({"__key__": f"k{i}", **sample})
    # 4 batches of 5 = two passes over the 10 good samples: k2, k7, k2, k7 skipped
    dm = ShardDataModule(str(path), batch_size=5, num_workers=0, multicrop=SMALL, batches_per_epoch=4, shuffle_buffer=1)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SkippedSamplesLogger(max_warnings=3)],
    )
    with caplog.at_level("WARNING", logger="locatdino.data.shards.skipped"):
        trainer.fit(_Tiny(), datamodule=dm)
    assert trainer.callback_metrics["data/skipped"].item() == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "locatdino.data.shards.skipped"]
    named = [m for m in lines if m.startswith("rank 0: skipped ")]
    assert [m.split(": ")[1].split(" ")[1] for m in named] == [f"{path}:k2", f"{path}:k7", f"{path}:k2"]
    assert lines[3:] == [
        "rank 0: more than 3 skips, from now on only counted (data/skipped)",
        "rank 0: 4 sample(s) skipped in this run, 3 named above",
    ]


def test_fit_on_shards_where_every_sample_is_bad_stops_at_once_with_one_line(tmp_path, capsys):
    """Such shards gave a fixed-length stream that skipped samples forever: no step, no output."""
    from locatdino import cli
    from tests.ssl.ssl_helpers import tiny_overrides

    folder = tmp_path / "bad"
    folder.mkdir()
    for k in range(2):
        with wds.TarWriter(str(folder / f"shard-{k:06d}.tar")) as w:
            for i in range(3):
                w.write({"__key__": f"s{k}{i}", "jpg": b"<html>not found</html>"})
    dm = ShardDataModule(str(folder), batch_size=2, num_workers=0, multicrop=SMALL)
    with pytest.raises(
        ValueError,
        match=r"no usable sample in the shards .*shard-00000\d.tar and 1 more: 6 read, "
        r"every one skipped \(.*:s\d\d: UnidentifiedImageError",
    ):
        dm.setup("fit")
    status = cli.main(["fit", *tiny_overrides(tmp_path, shards=folder), "--trainer.max_steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and err[-1].startswith("locatdino fit: no usable sample in the shards "), err
    assert not (tmp_path / "run" / "checkpoints").exists()
