"""How much context does BERT use? Masked-word accuracy when attention is cut to a window.

Cheaper attention (Longformer's local windows, ModernBERT's local layers) lets each token attend only to
the tokens within `w` positions of it. Whether that costs anything depends on how far the model looks:
here each chosen layer's attention is cut to a window of ±w positions (a hook on its scores sets every key
farther than `w` from the query to -inf before the softmax, so the pattern over the window sums to 1), and
the model guesses held-out masked words (scored by the function given, e.g.
`bertlab.training.pretrain.evaluate_mlm` on seeded masks: the same words in every row). Where the accuracy
with a window equals the full one, the window is free.

    score = lambda m: evaluate_mlm(m, tok, documents, max_tokens=20_000)
    rows = context_curve(model, score, windows=(1, 2, 4, 8, None))
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import torch

from bertlab.families.core import FamilyModel
from bertlab.masks import sliding_window

WINDOWS: tuple[int | None, ...] = (0, 1, 2, 4, 8, 16, 32, None)  # None: full attention


def window_allowed(n: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """[n, n] bool: query i may attend to key j when |i - j| <= window (`bertlab.masks.sliding_window` with no
    global token: each token always sees itself)."""
    return sliding_window(n, window, global_positions=()).to(device)


def score_points(model: FamilyModel) -> list[str]:
    """The model's attention-score hook points, one per layer, bottom layer first."""
    names = [n for n in model.hook_points if n.endswith("hook_scores")]
    return sorted(names, key=lambda n: [int(x) for x in re.findall(r"\d+", n)])


def layer_groups(model: FamilyModel) -> dict[str, list[int]]:
    """Which layers a window is applied to: all of them, the lower half, the upper half."""
    n = len(score_points(model))
    half = n // 2
    return {"all layers": list(range(n)), "lower half": list(range(half)), "upper half": list(range(half, n))}


@contextlib.contextmanager
def windowed(model: FamilyModel, layers: Sequence[int], window: int | None) -> Iterator[FamilyModel]:
    """Within the block, the attention of `layers` reaches only keys within ±`window` positions
    (`window=None`: the model as it is)."""
    if window is None or not layers:
        yield model
        return
    if window < 0:
        raise ValueError(f"the window must be 0 or more tokens on each side, not {window}")
    points = score_points(model)
    names = [points[i] for i in layers]

    def cut(scores: torch.Tensor, _name: str) -> torch.Tensor:  # [batch, head, query, key]
        allowed = window_allowed(scores.shape[-1], window, scores.device)
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)

    with model.hooks([(names, cut)]):
        yield model


@dataclass(frozen=True)
class ContextRow:
    layers: str  # "all layers", "lower half", "upper half"
    window: int | None  # None: full attention
    top1: float
    top5: float
    masked_tokens: int


def context_curve(model: FamilyModel, score: Callable[[FamilyModel], dict],
                  windows: Sequence[int | None] = WINDOWS,
                  groups: dict[str, list[int]] | None = None) -> list[ContextRow]:
    """`score(model)` (a dict with top1, top5, masked_tokens: MLM accuracy on seeded masks) for each layer
    group and window. Full attention is one row, "all layers" with window None."""
    model.require("mlm")
    groups = groups if groups is not None else layer_groups(model)
    rows: list[ContextRow] = []

    def measure(name: str, layers: list[int], window: int | None) -> None:
        with windowed(model, layers, window):
            m = score(model)
        rows.append(ContextRow(name, window, m["top1"], m["top5"], m["masked_tokens"]))

    if None in windows:
        measure("all layers", [], None)
    for name, layers in groups.items():
        for w in windows:
            if w is not None:
                measure(name, layers, w)
    return rows


def as_dicts(rows: Sequence[ContextRow]) -> list[dict]:
    return [asdict(r) for r in rows]
