"""Attention masks as functions: which keys each query may read.

Each function returns a boolean grid `allowed[query, key]` (True = may attend); `additive` turns it into
what attention adds to its scores. The models apply these grids and the views draw the same grids, so a
picture of a mask is always the mask the code uses.
"""

from __future__ import annotations

import torch


def bidirectional(n: int) -> torch.Tensor:
    """BERT: every position reads every position. [n, n] bool."""
    return torch.ones(n, n, dtype=torch.bool)


def causal(n: int) -> torch.Tensor:
    """GPT: position i reads positions 0..i (itself and its left). [n, n] bool."""
    return torch.ones(n, n, dtype=torch.bool).tril()


def prefix(n: int, source: int) -> torch.Tensor:
    """UniLM seq2seq: the first `source` positions read each other both ways; the rest read the whole
    source and the target to their left. [n, n] bool."""
    if not 0 <= source <= n:
        raise ValueError(f"the source ({source} positions) must fit in the sequence ({n} positions)")
    allowed = causal(n)
    allowed[:, :source] = True
    return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0 where attention is allowed, the dtype's most negative value where it is not (as transformers
    does), shaped to broadcast over [batch, head, query, key]."""
    out = torch.zeros(allowed.shape, dtype=dtype)
    out.masked_fill_(~allowed, torch.finfo(dtype).min)
    return out.view(*(1,) * (4 - allowed.dim()), *allowed.shape)


def causal_mask(n: int, dtype: torch.dtype, device: torch.device | str | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """What a decoder adds to its scores: `causal(n)` (and, given attention_mask [batch, n] of 1 = token,
    0 = padding, no padded key) as `additive` makes it, on `device`. [1 or batch, 1, n, n]."""
    allowed = causal(n).to(device)[None, None]  # [1, 1, query, key]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].to(device=device, dtype=torch.bool)
    out = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)
