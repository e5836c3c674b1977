"""Robust image and mask decoding shared by the shard stream and the segmentation readers.

Web-scale image sets contain every PIL mode there is. ``decode_rgb`` turns all of them into
8-bit RGB: grayscale (L, 1), palette (P), alpha (RGBA, LA, PA: composited on white, so hidden
colours under transparent pixels do not leak), CMYK and YCbCr JPEGs, 16/32-bit integer and
float images (scaled from their nominal range: [0, 1] float, 8 or 16 bit; stretched from
their own range only when they fit none; non-finite pixels are left out of the range and
drawn as its ends, an image with no finite pixel is an error). The EXIF orientation is applied
(phone photos are stored sideways with a rotation tag), except for segmentation pairs, whose
masks label the stored pixel grid. Anything PIL cannot fully decode (corrupt or
truncated files, decompression bombs, empty images) raises ``DecodeError`` with one line saying
why, so that the caller can skip and count the sample instead of crashing.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping

import numpy as np
from PIL import Image, ImageOps

# Sample keys that may hold an image, in order of preference (webdataset lower-cases suffixes).
IMAGE_KEYS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "pbm", "gif")
IMAGE_SUFFIXES: frozenset[str] = frozenset("." + k for k in IMAGE_KEYS)


class DecodeError(ValueError):
    """An image or mask that cannot be decoded; the message names the reason."""


def find_image(sample: Mapping[str, object]) -> bytes:
    """The encoded image of a webdataset sample, or ``DecodeError`` if it has none."""
    for key in IMAGE_KEYS:
        data = sample.get(key)
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
    present = sorted(k for k in sample if not k.startswith("__"))
    raise DecodeError(f"no image key (looked for {'/'.join(IMAGE_KEYS[:4])}/...; sample has {present})")


def _open(data: bytes | str | os.PathLike, draft: tuple[int, int] | None = None) -> Image.Image:
    in_memory = isinstance(data, bytes | bytearray)
    if in_memory and not data:
        raise DecodeError("empty file (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data) if in_memory else data)
        if draft is not None:
            image.draft(None, draft)  # JPEG only: decode at 1/2, 1/4 or 1/8 scale, still >= draft
        image.load()  # force full decoding: truncated files fail here, not later in a worker
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        message = str(exc).split(" <_io.BytesIO")[0] if in_memory else str(exc)  # not the buffer's address
        raise DecodeError(f"{type(exc).__name__}: {message}") from None
    if image.width < 1 or image.height < 1:
        raise DecodeError(f"empty image {image.size}")
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):  # high bit depth: rescale to 8 bit
        arr = np.asarray(image, dtype=np.float64)
        finite = np.isfinite(arr)
        if not finite.any():
            raise DecodeError(f"no finite pixel in a {image.width}x{image.height} float image")
        lo, hi = float(arr[finite].min()), float(arr[finite].max())  # NaN/inf would blacken it all
        arr = np.where(np.isnan(arr), lo, np.clip(arr, lo, hi))  # -inf/NaN -> darkest, +inf -> brightest
        # the nominal range of the data (float [0, 1], 8 or 16 bit); stretch only what fits none
        if mode.startswith("I;16"):
            lo, hi = 0.0, 65535.0
        elif lo >= 0:
            nominal = ((1.0,) if mode == "F" else ()) + (255.0, 65535.0)
            full = next((r for r in nominal if hi <= r), None)
            if full is not None:
                lo, hi = 0.0, full
        arr = np.clip((arr - lo) / max(hi - lo, 1e-12) * 255 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def decode_rgb(
    data: bytes | str | os.PathLike, upright: bool = True, draft: tuple[int, int] | None = None
) -> Image.Image:
    """Decode encoded bytes or a file path to an 8-bit RGB PIL image (see module docstring);
    ``upright``: apply the EXIF orientation (off for images paired with a mask); ``draft``
    ``(w, h)``: a JPEG may be decoded at a power-of-two reduced scale that stays at least that
    large (the DCT-domain downscale libjpeg offers, several times faster on large photos)."""
    image = _open(data, draft)
    try:
        if upright:
            ImageOps.exif_transpose(image, in_place=True)
        return _to_rgb(image)
    except Exception as exc:
        raise DecodeError(f"cannot convert mode {image.mode} to RGB: {exc}") from None


def decode_mask(data: bytes | str | os.PathLike) -> np.ndarray:
    """Decode a label map (palette or grayscale PNG) to its class indices ``[H, W]``.

    Palette PNGs (VOC ``SegmentationClass``) hold class indices as palette entries, so the
    indices are read directly, never the RGB colours. 8-bit masks come back as uint8, wider
    ones (16-bit PNG) as int64.
    """
    image = _open(data)
    if image.mode in ("P", "L"):
        return np.asarray(image, dtype=np.uint8)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        return np.asarray(image).astype(np.int64)
    raise DecodeError(f"mask must be a palette or grayscale image, got mode {image.mode}")
