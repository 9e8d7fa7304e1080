"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

One layer's attention says which tokens of the layer below each token reads; rollout follows
that through all the layers down to the input tokens. Per layer: average the heads, add the
identity for the residual connection (a token also keeps itself), renormalise the rows, then
multiply the layers together: rollout[L] = Â_L · Â_{L-1} · ... · Â_0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.analysis.attention import AttentionResult, attention_patterns
from bertlab.tokenizer import Tokenizer


@dataclass
class RolloutResult:
    """Raw attention and rollout of every layer, for one sentence (or pair).

    `raw[l, q, k]`: layer l's attention from token q to token k, averaged over heads.
    `rollout[l, q, k]`: how much of token q's vector after layer l flows from input token k.
    Every row of both sums to 1.
    """

    tokens: list[str]  # as a student reads them (byte-level "Ġ" drawn as "␣")
    sentence_b_start: int | None  # first token of sentence B, None without B
    raw: torch.Tensor  # [layers, query, key]
    rollout: torch.Tensor  # [layers, query, key]
    residual: bool = True  # whether the identity was added for the residual connection
    warning: str | None = None  # set when the text was cut to fit

    @property
    def num_layers(self) -> int:
        return self.raw.shape[0]

    def check_layer(self, layer: int) -> int:
        """`layer`, or an IndexError a student can act on."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} does not exist: this model has layers 0..{self.num_layers - 1}.")
        return layer


def attention_rollout(patterns: torch.Tensor, residual: bool = True) -> torch.Tensor:
    """patterns: [layers, heads, query, key] softmax weights -> rollout: [layers, query, key].

    rollout[l] is the product of the head-averaged (and, with `residual`, identity-mixed and
    row-renormalised) attention of layers l, l-1, ..., 0.
    """
    _check_patterns(patterns)
    mixed = mix_residual(patterns.mean(dim=1)) if residual else patterns.mean(dim=1)  # [layers, q, k]
    flow = torch.eye(patterns.shape[-1], dtype=patterns.dtype, device=patterns.device)  # [k, k]
    out = []
    for layer in mixed:  # [q, k]
        flow = layer @ flow  # [q, k]: from layer l's output back to the input tokens
        out.append(flow)
    return torch.stack(out)  # [layers, query, key]


def mix_residual(attention: torch.Tensor) -> torch.Tensor:
    """[..., q, k] -> (A + I) with rows renormalised to sum to 1 (= (A + I) / 2 for softmax rows)."""
    n = attention.shape[-1]
    mixed = attention + torch.eye(n, dtype=attention.dtype, device=attention.device)
    return mixed / mixed.sum(dim=-1, keepdim=True)


def rollout_from_attention(result: AttentionResult, residual: bool = True) -> RolloutResult:
    """Rollout of patterns already computed (e.g. by the attention tab), no new forward pass."""
    patterns = result.patterns.float()  # [layers, heads, query, key]
    return RolloutResult(
        tokens=list(result.labels),
        sentence_b_start=result.sentence_b_start,
        raw=patterns.mean(dim=1),
        rollout=attention_rollout(patterns, residual=residual),
        residual=residual,
        warning=result.warning,
    )


def compute_rollout(
    model: torch.nn.Module,
    tok: Tokenizer,
    a: str,
    b: str | None = None,
    max_length: int | None = None,
    residual: bool = True,
) -> RolloutResult:
    """Run the model on `a` (and `b`) and return raw attention and rollout for every layer."""
    return rollout_from_attention(attention_patterns(model, tok, a, b, max_length=max_length), residual)


def _check_patterns(patterns: torch.Tensor) -> None:
    if patterns.dim() != 4 or patterns.shape[-1] != patterns.shape[-2]:
        raise ValueError(
            f"attention patterns must be [layers, heads, query, key] with query = key; "
            f"got shape {tuple(patterns.shape)}."
        )
