"""DistilBERT: half BERT's depth, no segments (no token_type_embeddings), its own names
(`distilbert.transformer.layer.N.attention.q_lin`, `sa_layer_norm`, `ffn.lin1`, ...); its config.json
says dim / n_layers / n_heads / hidden_dim / activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig
from bertlab.families.bert import WORDPIECE_SPECIALS
from bertlab.families.core import Family, FamilyModel
from bertlab.hooks import HookPoint
from bertlab.model import (
    Adapter,
    AttentionHooks,
    BertEmbeddings,
    ModelOutput,
    activation,
    attend,
    decoder_is_tied,
    extended_mask,
    task_logits,
    write_heads,
)

EPS = 1e-12  # DistilBERT's LayerNorms do not read layer_norm_eps


class MultiHeadSelfAttention(AttentionHooks):
    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        self.q_lin = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.k_lin = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.v_lin = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_lin = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.attention_probs_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.hook_result = HookPoint()  # [batch, seq, head, d_model] each head's write (no bias)
        self.hook_attn_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None) -> torch.Tensor:
        z = attend(self, x, self.q_lin, self.k_lin, self.v_lin, mask, head_mask, self.dropout)
        out = self.hook_attn_out(write_heads(z, self.out_lin, self.hook_result, self.n_heads))
        return out if self.adapter is None else self.adapter(out)


class FFN(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.lin1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.lin2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None  # the fine-tuning lab's
        self.hook_post = HookPoint()  # [batch, seq, d_mlp]
        self.hook_mlp_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.hook_mlp_out(self.dropout(self.lin2(self.hook_post(self.act(self.lin1(x))))))
        return out if self.adapter is None else self.adapter(out)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = MultiHeadSelfAttention(cfg)
        self.sa_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=EPS)
        self.ffn = FFN(cfg)
        self.output_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=EPS)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(self.sa_layer_norm(self.attention(x, mask, head_mask) + x))
        return self.hook_resid_post(self.output_layer_norm(self.ffn(mid) + mid))


class Transformer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.num_hidden_layers))


class DistilBertModel(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)  # type_vocab_size 0: word + position only
        self.transformer = Transformer(cfg)

    def forward(self, input_ids, attention_mask, head_mask):
        x = self.embeddings(input_ids, None)
        mask = extended_mask(attention_mask, x.dtype)
        for i, block in enumerate(self.transformer.layer):
            x = block(x, mask, None if head_mask is None else head_mask[i])
        return x


class DistilBert(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        if "mlm" in config.pretraining_heads:
            self.vocab_transform = nn.Linear(config.hidden_size, config.hidden_size)
            self.vocab_layer_norm = nn.LayerNorm(config.hidden_size, eps=EPS)
            # tied: only the bias is stored (the weight is the word embeddings); untied, a Linear of its own
            tied = decoder_is_tied(config)
            self.vocab_projector = _BiasOnly(config.vocab_size) if tied else nn.Linear(config.hidden_size,
                                                                                        config.vocab_size)
            self.mlm_act = activation(config.hidden_act)
        task = config.task
        if task == "sequence_classification":
            self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
            self.dropout = nn.Dropout(config.extra.get("seq_classif_dropout", 0.2))
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        elif task == "token_classification":
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        elif task == "question_answering":
            self.dropout = nn.Dropout(config.extra.get("qa_dropout", 0.1))
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.finish()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """token_type_ids are accepted (today's call) and ignored: DistilBERT has no segments; all_positions
        is the protocol's "the heads read only some rows" (`Bert.forward`): DistilBERT computes every row."""
        self.check_input(input_ids, None)
        seq = self.distilbert(input_ids, attention_mask, head_mask)
        out = ModelOutput(last_hidden_state=seq)
        if self.has_mlm:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        task = self.config.task
        if task == "sequence_classification":
            out.logits = self.classifier(self.dropout(F.relu(self.pre_classifier(seq[:, 0]))))
        elif task == "question_answering":  # DistilBERT drops out before the span head too
            task_logits(out, self, self.dropout(seq), None)
        else:
            task_logits(out, self, seq, None)
        return out

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        h = self.vocab_layer_norm(self.mlm_act(self.vocab_transform(states)))
        if isinstance(self.vocab_projector, nn.Linear):
            return self.vocab_projector(h)
        return F.linear(h, self.distilbert.embeddings.word_embeddings.weight, self.vocab_projector.bias)


class _BiasOnly(nn.Module):
    """`vocab_projector`: HF's Linear whose weight is the word embeddings; only `.bias` is stored."""

    def __init__(self, n: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))



FAMILY = Family(
    name="distilbert",
    prefix="distilbert",
    model_class=DistilBert,
    fields={"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size", "activation": "hidden_act",
            "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
            "max_position_embeddings": "max_position_embeddings", "pad_token_id": "pad_token_id",
            "initializer_range": "initializer_range"},
    defaults={"activation": "gelu", "pad_token_id": 0, "dim": 768, "n_layers": 6, "n_heads": 12,
              "hidden_dim": 3072, "max_position_embeddings": 512},
    fixed={"type_vocab_size": 0, "layer_norm_eps": EPS},
    architectures={
        "DistilBertModel": ((), None),
        "DistilBertForMaskedLM": (("mlm",), None),
        "DistilBertForSequenceClassification": ((), "sequence_classification"),
        "DistilBertForTokenClassification": ((), "token_classification"),
        "DistilBertForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths={
        **{s: "distilbert.transformer.layer.{i}." for s in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")},
        **{s: "distilbert.transformer.layer.{i}.attention." for s in (
            "hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z", "hook_result", "hook_attn_out")},
        **{s: "distilbert.transformer.layer.{i}.ffn." for s in ("hook_post", "hook_mlp_out")},
    },
    head_keys={"mlm": "vocab_transform.weight"},
    pooler_key=None,
    tokenizer_kind="wordpiece",
    special_tokens=WORDPIECE_SPECIALS,
    base_keys=("embeddings.", "transformer."),
    head_prefixes=("vocab_transform.", "vocab_layer_norm.", "vocab_projector."),
    tied={"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"},
    title="DistilBERT",
    has_segments=False,
    objective="MLM by distillation",
    objective_about="a half-depth student trained to match BERT's output distribution (soft targets) as well as "
                    "the hidden word, no NSP",
    objective_demo="distil",
)
DistilBert.FAMILY = FAMILY
