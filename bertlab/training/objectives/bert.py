"""BERT (Devlin et al. 2018): MLM (15 % of the tokens, 80/10/10) + next-sentence prediction on
`[CLS] A [SEP] B [SEP]` pairs packed from documents (see bertlab.training.pairs). Kept: the whole
model, `BertForPreTraining`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.masking import MLMBatch
from bertlab.training.objectives.base import ModelShape, Objective, collator, mlm_forward, new_family_model
from bertlab.training.pairs import build_pairs


def sentence_pair_loss(model: nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MLM + the pair head's cross-entropy (NSP for BERT, SOP for ALBERT: both come back as `nsp_logits`)."""
    loss, metrics, out = mlm_forward(model, batch)
    pair = F.cross_entropy(out.nsp_logits.float(), batch.next_sentence_label)
    metrics["pair_loss"] = pair.detach()
    metrics["pair_acc"] = (out.nsp_logits.argmax(-1) == batch.next_sentence_label).float().mean()
    return loss + pair, metrics


def pair_examples(task: str) -> Any:
    def make(documents: Sequence[Any], tokenizer: Tokenizer, seq_len: int, seed: int) -> list[Any]:
        return build_pairs(documents, tokenizer, task=task, max_seq_length=seq_len, seed=seed)
    return make


def save_whole(model: nn.Module, tokenizer: Tokenizer, folder: Path) -> Path:
    return save_model_atomically(model, tokenizer, folder)


OBJECTIVE = Objective(
    name="bert",
    title="BERT: MLM (15 %, 80/10/10) + next-sentence prediction",
    teaches=("Masked-word prediction: 15 % of the tokens are hidden and guessed from both sides, plus a guess "
             "whether sentence B follows sentence A."),
    model_type="bert",
    hf_class="BertForPreTraining",
    own_loss="loss",
    build=lambda shape, tok: new_family_model("bert", "BertForPreTraining", shape, tok),
    examples=pair_examples("nsp"),
    collate=lambda tok, seed: collator(tok, seed),
    loss=sentence_pair_loss,
    kept=lambda m: m,
    mlm_model=lambda m: m,
    save=save_whole,
    pair_task="nsp",
    loss_name="MLM + NSP",
)

__all__ = ["OBJECTIVE", "ModelShape", "pair_examples", "save_whole", "sentence_pair_loss"]
