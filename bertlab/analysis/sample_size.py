"""How much a figure measured on n examples can mean: its sample size in words, a 95 % interval for a
share (accuracy), and a warning below the size under which a figure means little.

    measured_on(0.85, 40, "dev examples")  # "85.0 % of 40 dev examples (95 % interval 71–93 %)"
    too_few(12)                            # a warning sentence, or "" from MIN_EXAMPLES on
"""

from __future__ import annotations

import math

MIN_EXAMPLES = 30  # below this a share's 95 % interval is wider than ±15 points: a figure warns
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


def share_interval(share: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's interval for a share (e.g. accuracy) measured on `n` examples, as (low, high) in [0, 1]."""
    if n <= 0:
        return 0.0, 1.0
    p = min(max(float(share), 0.0), 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def examples_text(n: int, what: str = "examples") -> str:
    """"40 dev examples", "1 dev example"."""
    return f"{n:,} {what}" if n != 1 else f"1 {what.removesuffix('s')}"


def measured_on(share: float, n: int, what: str = "examples") -> str:
    """A share and what it was measured on: "85.0 % of 40 dev examples (95 % interval 71–93 %)"."""
    lo, hi = share_interval(share, n)
    return f"{100 * share:.1f} % of {examples_text(n, what)} (95 % interval {100 * lo:.0f}–{100 * hi:.0f} %)"


def too_few(n: int, what: str = "examples") -> str:
    """A warning when `n` examples are too few for a figure to mean much; "" when they are enough."""
    if n >= MIN_EXAMPLES:
        return ""
    return (f"Only {examples_text(n, what)}: too few for this figure to mean much (it needs {MIN_EXAMPLES} or more; "
            f"use more data).")


__all__ = ["MIN_EXAMPLES", "examples_text", "measured_on", "share_interval", "too_few"]
