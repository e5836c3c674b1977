import json

import numpy as np
import pytest
import torch

from locatdino.evaluation.hbird.memory import MemoryBank


def _batch(n, d=8, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
    labels = torch.softmax(torch.randn(n, c, generator=g), dim=1)
    return feats, labels


def test_in_ram_append_and_views():
    bank = MemoryBank.allocate(10, 8, 3)
    f1, l1 = _batch(4)
    f2, l2 = _batch(3, seed=1)
    bank.append(f1, l1)
    bank.append(f2, l2)
    bank.finish()
    assert len(bank) == 7 and bank.features.shape == (7, 8) and bank.labels.dtype == np.float16
    assert np.allclose(bank.features[4:], f2.numpy())
    assert np.allclose(bank.labels[:4], l1.numpy(), atol=1e-3)
    with pytest.raises(ValueError, match="capacity 10"):
        bank.append(*_batch(4))


def test_directory_bank_is_memory_mapped_trimmed_and_atomic(tmp_path):
    out = tmp_path / "bank"
    bank = MemoryBank.allocate(100, 8, 3, dtype="float16", directory=out, meta={"model": "x"})
    assert not out.exists()  # built under a temporary name
    feats, labels = _batch(30)
    bank.append(feats, labels)
    bank.finish()
    assert out.is_dir() and sorted(p.name for p in out.iterdir()) == ["features.bin", "labels.bin", "meta.json"]
    assert (out / "features.bin").stat().st_size == 30 * 8 * 2  # trimmed to the 30 stored rows
    meta = json.loads((out / "meta.json").read_text())
    assert meta["size"] == 30 and meta["model"] == "x" and meta["dtype"] == "float16"
    loaded = MemoryBank.load(out)
    assert isinstance(loaded.features, np.memmap)
    assert np.allclose(loaded.features, feats.numpy(), atol=1e-3)
    # rebuilding replaces the old bank only when the new one is complete
    again = MemoryBank.allocate(5, 8, 3, directory=out)
    again.append(*_batch(5, seed=3))
    assert MemoryBank.load(out).size == 30
    again.finish()
    assert MemoryBank.load(out).size == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]  # no leftovers


def test_save_then_load_round_trip(tmp_path):
    bank = MemoryBank.allocate(6, 8, 3)
    bank.append(*_batch(6))
    bank.finish().save(tmp_path / "b")
    loaded = MemoryBank.load(tmp_path / "b")
    assert np.array_equal(loaded.features, bank.features)
    assert np.array_equal(loaded.labels, bank.labels)


def test_gather_handles_missing_neighbours():
    bank = MemoryBank.allocate(4, 8, 3)
    feats, labels = _batch(4)
    bank.append(feats, labels)
    ids = np.array([[3, -1], [0, 1]])
    got = bank.gather_labels(ids)
    assert got.shape == (2, 2, 3)
    assert torch.equal(got[0, 1], torch.zeros(3))
    assert torch.allclose(got[0, 0], labels[3], atol=1e-3)
    assert torch.allclose(bank.gather_features(ids)[1, 1], feats[1])


def test_load_rejects_non_bank_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        MemoryBank.load(tmp_path)


@pytest.mark.parametrize("kind", ["user-folder", "file", "partial"])
def test_a_target_that_is_not_a_bank_is_refused_and_kept(tmp_path, kind):
    """A bank replaces its folder whole: only an absent or empty folder or an earlier bank may be
    replaced; the user's files (or a file given as the folder) stay as they were."""
    target = tmp_path / "bank"
    if kind == "file":
        target.write_text("my notes")
    else:
        target.mkdir()
        (target / ("features.bin" if kind == "partial" else "thesis.tex")).write_text("my notes")
    with pytest.raises(ValueError, match="is a file" if kind == "file" else "not a memory bank"):
        MemoryBank.allocate(4, 8, 3, directory=target)
    assert (target.read_text() if kind == "file" else next(target.iterdir()).read_text()) == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]  # no staging folder left


def test_an_earlier_bank_or_an_empty_folder_is_replaced(tmp_path):
    target = tmp_path / "bank"
    target.mkdir()
    for n in (3, 5):  # empty folder, then the bank of the first run
        bank = MemoryBank.allocate(n, 8, 3, directory=target)
        bank.append(*_batch(n))
        bank.finish()
        assert len(MemoryBank.load(target)) == n
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]
