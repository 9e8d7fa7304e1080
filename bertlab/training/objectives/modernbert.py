"""ModernBERT (Warner et al. 2024): MLM only, no NSP, 30 % of the pieces chosen for prediction (not
BERT's 15 %; 80/10/10 as BERT), a new mask each time an example comes round, whole sentences packed
across document boundaries. Kept: `ModernBertForMaskedLM` (rotary positions, alternating local and
global attention, GeGLU, pre-norm: `bertlab.families.modernbert`).

As with the other objectives here, the model reads the lab's WordPiece vocabulary (so that the
comparison changes the objective and the architecture, not the tokenizer), not ModernBERT's BPE."""

from __future__ import annotations

from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives.base import ModelShape, Objective, collator, new_family_model
from bertlab.training.objectives.bert import save_whole
from bertlab.training.objectives.roberta import full_sentences, mlm_only_loss

MLM_PROBABILITY = 0.30  # ModernBERT's masking rate
# Of ModernBERT's config: its MLP as wide as ModernBERT-base's (1152 / 768, GeGLU), a local window of
# 128 tokens, every third layer global (layer 0 first).
MLP_RATIO = 1.5
LOCAL_ATTENTION = 128
GLOBAL_EVERY = 3


def build(shape: ModelShape, tok: Tokenizer):
    """A new ModernBertForMaskedLM at `shape`, its special-token ids the tokenizer's."""
    ids = {"cls_token_id": tok.cls_token_id, "sep_token_id": tok.sep_token_id, "bos_token_id": tok.cls_token_id,
           "eos_token_id": tok.sep_token_id}
    return new_family_model("modernbert", "ModernBertForMaskedLM", shape, tok, **ids,
                            intermediate_size=int(MLP_RATIO * shape.hidden), local_attention=LOCAL_ATTENTION,
                            global_attn_every_n_layers=GLOBAL_EVERY)


OBJECTIVE = Objective(
    name="modernbert",
    title="ModernBERT: MLM at 30 %, no NSP, full sentences; rotary, local/global attention, GeGLU",
    teaches=("A modern encoder: more masking (30 %), rotary positions, local and global attention layers."),
    model_type="modernbert",
    hf_class="ModernBertForMaskedLM",
    own_loss="mlm_loss",
    build=build,
    examples=full_sentences,
    collate=lambda tok, seed: collator(tok, seed, mlm_probability=MLM_PROBABILITY),
    loss=mlm_only_loss,
    kept=lambda m: m,
    mlm_model=lambda m: m,
    save=save_whole,
)
