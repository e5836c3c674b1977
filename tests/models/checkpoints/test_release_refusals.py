"""Release files that cannot be used are refused in one line naming the file, before any data is read or
output written: a ViT-g-style file for a ViT-S name, a safetensors header that lies about a shape, a
truncated safetensors file, a config.json that disagrees with its weights."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from locatdino import cli as command_line
from locatdino.models import load_checkpoint
from tests.models.checkpoints.dinov2_reference import release_weights
from tests.models.checkpoints.test_hugging_face import DINOV2_CONFIG, _published_dinov2_keys


def _with_header(data: bytes, edit) -> bytes:
    """A safetensors file's bytes with its JSON header changed by ``edit(header)``, the tensor bytes kept."""
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + length :]


def _lie_about(key: str, shape: list[int]):
    def edit(header: dict) -> None:
        header[key]["shape"] = shape

    return edit


def test_every_cut_of_a_safetensors_file_is_named_truncated(tmp_path):
    save_file({"a": torch.arange(1000.0), "b": torch.ones(10)}, tmp_path / "whole.safetensors")
    data = (tmp_path / "whole.safetensors").read_bytes()
    for size in (len(data) - 5, len(data) // 2, 20, 4):
        path = tmp_path / f"cut{size}.safetensors"
        path.write_bytes(data[:size])
        with pytest.raises(ValueError) as err:
            load_checkpoint(path)
        assert str(err.value).startswith(f"{path}: is truncated ({size} bytes"), str(err.value)
        assert "\n" not in str(err.value)
    assert torch.equal(load_checkpoint(tmp_path / "whole.safetensors")["a"], torch.arange(1000.0))


def test_a_header_that_lies_about_a_shape_is_named(tmp_path):
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4)}, tmp_path / "ok.safetensors")
    lying = tmp_path / "lying.safetensors"
    lying.write_bytes(_with_header((tmp_path / "ok.safetensors").read_bytes(), _lie_about("a", [3, 3])))
    with pytest.raises(ValueError) as err:
        load_checkpoint(lying)
    assert str(err.value).startswith(f"{lying}: its safetensors header does not match its ") and "lies" in str(
        err.value
    )


def test_a_safetensors_file_is_told_by_its_content_not_its_name(tmp_path):
    first_bytes = set()
    for width in range(1, 80, 4):  # some header lengths start with 0x80, a pickle's first byte
        save_file({"w" * width: torch.full((3,), 2.0)}, tmp_path / "weights.pth")
        first_bytes.add((tmp_path / "weights.pth").read_bytes()[0])
        assert torch.equal(load_checkpoint(tmp_path / "weights.pth")["w" * width], torch.full((3,), 2.0))
    assert 0x80 in first_bytes


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict:
    """``{case: (--model value, path named in the line, what the line says)}``."""
    tmp = tmp_path_factory.mktemp("bad")
    giant = tmp / "dinov2_vitg14_pretrain.pth"  # SwiGLU blocks, another width: a ViT-g release's layout
    torch.save(release_weights(64, 2, swiglu=True), giant)
    save_file(_published_dinov2_keys(release_weights(32, 2)), tmp / "ok.safetensors")
    data = (tmp / "ok.safetensors").read_bytes()
    (tmp / "lying.safetensors").write_bytes(_with_header(data, _lie_about("embeddings.cls_token", [1, 1, 384])))
    (tmp / "cut.safetensors").write_bytes(data[: len(data) // 2])
    folder = tmp / "dinov2-small"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(data)
    (folder / "config.json").write_text(json.dumps({**DINOV2_CONFIG, "hidden_size": 384}))
    name = "vit_small_patch14_dinov2"
    return {
        "ViT-g file for ViT-S": (
            f"{name}:{giant}",
            giant,
            f"{giant} does not fit {name}: cls_token: checkpoint [1, 1, 64] vs model [1, 1, 384]",
        ),
        "lying header": (
            f"{name}:{tmp / 'lying.safetensors'}",
            tmp / "lying.safetensors",
            f"{tmp / 'lying.safetensors'}: its safetensors header does not match",
        ),
        "truncated": (
            f"{name}:{tmp / 'cut.safetensors'}",
            tmp / "cut.safetensors",
            f"{tmp / 'cut.safetensors'}: is truncated ({len(data) // 2} bytes of the {len(data)}",
        ),
        "config.json": (
            f"{name}:{folder}",
            folder,
            f"{folder / 'config.json'}: hidden_size 384 but the weights are 32 wide",
        ),
    }


@pytest.mark.parametrize("case", ["ViT-g file for ViT-S", "lying header", "truncated", "config.json"])
def test_bad_release_files_are_refused_in_one_line_before_work(bad_files, tmp_path, capsys, case):
    model, path, says = bad_files[case]
    argv = [
        "hbird",
        "--model",
        model,
        "--num-train",
        "4",
        "--num-val",
        "2",
        "--scene-size",
        "28",
        "--input-size",
        "28",
        "--workers",
        "0",
        "--no-progress",
        "--batch-size",
        "2",
        "--out",
        str(tmp_path / "out"),
    ]
    assert command_line.main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"locatdino hbird: {says}") and str(path) in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # no --out
