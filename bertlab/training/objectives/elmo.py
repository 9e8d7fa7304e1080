"""ELMo (Peters et al. 2018), with one-way Transformers in place of the paper's LSTMs: a forward language model
reads left to right and predicts the next token, a backward one reads right to left and predicts the previous
token; they train together (loss = the mean of the two) and a token's feature is the two states side by side.
"Shallow" bidirectionality: neither direction sees the other inside its model, only the concatenation does.

Each direction is a causal BERT (`BertLMHeadModel`, is_decoder) of the run's size, with its own weights (the
paper ties the token embedding and the softmax across directions; here nothing is shared, so each folder stands
alone). The backward model is the same kind of model fed each row reversed: `[SEP] t_n … t_1 [CLS]`, padding
left on the right, so "next" for it is "previous" in the sentence.

Saved: the forward model in the run's folder (transformers' BertLMHeadModel reads it; the picker takes it), the
backward one in `backward/` (the same class), and `elmo.json` saying how to combine them:

    fwd, bwd, tok = load_elmo(folder)
    feats = elmo_features(fwd, bwd, ids, mask)            # [batch, seq, 2 * hidden]
    logp = middle_word_log_probs(fwd, bwd, ids, mask)     # [batch, seq, vocab]: token i from both sides
    guess_middle_word(fwd, bwd, tok, "the cat sat on the mat.", 2)  # [(token, probability), ...] best first
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.objectives.base import ModelShape, Objective, ObjectiveError, new_family_model
from bertlab.training.objectives.causal import (
    ARCHITECTURE,
    NEXT_TOKEN_LESSON,
    NextTokenBatch,
    next_token_collate,
    next_token_loss,
)
from bertlab.training.objectives.roberta import full_sentences

BACKWARD_FOLDER = "backward"
ELMO_FILE = "elmo.json"


class ElmoPair(nn.Module):
    """A forward and a backward causal BERT trained together; `forward(batch)` -> (mean loss, metrics)."""

    def __init__(self, forward_lm: nn.Module, backward_lm: nn.Module) -> None:
        super().__init__()
        for name, lm in (("forward", forward_lm), ("backward", backward_lm)):
            if not getattr(lm.config, "is_decoder", False):
                raise ObjectiveError(f"ELMo's {name} model must read one way (a BertLMHeadModel with is_decoder); "
                                     "this one reads both ways and would see the tokens it predicts.")
        self.forward_lm, self.backward_lm = forward_lm, backward_lm

    def forward(self, batch: NextTokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        fwd_loss, fwd = next_token_loss(self.forward_lm, batch)
        bwd_loss, bwd = next_token_loss(self.backward_lm, reversed_batch(batch))
        loss = (fwd_loss + bwd_loss) / 2
        return loss, {"lm_loss": loss.detach(), "lm_acc": (fwd["lm_acc"] + bwd["lm_acc"]) / 2,
                      "forward_loss": fwd["lm_loss"], "backward_loss": bwd["lm_loss"],
                      "forward_acc": fwd["lm_acc"], "backward_acc": bwd["lm_acc"]}


# ---------------------------------------------------------------------------------------------
# Reading right to left
# ---------------------------------------------------------------------------------------------
def _check_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The attention mask [batch, seq] (all ones when None), checked: same shape, padding on the right only."""
    if input_ids.dim() != 2:
        raise ObjectiveError(f"ELMo reads a batch of token ids [batch, seq]; got a tensor of shape "
                             f"{tuple(input_ids.shape)}.")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ObjectiveError(f"the attention mask {tuple(attention_mask.shape)} must have the token ids' shape "
                             f"{tuple(input_ids.shape)}.")
    mask = attention_mask.bool()
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ObjectiveError("ELMo's backward model reads each row reversed, so the padding must be on the right "
                             "(1 1 … 1 0 … 0 in the attention mask); this batch has padding before a token.")
    return attention_mask


def reverse_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, seq] positions that reverse each row's real tokens and leave its padding where it is: j -> L-1-j
    for j < L (the row's length), j -> j after. It is its own inverse."""
    seq = attention_mask.shape[1]
    j = torch.arange(seq, device=attention_mask.device).expand_as(attention_mask)  # [batch, seq]
    length = attention_mask.long().sum(1, keepdim=True)  # [batch, 1]
    return torch.where(j < length, length - 1 - j, j)


def reverse_rows(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`x` [batch, seq, ...] with each row's real positions in reverse order (padding stays on the right)."""
    index = reverse_index(attention_mask)
    if x.dim() > 2:
        index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


def reversed_batch(batch: NextTokenBatch) -> NextTokenBatch:
    """The batch as the backward model reads it: each row's tokens right to left."""
    mask = batch.attention_mask
    return NextTokenBatch(reverse_rows(batch.input_ids, mask), reverse_rows(batch.token_type_ids, mask), mask)


# ---------------------------------------------------------------------------------------------
# Using the two: features and the middle word
# ---------------------------------------------------------------------------------------------
def _both(forward_lm: nn.Module, backward_lm: nn.Module, input_ids: torch.Tensor,
          attention_mask: torch.Tensor | None, logits: bool) -> tuple[Any, Any, torch.Tensor]:
    mask = _check_rows(input_ids, attention_mask)
    none = None if logits else torch.zeros_like(mask, dtype=torch.bool)  # no LM head when only states are read
    fwd = forward_lm(input_ids, None, mask, mlm_positions=none)
    bwd = backward_lm(reverse_rows(input_ids, mask), None, mask, mlm_positions=none)
    return fwd, bwd, mask


def elmo_features(forward_lm: nn.Module, backward_lm: nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's ELMo feature [batch, seq, 2 * hidden]: the forward model's last hidden state at i (it has read
    tokens 0..i) then the backward model's at i (it has read tokens i..L-1). Padding rows are whatever the models
    give there."""
    fwd, bwd, mask = _both(forward_lm, backward_lm, input_ids, attention_mask, logits=False)
    backward_at_i = reverse_rows(bwd.last_hidden_state, mask)  # back in the sentence's order
    return torch.cat([fwd.last_hidden_state, backward_at_i], dim=-1)


def middle_word_log_probs(forward_lm: nn.Module, backward_lm: nn.Module, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log P(token i | the rest) [batch, seq, vocab] as a product of experts: the forward model at i-1 (tokens
    left of i) times the backward model at i+1 (tokens right of i), renormalised. Neither reads token i. The
    first and last real positions have one side only; padding rows are meaningless."""
    fwd, bwd, mask = _both(forward_lm, backward_lm, input_ids, attention_mask, logits=True)
    left = fwd.mlm_logits.float().log_softmax(-1)  # [batch, seq, vocab]: at j, token j+1 from tokens <= j
    right = reverse_rows(bwd.mlm_logits.float().log_softmax(-1), mask)  # at j, token j-1 from tokens >= j
    combined = torch.zeros_like(left)
    combined[:, 1:] += left[:, :-1]  # token i from the left: the forward model at i-1
    has_right = (torch.arange(mask.shape[1], device=mask.device) + 1 < mask.long().sum(1, keepdim=True))
    combined[:, :-1] += right[:, 1:] * has_right[:, :-1, None]  # from the right: the backward model at i+1
    return combined.log_softmax(-1)


@torch.inference_mode()
def guess_middle_word(forward_lm: nn.Module, backward_lm: nn.Module, tokenizer: Tokenizer, text: str, index: int,
                      k: int = 5) -> list[tuple[str, float]]:
    """The `k` likeliest tokens at position `index` of `text` as encoded (the first token is 0), guessed from the
    tokens on both sides of it (`middle_word_log_probs`), with their probabilities, best first."""
    enc = tokenizer.encode_batch([text])
    n = int(enc.attention_mask[0].sum())
    if not 1 <= index <= n - 2:
        raise ObjectiveError(f"position {index} has no token on both sides: {text[:40]!r} encodes to {n} tokens, "
                             f"so pick a position from 1 to {n - 2}.")
    if k < 1:
        raise ObjectiveError(f"k must be at least 1; got {k}.")
    was = forward_lm.training, backward_lm.training
    forward_lm.eval(), backward_lm.eval()
    device = next(forward_lm.parameters()).device
    try:
        logp = middle_word_log_probs(forward_lm, backward_lm, enc.input_ids.to(device),
                                     enc.attention_mask.to(device))[0, index]  # [vocab]
    finally:
        forward_lm.train(was[0]), backward_lm.train(was[1])
    best = logp.topk(min(k, logp.numel()))
    return [(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(best.values.exp(), best.indices)]


# ---------------------------------------------------------------------------------------------
# Building, saving, loading
# ---------------------------------------------------------------------------------------------
def build(shape: ModelShape, tokenizer: Tokenizer) -> ElmoPair:
    """Two causal BERTs of the run's shape, with their own weights."""
    make = lambda: new_family_model("bert", ARCHITECTURE, shape, tokenizer, is_decoder=True)  # noqa: E731
    return ElmoPair(make(), make())


def elmo_loss(model: nn.Module, batch: NextTokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return model(batch)


def save(pair: nn.Module, tokenizer: Tokenizer, folder: Path) -> Path:
    """The forward model in `folder`, the backward one in `folder/backward`, how to combine them in elmo.json."""
    folder = save_model_atomically(pair.forward_lm, tokenizer, folder)
    save_model_atomically(pair.backward_lm, tokenizer, Path(folder) / BACKWARD_FOLDER)
    note = {
        "kind": "elmo", "forward": ".", "backward": BACKWARD_FOLDER, "class": ARCHITECTURE,
        "backward_reads": "each row reversed: its real tokens right to left (the closing separator first), "
                          "padding on the right",
        "feature": "concat(forward last hidden state at i, backward last hidden state at i, in the row's order)",
        "middle_word": ("token i: log_softmax(log_softmax(forward logits at i-1) + log_softmax(backward logits at "
                        "i+1)), a product of experts"),
        "code": "bertlab.training.objectives.elmo: load_elmo, elmo_features, middle_word_log_probs",
    }
    (Path(folder) / ELMO_FILE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
    return folder


def load_elmo(folder: str | Path) -> tuple[nn.Module, nn.Module, Tokenizer]:
    """(forward model, backward model, tokenizer) from a folder the elmo objective saved, in eval mode."""
    from bertlab.loading import load

    folder = Path(folder)
    if not (folder / ELMO_FILE).is_file() or not (folder / BACKWARD_FOLDER / "config.json").is_file():
        raise ObjectiveError(f"{folder.name or folder} is not an ELMo run's folder: it needs {ELMO_FILE} and a "
                             f"{BACKWARD_FOLDER}/ model beside the forward one (pre-train with the elmo objective).")
    forward_lm, tok = load(str(folder))
    backward_lm, _ = load(str(folder / BACKWARD_FOLDER))
    return forward_lm.eval(), backward_lm.eval(), tok


OBJECTIVE = Objective(
    name="elmo",
    title="ELMo: a forward and a backward one-way Transformer, their states side by side",
    teaches=("Two one-way language models trained together, one predicting the next token from the left, one the "
             "previous token from the right (one-way Transformers here; ELMo used LSTMs). A word's feature puts "
             "the two states side by side, but neither model sees the other side: only shallowly bidirectional."),
    model_type="bert",
    hf_class=ARCHITECTURE,
    own_loss="lm_loss",
    build=build,
    examples=full_sentences,
    collate=next_token_collate,
    loss=elmo_loss,
    kept=lambda pair: pair.forward_lm,
    mlm_model=lambda pair: None,
    save=save,
    loss_name="next + previous token",
    mlm_acc_key="",  # it guesses no masked words (the curves show the two directions' mean accuracy)
    continue_with=None,
    builds="a forward and a backward causal BERT",
    lesson=dict(NEXT_TOKEN_LESSON),  # the same run as causal's and peek's, to put the three side by side
    ended=("The forward model joined the picker (it reads left to right). The backward one is saved beside it, in "
           "the run folder's backward/: it reads each sentence reversed. A word's ELMo feature is the two states "
           "side by side (bertlab.training.objectives.elmo.elmo_features)."),
)

__all__ = ["BACKWARD_FOLDER", "ELMO_FILE", "OBJECTIVE", "ElmoPair", "elmo_features", "guess_middle_word", "load_elmo",
           "middle_word_log_probs", "reverse_index", "reverse_rows", "reversed_batch"]
