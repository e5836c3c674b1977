import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, build_memory, hummingbird
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.evaluation.metric import ConfusionMatrix
from locatdino.evaluation.splits import CachedSplit, SubsetSplit
from tests.evaluation.hbird.hbird_fixtures import MaskAsImage, OracleEncoder

# The oracle reads labels from grey levels, which bilinear crops would blend: no augmentation.
PLAIN = dict(num_workers=0, progress=False, input_size=96, jitter=0.0, scale=(1.0, 1.0), ratio=(1.0, 1.0))


@pytest.fixture(scope="module")
def oracle_sets(scenes):
    return CachedSplit(MaskAsImage(scenes[0])), CachedSplit(MaskAsImage(scenes[1]))


def _majority_bound(val, p):
    """mIoU of the best any per-patch class prediction can do: patch majority, nearest upsampled."""
    cm = ConfusionMatrix(val.num_classes, val.ignore_index)
    for i in range(len(val)):
        mask = torch.from_numpy(val[i][1].astype(np.int64))[None]
        frac = F.avg_pool2d(F.one_hot(mask, val.num_classes).permute(0, 3, 1, 2).float(), p)
        cm.update(F.interpolate(frac, scale_factor=p, mode="nearest").argmax(1), mask)
    return 100 * cm.compute().miou


def test_oracle_features_score_at_least_95(oracle_sets):
    # 1 px patches: the grid cannot limit the oracle, so anything below ~100 would be a misaligned
    # grid, label or mask somewhere in the pipeline (4 memory + 2 query scenes keep it fast).
    train, val = (SubsetSplit(s, np.arange(n)) for s, n in zip(oracle_sets, (4, 2)))
    result = hummingbird(OracleEncoder(1, 10), train, val, HummingbirdConfig(**PLAIN))
    assert result.miou >= 99.0
    assert result.memory_patches == 4 * 96 * 96


def test_oracle_reaches_the_patch_grid_bound(oracle_sets):
    # At 8 px patches the scenes' thin structures cap any per-patch predictor (~74 mIoU): the
    # pipeline must reach that cap, not lose anything on the way.
    result = hummingbird(OracleEncoder(8, 10), *oracle_sets, HummingbirdConfig(**PLAIN))
    assert result.miou == pytest.approx(_majority_bound(oracle_sets[1], 8), abs=1.0)


def test_random_vit_scores_clearly_below_the_oracle(scenes, oracle_sets, tiny_vit):
    oracle = hummingbird(OracleEncoder(8, 10), *oracle_sets, HummingbirdConfig(**PLAIN)).miou
    cfg = HummingbirdConfig(input_size=96, num_workers=0, progress=False, batch_size=8)
    result = hummingbird(tiny_vit, *scenes, cfg)
    assert 0 < result.miou < oracle - 15
    assert result.memory_patches > 16 * 144 * 0.6  # zoom-out views drop mostly-canvas patches
    assert set(result.timings) >= {"features", "memory", "index", "search", "transfer", "total"}


def test_budgeted_memory_size_and_eval_at_input_resolution(scenes, tiny_vit):
    cfg = HummingbirdConfig(
        input_size=64,
        num_workers=0,
        progress=False,
        memory_size=500,
        aug_epochs=2,
        k=5,
        eval_resolution="input",
        scale=(0.5, 1.0),
        ratio=(1.0, 1.0),
        memory_dtype="float16",
    )
    result = hummingbird(tiny_vit, *scenes, cfg)
    assert result.memory_patches == 16 * 2 * (500 // 32)  # floor(M / (N E)) per view
    # float16 features and float16 labels
    assert result.memory_bytes == result.memory_patches * (64 * 2 + 10 * 2)


def test_memory_directory_bank_matches_in_ram_bank(scenes, tiny_vit, tmp_path):
    from locatdino.evaluation.features import FeatureExtractor

    extractor = FeatureExtractor(tiny_vit)
    base = dict(input_size=64, num_workers=0, progress=False, aug_epochs=1)
    ram, _ = build_memory(extractor, scenes[0], HummingbirdConfig(**base))
    disk, _ = build_memory(extractor, scenes[0], HummingbirdConfig(**base, memory_dir=str(tmp_path / "m")))
    assert isinstance(disk.features, np.memmap) and len(disk) == len(ram)
    assert np.array_equal(disk.features, ram.features) and np.array_equal(disk.labels, ram.labels)
    assert json.loads((tmp_path / "m" / "meta.json").read_text())["size"] == len(ram)
    assert MemoryBank.load(tmp_path / "m").size == len(ram)


def test_torch_knn_backend_gives_the_faiss_result(scenes, tiny_vit, monkeypatch):
    """The torch exact search, as the evaluation picks it (on the encoder's device), changes nothing."""
    from locatdino.evaluation.torch_knn import TorchExactSearch

    devices = []
    search = TorchExactSearch.search
    monkeypatch.setattr(TorchExactSearch, "search", lambda self, *a: devices.append(self.device) or search(self, *a))
    base = dict(input_size=64, num_workers=0, progress=False, k=5)
    faiss_run = hummingbird(tiny_vit, *scenes, HummingbirdConfig(**base, knn_backend="faiss"))
    assert devices == []
    torch_run = hummingbird(tiny_vit, *scenes, HummingbirdConfig(**base, knn_backend="torch"))
    assert devices and set(devices) == {torch.device("cpu")}  # the encoder's device
    assert torch_run.miou == faiss_run.miou and torch_run.per_class_iou == faiss_run.per_class_iou


def test_augment_off_memory_is_the_same_for_every_seed(scenes, tiny_vit):
    from locatdino.evaluation.features import FeatureExtractor

    extractor = FeatureExtractor(tiny_vit)
    train = SubsetSplit(scenes[0], np.arange(6))
    base = dict(input_size=64, num_workers=0, progress=False)
    off = [build_memory(extractor, train, HummingbirdConfig(**base, augment="off", seed=s))[0] for s in (0, 1)]
    assert len(off[0]) == 6 * 64  # every patch of every whole image
    assert np.array_equal(off[0].features, off[1].features) and np.array_equal(off[0].labels, off[1].labels)
    for mode in ("zoom-out", "reference"):  # augmented memories change with the seed
        banks = [build_memory(extractor, train, HummingbirdConfig(**base, augment=mode, seed=s))[0] for s in (0, 1)]
        assert banks[0].features.shape != banks[1].features.shape or not np.array_equal(
            banks[0].features, banks[1].features
        )
    with pytest.raises(ValueError, match="augment 'off' makes all 2 augmentation epochs identical"):
        HummingbirdConfig(augment="off", aug_epochs=2)
