"""ELECTRA's discriminator on a text: for each token, the probability that it was replaced
(the replaced-token-detection head, `ModelOutput.rtd_logits`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.inputs import require_text
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tokenizer import Tokenizer


@dataclass
class ReplacedTokens:
    """P(replaced) for every token the model read; special tokens are left out of `words`."""

    tokens: list[str]  # as the model reads them, specials included
    p_replaced: list[float]  # [seq] sigmoid of the discriminator's logit
    special: list[bool]  # [seq] True for the tokenizer's special tokens ([CLS], </s>, ...)
    words: list[tuple[str, float]]  # (word as typed, max P(replaced) over its pieces), in order
    warning: str | None = None  # set when the text was cut to fit the model

    @property
    def flagged(self) -> list[str]:
        """Words the discriminator thinks were replaced (P > 0.5)."""
        return [w for w, p in self.words if p > 0.5]


def replaced_tokens(model: torch.nn.Module, tok: Tokenizer, text: str) -> ReplacedTokens:
    """Run the discriminator on `text` and say, per token and per word, how likely each was replaced.
    Raises MissingHeadError without a replaced-token-detection head, InputError for empty text."""
    model.require("rtd")
    text = require_text(text)
    enc = tok.encode(text, max_length=input_limit(model, tok))
    device = model_device(model)
    ids = torch.tensor([enc.ids], device=device)  # [1, seq]
    with eval_mode(model), torch.inference_mode():
        logits = model(ids, torch.zeros_like(ids), torch.ones_like(ids)).rtd_logits[0]  # [seq]
    p = torch.sigmoid(logits.float()).cpu().tolist()
    special = [bool(m) for m in enc.special_tokens_mask]
    words: list[tuple[str, float]] = []
    for _, first, end in enc.word_spans():
        start, stop = enc.offsets[first][0], enc.offsets[end - 1][1]
        words.append((text[start:stop], max(p[first:end])))
    return ReplacedTokens(list(enc.tokens), p, special, words, enc.warning)
