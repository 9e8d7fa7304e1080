"""The neuron view of one head (bertviz's): the query vector of a chosen token, the key vector of every
token, their elementwise product, and the score it sums to (÷ √d_head) with the softmax weight it gives.

q and k are read at the family's own hook points, as the scores use them: `hook_rot_q` / `hook_rot_k` where the
family rotates them (rotary positions), else `hook_q` / `hook_k`; the weights are the softmax of the model's own
scores (`hook_scores`, with its attention mask: a local band, padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.analysis.similarity import encode_input
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

MAX_TOKENS = 48  # one row per token: beyond this a row is thinner than its label and the view unreadable


@dataclass
class NeuronView:
    """One head's q·k for one query token against every key token."""

    tokens: list[str]
    layer: int
    head: int
    query: int  # token index of the chosen token
    q: torch.Tensor  # [d_head] the query vector of the chosen token
    k: torch.Tensor  # [seq, d_head] every token's key vector
    product: torch.Tensor  # [seq, d_head] q * k elementwise
    scores: torch.Tensor  # [seq] product summed ÷ √d_head (before the softmax)
    weights: torch.Tensor  # [seq] the head's attention from the chosen token (softmax of the model's scores)
    model_scores: torch.Tensor  # [seq] the model's own scores at hook_scores (a check)
    warning: str | None = None


def neuron_view(model: Bert, tok: Tokenizer, text: str, layer: int, head: int, query: int,
                text_b: str | None = None) -> NeuronView:
    """q, k, q∘k and the scores of head `head` in layer `layer` for token `query` of the text; InputError for
    an empty text or one over MAX_TOKENS tokens."""
    fam = model.family
    names = [_qk_hook(fam, layer, s) for s in ("q", "k")] + [fam.hook_name(layer, "hook_scores")]
    heads = model.config.num_attention_heads
    if not 0 <= head < heads:
        raise IndexError(f"head {head} does not exist: each layer has heads 0..{heads - 1}.")
    enc = encode_input(model, tok, text, text_b)
    if len(enc) > MAX_TOKENS:
        raise InputError(f"The neuron view shows up to {MAX_TOKENS} tokens, one row each; this text has "
                         f"{len(enc) + enc.num_truncated}: shorten it.")
    if not 0 <= query < len(enc):
        raise IndexError(f"token {query} does not exist: the text has tokens 0..{len(enc) - 1}.")
    ids = torch.tensor([enc.ids], device=model_device(model))
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(ids, token_type_ids=torch.tensor([enc.type_ids], device=ids.device),
                                        mlm_positions=torch.zeros_like(ids, dtype=torch.bool) if model.has_mlm
                                        else None, names=names)
    q = cache[names[0]][0, query, head].float().cpu()  # [d_head]
    k = cache[names[1]][0, :, head].float().cpu()  # [seq, d_head]
    product = q[None] * k
    scores = product.sum(-1) / q.shape[0] ** 0.5
    model_scores = cache[names[2]][0, head, query].float().cpu()
    return NeuronView(list(enc.tokens), layer, head, query, q, k, product, scores, model_scores.softmax(-1),
                      model_scores, enc.warning)


def _qk_hook(fam, layer: int, which: str) -> str:
    """The hook of the q (or k) the scores multiply: the rotated one where the family has it."""
    try:
        return fam.hook_name(layer, f"hook_rot_{which}")
    except KeyError:
        return fam.hook_name(layer, f"hook_{which}")  # IndexError names the layers
