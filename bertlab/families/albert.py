"""ALBERT: factorised embeddings (embedding_size -> hidden_size through
`albert.encoder.embedding_hidden_mapping_in`), layer groups shared across depth, SOP.

config.json's num_hidden_layers counts group calls; each call runs the group's inner_group_num
layers. The logical layers (the spec's num_hidden_layers, what caches and panels count) are the
layers run: num_hidden_layers x inner_group_num. The shared layers hold the weights once; the hook
points live in `albert.encoder.layer.{i}`, one set per logical depth, so a cache keeps every depth
apart. SOP logits come back as `nsp_logits`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.families.bert import BERT_DEFAULTS, BERT_FIELDS
from bertlab.families.core import Family, FamilyModel
from bertlab.hooks import HookPoint
from bertlab.model import (
    Adapter,
    AttentionHooks,
    BertEmbeddings,
    ModelOutput,
    activation,
    add_task_heads,
    attend,
    decoder_is_tied,
    extended_mask,
    task_logits,
    write_heads,
)
from bertlab.tokenizer import TOKENIZER_PIPELINES


class AlbertDepth(AttentionHooks):
    """The hook points of one logical layer (no weights): the shared layer runs through them."""

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model]
        self.hook_result = HookPoint()  # [batch, seq, head, d_model] each head's write (no bias)
        self.hook_attn_out = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model]
        self.hook_post = HookPoint()  # [batch, seq, d_mlp]
        self.hook_mlp_out = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model]


class AlbertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention_dropout = nn.Dropout(cfg.attention_probs_dropout_prob)
        self.output_dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's, after attention


class AlbertLayer(nn.Module):
    """One post-LN layer; its weights serve every depth of its group."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.full_layer_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = AlbertAttention(cfg)
        self.ffn = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_output = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's, after the MLP

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                hp: AlbertDepth) -> torch.Tensor:
        a = self.attention
        x = hp.hook_resid_pre(x)
        z = attend(hp, x, a.query, a.key, a.value, mask, head_mask, a.attention_dropout)
        out = hp.hook_attn_out(a.output_dropout(write_heads(z, a.dense, hp.hook_result, hp.n_heads)))
        if a.adapter is not None:
            out = a.adapter(out)
        mid = hp.hook_resid_mid(a.LayerNorm(x + out))
        ffn = hp.hook_mlp_out(self.ffn_output(hp.hook_post(self.act(self.ffn(mid)))))
        if self.adapter is not None:
            ffn = self.adapter(ffn)
        return hp.hook_resid_post(self.full_layer_layer_norm(ffn + mid))


class AlbertLayerGroup(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(cfg) for _ in range(inner_group_num(cfg)))


class AlbertTransformer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.embedding_hidden_mapping_in = nn.Linear(cfg.embedding_size or cfg.hidden_size, cfg.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(cfg) for _ in range(cfg.num_hidden_groups))
        self.layer = nn.ModuleList(AlbertDepth(cfg) for _ in range(cfg.num_hidden_layers))  # hooks per depth
        inner = inner_group_num(cfg)
        calls = cfg.num_hidden_layers // inner  # config.json's num_hidden_layers
        # logical layer j: the (j % inner)-th layer of the group HF's loop picks for call j // inner
        self.shared = [(int((j // inner) / (calls / cfg.num_hidden_groups)), j % inner)
                       for j in range(cfg.num_hidden_layers)]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.embedding_hidden_mapping_in(x)  # [batch, seq, d_model]
        for i, hp in enumerate(self.layer):
            group, inner = self.shared[i]
            layer = self.albert_layer_groups[group].albert_layers[inner]
            x = layer(x, mask, None if head_mask is None else head_mask[i], hp)
        return x


class AlbertModel(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = AlbertTransformer(cfg)
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size) if cfg.add_pooler else None

    def forward(self, input_ids, token_type_ids, attention_mask, head_mask):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        x = self.encoder(x, extended_mask(attention_mask, x.dtype), head_mask)
        return x, (torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None)


class AlbertMLMHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.LayerNorm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.dense = nn.Linear(cfg.hidden_size, width)
        self.act = activation(cfg.hidden_act)
        # untied (tie_word_embeddings false): a decoder of its own, as HF's
        self.decoder = None if decoder_is_tied(cfg) else nn.Linear(width, cfg.vocab_size)

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        h = self.LayerNorm(self.act(self.dense(x)))
        if self.decoder is not None:
            return self.decoder(h)  # [..., vocab]
        return F.linear(h, word_embeddings, self.bias)  # [..., vocab]


class AlbertSOPHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dropout = nn.Dropout(cfg.extra.get("classifier_dropout_prob", 0.1))
        # HF sizes it by config.num_labels (2 in every released ALBERT: in order / swapped)
        self.classifier = nn.Linear(cfg.hidden_size, len(cfg.extra.get("id2label") or (0, 1)))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))  # [batch, 2]: 0 = in order, 1 = swapped


class Albert(FamilyModel):
    def __init__(self, config: BertConfig):
        needs_pooler = "sop" in config.pretraining_heads or config.task == "sequence_classification"
        super().__init__(config.replace(add_pooler=True) if needs_pooler else config)
        config = self.config
        self.albert = AlbertModel(config)
        self.predictions = AlbertMLMHead(config) if "mlm" in config.pretraining_heads else None
        self.sop_classifier = AlbertSOPHead(config) if "sop" in config.pretraining_heads else None
        add_task_heads(self, config, dropout_p=config.extra.get("classifier_dropout_prob", 0.1))
        self.finish()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """all_positions is the protocol's "the heads read only some rows" (`Bert.forward`): ALBERT computes every
        row."""
        self.check_input(input_ids, token_type_ids)
        seq, pooled = self.albert(input_ids, token_type_ids, attention_mask, head_mask)
        out = ModelOutput(last_hidden_state=seq, pooler_output=pooled)
        if self.predictions is not None:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        if self.sop_classifier is not None:
            out.nsp_logits = self.sop_classifier(pooled)
        task_logits(out, self, seq, pooled)
        return out

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        return self.predictions(states, self.albert.embeddings.word_embeddings.weight)


def sentencepiece_pipeline(tok: dict, cfg: dict) -> dict:
    """ALBERT's tokenizer as transformers' AlbertTokenizer builds it over tokenizer.json: quotes, accents
    (unless keep_accents), lower case (do_lower_case), the file's precompiled charsmap; whitespace split
    then Metaspace."""
    norms: list[dict] = [{"type": "Replace", "pattern": {"String": "``"}, "content": '"'},
                         {"type": "Replace", "pattern": {"String": "''"}, "content": '"'}]
    if not cfg.get("keep_accents", False):
        norms += [{"type": "NFKD"}, {"type": "StripAccents"}]
    if cfg.get("do_lower_case", True):
        norms.append({"type": "Lowercase"})
    old = tok.get("normalizer") or {}
    norms += [n for n in [old, *old.get("normalizers", [])] if n.get("type") == "Precompiled"]
    scheme = "always" if cfg.get("add_prefix_space", True) else "never"
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": True}
    return {**tok, "normalizer": {"type": "Sequence", "normalizers": norms},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, meta]},
            "decoder": meta}


TOKENIZER_PIPELINES["AlbertTokenizer"] = sentencepiece_pipeline


def inner_group_num(cfg: BertConfig) -> int:
    """Layers per group (config.json's inner_group_num, default 1)."""
    return int(cfg.extra.get("inner_group_num", 1))


def _check(d: dict) -> None:
    inner = d.get("inner_group_num", 1)
    if isinstance(inner, bool) or not isinstance(inner, int) or not 1 <= inner <= 64:
        raise ConfigError(f"inner_group_num must be a whole number from 1 to 64 (layers per group); "
                          f"got {str(inner)[:20]!r}.")


def _spec(d: dict, kwargs: dict) -> None:
    kwargs["embedding_size"] = d.get("embedding_size", 128)
    kwargs["num_hidden_groups"] = d.get("num_hidden_groups", 1)
    layers = kwargs.get("num_hidden_layers", 12)
    if isinstance(layers, int) and not isinstance(layers, bool):  # else the spec refuses it by name
        kwargs["num_hidden_layers"] = layers * d.get("inner_group_num", 1)  # logical layers: every layer run


def _new_fields(d: dict, options: dict) -> None:
    """A new ALBERT: no factorisation unless asked (config.json's default is 128), one group shared by every
    layer when `shared_layers`, else a group per layer."""
    d.setdefault("embedding_size", d["hidden_size"])
    d["num_hidden_groups"] = 1 if options.get("shared_layers") else d["num_hidden_layers"]


def _hf(spec: BertConfig, d: dict) -> None:
    d["num_hidden_layers"] = spec.num_hidden_layers // inner_group_num(spec)


FAMILY = Family(
    name="albert",
    prefix="albert",
    model_class=Albert,
    fields=BERT_FIELDS,
    defaults={**BERT_DEFAULTS, "hidden_act": "gelu_new", "pad_token_id": 0},
    architectures={
        "AlbertModel": ((), None),
        "AlbertForPreTraining": (("mlm", "sop"), None),
        "AlbertForMaskedLM": (("mlm",), None),
        "AlbertForSequenceClassification": ((), "sequence_classification"),
        "AlbertForTokenClassification": ((), "token_classification"),
        "AlbertForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths={short: "albert.encoder.layer.{i}." for short in (
        "hook_resid_pre", "hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z", "hook_result",
        "hook_attn_out", "hook_resid_mid", "hook_post", "hook_mlp_out", "hook_resid_post")},
    head_keys={"mlm": "predictions.dense.weight", "sop": "sop_classifier.classifier.weight"},
    pooler_key="albert.pooler.weight",
    tokenizer_kind="unigram",
    special_tokens={"cls": "[CLS]", "sep": "[SEP]", "pad": "<pad>", "unk": "<unk>", "mask": "[MASK]"},
    base_keys=("embeddings.", "encoder.", "pooler."),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    check=_check,
    spec_hook=_spec,
    hf_hook=_hf,
    title="ALBERT",
    objective="MLM + SOP",
    objective_about="sentence-order prediction: are A and B in their order, or swapped? (NSP was too easy: topic "
                    "alone gave it away); one layer shared across depth; factorised embeddings",
    objective_demo="pair",
    new_fields=_new_fields,
)
Albert.FAMILY = FAMILY
