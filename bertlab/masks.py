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


def sliding_window(n: int, window: int, global_positions: tuple[int, ...] = (0,)) -> torch.Tensor:
    """Longformer: position i reads the keys i - window .. i + window; a global position (default [CLS] at 0)
    reads every key and is read by every query. [n, n] bool, symmetric. `sliding_window(n, w, ())` is the band
    of a ModernBERT local layer (`bertlab.families.modernbert.attention_masks`, `window` = local_attention / 2)."""
    if window < 0:
        raise ValueError(f"the window must be 0 or more tokens on each side, not {window}")
    outside = [p for p in global_positions if not 0 <= p < n]
    if outside:
        raise ValueError(f"global position {outside[0]} is outside the sequence (positions 0..{n - 1})")
    pos = torch.arange(n)
    allowed = (pos[:, None] - pos[None, :]).abs() <= window
    for p in global_positions:
        allowed[p, :] = True
        allowed[:, p] = True
    return allowed


def lsh_buckets(vectors: torch.Tensor, n_buckets: int, seed: int = 0) -> torch.Tensor:
    """Reformer's angular hash: each token's vector [n, d] is turned by one random rotation R [d, n_buckets / 2]
    (drawn from a generator seeded by `seed`), and its bucket is argmax([xR; -xR]). Reformer ties keys to
    queries, so one vector per token picks both its row's and its column's bucket. -> [n] long in 0..n_buckets-1."""
    if n_buckets < 2 or n_buckets % 2:
        raise ValueError(f"the number of buckets must be even and at least 2 (Reformer hashes into ±R), "
                         f"not {n_buckets}")
    if vectors.dim() != 2:
        raise ValueError(f"lsh_buckets hashes one vector per token, [n, d]; got shape {tuple(vectors.shape)}")
    generator = torch.Generator().manual_seed(seed)
    rotation = torch.randn(vectors.shape[1], n_buckets // 2, generator=generator)  # [d, n_buckets / 2]
    turned = vectors.detach().to("cpu", torch.float32) @ rotation  # [n, n_buckets / 2]
    return torch.cat([turned, -turned], dim=-1).argmax(dim=-1)


def lsh_hash(buckets: torch.Tensor) -> torch.Tensor:
    """Reformer's LSH attention as the grid it approximates: query i may read key j when both hashed into the
    same bucket (`lsh_buckets`), in both directions (no causal part); every token is in its own bucket, so no
    row is empty. (Reformer then sorts by bucket and attends within chunks, which this grid does not draw.)
    buckets [n] -> [n, n] bool."""
    return buckets[:, None] == buckets[None, :]


def segment_recurrence(n: int, segment: int) -> torch.Tensor:
    """Transformer-XL, one layer, the n positions cut into segments of `segment` tokens: a query reads its own
    segment up to itself (left to right: Transformer-XL is a language model) and every position of the segment
    just before (the cached states of the previous step, read as extra keys and never trained through). Keys
    two or more segments back are not in the grid: they reach a query only through the layers below, one
    segment further per layer. [n, n] bool."""
    if segment < 1:
        raise ValueError(f"a segment must hold at least 1 token, not {segment}")
    pos = torch.arange(n)
    seg = pos // segment
    same = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    previous = seg[None, :] == seg[:, None] - 1
    return same | previous
