"""Tiny models shared by the fine-tuning tests (an import, not a fixture: helpers call it too)."""

from __future__ import annotations

import torch

from bertlab.config import BertConfig
from bertlab.model import Bert
from bertlab.tokenizer import Tokenizer


def tiny_bert(tok: Tokenizer, seed: int = 0) -> Bert:
    """An encoder-only BERT of 2 layers, 32 wide, no dropout, with the tokenizer's vocabulary."""
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return Bert(cfg)
