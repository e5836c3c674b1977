"""The image files of a folder tree, each real file once (``locatdino shards`` of a folder, the
``imagefolder`` splits of ``knn`` and ``lincls``).

Symbolic links are followed, as torchvision's ``ImageFolder`` follows them (a class folder that is
a link into a data store is common), but each real folder is entered once and each real file listed
once, under its name with the fewest links on the way (ties: the first path in sorted order). A link
loop (``cat/again -> ..``) or two links to one folder would otherwise list the same images again:
``os.walk(followlinks=True)`` descends a loop until the path is too long, so 12 images read as 172.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Collection
from pathlib import Path


def image_files(root: str | os.PathLike, suffixes: Collection[str]) -> list[Path]:
    """The regular files under ``root`` (recursive, links followed) whose lower-cased suffix is in
    ``suffixes``, each real file once, in ``ImageFolder``'s order: by folder path, then by name.

    Folders are entered by increasing number of links on their path, then by path: every folder of
    the real tree is entered under its own name before any link to it is met, and a folder already
    entered (a loop, a second link) is not entered again. A file reached by several names (a link to
    a file, a linked folder) is listed under the one with the fewest links."""
    heap = [(0, os.fspath(root))]
    entered: set[str] = set()
    chosen: dict[str, tuple[int, str]] = {}  # real path -> (links on the way, path listed)
    while heap:
        links, folder = heapq.heappop(heap)
        real = os.path.realpath(folder)
        if real in entered:
            continue
        entered.add(real)
        try:
            with os.scandir(folder) as found:
                entries = list(found)
        except OSError:  # unreadable: skipped, as os.walk does
            continue
        for entry in entries:
            link = int(entry.is_symlink())
            if entry.is_dir():
                heapq.heappush(heap, (links + link, entry.path))
            elif entry.is_file() and os.path.splitext(entry.name)[1].lower() in suffixes:
                target = os.path.realpath(entry.path) if link else os.path.join(real, entry.name)
                name = (links + link, entry.path)
                chosen[target] = min(chosen.get(target, name), name)
    return sorted((Path(path) for _, path in chosen.values()), key=lambda p: (str(p.parent), p.name))
