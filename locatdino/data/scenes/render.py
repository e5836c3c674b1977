"""Built-in synthetic scenes: the embedded default data set (no download needed).

Each scene is a landscape: a sky above a random horizon, distant mountain ridges, bands of grass,
bare ground or water below, and 2–8 objects (trees, bushes, buildings, rocks, animals) standing
on the ground, smaller and hazier towards the horizon, drawn back to front so that near objects
occlude far ones. Every pixel gets one of the 10 classes of ``SCENE_CLASSES`` (no void).

The scenes are built to *rank* dense features, which flat-coloured or one-texture-per-class
scenes cannot (a random-init ViT-S already scores 47–67 mIoU on those): every class has several
textures, colour pairs and scales; colours are shared between classes (sky/water, grass/tree/
bush, rock/building/ground/animal/mountain); and several classes differ mainly by shape and
layout, i.e. by context larger than one 16 px patch (bush vs tree canopy: same textures and
colours; sky vs water: position and ripples; rock vs mountain; windows vs water).

Deterministic: scene ``i`` of split ``s`` depends only on ``(seed, s, i)`` and the image size
(textures scale with the size, so a 448 px scene is the 224 px scene at higher resolution up
to the random draws of the finest noise). Vectorised with torch: ~10 ms per 224 px scene.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from locatdino.data.scenes.textures import TEXTURES, colourize, fbm, rgb, value_noise

SCENE_CLASSES: tuple[str, ...] = (
    "sky",
    "water",
    "grass",
    "ground",
    "mountain",
    "tree",
    "bush",
    "building",
    "rock",
    "animal",
)
_ID = {name: i for i, name in enumerate(SCENE_CLASSES)}
_SPLITS = {"train": 0, "val": 1}


@dataclass(frozen=True)
class Look:
    """How one class may look: texture kinds, (dark, light) colour pairs, feature size at 224 px."""

    textures: tuple[str, ...]
    colours: tuple[tuple[str, str], ...]
    cell: tuple[float, float]


_FOLIAGE = Look(
    ("leafy", "blotchy", "grainy"),
    (
        ("dark_green", "green"),
        ("green", "yellow_green"),
        ("red_brown", "orange"),
        ("olive", "yellow"),
        ("dark_green", "olive"),
    ),
    (1.5, 5.0),
)
LOOKS: dict[str, Look] = {
    "sky": Look(
        ("smooth", "blotchy", "ripples"),
        (
            ("blue", "sky_blue"),
            ("sky_blue", "white"),
            ("grey", "light_grey"),
            ("orange", "pink"),
            ("light_grey", "white"),
        ),
        (6.0, 20.0),
    ),
    "water": Look(
        ("ripples", "smooth", "blotchy"),
        (
            ("dark_blue", "sky_blue"),
            ("blue", "white"),
            ("grey", "light_grey"),
            ("teal", "sky_blue"),
            ("dark_grey", "grey"),
        ),
        (2.0, 8.0),
    ),
    "grass": Look(
        ("blades", "grainy", "leafy"),
        (("dark_green", "green"), ("green", "yellow_green"), ("olive", "yellow_green"), ("olive", "beige")),
        (1.5, 5.0),
    ),
    "ground": Look(
        ("grainy", "blotchy", "stripes", "spotted"),
        (
            ("brown", "beige"),
            ("dark_brown", "brown"),
            ("beige", "sand"),
            ("grey", "light_grey"),
            ("light_grey", "white"),
        ),
        (1.5, 6.0),
    ),
    "mountain": Look(
        ("blotchy", "veined", "smooth"),
        (
            ("dark_grey", "grey"),
            ("grey", "light_grey"),
            ("dark_blue", "grey"),
            ("brown", "beige"),
            ("dark_green", "olive"),
        ),
        (4.0, 12.0),
    ),
    "tree": _FOLIAGE,
    "bush": _FOLIAGE,
    "building": Look(
        ("bricks", "smooth", "grainy"),
        (
            ("red_brown", "orange"),
            ("grey", "light_grey"),
            ("beige", "white"),
            ("brown", "beige"),
            ("light_grey", "white"),
        ),
        (2.0, 6.0),
    ),
    "rock": Look(
        ("grainy", "veined", "blotchy"),
        (("dark_grey", "grey"), ("grey", "light_grey"), ("brown", "beige"), ("dark_brown", "brown")),
        (2.0, 8.0),
    ),
    "animal": Look(
        ("smooth", "spotted", "stripes", "grainy"),
        (
            ("dark_brown", "brown"),
            ("brown", "beige"),
            ("black", "white"),
            ("grey", "light_grey"),
            ("orange", "sand"),
            ("black", "dark_grey"),
        ),
        (1.5, 5.0),
    ),
}
_TRUNK = Look(
    ("stripes", "blades"), (("dark_brown", "brown"), ("dark_grey", "grey"), ("black", "dark_brown")), (1.0, 3.0)
)
_WINDOWS = ("dark_blue", "black", "sky_blue", "light_grey", "yellow")
_ROOFS = ("red_brown", "dark_grey", "brown", "dark_blue")
_OBJECTS = ("tree", "bush", "building", "rock", "animal")
_OBJECT_P = (0.22, 0.22, 0.12, 0.22, 0.22)
_OBJECT_IDS = np.array([_ID[name] for name in _OBJECTS])


def texture(rng: np.random.Generator, look: Look, h: int, w: int, scale: float) -> torch.Tensor:
    """One random appearance of ``look`` as RGB ``[3, h, w]``; ``scale`` = image size / 224."""
    kind = look.textures[rng.integers(len(look.textures))]
    dark, light = look.colours[rng.integers(len(look.colours))]
    cell = rng.uniform(*look.cell) * scale
    return colourize(TEXTURES[kind](rng, h, w, cell), rgb(dark, rng), rgb(light, rng))


def _grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(h, dtype=torch.float32)[:, None], torch.arange(w, dtype=torch.float32)[None, :]


def _curve(rng: np.random.Generator, w: int, cell: float) -> torch.Tensor:
    """A smooth random 1-D profile ``[w]`` in ~[0, 1] (horizons, ridges, band boundaries)."""
    return value_noise(rng, 1, w, 1.0, cell)[0]


def _blob(rng: np.random.Generator, dy: torch.Tensor, dx: torch.Tensor, lumpiness: float) -> torch.Tensor:
    """Inside test of a lumpy unit blob at normalised offsets (radius 1 ± a few harmonics)."""
    theta = torch.atan2(dy, dx)
    radius = torch.ones_like(theta)
    for k in range(2, 6):
        radius += lumpiness / k * rng.normal() * torch.cos(k * theta + rng.uniform(0, 2 * math.pi))
    return dy**2 + dx**2 < radius**2


def _shade(dy: torch.Tensor, dx: torch.Tensor, strength: float) -> torch.Tensor:
    """Top-left lighting factor for normalised offsets: brighter up-left, darker down-right."""
    return (1 + strength * (-0.6 * dy - 0.3 * dx)).clamp(0.4, 1.4)


class _Canvas:
    """An RGB image ``[3, H, W]`` and its label map ``[H, W]`` painted back to front."""

    def __init__(self, h: int, w: int) -> None:
        self.h, self.w = h, w
        self.image = torch.zeros(3, h, w)
        self.label = torch.zeros(h, w, dtype=torch.uint8)

    def paste(self, y0: int, x0: int, mask: torch.Tensor, rgb_: torch.Tensor, cls: str) -> None:
        """Paint ``rgb_ [3, h, w]`` where ``mask [h, w]`` at top-left ``(y0, x0)``, clipped."""
        h, w = mask.shape
        ys, xs = max(0, -y0), max(0, -x0)
        ye, xe = min(h, self.h - y0), min(w, self.w - x0)
        if ye <= ys or xe <= xs:
            return
        m = mask[ys:ye, xs:xe]
        img = self.image[:, y0 + ys : y0 + ye, x0 + xs : x0 + xe]
        img.copy_(torch.where(m, rgb_[:, ys:ye, xs:xe], img))
        lab = self.label[y0 + ys : y0 + ye, x0 + xs : x0 + xe]
        lab.masked_fill_(m, _ID[cls])


def _tree(rng: np.random.Generator, size: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    r = size * rng.uniform(0.22, 0.36)
    trunk_h, trunk_w = size * rng.uniform(0.25, 0.45), r * rng.uniform(0.15, 0.3)
    h, w = int(trunk_h + 2.1 * r) + 1, int(2.4 * r) + 1
    y, x = _grid(h, w)
    cy, cx = 1.05 * r, w / 2
    if rng.random() < 0.3:  # conifer: a jagged cone
        t = (y / (h - trunk_h * 0.6)).clamp(0, 1)
        half = 1.15 * r * t
        jag = 0.15 * r * torch.sin(y / max(1.0, 0.08 * r) * math.pi).abs()
        canopy = ((x - cx).abs() < half - jag) & (y < h - trunk_h * 0.6)
    else:  # broadleaf: a union of round clumps
        canopy = torch.zeros(h, w, dtype=torch.bool)
        for _ in range(int(rng.integers(3, 7))):
            oy, ox, rr = rng.normal(0, 0.3 * r), rng.normal(0, 0.35 * r), r * rng.uniform(0.45, 0.75)
            canopy |= _blob(rng, (y - cy - oy) / rr, (x - cx - ox) / rr, 0.2)
    trunk = ((x - cx).abs() < trunk_w / 2) & (y > cy) & ~canopy
    rgb_ = texture(rng, LOOKS["tree"], h, w, scale) * _shade((y - cy) / r, (x - cx) / r, 0.35)
    rgb_ = torch.where(trunk, texture(rng, _TRUNK, h, w, scale), rgb_)
    return canopy | trunk, rgb_


def _bush(rng: np.random.Generator, size: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    rx = size * rng.uniform(0.18, 0.38)
    ry = rx * rng.uniform(0.45, 0.8)
    h, w = int(ry) + 1, int(2.3 * rx) + 1
    y, x = _grid(h, w)
    dy, dx = (y - h) / ry, (x - w / 2) / rx
    mask = _blob(rng, dy, dx, 0.35) & (dy <= 0)
    return mask, texture(rng, LOOKS["bush"], h, w, scale) * _shade(dy, dx, 0.4)


def _building(rng: np.random.Generator, size: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    bw, bh = size * rng.uniform(0.35, 0.9), size * rng.uniform(0.3, 0.75)
    roof = rng.choice(["flat", "gable", "gable"])
    rh = bw * rng.uniform(0.2, 0.4) if roof == "gable" else 0.0
    h, w = int(bh + rh) + 1, int(bw) + 1
    y, x = _grid(h, w)
    wall_y = y - rh
    wall = (wall_y >= 0).expand(h, w)
    rgb_ = texture(rng, LOOKS["building"], h, w, scale)
    rgb_ = rgb_ * (0.85 if rng.random() < 0.5 else 1.0)  # the side in shadow or not
    rows, cols = int(rng.integers(1, 6)), int(rng.integers(2, 7))
    fy, fx = (wall_y / bh * rows) % 1.0, (x / bw * cols) % 1.0
    windows = wall & (fy > 0.3) & (fy < 0.8) & (fx > 0.25) & (fx < 0.75)
    rgb_ = torch.where(windows, rgb(_WINDOWS[rng.integers(len(_WINDOWS))], rng)[:, None, None], rgb_)
    mask = wall
    if rh > 0:
        roof_mask = (y < rh) & ((x - w / 2).abs() < (w / 2) * (y / rh) + 1)
        roof_rgb = colourize(
            fbm(rng, h, w, 2 * scale, 2),
            rgb(_ROOFS[rng.integers(len(_ROOFS))], rng) * 0.7,
            rgb(_ROOFS[rng.integers(len(_ROOFS))], rng),
        )
        rgb_ = torch.where(roof_mask, roof_rgb, rgb_)
        mask = mask | roof_mask
    return mask, rgb_


def _rock(rng: np.random.Generator, size: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    rx = size * rng.uniform(0.1, 0.3)
    ry = rx * rng.uniform(0.5, 0.9)
    h, w = int(1.5 * ry) + 1, int(2.6 * rx) + 1
    y, x = _grid(h, w)
    dy, dx = (y - h + 0.5 * ry) / ry, (x - w / 2) / rx
    mask = _blob(rng, dy, dx, 0.6) & (dy < 0.5)
    return mask, texture(rng, LOOKS["rock"], h, w, scale) * _shade(dy, dx, 0.6)


def _animal(rng: np.random.Generator, size: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    length = size * rng.uniform(0.22, 0.42)
    brx, bry = length / 2, length * rng.uniform(0.18, 0.26)
    leg_len, leg_w = length * rng.uniform(0.25, 0.4), length * 0.07
    head_r = length * rng.uniform(0.11, 0.16)
    h, w = int(2 * bry + leg_len + 2 * head_r) + 1, int(length + 3 * head_r) + 1
    y, x = _grid(h, w)
    face = 1 if rng.random() < 0.5 else -1
    cy, cx = 2 * head_r + bry, w / 2 - face * head_r
    body = ((y - cy) / bry) ** 2 + ((x - cx) / brx) ** 2 < 1
    hy, hx = cy - bry - rng.uniform(0, 0.5) * head_r, cx + face * (brx + 0.4 * head_r)
    head = ((y - hy) / head_r) ** 2 + ((x - hx) / (1.3 * head_r)) ** 2 < 1
    neck = ((x - (cx + face * 0.8 * brx)).abs() < head_r * 0.6) & (y > hy) & (y < cy)
    legs = torch.zeros(h, w, dtype=torch.bool)
    for off in (-0.75, -0.45, 0.45, 0.75):
        legs |= ((x - cx - off * brx).abs() < leg_w / 2) & (y > cy) & (y < cy + bry + leg_len)
    mask = body | head | neck | legs
    return mask, texture(rng, LOOKS["animal"], h, w, scale) * _shade((y - cy) / bry, (x - cx) / brx, 0.3)


_DRAW = {"tree": _tree, "bush": _bush, "building": _building, "rock": _rock, "animal": _animal}
_SIZE = {"tree": 1.0, "bush": 1.1, "building": 0.9, "rock": 1.2, "animal": 1.2}


def render_scene(
    rng: np.random.Generator, height: int = 224, width: int | None = None, image_wide: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Draw one scene: ``(image uint8 [H, W, 3], mask uint8 [H, W])`` with ``SCENE_CLASSES`` ids.

    ``image_wide=False`` leaves out the effects that one scene shares across all its pixels (the
    sky-coloured haze over far things, exposure, white balance) while drawing the same random
    numbers, so the layout and mask stay those of the default scene: an ablation of what crops of
    one image can agree on without looking at its content (``benchmarks/studies/pretraining.py``).
    """
    h, w = height, width or height
    scale = min(h, w) / 224
    haze_on = float(image_wide)  # weights the haze lerps; the random draws happen either way
    c = _Canvas(h, w)
    y, x = _grid(h, w)
    horizon = rng.uniform(0.25, 0.6) * h

    sky = texture(rng, LOOKS["sky"], h, w, scale) * (0.85 + 0.25 * (y / horizon).clamp(0, 1))[None]
    c.paste(0, 0, torch.ones(h, w, dtype=torch.bool), sky, "sky")
    haze = sky[:, int(horizon * 0.9)].mean(1)  # colour of the sky near the horizon
    for _ in range(int(rng.integers(0, 3))):  # mountain ridges, far to near
        peak = rng.uniform(0.08, 0.35) * h
        top = horizon - peak * (0.25 + 0.75 * _curve(rng, w, w / rng.uniform(1.5, 5)))[None]
        mask = (y >= top) & (y < horizon + 2)
        rgb_ = texture(rng, LOOKS["mountain"], h, w, scale)
        c.paste(0, 0, mask, torch.lerp(rgb_, haze[:, None, None], rng.uniform(0.1, 0.5) * haze_on), "mountain")

    # ground bands below the horizon, separated by wavy boundaries
    n_bands = int(rng.integers(1, 4))
    tops = np.sort(rng.uniform(horizon, h, n_bands - 1))
    for i, t in enumerate([horizon, *tops]):
        kind = str(rng.choice(["grass", "ground", "water"], p=[0.45, 0.35, 0.2]))
        wave = 0.0 if i == 0 else (h - horizon) * 0.08 * (_curve(rng, w, w / 4) - 0.5)[None]
        band = texture(rng, LOOKS[kind], h, w, scale)
        depth = ((y - horizon) / (h - horizon)).clamp(0, 1)
        band = torch.lerp(band, haze[:, None, None], (0.45 * (1 - depth) * haze_on)[None])  # aerial perspective
        c.paste(0, 0, (y >= t + wave).expand(h, w), band, kind)

    # objects standing on the ground, far (near the horizon, small, hazy) to near
    n_obj = int(rng.integers(2, 9))
    bases = np.sort(horizon + (h - horizon) * rng.uniform(0.02, 1.15, n_obj))
    for base in bases:
        kind = str(rng.choice(_OBJECTS, p=_OBJECT_P))
        depth = float(np.clip((base - horizon) / (h - horizon), 0.0, 1.2))
        size = min(h, w) * _SIZE[kind] * (0.15 + 0.85 * depth) * rng.uniform(0.7, 1.3)
        mask, rgb_ = _DRAW[kind](rng, size, scale)
        rgb_ = torch.lerp(rgb_, haze[:, None, None], 0.4 * (1 - min(depth, 1.0)) * haze_on)
        oh, ow = mask.shape
        c.paste(int(base) - oh, int(rng.uniform(-0.1, 1.1) * w - ow / 2), mask, rgb_, kind)

    # camera: exposure, white balance, slight optical blur, sensor noise
    gain = rng.uniform(0.8, 1.15) * (1 + rng.normal(0, 0.05, 3))
    img = c.image * torch.from_numpy(gain.astype(np.float32) if image_wide else np.ones(3, np.float32))[:, None, None]
    img = torch.lerp(img, F.avg_pool2d(img[None], 3, 1, 1, count_include_pad=False)[0], 0.6)
    img = img + torch.from_numpy(rng.normal(0, 0.015, (1, h, w)).astype(np.float32))
    out = (img.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
    return out, c.label.numpy()


def scene_class(mask: np.ndarray) -> int:
    """The image-level label of a scene: its dominant object class.

    The class id (in ``SCENE_CLASSES``) of the object class — tree, bush, building, rock or
    animal — with the most visible pixels in ``mask``; ties go to the smaller id. A scene whose
    objects are all hidden or off-canvas falls back to its most frequent class of any kind. The
    objects are what the scenes vary most (2–8 of 5 kinds, near ones large), so the label is a
    global "what is in the picture" question for class-token probes, while the background
    classes are left to the dense (Hummingbird) evaluation.
    """
    counts = np.bincount(np.asarray(mask, dtype=np.int64).ravel(), minlength=len(SCENE_CLASSES))
    objects = counts[_OBJECT_IDS]
    if objects.sum() > 0:
        return int(_OBJECT_IDS[int(objects.argmax())])
    return int(counts.argmax())


def scene_classes(mask: np.ndarray, min_share: float) -> list[int]:
    """The multi-label image-level label of a scene: every class (objects and background alike)
    covering at least ``min_share`` of the pixels of ``mask``, ascending ids. ``min_share`` in
    (0, 1]: at most ``1 / min_share`` classes qualify, and the most frequent class always does
    when ``min_share <= 1 / num_classes``."""
    if not 0 < min_share <= 1:
        raise ValueError(f"scene_classes: min_share must be in (0, 1], got {min_share}")
    counts = np.bincount(np.asarray(mask, dtype=np.int64).ravel(), minlength=len(SCENE_CLASSES))
    return [int(i) for i in np.flatnonzero(counts >= min_share * counts.sum())]


def scene_rng(seed: int, index: int, split: str = "train") -> np.random.Generator:
    """The random stream of scene ``index``: train and val draw from disjoint seed sequences."""
    if split not in _SPLITS:
        raise ValueError(f"scenes: split must be one of {sorted(_SPLITS)}, got {split!r}")
    return np.random.default_rng([seed, _SPLITS[split], index])


class ScenesSegmentation:
    """Map-style segmentation set of built-in scenes: ``ds[i] -> (PIL RGB image, mask uint8 [H, W])``.

    Every pixel is labelled (``ignore_index = None``); ``num_classes = 10``. ``train`` and ``val``
    never share a scene. Scenes are rendered on access (a few ms each), nothing is stored.
    """

    class_names: list[str] = list(SCENE_CLASSES)
    num_classes: int = len(SCENE_CLASSES)
    ignore_index: int | None = None

    def __init__(self, num_images: int, size: int = 224, seed: int = 0, split: str = "train") -> None:
        scene_rng(seed, 0, split)  # validates split
        self.num_images, self.size, self.seed, self.split = num_images, size, seed, split

    def __len__(self) -> int:
        return self.num_images

    def sample_ids(self) -> list[str]:
        """Every scene's id, ``<split>_<index, 5 digits>`` (``train_00003``): what an image-id list
        (``--train-list``) names; a scene of another split never shares one."""
        return [f"{self.split}_{i:05d}" for i in range(self.num_images)]

    def __getitem__(self, index: int) -> tuple[Image.Image, np.ndarray]:
        if not 0 <= index < self.num_images:
            raise IndexError(f"scene index {index} out of range [0, {self.num_images})")
        image, mask = render_scene(scene_rng(self.seed, index, self.split), self.size)
        return Image.fromarray(image), mask
