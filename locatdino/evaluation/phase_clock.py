"""Wall time per phase of an evaluation (data, features, memory, search, head, ...): what a
``results.json``'s ``timings`` record, so that a slow run says where its time went."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator


class PhaseClock:
    """Wall time per phase: ``with clock("search"): ...``; ``clock.iterate(loader, "data")``
    times the waits on a DataLoader."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] += time.perf_counter() - start

    def iterate(self, iterable: Iterable, phase: str) -> Iterator:
        iterator = iter(iterable)
        while True:
            with self(phase):
                item = next(iterator, StopIteration)
            if item is StopIteration:
                return
            yield item
