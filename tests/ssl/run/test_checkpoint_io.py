import os

import pytest
import torch

from locatdino.ssl import AtomicCheckpointIO, atomic_torch_save


def test_save_replaces_atomically_and_leaves_no_temp(tmp_path):
    path = tmp_path / "ckpts" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"a": torch.ones(3)}, path)
    AtomicCheckpointIO().save_checkpoint({"a": torch.zeros(2)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.zeros(2))
    assert os.listdir(path.parent) == ["last.ckpt"]
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_failed_save_keeps_previous_file(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"a": torch.ones(1)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        atomic_torch_save({"a": Unpicklable()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(1))
    assert os.listdir(tmp_path) == ["last.ckpt"]
