"""BERT (also SpanBERT, whole-word-masking and multilingual BERTs): the model is `bertlab.model.Bert`;
this module says what the registry needs to know about it."""

from __future__ import annotations

from bertlab.config import ARCHITECTURES
from bertlab.families.core import Family
from bertlab.model import Bert

# Config fields shared by BERT, RoBERTa and ELECTRA (HF name = spec name).
BERT_FIELDS = {name: name for name in (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "layer_norm_eps", "pad_token_id", "initializer_range",
)}
BERT_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0, "type_vocab_size": 2}
WORDPIECE_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"}


def bert_layer_hook_paths(prefix: str) -> dict[str, str]:
    """Where each hook point of layer {i} sits in the BERT layer (bertlab.model.BertLayer)."""
    layer = f"{prefix}.encoder.layer.{{i}}."
    where = {"attention.self.": ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z"),
             "attention.output.": ("hook_result", "hook_attn_out"), "intermediate.": ("hook_post",),
             "output.": ("hook_mlp_out",), "": ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")}
    return {short: layer + sub for sub, shorts in where.items() for short in shorts}


FAMILY = Family(
    name="bert",
    prefix="bert",
    model_class=Bert,
    fields=BERT_FIELDS,
    defaults=BERT_DEFAULTS,
    architectures=dict(ARCHITECTURES),
    hook_paths=bert_layer_hook_paths("bert"),
    head_keys={"mlm": "cls.predictions.transform.dense.weight", "nsp": "cls.seq_relationship.weight"},
    pooler_key="bert.pooler.dense.weight",
    tokenizer_kind="wordpiece",
    special_tokens=WORDPIECE_SPECIALS,
    base_keys=("embeddings.", "encoder.", "pooler."),
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    title="BERT",
    objective="MLM + NSP",
    objective_about="15% of pieces hidden (static: masked once, before training), plus next-sentence prediction: "
                    "does B follow A, or is it a random sentence?",
    objective_demo="pair",
)
Bert.FAMILY = FAMILY
