"""ELECTRA: BERT's layer under `electra.`, factorised embeddings (`electra.embeddings_project`),
no pooler. The discriminator (ElectraForPreTraining) scores each token "replaced?" into
`rtd_logits`; the generator (ElectraForMaskedLM) is a small MLM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig
from bertlab.families.bert import BERT_DEFAULTS, BERT_FIELDS, WORDPIECE_SPECIALS, bert_layer_hook_paths
from bertlab.families.core import Family, FamilyModel
from bertlab.model import BertModel, ModelOutput, activation, add_task_heads, decoder_is_tied, task_logits


class ElectraDiscriminatorPredictions(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense_prediction = nn.Linear(cfg.hidden_size, 1)
        self.act = activation(cfg.hidden_act)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(seq))).squeeze(-1)  # [batch, seq]


class ElectraGeneratorPredictions(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.LayerNorm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dense = nn.Linear(cfg.hidden_size, width)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(seq)))  # [..., embedding_size]


class Electra(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config.replace(add_pooler=False))
        config = self.config
        self.electra = BertModel(config)
        heads = config.pretraining_heads
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config) if "rtd" in heads else None
        if "mlm" in heads:
            self.generator_predictions = ElectraGeneratorPredictions(config)
            # tied: only the bias is stored (the weight is the word embeddings); untied, a Linear of its own
            width = config.embedding_size or config.hidden_size
            self.generator_lm_head = (_BiasOnly(config.vocab_size) if decoder_is_tied(config)
                                      else nn.Linear(width, config.vocab_size))
        else:
            self.generator_predictions = None
        add_task_heads(self, config, sentence_act=F.gelu)
        self.finish()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """all_positions is the protocol's "the heads read only some rows" (`Bert.forward`): ELECTRA computes every
        row."""
        self.check_input(input_ids, token_type_ids)
        seq, pooled = self.electra(input_ids, token_type_ids, attention_mask, head_mask)  # no pooler: None
        out = ModelOutput(last_hidden_state=seq)
        if self.discriminator_predictions is not None:
            out.rtd_logits = self.discriminator_predictions(seq)
        if self.generator_predictions is not None:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        task_logits(out, self, seq, pooled)
        return out

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        h = self.generator_predictions(states)
        if isinstance(self.generator_lm_head, nn.Linear):
            return self.generator_lm_head(h)
        return F.linear(h, self.electra.embeddings.word_embeddings.weight, self.generator_lm_head.bias)


class _BiasOnly(nn.Module):
    """`generator_lm_head`: HF's Linear whose weight is tied to the word embeddings; only `.bias` is stored."""

    def __init__(self, n: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))


def _embedding_size(d: dict, kwargs: dict) -> None:
    kwargs["embedding_size"] = int(d.get("embedding_size", kwargs.get("hidden_size", 768)))


FAMILY = Family(
    name="electra",
    prefix="electra",
    model_class=Electra,
    fields=BERT_FIELDS,
    defaults=BERT_DEFAULTS,
    architectures={
        "ElectraModel": ((), None),
        "ElectraForPreTraining": (("rtd",), None),  # the discriminator
        "ElectraForMaskedLM": (("mlm",), None),  # the generator
        "ElectraForSequenceClassification": ((), "sequence_classification"),
        "ElectraForTokenClassification": ((), "token_classification"),
        "ElectraForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths=bert_layer_hook_paths("electra"),
    head_keys={"rtd": "discriminator_predictions.dense.weight", "mlm": "generator_predictions.dense.weight"},
    pooler_key=None,
    tokenizer_kind="wordpiece",
    special_tokens=WORDPIECE_SPECIALS,
    base_keys=("embeddings.", "embeddings_project.", "encoder."),
    head_prefixes=("discriminator_predictions.", "generator_predictions.", "generator_lm_head."),
    tied={"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"},
    title="ELECTRA",
    spec_hook=_embedding_size,
    objective="replaced-token detection",
    objective_about="a small generator fills masked pieces; the discriminator, the model kept, says for every "
                    "piece whether it was replaced",
    objective_demo="rtd",
    mlm_role="generator",
)
Electra.FAMILY = FAMILY
