"""What a sliding window saves: attention under Longformer's window mask computed without the n × n grid, and
both timed on this machine (the Masks view's "Time it here"; bench/bench_attention.py measures the same with
eager attention and memory, for the docs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bertlab import masks

LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     global_positions: tuple[int, ...] = (0,)) -> torch.Tensor:
    """Attention under `masks.sliding_window(n, window, global_positions)` without the n × n grid (Longformer's
    sliding chunks): queries in blocks of `window`, each block reading the global keys and the 3 · window keys
    around it, all blocks in one fused call; the global queries read every key.
    q, k, v [batch, head, n, d_head] -> [batch, head, n, d_head]."""
    b, h, n, d = q.shape
    w = max(window, 1)
    blocks = -(-n // w)
    padded = blocks * w
    glob = torch.tensor(sorted(set(global_positions)), dtype=torch.long)
    g = len(glob)

    def around(x: torch.Tensor) -> torch.Tensor:  # [b, h, n, d] -> [b · h, block, g + 3w, d]
        slabs = F.pad(x, (0, 0, w, padded - n + w)).view(b * h, blocks + 2, w, d)  # block i: slabs i, i+1, i+2
        keys = x.new_empty(b * h, blocks, g + 3 * w, d)
        keys[:, :, :g] = x[..., glob, :].reshape(b * h, 1, g, d)
        for i in range(3):
            keys[:, :, g + i * w:g + (i + 1) * w] = slabs[:, i:i + blocks]
        return keys

    qpos = torch.arange(padded).view(blocks, w, 1)  # [block, w, 1]
    kpos = (torch.arange(blocks) * w - w).view(blocks, 1, 1) + torch.arange(3 * w).view(1, 1, 3 * w)
    band = ((qpos - kpos).abs() <= window) & (kpos >= 0) & (kpos < n) & ~torch.isin(kpos, glob)
    allowed = torch.cat([torch.ones(blocks, w, g, dtype=torch.bool), band], dim=-1)  # [block, w, g + 3w]
    qb = F.pad(q, (0, 0, 0, padded - n)).view(b * h, blocks, w, d)  # 4-D, the blocks as heads: the fused kernel
    kb, vb = around(k), around(v)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed[None])  # [b·h, block, w, d]
    out = out.reshape(b, h, padded, d)[:, :, :n].clone()
    if g:  # a global query reads every key
        out[..., glob, :] = F.scaled_dot_product_attention(q[..., glob, :], k, v)
    return out


@dataclass
class WindowTiming:
    """One length: full attention (torch's fused SDPA) against `banded_attention`, median ms of `repeats` calls."""

    seq: int
    full_ms: float
    banded_ms: float
    full_pairs: int  # query-key scores full attention computes: n²
    banded_pairs: int  # ... and the banded one (blocks padded to whole blocks)

    @property
    def speedup(self) -> float:
        return self.full_ms / self.banded_ms


def banded_pairs(n: int, window: int, globals_: int = 1) -> int:
    """Query-key scores `banded_attention` computes: blocks of `window` queries padded to whole blocks, each
    scoring 3 · window local keys and the global keys, and the global queries' full rows."""
    w = max(window, 1)
    return -(-n // w) * w * (3 * w + globals_) + globals_ * n


def time_window(lengths: Sequence[int] = LENGTHS, window: int = 64, heads: int = 12, d_head: int = 64,
                repeats: int = 3, seed: int = 0, threads: int = 1,
                progress: Callable[[int], None] | None = None) -> list[WindowTiming]:
    """Time full attention against the window (±`window`, the first token global) on random q, k, v
    [1, heads, n, d_head] float32 for each length, on `threads` torch threads (one by default: on a shared
    machine, threads that wait for each other time the waiting); the two take turns, after a warm-up call each.
    The banded result is checked against SDPA under `masks.sliding_window` at the shortest length.
    `progress(n)`: called before each length."""
    if any(n < 2 for n in lengths) or window < 1 or repeats < 1 or threads < 1:
        raise ValueError("lengths must be at least 2 tokens, the window, the repeats and the threads at least 1")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _time(lengths, window, heads, d_head, repeats, torch.Generator().manual_seed(seed), progress)
    finally:
        torch.set_num_threads(before)


def _time(lengths: Sequence[int], window: int, heads: int, d_head: int, repeats: int, g: torch.Generator,
          progress: Callable[[int], None] | None) -> list[WindowTiming]:
    rows = []
    for i, n in enumerate(lengths):
        if progress is not None:
            progress(n)
        q, k, v = (torch.randn(1, heads, n, d_head, generator=g) for _ in range(3))  # [1, head, n, d_head]
        with torch.inference_mode():
            if i == 0:
                want = F.scaled_dot_product_attention(q, k, v, attn_mask=masks.sliding_window(n, window, (0,)))
                if not torch.allclose(banded_attention(q, k, v, window), want, atol=1e-4):
                    raise RuntimeError("the banded attention differs from attention under the window mask")
            calls = {"full": lambda: F.scaled_dot_product_attention(q, k, v),
                     "banded": lambda: banded_attention(q, k, v, window)}
            times: dict[str, list[float]] = {name: [] for name in calls}
            for fn in calls.values():
                fn()
            for r in range(repeats):
                for name in (("full", "banded") if r % 2 == 0 else ("banded", "full")):
                    t = time.perf_counter()
                    calls[name]()
                    times[name].append((time.perf_counter() - t) * 1000)
        rows.append(WindowTiming(n, statistics.median(times["full"]), statistics.median(times["banded"]), n * n,
                                 banded_pairs(n, window)))
    return rows
