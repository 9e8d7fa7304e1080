"""Next-token objectives on a BERT, the lectures' argument for masking:

- `causal` (GPT, Radford et al. 2018): every position predicts the token after it, reading only itself and the
  tokens to its left (a decoder: config.json's is_decoder, a causal mask in every layer).
- `peek`: the same next-token loss with BERT's full, two-way attention. Every position can read the very token
  it must predict: once the model finds that shortcut (copying its right neighbour), the loss falls to almost
  nothing and it learns no more language. Why BERT hides the words it predicts (masks) instead of reading both
  ways to predict the next one. How soon it finds the shortcut depends on the text and the budget: a short run
  on Wikipedia text may end before it does.

Both read whole sentences packed across documents ([CLS] ... [SEP], no masking, no pair task). Kept:
`BertLMHeadModel` (is_decoder true for causal; false for peek, which transformers then also runs both ways)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.tasks.batching import pad_inputs
from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives.base import ModelShape, Objective, new_family_model
from bertlab.training.objectives.bert import save_whole
from bertlab.training.objectives.roberta import full_sentences

ARCHITECTURE = "BertLMHeadModel"


@dataclass
class NextTokenBatch:
    """A padded batch of whole sentences; every tensor [batch, seq]. The targets are the inputs shifted left."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor  # 1 = token, 0 = padding


def next_token_collate(tokenizer: Tokenizer, seed: int = 0) -> Callable[[Sequence[Any]], NextTokenBatch]:
    """Batch maker for `{"input_ids": [...]}` examples: right-padded, nothing masked (the seed is unused)."""

    def collate(examples: Sequence[Any]) -> NextTokenBatch:
        ids, types, mask = pad_inputs([e["input_ids"] for e in examples], [None] * len(examples),
                                      tokenizer.pad_token_id)
        return NextTokenBatch(ids, types, mask)

    return collate


def next_token_targets(batch: NextTokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions that predict [batch, seq] bool: those whose next token is real, the tokens they predict [n],
    in row-major order)."""
    real_next = batch.attention_mask[:, 1:].bool()  # [batch, seq - 1]
    picked = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    picked[:, :-1] = real_next
    return picked, batch.input_ids[:, 1:][real_next]


def next_token_loss(model: nn.Module, batch: NextTokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of each position's LM logits against the token after it; its accuracy (top-1)."""
    picked, targets = next_token_targets(batch)
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked)
    loss = F.cross_entropy(out.mlm_logits.float(), targets)
    return loss, {"lm_loss": loss.detach(), "lm_acc": (out.mlm_logits.argmax(-1) == targets).float().mean()}


def build(decoder: bool) -> Callable[[ModelShape, Tokenizer], nn.Module]:
    """A new BertLMHeadModel at the shape: causal attention when `decoder`, BERT's two-way attention otherwise."""
    return lambda shape, tok: new_family_model("bert", ARCHITECTURE, shape, tok, is_decoder=decoder)


def _objective(name: str, title: str, decoder: bool, teaches: str, ended: str = "") -> Objective:
    return Objective(
        name=name, title=title, model_type="bert", hf_class=ARCHITECTURE, own_loss="lm_loss", build=build(decoder),
        examples=full_sentences, collate=next_token_collate, loss=next_token_loss, kept=lambda m: m,
        mlm_model=lambda m: None, save=save_whole, loss_name="next token",
        mlm_acc_key="",  # it guesses no masked words (the live curves show its next-token accuracy)
        continue_with=None, builds="a new BERT with a next-token head", teaches=teaches,
        ended=ended, lesson=dict(NEXT_TOKEN_LESSON),
    )


# Short sequences, a high learning rate: at size tiny on Wikipedia leads, peek finds its shortcut within a
# lesson (400 steps, about 5 minutes on 2 cores: next-token loss 3.4 and falling, causal 6.1), where at the
# tab's usual 64 tokens, lr 5e-4 and 200 steps its curve still followed causal's. Both take the same settings.
NEXT_TOKEN_LESSON = {"steps": 400, "batch_size": 32, "seq_len": 16, "lr": 3e-3}


CAUSAL = _objective(
    "causal", "Causal LM (GPT): predict the next token, reading only the tokens to its left", True,
    "A left-to-right language model as GPT trains: each position predicts the next token from the tokens "
    "before it alone (a causal mask hides everything to its right).")
PEEK = _objective(
    "peek", "Peek: predict the next token with BERT's full attention (it can see the answer)", False,
    "Next-token prediction with attention both ways: every position can read the token it must predict. Once the "
    "model finds that shortcut (copying its right neighbour), its loss falls to almost nothing and it learns no "
    "more about language: this is why BERT masks the words it predicts.",
    "Peek can read the very token it has to predict. A model that finds this shortcut copies its right "
    "neighbour: its loss falls to almost nothing, and its attention (pick the model, open the Attention tab) "
    "looks one position ahead. If its curve still follows a causal run's, it has not found the shortcut yet: give "
    "it more steps. A model that reads both ways learns nothing from predicting words it can see: this is why "
    "BERT masks them.")
OBJECTIVE = CAUSAL  # the module's objective, as in every objective module; PEEK is its foil

__all__ = ["CAUSAL", "OBJECTIVE", "PEEK", "NextTokenBatch", "next_token_collate", "next_token_loss",
           "next_token_targets"]
