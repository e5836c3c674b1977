"""The training subsets open-hummingbird-eval publishes, shipped with the package (``file_sets/``,
source and license in its README), and the image-id list format they share with ``--train-list``.

A published Hummingbird number on "1/128 of VOC" was computed on one of five fixed lists of image
ids; a subset drawn here with another seed holds other images, and the two numbers cannot be put
side by side. The lists are read as ids only: no dataset is needed to read or count them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FRACTIONS = ("1/8", "1/64", "1/128")
FRACTION_SEEDS = (42, 400, 783, 1293, 4019)
# dataset name -> (its split the lists subset, the spellings of that split the reader accepts)
PUBLISHED_SPLITS = {"voc": ("trainaug", {"trainaug"}), "ade20k": ("training", {"training", "train"})}


def read_id_list(path: str | Path) -> list[str]:
    """The image ids of a list file, one per line (blank lines skipped, surrounding spaces
    stripped), each once, in file order. ``ValueError`` naming the file when it holds none."""
    path = Path(path)
    ids = list(dict.fromkeys(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()))
    if not ids:
        raise ValueError(f"{path}: no image id in it (one id per line)")
    return ids


def published_list_path(dataset: str, fraction: str, seed: int) -> Path:
    """The shipped list of ``fraction`` (``"1/128"``) of ``dataset``'s training split drawn with
    ``seed``; ``ValueError`` in one line when open-hummingbird-eval publishes no such list."""
    if dataset not in PUBLISHED_SPLITS:
        raise ValueError(
            f"--fraction {fraction}: open-hummingbird-eval publishes subsets of {' and '.join(PUBLISHED_SPLITS)} "
            f"only, not of {dataset} (give your own --train-list FILE)"
        )
    if fraction not in FRACTIONS:
        raise ValueError(f"--fraction {fraction}: the published fractions are {', '.join(FRACTIONS)}")
    if seed not in FRACTION_SEEDS:
        raise ValueError(f"--fraction-seed {seed}: the published seeds are {', '.join(str(s) for s in FRACTION_SEEDS)}")
    split, denominator = PUBLISHED_SPLITS[dataset][0], fraction.split("/")[1]
    name = f"{split}_{denominator}_{seed}.txt"
    return Path(str(resources.files(__package__).joinpath("file_sets", dataset, f"1_div_{denominator}", name)))


def published_ids(dataset: str, fraction: str, seed: int) -> list[str]:
    """The ids of the shipped list :func:`published_list_path` names."""
    return read_id_list(published_list_path(dataset, fraction, seed))
