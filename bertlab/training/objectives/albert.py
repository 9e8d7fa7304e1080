"""ALBERT (Lan et al. 2019): a factorised embedding (`embedding_size` < hidden, projected up) and
one layer's weights shared across depth (`shared_layers`), trained with MLM + sentence-order
prediction (SOP: two consecutive segments, swapped half of the time). Kept: `AlbertForPreTraining`."""

from __future__ import annotations

from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives.base import ModelShape, Objective, collator, new_family_model
from bertlab.training.objectives.bert import pair_examples, save_whole, sentence_pair_loss


def build(shape: ModelShape, tokenizer: Tokenizer) -> nn.Module:
    """ALBERT's defaults when the size options are left out: embedding 128 (at most half the width),
    every layer shared."""
    if shape.embedding_size is None:
        shape = ModelShape(shape.layers, shape.hidden, shape.heads, min(128, shape.hidden // 2),
                           shape.shared_layers, shape.max_len)
    return new_family_model("albert", "AlbertForPreTraining", shape, tokenizer, hidden_act="gelu_new")


OBJECTIVE = Objective(
    name="albert",
    title="ALBERT: factorised embedding, shared layers, MLM + sentence-order prediction",
    teaches=("Fewer parameters for the same depth (one layer shared by every depth, a narrow embedding), and "
             "sentence order instead of next-sentence prediction."),
    model_type="albert",
    hf_class="AlbertForPreTraining",
    own_loss="loss",
    build=build,
    examples=pair_examples("sop"),
    collate=lambda tok, seed: collator(tok, seed),
    loss=sentence_pair_loss,
    kept=lambda m: m,
    mlm_model=lambda m: m,
    save=save_whole,
    size_options=("embedding_size", "shared_layers"),
    pair_task="sop",
    loss_name="MLM + SOP",
)
