"""RoBERTa: BERT's layer (bertlab.model.BertLayer) under `roberta.`, positions counted from
padding_idx + 1 over non-padding tokens, byte-level BPE, no NSP; `lm_head` for MLM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig
from bertlab.families.bert import BERT_DEFAULTS, BERT_FIELDS, bert_layer_hook_paths
from bertlab.families.core import Family, FamilyModel
from bertlab.model import BertEmbeddings, BertModel, ModelOutput, add_task_heads, decoder_is_tied, task_logits
from bertlab.tokenizer import TOKENIZER_PIPELINES


class RobertaEmbeddings(BertEmbeddings):
    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[batch, seq]: padding tokens sit at padding_idx, the others count on from padding_idx + 1."""
        pad = self.word_embeddings.padding_idx
        real = input_ids.ne(pad).int()
        return torch.cumsum(real, dim=1).type_as(real) * real + pad


class RobertaLMHead(nn.Module):
    """MLM head: dense, gelu, layer_norm, then the word embeddings (tied) plus a bias; untied
    (tie_word_embeddings false), a `decoder` Linear of its own."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.decoder = None if decoder_is_tied(cfg) else nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        h = self.layer_norm(F.gelu(self.dense(x)))
        if self.decoder is not None:
            return self.decoder(h)  # [..., vocab]
        return F.linear(h, word_embeddings, self.bias)  # [..., vocab]


class Roberta(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.roberta = BertModel(config, embeddings=RobertaEmbeddings(config))
        self.lm_head = RobertaLMHead(config) if "mlm" in config.pretraining_heads else None
        add_task_heads(self, config, sentence_act=torch.tanh)
        self.finish()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """all_positions is the protocol's "the heads read only some rows" (`Bert.forward`): RoBERTa computes every
        row."""
        self.check_input(input_ids, token_type_ids)
        seq, pooled = self.roberta(input_ids, token_type_ids, attention_mask, head_mask)
        out = ModelOutput(last_hidden_state=seq, pooler_output=pooled)
        if self.lm_head is not None:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        task_logits(out, self, seq, pooled)
        return out

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        return self.lm_head(states, self.roberta.embeddings.word_embeddings.weight)


def byte_level_pipeline(tok: dict, cfg: dict) -> dict:
    """RoBERTa's tokenizer as transformers' RobertaTokenizer builds it over tokenizer.json: no normaliser,
    byte-level pre-tokenizer and decoder, <s> A </s></s> B </s>, with the config's add_prefix_space and
    trim_offsets."""
    prefix, trim = bool(cfg.get("add_prefix_space", False)), bool(cfg.get("trim_offsets", True))
    ids = {**tok.get("model", {}).get("vocab", {}), **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}

    def special(role: str, default: str) -> list:
        value = cfg.get(f"{role}_token", default)
        token = value.get("content", default) if isinstance(value, dict) else str(value)
        return [token, ids.get(token, 0)]

    level = {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": True}
    return {**tok, "normalizer": None, "pre_tokenizer": level, "decoder": {**level},
            "post_processor": {"type": "RobertaProcessing", "sep": special("sep", "</s>"),
                               "cls": special("cls", "<s>"), "trim_offsets": trim, "add_prefix_space": prefix}}


TOKENIZER_PIPELINES["RobertaTokenizer"] = byte_level_pipeline


def _positions(d: dict, kwargs: dict) -> None:
    kwargs["position_offset"] = int(kwargs.get("pad_token_id", 1)) + 1  # positions start after padding_idx


FAMILY = Family(
    name="roberta",
    prefix="roberta",
    model_class=Roberta,
    fields=BERT_FIELDS,
    defaults={**BERT_DEFAULTS, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
    architectures={
        "RobertaModel": ((), None),
        "RobertaForMaskedLM": (("mlm",), None),
        "RobertaForSequenceClassification": ((), "sequence_classification"),
        "RobertaForTokenClassification": ((), "token_classification"),
        "RobertaForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths=bert_layer_hook_paths("roberta"),
    head_keys={"mlm": "lm_head.dense.weight"},
    pooler_key="roberta.pooler.dense.weight",
    tokenizer_kind="bpe",
    special_tokens={"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"},
    base_keys=("embeddings.", "encoder.", "pooler."),
    tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    title="RoBERTa",
    spec_hook=_positions,
    objective="MLM, dynamic masking, no NSP",
    objective_about="a new mask every time a sentence is seen, no next-sentence task, full sentences packed to 512 "
                    "tokens, far more data",
    objective_demo="dynamic",
)
Roberta.FAMILY = FAMILY
