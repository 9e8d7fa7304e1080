"""Attention patterns of every layer and head for one sentence (or sentence pair)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.analysis import eval_mode
from bertlab.tokenizer import Tokenizer

PATTERN_HOOK = "attention.self.hook_pattern"


@dataclass
class AttentionResult:
    """What the model's attention looked like for one input.

    `patterns[layer, head, query, key]` is the softmax weight query token puts on key token;
    each row sums to 1.
    """

    tokens: list[str]  # one per position, [CLS] ... [SEP] (... [SEP])
    sentence_b_start: int | None  # index of the first token of sentence B, None without B
    patterns: torch.Tensor  # [layers, heads, query, key] float32 on CPU
    warning: str | None = None  # set when the text was cut to fit `max_length`
    text_a: str = ""
    text_b: str | None = None

    @property
    def num_layers(self) -> int:
        return self.patterns.shape[0]

    @property
    def num_heads(self) -> int:
        return self.patterns.shape[1]

    @property
    def num_unknown(self) -> int:
        """How many tokens are [UNK] (pieces the vocabulary cannot spell, e.g. emoji)."""
        return sum(t == "[UNK]" for t in self.tokens)

    def pattern(self, layer: int, head: int) -> torch.Tensor:
        """The [query, key] weights of one head, with a clear error for a wrong index."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} does not exist: this model has layers 0..{self.num_layers - 1}.")
        if not 0 <= head < self.num_heads:
            raise IndexError(f"head {head} does not exist: each layer has heads 0..{self.num_heads - 1}.")
        return self.patterns[layer, head]


def attention_patterns(
    model: torch.nn.Module,
    tok: Tokenizer,
    a: str,
    b: str | None = None,
    max_length: int | None = None,
) -> AttentionResult:
    """Run `model` on sentence `a` (and `b` as the second segment) and collect the attention
    pattern of every layer and head: `patterns` is [layers, heads, query, key].

    Texts longer than `max_length` tokens (default: what the model can read) are cut,
    and `warning` says so. Raises ValueError with a readable message for empty input.
    """
    if not isinstance(a, str) or not a.strip():
        raise ValueError("There is no text to look at: type a sentence first.")
    if b is not None and not b.strip():
        b = None
    limit = model.config.max_position_embeddings - model.config.position_offset
    if max_length is not None and max_length < 3:
        raise ValueError(f"max_length must leave room for [CLS] and [SEP]: got {max_length}, use at least 3.")
    max_length = min(max_length or limit, limit)
    enc = tok.encode(a, b, max_length=max_length)
    warning = None
    if enc.truncated:
        warning = (
            f"The text is {len(enc) + enc.num_truncated} tokens long; only {max_length} fit, "
            f"so {enc.num_truncated} tokens were cut from the end"
            + (" of the longer sentence." if b is not None else ".")
        )
    input_ids = torch.tensor([enc.ids])  # [1, seq]
    token_type_ids = torch.tensor([enc.type_ids])  # [1, seq]
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(
            input_ids, token_type_ids=token_type_ids, names=lambda n: n.endswith(PATTERN_HOOK),
            mlm_positions=torch.zeros_like(input_ids, dtype=torch.bool) if model.has_mlm else None,  # not needed
        )
    patterns = cache.stack(PATTERN_HOOK)[:, 0]  # [layers, heads, query, key]
    b_start = enc.sequence_ids.index(1) if 1 in enc.sequence_ids else None
    return AttentionResult(
        tokens=list(enc.tokens),
        sentence_b_start=b_start,
        patterns=patterns.detach().to("cpu", torch.float32),
        warning=warning,
        text_a=a,
        text_b=b,
    )
