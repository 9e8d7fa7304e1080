"""Timing two or more variants of one step in one process, taking turns step by step (the order flipping every
round), so that a burst of background load on a shared machine hits every variant alike; the model shapes and the
results' header the turn-taking benchmarks share."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

PRESETS = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def meta(threads: int, steps: int, load_start: list[float]) -> dict[str, Any]:
    """What a turn-taking result was measured with: torch, threads, CPU, steps and the load before and after."""
    import torch

    return {"torch": torch.__version__, "threads": threads, "cpu": platform.processor() or platform.machine(),
            "steps": steps, "load_avg_start": load_start, "load_avg_end": load_average()}


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
