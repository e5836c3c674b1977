import io

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from locatdino.data.shards.stream import ShardStream
from locatdino.data.transforms.decode import DecodeError, decode_mask, decode_rgb, find_image
from tests.data.data_fixtures import id_image, png_bytes


def _encoded(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _good_variants() -> dict[str, bytes]:
    rgb = Image.new("RGB", (9, 7), (200, 40, 90))
    pal = rgb.quantize(4)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 0
    return {
        "gray": _encoded(rgb.convert("L"), "PNG"),
        "bitmap": _encoded(rgb.convert("1"), "PNG"),
        "cmyk": _encoded(rgb.convert("CMYK"), "JPEG"),
        "rgba": _encoded(rgb.convert("RGBA"), "PNG"),
        "la": _encoded(rgb.convert("LA"), "PNG"),
        "palette": _encoded(pal, "PNG"),
        "palette_transparent": _encoded(pal_t, "PNG"),
        "gray16": _encoded(Image.fromarray(np.full((7, 9), 65535, np.uint16)), "PNG"),
        "float_tiff": _encoded(Image.fromarray(np.linspace(0, 1, 63, dtype=np.float32).reshape(7, 9)), "TIFF"),
        "webp": _encoded(rgb, "WEBP"),
    }


def _bad_variants() -> dict[str, dict]:
    jpeg = _encoded(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)), "JPEG")
    return {
        "truncated": {"jpg": jpeg[: len(jpeg) // 2]},
        "garbage": {"jpg": b"\x00\x01not an image at all" * 10},
        "empty": {"png": b""},
        "no_image": {"cls": b"3"},
    }


@pytest.mark.parametrize("name", list(_good_variants()))
def test_every_mode_decodes_to_8bit_rgb(name):
    image = decode_rgb(_good_variants()[name])
    assert image.mode == "RGB" and image.size == (9, 7)


def test_conversions_keep_the_right_values():
    assert decode_rgb(_good_variants()["gray16"]).getpixel((0, 0)) == (255, 255, 255)  # 65535 -> 255
    transparent = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    assert decode_rgb(_encoded(transparent, "PNG")).getpixel((0, 0)) == (255, 255, 255)  # on white
    f = np.asarray(decode_rgb(_good_variants()["float_tiff"]))[..., 0]
    assert f.min() == 0 and f.max() == 255  # float in [0, 1] -> 0..255
    i32 = Image.fromarray(np.array([[0, 1000], [30000, 65535]], np.int32), "I")
    np.testing.assert_array_equal(np.asarray(decode_rgb(_encoded(i32, "TIFF")))[..., 0], [[0, 4], [117, 255]])
    dark = Image.fromarray(np.array([[0, 100]], np.int32), "I")  # 8-bit range stays as is
    np.testing.assert_array_equal(np.asarray(decode_rgb(_encoded(dark, "TIFF")))[..., 0], [[0, 100]])
    cmyk = decode_rgb(_good_variants()["cmyk"]).getpixel((4, 3))
    assert np.abs(np.subtract(cmyk, (200, 40, 90))).max() < 12


def test_non_finite_pixels_of_a_float_image_do_not_blacken_it():
    """One NaN (or inf) pixel used to make the range NaN and the whole image black: the range now
    comes from the finite pixels (here [0, 1]), NaN/-inf draw as its low end, +inf as its high end."""
    values = np.linspace(0, 1, 63, dtype=np.float32).reshape(7, 9)
    expected = np.asarray(decode_rgb(_encoded(Image.fromarray(values), "TIFF")))[..., 0]
    for bad, drawn in ((np.nan, 0), (np.inf, 255), (-np.inf, 0)):
        poisoned = values.copy()
        poisoned[3, 4] = bad
        got = np.asarray(decode_rgb(_encoded(Image.fromarray(poisoned), "TIFF")))[..., 0]
        want = expected.copy()
        want[3, 4] = drawn
        np.testing.assert_array_equal(got, want)
    assert expected.max() == 255 and np.unique(expected).size > 50
    with pytest.raises(DecodeError, match="no finite pixel in a 9x7 float image"):
        decode_rgb(_encoded(Image.fromarray(np.full((7, 9), np.nan, np.float32)), "TIFF"))


def test_exif_orientation_is_applied_except_for_mask_pairs():
    """A phone photo stored 9 wide x 7 high with orientation 6 (rotate 90° clockwise to view) comes
    out 7 x 9 with its stored top-left pixel at the top-right, as a viewer shows it."""
    stored = np.zeros((7, 9, 3), np.uint8)
    stored[:2, :2] = 255  # a white corner at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(stored).save(buf, "JPEG", exif=exif, quality=100)
    upright = np.asarray(decode_rgb(buf.getvalue()))
    assert upright.shape == (9, 7, 3)
    assert upright[0, -1].min() > 200 and upright[0, 0].max() < 50 and upright[-1, -1].max() < 50
    raw = np.asarray(decode_rgb(buf.getvalue(), upright=False))
    assert raw.shape == (7, 9, 3) and raw[0, 0].min() > 200


@pytest.mark.parametrize("name", list(_bad_variants()))
def test_bad_samples_raise_decode_error(name):
    with pytest.raises(DecodeError):
        decode_rgb(find_image({"__key__": "k", **_bad_variants()[name]}))


def test_mask_reads_palette_indices_not_colours():
    mask = Image.fromarray(np.array([[0, 1], [15, 255]], np.uint8), "P")
    mask.putpalette([255, 0, 0, 0, 255, 0] * 128)
    np.testing.assert_array_equal(decode_mask(png_bytes(mask)), [[0, 1], [15, 255]])


def test_stream_with_5_percent_bad_samples_of_every_kind_runs_to_the_end(tmp_path):
    good, bad = _good_variants(), _bad_variants()
    n_plain, bad_keys, expected_good = 70, [], 0
    urls = []
    for shard in range(2):
        path = str(tmp_path / f"mixed-{shard}.tar")
        with wds.TarWriter(path) as w:
            for i in range(n_plain // 2):
                w.write({"__key__": f"plain{shard}_{i}", "png": png_bytes(id_image(i))})
                expected_good += 1
            for name, data in good.items():
                ext = {"cmyk": "jpg", "float_tiff": "tif", "webp": "webp"}.get(name, "png")
                w.write({"__key__": f"{name}{shard}", ext: data})
                expected_good += 1
            for name, sample in bad.items():
                w.write({"__key__": f"{name}{shard}", **sample})
                bad_keys.append(f"{path}:{name}{shard}")
        urls.append(path)
    total = expected_good + len(bad_keys)
    assert 0.04 <= len(bad_keys) / total <= 0.1
    batches = list(ShardStream(urls, _crop, batch_size=8, shuffle_buffer=16))
    assert sum(b["global"].shape[1] for b in batches) == expected_good
    assert sum(int(b["skipped"]) for b in batches) == len(bad_keys)
    notes = [n for b in batches for n in b["skipped_keys"]]
    assert sorted(n.split(": ")[0] for n in notes) == sorted(bad_keys)


def _crop(image):
    return [torch.zeros(3, 2, 2)]


def test_truncated_shard_is_reported_and_its_lost_samples_counted(tmp_path, id_shards):
    data = open(id_shards[0], "rb").read()  # 7 samples, one 1 KiB member each (header + padded data)
    broken = tmp_path / "broken.tar"
    broken.write_bytes(data[: 1024 * 3 + 300])  # 3 whole samples, then a cut inside the 4th header
    stream = ShardStream([str(broken), id_shards[1]], _crop, batch_size=2, shuffle_shards=False, shard_sizes=[7, 3])
    batches = list(stream)
    seen = sum(b["global"].shape[1] for b in batches)
    # tarfile reads 10 KiB blocks, so samples before the cut may be lost too: the account stays exact
    assert seen + sum(int(b["skipped"]) for b in batches) == 7 + 3 and seen >= 3
    notes = [n for b in batches for n in b["skipped_keys"]]
    assert any(f"{broken}: " in n and "missing of 7" in n for n in notes)


def test_a_truncated_shard_is_counted_once_per_epoch_however_often_it_is_cycled(tmp_path, id_shards):
    """Fixed-length epochs cycle the shard list: the samples the truncated shard lost are counted
    once per epoch over all ranks (not at every re-read), and again in the next epoch."""
    data = open(id_shards[0], "rb").read()
    broken = tmp_path / "broken.tar"
    broken.write_bytes(data[: 1024 * 3 + 300])
    one_read = sum(1 for _ in ShardStream([str(broken)], _crop, batch_size=1, shuffle_buffer=1))
    lost = 7 - one_read
    assert lost >= 1
    streams = [
        ShardStream(
            [str(broken), id_shards[1]],
            _crop,
            batch_size=2,
            num_batches=12,
            rank=r,
            world_size=2,
            shuffle_buffer=1,
            shard_sizes=[7, 3],
        )
        for r in range(2)
    ]
    for epoch in range(2):
        batches = [b for s in streams for b in s]
        for s in streams:
            s.epoch += 1
        assert sum(int(b["global"].shape[1]) for b in batches) == 48  # the broken shard is read ~10 times
        assert sum(int(b["skipped"]) for b in batches) == lost, epoch
        notes = [n for b in batches for n in b["skipped_keys"]]
        assert [n for n in notes if "missing" in n] == [
            f"{broken}: {lost} sample(s) missing of 7 (truncated or damaged tar)"
        ]
        assert 1 <= sum("truncated header" in n for n in notes) <= 2  # named once per rank at most
