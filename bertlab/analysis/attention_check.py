"""Does attention explain it? One prediction seen three ways, and a test of the heads.

For the token the prediction is read at (the query: the masked word, [CLS] for the sentence heads,
the tagged word, the answer's start/end), three scores per input token:

- raw attention from the query, of a chosen layer and head (or averaged over heads, or over all layers);
- attention rollout (Abnar & Zuidema 2020) through every layer, from the query;
- the attribution of the prediction's probability (integrated gradients or gradient × input).

Their rank agreement over the words (special tokens left out) is Spearman's ρ and Kendall's τ-b of
the attention against the attribution's size |score|. Then the ablation check: switch off the heads
the attention view credits (those that attend most from the query to the word it ranks first) and
see whether the probability moves, against as many heads picked at random (seeded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.analysis.attribution import Attribution, ExplainInput, Target, target_probability
from bertlab.analysis.rollout import attention_rollout
from bertlab.runtime import eval_mode

DEFAULT_HEADS_OFF = 6
RANDOM_DRAWS = 8  # random head sets the credited heads are compared with


@dataclass
class HeadCheck:
    """The probability with the credited heads off, and with random heads off."""

    heads_off: list[tuple[int, int]]  # (layer, head) the attention view credits
    base: float  # the probability with every head on
    ablated: float  # with `heads_off` off
    random_mean: float  # mean over RANDOM_DRAWS sets of as many random heads
    random_draws: list[float]

    @property
    def change(self) -> float:
        return self.ablated - self.base

    @property
    def random_change(self) -> float:
        return self.random_mean - self.base


@dataclass
class AttentionCheck:
    """Attention, rollout and attribution of one prediction over the same tokens, and how they agree."""

    tokens: list[str]
    query: int  # token the prediction is read at
    view: str  # what the raw row is: "layer 3, head 5", "layer 3, mean of heads", "mean of all layers and heads"
    raw: list[float]  # [seq] attention from the query
    rollout: list[float]  # [seq] rollout through all layers, from the query
    attribution: list[float]  # [seq] signed scores
    scored: list[bool]  # tokens the agreement counts (the words; not the special tokens)
    spearman_raw: float
    kendall_raw: float
    spearman_rollout: float
    kendall_rollout: float
    top_attention: int  # the word the attention view ranks first
    top_attribution: int  # the word the attribution ranks first (by size)
    heads: HeadCheck | None = None
    sentence_b_start: int | None = None


# ---------------------------------------------------------------------------------------------
# Rank agreement
# ---------------------------------------------------------------------------------------------
def ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor, ties given their average rank (float64)."""
    x = x.double()
    order = x.argsort()
    r = torch.empty_like(x)
    r[order] = torch.arange(1, len(x) + 1, dtype=torch.float64)
    for v in x.unique():  # average the ranks of ties
        same = x == v
        if int(same.sum()) > 1:
            r[same] = r[same].mean()
    return r


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's ρ of two 1-D tensors: the Pearson correlation of their ranks (NaN when one is constant
    or there are fewer than 2 values)."""
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float("nan") if den == 0 else float((ra * rb).sum()) / den


def kendall(a: torch.Tensor, b: torch.Tensor) -> float:
    """Kendall's τ-b of two 1-D tensors (ties counted as in scipy.stats.kendalltau; NaN when undefined)."""
    if len(a) < 2:
        return float("nan")
    da = torch.sign(a.double()[:, None] - a.double()[None, :])  # [n, n]
    db = torch.sign(b.double()[:, None] - b.double()[None, :])
    upper = torch.triu(torch.ones_like(da, dtype=torch.bool), diagonal=1)
    s = float((da * db)[upper].sum())
    n_a, n_b = float((da[upper] != 0).sum()), float((db[upper] != 0).sum())
    return float("nan") if n_a == 0 or n_b == 0 else s / (n_a * n_b) ** 0.5


# ---------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------
def attention_from_query(patterns: torch.Tensor, query: int, layer: int | None = None,
                         head: int | None = None) -> tuple[torch.Tensor, str]:
    """The attention row of the query [seq] from patterns [layers, heads, query, key]: one head, the
    mean of a layer's heads, or (layer None) the mean of every layer and head; and its description."""
    n_layers, n_heads = patterns.shape[:2]
    if layer is None:
        return patterns[:, :, query].mean(dim=(0, 1)), "mean of all layers and heads"
    if not 0 <= layer < n_layers:
        raise IndexError(f"layer {layer} does not exist: this model has layers 0..{n_layers - 1}.")
    if head is None:
        return patterns[layer, :, query].mean(dim=0), f"layer {layer}, mean of heads"
    if not 0 <= head < n_heads:
        raise IndexError(f"head {head} does not exist: each layer has heads 0..{n_heads - 1}.")
    return patterns[layer, head, query], f"layer {layer}, head {head}"


def credited_heads(patterns: torch.Tensor, query: int, key: int, n: int) -> list[tuple[int, int]]:
    """The `n` heads that put the most attention from `query` on `key`, most first: [(layer, head)]."""
    weights = patterns[:, :, query, key]  # [layers, heads]
    n = max(1, min(n, weights.numel()))
    top = weights.flatten().topk(n).indices
    heads = weights.shape[1]
    return [(int(i) // heads, int(i) % heads) for i in top]


def check_attention(
    model: torch.nn.Module,
    ex: ExplainInput,
    target: Target,
    attribution: Attribution,
    layer: int | None = None,
    head: int | None = None,
    heads_off: int = DEFAULT_HEADS_OFF,
    seed: int = 0,
    ablate: bool = True,
) -> AttentionCheck:
    """Attention (raw and rollout) against `attribution` for `target` on `ex`, and (with `ablate`)
    the ablation check with `heads_off` credited heads against as many random ones (seeded)."""
    if len(attribution.scores) != len(ex):
        raise ValueError(f"the attribution has {len(attribution.scores)} scores for {len(ex)} tokens.")
    names = model.family.layer_hook_names("hook_pattern")
    kwargs = {}
    if model.has_mlm:
        kwargs["mlm_positions"] = torch.zeros_like(ex.input_ids, dtype=torch.bool)
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(ex.input_ids, token_type_ids=ex.token_type_ids, names=names, **kwargs)
    patterns = cache.stack("hook_pattern")[:, 0].float().cpu()  # [layers, heads, query, key]
    q = target.query
    raw, view = attention_from_query(patterns, q, layer, head)
    roll = attention_rollout(patterns)[-1, q]  # [key]
    attr = torch.tensor(attribution.scores, dtype=torch.float64)
    scored = torch.tensor([not k for k in ex.keep])
    if target.kind in ("tag", "start", "end"):
        scored[q] = True  # the query is a word of its own here
    idx = scored.nonzero().flatten()
    size = attr.abs()[idx]
    top_att = int(idx[raw[idx].argmax()]) if len(idx) else q
    top_attr = int(idx[size.argmax()]) if len(idx) else q
    check = AttentionCheck(
        tokens=list(ex.tokens), query=q, view=view, raw=raw.tolist(), rollout=roll.tolist(),
        attribution=attr.tolist(), scored=scored.tolist(),
        spearman_raw=spearman(raw[idx], size), kendall_raw=kendall(raw[idx], size),
        spearman_rollout=spearman(roll[idx], size), kendall_rollout=kendall(roll[idx], size),
        top_attention=top_att, top_attribution=top_attr, sentence_b_start=ex.sentence_b_start,
    )
    if ablate:
        credited = credited_heads(patterns, q, top_att, heads_off)
        check.heads = head_check(model, ex, target, credited, seed)
    return check


def head_check(model: torch.nn.Module, ex: ExplainInput, target: Target, heads_off: list[tuple[int, int]],
               seed: int = 0, draws: int = RANDOM_DRAWS) -> HeadCheck:
    """The probability with every head on, with `heads_off` off, and with `draws` sets of as many heads
    drawn at random (a torch.Generator seeded with `seed`), in one batch."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    masks = torch.ones(2 + draws, layers * heads)
    for la, h in heads_off:
        masks[1, la * heads + h] = 0.0
    rng = torch.Generator().manual_seed(seed)
    for d in range(draws):
        masks[2 + d, torch.randperm(layers * heads, generator=rng)[: len(heads_off)]] = 0.0
    probs = target_probability(model, ex, target, masks.view(-1, layers, heads))  # [2 + draws]
    rand = probs[2:].tolist()
    return HeadCheck(list(heads_off), float(probs[0]), float(probs[1]), float(sum(rand) / len(rand)), rand)
