"""``locatdino export`` never writes over its input or over a file it did not write."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from ssl_helpers import TINY_MODEL

from locatdino.models import load_checkpoint
from locatdino.ssl.export import cli as export
from locatdino.ssl.export.files import export_metadata


@pytest.fixture
def dino_checkpoint(tmp_path):
    """A full DINO training checkpoint (student / teacher) of the tiny ViT."""
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"])
    nets = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    path = tmp_path / "checkpoint.pth"
    torch.save({"student": nets, "teacher": nets, "epoch": 3}, path)
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_the_input_checkpoint_is_never_the_output(dino_checkpoint, capsys):
    before = dino_checkpoint.read_bytes()
    for overwrite in ([], ["--overwrite"]):
        assert export.main([str(dino_checkpoint), str(dino_checkpoint), *overwrite]) == 1
        assert _one_line(capsys) == (
            f"locatdino export: the output {dino_checkpoint} is the input checkpoint: write the export to another file"
        )
    link, hard = dino_checkpoint.with_name("link.pth"), dino_checkpoint.with_name("hard.pth")
    link.symlink_to(dino_checkpoint)
    hard.hardlink_to(dino_checkpoint)
    for out in (link, hard):
        assert export.main([str(dino_checkpoint), str(out), "--overwrite"]) == 1
        assert _one_line(capsys).endswith("is the input checkpoint: write the export to another file")
        assert export.main([str(out), str(dino_checkpoint), "--overwrite"]) == 1  # the input named by its link
        assert _one_line(capsys).endswith("is the input checkpoint: write the export to another file")
    assert dino_checkpoint.read_bytes() == before and hard.read_bytes() == before


def test_a_link_to_nothing_is_named_and_kept(dino_checkpoint, tmp_path, capsys):
    """It gave ``[Errno 2] No such file or directory`` naming the link, which is there; export never
    wrote it, so ``--overwrite`` does not replace it either (docs/commands.md's rule)."""
    link = tmp_path / "teacher.pth"
    link.symlink_to(tmp_path / "gone.pth")
    for overwrite in ([], ["--overwrite"]):
        assert export.main([str(dino_checkpoint), str(link), *overwrite]) == 1
        assert _one_line(capsys) == (
            f"locatdino export: the output {link} is a link to a missing file "
            f"{tmp_path / 'gone.pth'}, not an earlier export: remove the link, or choose another file"
        )
        assert link.is_symlink() and not link.exists()


def test_truncated_and_empty_checkpoints_are_named(dino_checkpoint, tmp_path, capsys):
    data = dino_checkpoint.read_bytes()
    for name, content, sentence in (
        ("half.pth", data[: len(data) // 2], f"is truncated ({len(data) // 2} bytes"),
        ("empty.pth", b"", "is empty (0 bytes)"),
    ):
        (tmp_path / name).write_bytes(content)
        assert export.main([str(tmp_path / name), str(tmp_path / "out.pth")]) == 1
        assert _one_line(capsys).startswith(f"locatdino export: {tmp_path / name}: {sentence}")
    assert not (tmp_path / "out.pth").exists()


def test_only_an_earlier_export_is_replaced_and_only_with_overwrite(dino_checkpoint, tmp_path, capsys):
    """A released weights file (a plain state dict, as an export is) kept at OUT was once taken for an
    earlier export and replaced, and ``--overwrite`` replaced any file at all; now a file export did
    not write is never replaced, and an earlier export (known only by the metadata export wrote into
    it) only with ``--overwrite``."""
    notes, released = tmp_path / "notes.pth", tmp_path / "released.pth"
    notes.write_text("my notes")
    torch.save(torch.load(dino_checkpoint, weights_only=True)["teacher"], released)
    kept = {path: path.read_bytes() for path in (notes, released)}
    for path in kept:
        for overwrite in ([], ["--overwrite"]):
            assert export.main([str(dino_checkpoint), str(path), *overwrite]) == 1
            assert _one_line(capsys) == (
                f"locatdino export: the output {path} exists and was not written by export, which never "
                "replaces such a file: choose another file"
            )
            assert path.read_bytes() == kept[path]
    out = tmp_path / "teacher.pth"
    assert export.main([str(dino_checkpoint), str(out)]) == 0
    assert export.main([str(dino_checkpoint), str(out), "--which", "student"]) == 1
    assert _one_line(capsys) == (
        f"locatdino export: the output {out} is an earlier export (the teacher of checkpoint.pth): "
        "pass --overwrite to replace it, or choose another file"
    )
    assert export.main([str(dino_checkpoint), str(out), "--which", "student", "--overwrite"]) == 0
    assert export_metadata(out)["network"] == "student"


def test_a_hugging_face_folder_is_exported_through_its_weights_file(dino_checkpoint, tmp_path, capsys):
    """It was refused as "a sharded FSDP checkpoint?"; the folder's weights file is its input."""
    weights = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=32).state_dict()
    folder = tmp_path / "repo"
    folder.mkdir()
    save_file(weights, folder / "model.safetensors")
    assert export.main([str(folder), str(tmp_path / "plain.pth")]) == 0, capsys.readouterr().err
    assert export.main([f"vit_tiny_patch16_224:{folder}", str(tmp_path / "vit.safetensors")]) == 0
    for out in ("plain.pth", "vit.safetensors"):
        exported = load_checkpoint(tmp_path / out)
        assert exported.keys() == weights.keys() and all(torch.equal(exported[k], weights[k]) for k in weights)
        assert export_metadata(tmp_path / out)["source"] == "repo"
    capsys.readouterr()
    assert export.main([f"vit_tiny_patch16_224:{folder}", str(folder), "--format", "hf-hub", "--overwrite"]) == 1
    assert _one_line(capsys) == (
        f"locatdino export: the output {folder / 'model.safetensors'} is the input checkpoint: write the "
        "export to another folder"
    )
    (tmp_path / "shards").mkdir()
    assert export.main([str(tmp_path / "shards"), str(tmp_path / "x.pth")]) == 1
    assert _one_line(capsys).startswith(
        f"locatdino export: {tmp_path / 'shards'}: is a folder without model.safetensors or pytorch_model.bin"
    )


def test_a_checkpoint_with_non_finite_weights_is_refused(dino_checkpoint, tmp_path, capsys):
    ckpt = torch.load(dino_checkpoint, weights_only=True)
    ckpt["teacher"]["backbone.blocks.0.attn.qkv.weight"][0, :3] = torch.tensor([float("nan"), float("inf"), 1.0])
    torch.save(ckpt, dino_checkpoint)
    assert export.main([str(dino_checkpoint), str(tmp_path / "out.pth")]) == 1
    assert _one_line(capsys) == (
        f"locatdino export: {dino_checkpoint}: 2 NaN/inf weight value(s) "
        "in blocks.0.attn.qkv.weight (a diverged run? use a checkpoint from before it)"
    )
    assert not (tmp_path / "out.pth").exists()
