"""Attention patterns of every layer and head for one sentence (or sentence pair)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from bertlab.inputs import optional_text, require_text
from bertlab.runtime import eval_mode
from bertlab.tokenizer import Tokenizer


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
    num_unknown: int = 0  # tokens that are the tokenizer's unknown token (pieces it cannot spell, e.g. emoji)
    unk_token: str = ""  # how the tokenizer spells that token
    readable: list[str] = field(default_factory=list)  # the tokens as a student reads them ("Ġcat" -> "␣cat")
    windows: list[int | None] = field(default_factory=list)  # per layer: tokens seen on each side, None: all
    causal: bool = False  # the model reads left to right: a local layer's window reaches back only

    @property
    def labels(self) -> list[str]:
        """The tokens as drawn: readable (byte-level "Ġ" shown as "␣"), else as the tokenizer spells them."""
        return self.readable or self.tokens

    def window(self, layer: int) -> int | None:
        """How many tokens on each side a query of `layer` may read (a local layer's band); None: every token."""
        return self.windows[layer] if self.windows else None

    @property
    def num_layers(self) -> int:
        return self.patterns.shape[0]

    @property
    def num_heads(self) -> int:
        return self.patterns.shape[1]

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
    and `warning` says so. Raises InputError with a readable message for text it cannot read.
    """
    a = require_text(a if isinstance(a, str) else None)
    b = optional_text(b, "second sentence (B)")
    limit = model.config.max_position_embeddings - model.config.position_offset
    if max_length is not None and max_length < 3:
        raise ValueError(f"max_length must leave room for the special tokens ({tok.cls_token}, {tok.sep_token}): "
                         f"got {max_length}, use at least 3.")
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
            input_ids, token_type_ids=token_type_ids, names=model.family.layer_hook_names("hook_pattern"),
            mlm_positions=torch.zeros_like(input_ids, dtype=torch.bool) if model.has_mlm else None,  # not needed
        )
    patterns = cache.stack("hook_pattern")[:, 0]  # [layers, heads, query, key]
    b_start = enc.sequence_ids.index(1) if 1 in enc.sequence_ids else None
    return AttentionResult(
        tokens=list(enc.tokens),
        sentence_b_start=b_start,
        patterns=patterns.detach().to("cpu", torch.float32),
        warning=warning,
        text_a=a,
        text_b=b,
        num_unknown=sum(i == tok.unk_token_id for i in enc.ids),
        unk_token=tok.unk_token,
        readable=tok.readable_pieces(enc.tokens),
        windows=attention_windows(model),
        causal=bool(model.family.causal),
    )


def attention_module(model: torch.nn.Module, layer: int) -> nn.Module:
    """The module of layer `layer` that holds its hook_pattern (the attention itself)."""
    path = model.family.hook_name(layer, "hook_pattern").rsplit(".", 1)[0]
    return model.get_submodule(path)


def attention_windows(model: torch.nn.Module) -> list[int | None]:
    """Per layer, how many tokens on each side a query may read: a local layer's band (its attention
    module's `window`, e.g. ModernBERT's local_attention / 2), None for a layer that reads every token."""
    windows = [getattr(attention_module(model, i), "window", None) for i in range(model.family.num_layers)]
    return [None if w is None else int(w) for w in windows]
