"""RoBERTa (Liu et al. 2019): MLM only (no NSP), a new mask each time an example comes round
(dynamic masking: the loop hands the collator a generator fixed by epoch and step), inputs packed
with whole sentences that run on across document boundaries after an extra separator
(FULL-SENTENCES). Kept: `RobertaForMaskedLM`.

bertlab's RoBERTa here reads the same WordPiece vocabulary as the other objectives (so the comparison
changes the objective only), not RoBERTa's byte-level BPE."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.masking import MLMBatch
from bertlab.training.objectives.base import Objective, collator, mlm_forward, new_family_model, packed_examples
from bertlab.training.objectives.bert import save_whole


def mlm_only_loss(model: nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss, metrics, _ = mlm_forward(model, batch)
    return loss, metrics


def full_sentences(documents: Sequence[Any], tokenizer: Tokenizer, seq_len: int, seed: int) -> list[Any]:
    """FULL-SENTENCES packing in corpus order (the loop shuffles the examples)."""
    return packed_examples(documents, tokenizer, seq_len, cross_documents=True)


OBJECTIVE = Objective(
    name="roberta",
    title="RoBERTa: dynamic MLM, no NSP, full sentences packed across documents",
    teaches=("The same masked words without the next-sentence task, a new mask every time a text comes round and "
             "longer packed inputs: RoBERTa's finding that these choices matter more than NSP."),
    model_type="roberta",
    hf_class="RobertaForMaskedLM",
    own_loss="mlm_loss",
    build=lambda shape, tok: new_family_model("roberta", "RobertaForMaskedLM", shape, tok),
    examples=full_sentences,
    collate=lambda tok, seed: collator(tok, seed),
    loss=mlm_only_loss,
    kept=lambda m: m,
    mlm_model=lambda m: m,
    save=save_whole,
)
