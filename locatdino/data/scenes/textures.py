"""Procedural texture fields and colours for the built-in scenes (`locatdino.data.scenes`).

Nothing here loops over pixels: every field is random values on a coarse lattice, upsampled
bicubically to the output size (value noise), summed over octaves (fractional Brownian motion),
or a closed-form function of the pixel coordinates (bricks, stripes). Fields are float32 tensors
``[h, w]`` in [0, 1]; ``colourize`` maps a field to RGB ``[3, h, w]`` between two colours.
Randomness comes only from the numpy ``Generator`` passed in, so a scene is fixed by its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

# Named colours shared between classes (sRGB in [0, 1]): several classes draw from the same
# entries so that no class can be told apart by its colour alone.
COLOURS: dict[str, tuple[float, float, float]] = {
    "white": (0.92, 0.92, 0.90),
    "light_grey": (0.72, 0.73, 0.74),
    "grey": (0.50, 0.51, 0.52),
    "dark_grey": (0.27, 0.28, 0.29),
    "black": (0.10, 0.10, 0.11),
    "sky_blue": (0.52, 0.70, 0.90),
    "blue": (0.22, 0.40, 0.68),
    "dark_blue": (0.10, 0.18, 0.35),
    "teal": (0.20, 0.45, 0.45),
    "green": (0.28, 0.52, 0.20),
    "dark_green": (0.12, 0.28, 0.10),
    "yellow_green": (0.58, 0.66, 0.25),
    "olive": (0.42, 0.42, 0.20),
    "beige": (0.80, 0.72, 0.56),
    "sand": (0.86, 0.78, 0.58),
    "brown": (0.45, 0.30, 0.18),
    "dark_brown": (0.24, 0.16, 0.10),
    "red_brown": (0.60, 0.28, 0.20),
    "orange": (0.90, 0.55, 0.25),
    "pink": (0.88, 0.62, 0.62),
    "yellow": (0.88, 0.80, 0.35),
}


def rgb(name: str, rng: np.random.Generator, jitter: float = 0.06) -> torch.Tensor:
    """Colour ``name`` as a ``[3]`` tensor, jittered per channel so instances differ slightly."""
    base = np.asarray(COLOURS[name], dtype=np.float32)
    return torch.from_numpy(np.clip(base * (1 + rng.normal(0, jitter, 3)), 0, 1).astype(np.float32))


def value_noise(rng: np.random.Generator, h: int, w: int, cell_h: float, cell_w: float) -> torch.Tensor:
    """Smooth random field ``[h, w]`` (values ~[0, 1]) with features about ``cell`` pixels wide."""
    gh = max(2, round(h / max(cell_h, 1e-3)) + 2)
    gw = max(2, round(w / max(cell_w, 1e-3)) + 2)
    grid = torch.from_numpy(rng.random((1, 1, gh, gw), dtype=np.float32))
    return F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=True)[0, 0]


def fbm(rng: np.random.Generator, h: int, w: int, cell: float, octaves: int = 3, aspect: float = 1.0) -> torch.Tensor:
    """Fractional Brownian motion: octaves of value noise, halving cell and amplitude, in [0, 1].

    ``aspect`` > 1 stretches features horizontally (ripples), < 1 vertically (grass blades).
    """
    out = torch.zeros(h, w)
    amp = 1.0
    for o in range(octaves):
        c = cell / 2**o
        out += amp * value_noise(rng, h, w, c, c * aspect)
        amp *= 0.5
    return normalise(out)


def normalise(x: torch.Tensor) -> torch.Tensor:
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo).clamp_min(1e-6)


def smoothstep(lo: float, hi: float, x: torch.Tensor) -> torch.Tensor:
    t = ((x - lo) / (hi - lo)).clamp(0, 1)
    return t * t * (3 - 2 * t)


def bricks(rng: np.random.Generator, h: int, w: int, cell: float) -> torch.Tensor:
    """Running-bond brick wall: bricks ~2 cells wide, 1 cell high, dark mortar, per-brick tone."""
    bh, bw = max(cell, 2.0), max(2 * cell, 4.0)
    y = torch.arange(h, dtype=torch.float32)[:, None]
    x = torch.arange(w, dtype=torch.float32)[None, :]
    row = torch.floor(y / bh)
    xs = x + (row % 2) * bw / 2
    col = torch.floor(xs / bw)
    mortar = ((y % bh) < max(1.0, bh * 0.15)) | ((xs % bw) < max(1.0, bw * 0.08))
    tone = torch.from_numpy(rng.random(64 * 64, dtype=np.float32))
    brick = tone[((row * 31 + col * 17) % (64 * 64)).long()]
    field = 0.45 + 0.4 * brick + 0.15 * fbm(rng, h, w, cell / 2, octaves=1)
    return torch.where(mortar, torch.zeros(()), field).clamp(0, 1)


def stripes(rng: np.random.Generator, h: int, w: int, cell: float) -> torch.Tensor:
    """Wavy parallel stripes at a random angle (bark, ploughed soil, fur markings)."""
    theta = rng.uniform(0, math.pi)
    y = torch.arange(h, dtype=torch.float32)[:, None]
    x = torch.arange(w, dtype=torch.float32)[None, :]
    phase = (x * math.cos(theta) + y * math.sin(theta)) / max(cell, 1.0) + 2.5 * fbm(rng, h, w, 6 * cell, 2)
    return 0.5 + 0.5 * torch.sin(2 * math.pi * phase)


# Texture kinds: (rng, h, w, cell) -> field [h, w] in [0, 1]. ``cell`` is the feature size in px.
TEXTURES: dict[str, Callable[[np.random.Generator, int, int, float], torch.Tensor]] = {
    "smooth": lambda r, h, w, c: fbm(r, h, w, 8 * c, octaves=2),
    "blotchy": lambda r, h, w, c: fbm(r, h, w, 3 * c, octaves=4),
    "grainy": lambda r, h, w, c: normalise(0.6 * fbm(r, h, w, c / 2, 2) + 0.4 * fbm(r, h, w, 4 * c, 2)),
    "blades": lambda r, h, w, c: fbm(r, h, w, 2 * c, octaves=3, aspect=0.2),
    "ripples": lambda r, h, w, c: fbm(r, h, w, c, octaves=3, aspect=6.0),
    "spotted": lambda r, h, w, c: smoothstep(0.5, 0.6, fbm(r, h, w, 2 * c, 3)),
    "veined": lambda r, h, w, c: 1 - (2 * fbm(r, h, w, 3 * c, 3) - 1).abs() ** 0.5,
    "leafy": lambda r, h, w, c: normalise(smoothstep(0.35, 0.65, fbm(r, h, w, c, 2)) + 0.5 * fbm(r, h, w, 4 * c, 2)),
    "bricks": bricks,
    "stripes": stripes,
}


def colourize(field: torch.Tensor, dark: torch.Tensor, light: torch.Tensor) -> torch.Tensor:
    """Map a field ``[h, w]`` in [0, 1] to RGB ``[3, h, w]`` between ``dark`` and ``light``."""
    return dark[:, None, None] + (light - dark)[:, None, None] * field[None]
