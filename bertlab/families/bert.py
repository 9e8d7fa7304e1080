"""BERT (also SpanBERT, whole-word-masking and multilingual BERTs): its facts for the registry and its whole
model, `Bert`, built from the reference modules of `bertlab.model` (HF's names: `bert.*`, `cls.*`)."""

from __future__ import annotations

import torch

from bertlab import fast
from bertlab.config import ARCHITECTURES, BertConfig, ConfigError
from bertlab.families.core import Family, FamilyModel
from bertlab.model import BertModel, BertPreTrainingHeads, ModelOutput, add_task_heads, task_logits


def check_bert_config(d: dict) -> None:
    """Refuse a BERT config.json that asks for what BERT does not have (an embedding projection)."""
    width, hidden = d.get("embedding_size"), d.get("hidden_size")
    if width is not None and width != hidden:
        raise ConfigError(f"embedding_size {width} differs from hidden_size {hidden}: BERT has no embedding "
                          f"projection (ALBERT and ELECTRA do: set model_type to one of them).")


class Bert(FamilyModel):
    """A BERT encoder with whichever heads its config names; HF weight names throughout."""

    def __init__(self, config: BertConfig):
        if config.embedding_size not in (None, config.hidden_size):
            raise ConfigError(
                f"embedding_size {config.embedding_size} differs from hidden_size {config.hidden_size}: BERT has no "
                f"embedding projection (ALBERT and ELECTRA do: set model_type to one of them)."
            )
        needs_pooler = "nsp" in config.pretraining_heads or config.task == "sequence_classification"
        if needs_pooler and not config.add_pooler:
            config = config.replace(add_pooler=True)
        super().__init__(config)
        if config.task in ("sequence_classification", "token_classification") and config.num_labels < 1:
            raise ValueError(f"a {config.task} head needs labels: set config.id2label.")
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config) if config.pretraining_heads else None
        add_task_heads(self, config)
        self.finish()
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.has_mlm and self.cls.predictions.tied:
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    # -- forward ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq]
        token_type_ids: torch.Tensor | None = None,  # [batch, seq]
        attention_mask: torch.Tensor | None = None,  # [batch, seq] 1 = token, 0 = padding
        head_mask: torch.Tensor | None = None,  # [layer, head] 1 = on, 0 = off
        mlm_positions: torch.Tensor | None = None,  # [batch, seq] bool: run the MLM head only there
        all_positions: bool = True,  # False: the last layer may compute only the rows the heads read
    ) -> ModelOutput:
        """With all_positions=False, the last layer's attention and feed-forward run only for the positions
        the heads read, unless a hook watches that layer: [CLS] for a model whose heads read it alone (a
        sentence classifier, NSP; no MLM), [CLS] and `mlm_positions` for a pre-training model (MLM, + NSP).
        `last_hidden_state` is then [batch, n, d_model] (those rows, [CLS] first); the logits are the same."""
        self.check_input(input_ids, token_type_ids)
        rows, mlm_rows = self._asked_rows(input_ids, mlm_positions) if not all_positions else (None, None)
        seq_out, pooled = self.bert(input_ids, token_type_ids, attention_mask, head_mask, rows)
        out = ModelOutput(last_hidden_state=seq_out, pooler_output=pooled)
        if self.has_mlm:
            picked = mlm_positions if mlm_rows is None else mlm_rows
            out.mlm_logits = self.mlm_head(seq_out if picked is None else seq_out[picked])
        if self.has_nsp:
            out.nsp_logits = self.cls.seq_relationship(pooled)
        task_logits(out, self, seq_out, pooled)
        return out

    def _asked_rows(self, input_ids: torch.Tensor, mlm_positions: torch.Tensor | None
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`bertlab.fast.asked_rows` for this model's heads; (None, None) when a hook watches the last layer."""
        if not len(self.bert.encoder.layer) or self.bert.encoder.last_layer_watched() or self.config.is_decoder:
            return None, None  # a decoder's rows read different keys each: the reference path
        return fast.asked_rows(input_ids, mlm_positions, reads_first_only=self.reads_first_only(),
                               reads_mlm_only=self.has_mlm and self.config.task is None)

    def reads_first_only(self) -> bool:
        """True when every head this model has reads position 0 alone (sequence classification, NSP)."""
        return not self.has_mlm and self.config.task in ("sequence_classification", None) and (
            self.config.task is not None or self.has_nsp)

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        return self.cls.predictions(states)

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
    architectures={**ARCHITECTURES, "BertLMHeadModel": (("mlm",), None)},  # the LM head: the next token
    decoder_architecture="BertLMHeadModel",
    hook_paths=bert_layer_hook_paths("bert"),
    head_keys={"mlm": "cls.predictions.transform.dense.weight", "nsp": "cls.seq_relationship.weight"},
    pooler_key="bert.pooler.dense.weight",
    check=check_bert_config,
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
