"""A truncated or empty checkpoint, or one of integer tensors, wherever a command reads one (``fit --ckpt_path``, ``fit
--model.backbone_checkpoint``, ``hbird`` / ``linprobe --checkpoint``; ``compare`` loads through the
same ``load_backbone``, ``export`` is tested in tests/ssl/export/test_export.py): one line naming the file
and saying it is truncated (or naming the first integer tensor and its dtype), before any data is
read or output written."""

import io

import pytest
import timm
import torch
from safetensors.torch import save

from locatdino import cli as command_line
from locatdino.models import load_checkpoint
from tests.ssl.ssl_helpers import TINY_MODEL, tiny_overrides


def _saved(obj, zip_format: bool = True) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=zip_format)
    return buffer.getvalue()


def test_every_cut_of_a_checkpoint_is_named_truncated(tmp_path):
    """Cut in its last bytes, a zip checkpoint gave ``[Errno 22] Invalid argument``; cut earlier,
    torch's paragraph on miniz; a legacy pickle an empty ``EOFError``."""
    state = {"w": torch.arange(1000.0)}
    for zip_format in (True, False):
        data = _saved(state, zip_format)
        for size in (len(data) - 5, len(data) - 30, len(data) // 2, 100, 4):
            path = tmp_path / f"cut{size}.pth"
            path.write_bytes(data[:size])
            for mmap in (False, True):
                with pytest.raises(ValueError) as err:
                    load_checkpoint(path, mmap=mmap)
                assert str(err.value) == (
                    f"{path}: is truncated ({size} bytes, the end of the checkpoint is missing: "
                    "an interrupted save, download or copy?)"
                )
        whole = tmp_path / "whole.pth"
        whole.write_bytes(data)
        assert torch.equal(load_checkpoint(whole)["w"], state["w"])


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict:
    """``{"truncated": (path, sentence), "empty": (path, sentence)}``: a tiny ViT's state dict cut
    in half, and a file of 0 bytes."""
    tmp = tmp_path_factory.mktemp("damaged")
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"])
    data = _saved(model.state_dict())
    (tmp / "half.pth").write_bytes(data[: len(data) // 2])
    (tmp / "empty.pth").write_bytes(b"")
    return {
        "truncated": (tmp / "half.pth", f"is truncated ({len(data) // 2} bytes"),
        "empty": (tmp / "empty.pth", "is empty (0 bytes)"),
    }


def _arguments(command: str, path: str, tmp_path) -> list[str]:
    small = [
        "--num-train",
        "4",
        "--num-val",
        "2",
        "--scene-size",
        "32",
        "--input-size",
        "32",
        "--workers",
        "0",
        "--no-progress",
        "--batch-size",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    return {
        "fit --ckpt_path": ["fit", *tiny_overrides(tmp_path), "--ckpt_path", path],
        "fit --model.backbone_checkpoint": ["fit", *tiny_overrides(tmp_path), "--model.backbone_checkpoint", path],
        "hbird": ["hbird", "--model", f"vit_tiny_patch16_224:{path}", *small],
        "linprobe": ["linprobe", "--model", f"vit_tiny_patch16_224:{path}", *small, "--train-batch-size", "2"],
    }[command]


@pytest.mark.parametrize("damage", ["truncated", "empty"])
@pytest.mark.parametrize("command", ["fit --ckpt_path", "fit --model.backbone_checkpoint", "hbird", "linprobe"])
def test_every_command_names_a_damaged_checkpoint(damaged, tmp_path, capsys, command, damage):
    path, sentence = damaged[damage]
    assert command_line.main(_arguments(command, str(path), tmp_path)) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("locatdino")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"locatdino {command.split()[0]}: {path}: {sentence}"), lines[0]
    assert list(tmp_path.iterdir()) == []  # no shards, no run folder, no --out


@pytest.fixture(scope="module")
def integers(tmp_path_factory) -> dict:
    """``{"int8": path, "I32 header": path}``: a tiny ViT's weights rounded to int8, and its float32
    safetensors file whose header was edited to claim I32 (same byte count, so the file stays valid)."""
    tmp = tmp_path_factory.mktemp("integers")
    state = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"]).state_dict()
    torch.save({k: (v * 10).to(torch.int8) for k, v in state.items()}, tmp / "int8.pth")
    data = save(state)
    length = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + length].replace(b'"F32"', b'"I32"')
    assert header.count(b'"I32"') == len(state)
    (tmp / "lying.safetensors").write_bytes(data[:8] + header + data[8 + length :])
    return {
        "int8": (tmp / "int8.pth", "int8", len(state)),
        "I32 header": (tmp / "lying.safetensors", "int32", len(state)),
    }


@pytest.mark.parametrize("kind", ["int8", "I32 header"])
@pytest.mark.parametrize("command", ["fit --model.backbone_checkpoint", "hbird", "linprobe"])
def test_every_command_refuses_integer_weights(integers, tmp_path, capsys, command, kind):
    """Integer tensors were copied into the float parameters without a word (the model ran as noise)."""
    path, dtype, tensors = integers[kind]
    assert command_line.main(_arguments(command, str(path), tmp_path)) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("locatdino")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(
        f"locatdino {command.split()[0]}: {path}: cls_token is {dtype} in the file but float32 in the model "
        f"(and {tensors - 1} more tensors): not floating-point weights"
    ), lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()
