"""Timing two or more variants of one step in one process, taking turns step by step (the order flipping every
round), so that a burst of background load on a shared machine hits every variant alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def median_in_turns(variants: Mapping[str, Callable[[], None]], steps: int) -> dict[str, float]:
    """Median seconds per call of each variant over `steps` rounds, after one untimed call of each."""
    for fn in variants.values():
        fn()
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(steps):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            variants[n]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}
