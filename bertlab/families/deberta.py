"""DeBERTa-v2 / v3 (`model_type` "deberta-v2"): disentangled attention under `deberta.`.

A token's score for another is the sum of up to three terms, each divided by sqrt(d_head x terms):
content-to-content (q . k, BERT's), content-to-position (q . the key projection of the relative
distance's embedding, "c2p") and position-to-content (k . the query projection of the reverse distance's
embedding, "p2c"). Distances are log-bucketed past `position_buckets / 2` and share one table,
`deberta.encoder.rel_embeddings` (LayerNorm'd when norm_rel_ebd says so); `share_att_key` projects
them with the content's own query/key weights. DeBERTa-v3 adds no absolute positions to its input
(position_biased_input false) and has no segments (type_vocab_size 0). v2's ConvLayer
(conv_kernel_size) mixes neighbouring tokens after the first layer. Each score term has its hook point
(`hook_c2c`, `hook_c2p`, `hook_p2c`), so the lab can show them apart.

DeBERTa-v3's replaced-token detector (`mask_predictions`, which its hub files carry and transformers
leaves unread) is read as the RTD head: `rtd_logits`, > 0 = "replaced", as ELECTRA's discriminator.
The MLM head has two layouts in transformers: `cls.predictions.*` (config.json's legacy, the default)
and DeBERTa's own `lm_predictions.lm_head.*` (legacy false, what the hub checkpoints hold); both are
the same computation and are read and written under the names the file uses.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.families.bert import BERT_FIELDS, bert_layer_hook_paths
from bertlab.families.core import Family, FamilyModel
from bertlab.hooks import HookPoint
from bertlab.model import (
    AttentionHooks,
    BertIntermediate,
    BertLayerOutput,
    BertSelfOutput,
    ModelOutput,
    activation,
    add_task_heads,
    decoder_is_tied,
    task_logits,
)
from bertlab.tokenizer import MODEL_TOKENIZERS, TOKENIZER_PIPELINES

log = logging.getLogger(__name__)

SCORE_TERMS = ("c2p", "p2c")  # the position terms pos_att_type can ask for (c2c is always there)
CONV_ACTS = {"tanh": torch.tanh, "gelu": F.gelu, "relu": F.relu}


# ---------------------------------------------------------------------------------------------
# The config.json fields only DeBERTa reads (kept in spec.extra, written back as they came)
# ---------------------------------------------------------------------------------------------
def pos_att_type(cfg: BertConfig) -> tuple[str, ...]:
    """The position terms of the score: ("p2c", "c2p"), one of them, or ()."""
    value = cfg.extra.get("pos_att_type") or ()
    if isinstance(value, str):
        value = [x.strip() for x in value.lower().split("|")]
    return tuple(v for v in value if v in SCORE_TERMS)


def relative_attention(cfg: BertConfig) -> bool:
    return bool(cfg.extra.get("relative_attention", False))


def max_relative_positions(cfg: BertConfig) -> int:
    """The distance the log buckets reach (config's max_relative_positions; < 1: max_position_embeddings)."""
    n = int(cfg.extra.get("max_relative_positions", -1))
    return n if n >= 1 else cfg.max_position_embeddings


def position_buckets(cfg: BertConfig) -> int:
    return int(cfg.extra.get("position_buckets", -1))


def attention_span(cfg: BertConfig) -> int:
    """Half the rows of rel_embeddings: position_buckets when set, else max_relative_positions."""
    return position_buckets(cfg) if position_buckets(cfg) > 0 else max_relative_positions(cfg)


def is_legacy_head(cfg: BertConfig) -> bool:
    """transformers' `legacy` flag: the MLM head under `cls.predictions` (true, its default) or `lm_predictions`."""
    return cfg.extra.get("legacy", True) is not False


# ---------------------------------------------------------------------------------------------
# Relative positions
# ---------------------------------------------------------------------------------------------
def log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """Distances within +-bucket_size/2 kept as they are; farther ones on a log scale up to max_position."""
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where((relative_pos < mid) & (relative_pos > -mid),
                          torch.tensor(mid - 1).type_as(relative_pos), torch.abs(relative_pos))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


def relative_positions(seq: int, buckets: int, max_position: int, device: torch.device) -> torch.Tensor:
    """[query, key] bucketed distance query - key (long)."""
    ids = torch.arange(seq, dtype=torch.long, device=device)
    rel = ids[:, None] - ids[None, :]
    if buckets > 0 and max_position > 0:
        rel = log_bucket_position(rel, buckets, max_position)
    return rel.to(torch.long)


# ---------------------------------------------------------------------------------------------
# Embeddings: words (+ absolute positions when position_biased_input) (+ segments), normalised
# ---------------------------------------------------------------------------------------------
class DebertaV2Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, width, padding_idx=cfg.pad_token_id)
        biased = cfg.extra.get("position_biased_input", True) is not False
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, width) if biased else None
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.embed_proj = nn.Linear(width, cfg.hidden_size, bias=False) if width != cfg.hidden_size else None
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.hook_word = HookPoint()  # [batch, seq, d_embed]
        self.hook_token_type = HookPoint()  # [batch, seq, d_embed] (only with segments)
        self.hook_position = HookPoint()  # [batch, seq, d_embed] (only with absolute positions)
        self.hook_sum = HookPoint()  # [batch, seq, d_embed] before LayerNorm
        self.hook_out = HookPoint()  # [batch, seq, d_model] normalised, padding zeroed

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        total = self.hook_word(self.word_embeddings(input_ids))
        if self.position_embeddings is not None:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            total = total + self.hook_position(self.position_embeddings(pos).expand_as(total))
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            total = total + self.hook_token_type(self.token_type_embeddings(token_type_ids))
        total = self.hook_sum(total)
        if self.embed_proj is not None:
            total = self.embed_proj(total)
        x = self.LayerNorm(total)
        if attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        return self.hook_out(self.dropout(x))


# ---------------------------------------------------------------------------------------------
# Disentangled self-attention
# ---------------------------------------------------------------------------------------------
class DisentangledSelfAttention(AttentionHooks):
    """Scores = (c2c + c2p + p2c) / sqrt(d_head x terms); the eager path materialises each term, the
    fast path hands the position terms to SDPA as an additive float mask."""

    EAGER_HOOKS = (*AttentionHooks.EAGER_HOOKS, "hook_c2c")  # the content-to-content scores: eager only

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        d = cfg.hidden_size
        self.query_proj = nn.Linear(d, d)
        self.key_proj = nn.Linear(d, d)
        self.value_proj = nn.Linear(d, d)
        self.terms = pos_att_type(cfg)
        self.share_att_key = bool(cfg.extra.get("share_att_key", False))
        self.relative = relative_attention(cfg)
        self.span = attention_span(cfg)
        if self.relative:
            self.pos_dropout = nn.Dropout(cfg.hidden_dropout_prob)
            if not self.share_att_key:
                if "c2p" in self.terms:
                    self.pos_key_proj = nn.Linear(d, d)
                if "p2c" in self.terms:
                    self.pos_query_proj = nn.Linear(d, d)
        self.dropout = nn.Dropout(cfg.attention_probs_dropout_prob)
        # the reference divides every term by sqrt(d_head x number of terms), c2c included
        self.scale = math.sqrt(self.d_head * (1 + len(self.terms)))
        self.hook_c2c = HookPoint()  # [batch, head, query, key] content-to-content, scaled
        self.hook_c2p = HookPoint()  # [batch, head, query, key] content-to-position, scaled
        self.hook_p2c = HookPoint()  # [batch, head, query, key] position-to-content, scaled

    def split(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(*t.shape[:-1], self.n_heads, self.d_head).transpose(-3, -2)  # [..., head, seq, d_head]

    def position_bias(self, q: torch.Tensor, k: torch.Tensor, rel_embeddings: torch.Tensor,
                      relative_pos: torch.Tensor) -> torch.Tensor | None:
        """c2p + p2c, scaled: [batch, head, query, key]; None without relative attention.
        q, k: [batch, head, seq, d_head]; rel_embeddings [2 x span, d_model]; relative_pos [query, key]."""
        if not self.relative or not self.terms:
            return None
        rel = self.pos_dropout(rel_embeddings[: 2 * self.span])  # [2 span, d_model]
        b, h, s, _ = q.shape
        bias = None
        if "c2p" in self.terms:
            pos_k = self.split(self.key_proj(rel) if self.share_att_key else self.pos_key_proj(rel))  # [head, 2span, d]
            index = torch.clamp(relative_pos + self.span, 0, 2 * self.span - 1).expand(b, h, s, s)
            c2p = self.hook_c2p(torch.gather(q @ pos_k.transpose(-1, -2), -1, index) / self.scale)
            bias = c2p
        if "p2c" in self.terms:
            pos_q = self.split(self.query_proj(rel) if self.share_att_key else self.pos_query_proj(rel))
            index = torch.clamp(-relative_pos + self.span, 0, 2 * self.span - 1).expand(b, h, s, s)
            p2c = self.hook_p2c(torch.gather(k @ pos_q.transpose(-1, -2), -1, index).transpose(-1, -2) / self.scale)
            bias = p2c if bias is None else bias + p2c
        return bias

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                rel_embeddings: torch.Tensor | None, relative_pos: torch.Tensor | None) -> torch.Tensor:
        """x [batch, seq, d_model]; mask additive [batch, 1, query, key] -> z [batch, seq, head, d_head]."""
        q = self.hook_q(self.split(self.query_proj(x)).transpose(1, 2)).transpose(1, 2)  # [batch, head, seq, d]
        k = self.hook_k(self.split(self.key_proj(x)).transpose(1, 2)).transpose(1, 2)
        v = self.hook_v(self.split(self.value_proj(x)).transpose(1, 2)).transpose(1, 2)
        bias = self.position_bias(q, k, rel_embeddings, relative_pos)
        if mask is not None:
            bias = mask if bias is None else bias + mask
        if self.uses_eager():
            scores = self.hook_c2c(q @ (k.transpose(-1, -2) / self.scale))
            if bias is not None:
                scores = scores + bias
            pattern = self.hook_pattern(self.hook_scores(scores).softmax(dim=-1))
            z = self.dropout(pattern) @ v  # [batch, head, seq, d_head]
        else:
            p = self.dropout.p if self.dropout.training else 0.0
            bias = None if bias is None else bias.to(q.dtype)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, scale=1.0 / self.scale)
        if head_mask is not None:  # [head]: 0 switches a head off
            z = z * head_mask.to(z.dtype).view(1, -1, 1, 1)
        return self.hook_z(z.transpose(1, 2))  # [batch, seq, head, d_head]


class DebertaV2Attention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = DisentangledSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)  # dense, dropout, (adapter,) LayerNorm(out + x): HF's names

    def forward(self, x, mask, head_mask, rel_embeddings, relative_pos) -> torch.Tensor:
        return self.output(self.self(x, mask, head_mask, rel_embeddings, relative_pos), x)


class ConvLayer(nn.Module):
    """DeBERTa-v2's n-gram mixer after the first layer: conv over the embeddings, activation, added to the
    layer's output, LayerNorm; padding stays zero."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        size = int(cfg.extra["conv_kernel_size"])
        d = cfg.hidden_size
        self.conv = nn.Conv1d(d, d, size, padding=(size - 1) // 2, groups=int(cfg.extra.get("conv_groups", 1)))
        self.LayerNorm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.act = CONV_ACTS[str(cfg.extra.get("conv_act", "tanh"))]

    def forward(self, embedded: torch.Tensor, residual: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """embedded, residual: [batch, seq, d_model]; keep: [batch, seq] 1 = token, 0 = padding."""
        out = self.conv(embedded.transpose(1, 2)).transpose(1, 2)
        out = out.masked_fill(~keep.bool().unsqueeze(-1), 0)
        out = self.LayerNorm(residual + self.act(self.dropout(out)))
        return out * keep.unsqueeze(-1).to(out.dtype)


class DebertaV2Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = DebertaV2Attention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertLayerOutput(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model]
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model] (after the ConvLayer in layer 0)

    def forward(self, x, mask, head_mask, rel_embeddings, relative_pos, after=None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(self.attention(x, mask, head_mask, rel_embeddings, relative_pos))
        out = self.output(self.intermediate(mid), mid)
        return self.hook_resid_post(out if after is None else after(out))


class DebertaV2Encoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(DebertaV2Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.relative = relative_attention(cfg)
        self.buckets, self.max_relative = position_buckets(cfg), max_relative_positions(cfg)
        if self.relative:
            self.rel_embeddings = nn.Embedding(2 * attention_span(cfg), cfg.hidden_size)
        norm = [x.strip() for x in str(cfg.extra.get("norm_rel_ebd", "none")).lower().split("|")]
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if "layer_norm" in norm else None
        self.conv = ConvLayer(cfg) if int(cfg.extra.get("conv_kernel_size", 0) or 0) > 0 else None

    def rel_table(self) -> torch.Tensor | None:
        """The relative-distance embeddings [2 x span, d_model] every layer reads (normalised if asked)."""
        if not self.relative:
            return None
        rel = self.rel_embeddings.weight
        return rel if self.LayerNorm is None else self.LayerNorm(rel)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """x [batch, seq, d_model]; keep [batch, seq] 1 = token, 0 = padding."""
        mask = pair_mask(keep, x.dtype)
        rel = self.rel_table()
        relative_pos = (relative_positions(x.shape[1], self.buckets, self.max_relative, x.device)
                        if self.relative else None)
        embedded = x
        for i, layer in enumerate(self.layer):
            after = None
            if i == 0 and self.conv is not None:
                def after(out, embedded=embedded):
                    return self.conv(embedded, out, keep)
            x = layer(x, mask, None if head_mask is None else head_mask[i], rel, relative_pos, after)
        return x


def pair_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """[batch, seq] 1/0 -> additive [batch, 1, query, key]: a pair is read only when both are tokens (as the
    reference masks; a padding query's row comes out uniform). None when nothing is padded."""
    if bool(keep.all()):
        return None
    both = keep[:, None, :, None] * keep[:, None, None, :]
    return (1.0 - both.to(dtype)) * torch.finfo(dtype).min


class DebertaV2Model(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.embeddings = DebertaV2Embeddings(cfg)
        self.encoder = DebertaV2Encoder(cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None) -> torch.Tensor:
        keep = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self.embeddings(input_ids, token_type_ids, keep)
        return self.encoder(x, keep, head_mask)


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------
class LMTransform(nn.Module):
    """dense -> activation -> LayerNorm (HF: `cls.predictions.transform`, or inside `lm_predictions.lm_head`)."""

    def __init__(self, cfg: BertConfig, width: int):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, width)
        self.act = activation(cfg.hidden_act)
        self.LayerNorm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class LegacyLMPredictionHead(nn.Module):
    """`cls.predictions`: transform, then the word embeddings (tied) plus `bias`; untied, a decoder of its own."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.transform = LMTransform(cfg, width)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.decoder = None if decoder_is_tied(cfg) else nn.Linear(width, cfg.vocab_size)

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        h = self.transform(x)
        return self.decoder(h) if self.decoder is not None else F.linear(h, word_embeddings, self.bias)


class LegacyOnlyMLMHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.predictions = LegacyLMPredictionHead(cfg)


class DebertaLMHead(LMTransform):
    """`lm_predictions.lm_head`: dense, activation, LayerNorm, the word embeddings plus `bias` (always tied)."""

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg, cfg.hidden_size)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))


class DebertaOnlyMLMHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.lm_head = DebertaLMHead(cfg)


class MaskPredictionHead(nn.Module):
    """`mask_predictions`: DeBERTa-v3's replaced-token detector (its original code's LMMaskPredictionHead):
    each token's state plus the first token's, LayerNorm, dense, activation, one logit (> 0 = "replaced")."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.classifier = nn.Linear(cfg.hidden_size, 1)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        h = self.act(self.dense(self.LayerNorm(seq[:, :1] + seq)))
        return self.classifier(h).squeeze(-1)  # [batch, seq]


class ContextPooler(nn.Module):
    """The sentence classifier's pooler (top-level `pooler.dense`): first token, dropout, dense, activation."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(float(cfg.extra.get("pooler_dropout", 0.0) or 0.0))
        self.act = activation(str(cfg.extra.get("pooler_hidden_act", "gelu")))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(self.dropout(seq[:, 0])))  # [batch, d_model]


# ---------------------------------------------------------------------------------------------
# The whole model
# ---------------------------------------------------------------------------------------------
class DebertaV2(FamilyModel):
    def __init__(self, config: BertConfig):
        super().__init__(config.replace(add_pooler=False))
        config = self.config
        self.deberta = DebertaV2Model(config)
        self.cls = self.lm_predictions = None
        if "mlm" in config.pretraining_heads:
            if is_legacy_head(config):
                self.cls = LegacyOnlyMLMHead(config)
            else:
                self.lm_predictions = DebertaOnlyMLMHead(config)
        self.mask_predictions = MaskPredictionHead(config) if "rtd" in config.pretraining_heads else None
        cls_dropout = config.extra.get("cls_dropout")
        add_task_heads(self, config, dropout_p=config.hidden_dropout_prob if cls_dropout is None else cls_dropout)
        self.pooler = ContextPooler(config) if config.task == "sequence_classification" else None
        self.finish()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None,
                mlm_positions=None, all_positions=True) -> ModelOutput:
        """token_type_ids are read only by a model with segments (DeBERTa-v3 has none: type_vocab_size 0);
        all_positions is the protocol's "the heads read only some rows" (`Bert.forward`): DeBERTa computes every row."""
        has_types = self.config.type_vocab_size > 0
        self.check_input(input_ids, token_type_ids if has_types else None)
        seq = self.deberta(input_ids, token_type_ids if has_types else None, attention_mask, head_mask)
        out = ModelOutput(last_hidden_state=seq)
        if self.has_mlm:
            out.mlm_logits = self.mlm_head(seq if mlm_positions is None else seq[mlm_positions])
        if self.mask_predictions is not None:
            out.rtd_logits = self.mask_predictions(seq)
        task_logits(out, self, seq, self.pooler(seq) if self.pooler is not None else None)
        return out

    def mlm_head(self, states: torch.Tensor) -> torch.Tensor:
        """The MLM head on hidden states `states` [..., hidden]: logits [..., vocab] (the logit lens
        applies it after every layer)."""
        self.require("mlm")
        words = self.deberta.embeddings.word_embeddings.weight
        if self.cls is not None:
            return self.cls.predictions(states, words)
        head = self.lm_predictions.lm_head
        return F.linear(head(states), words, head.bias)


# ---------------------------------------------------------------------------------------------
# The tokenizer: SentencePiece Unigram as transformers' DebertaV2Tokenizer builds it over tokenizer.json
# ---------------------------------------------------------------------------------------------
def deberta_pipeline(tok: dict, cfg: dict) -> dict:
    """(lower case,) runs of whitespace to one space, NFC, right strip; (punctuation split,) Metaspace
    ("always" with add_prefix_space, else "first"); [CLS] A [SEP] (B [SEP]) with segments 0 / 1."""
    norms: list[dict] = [{"type": "Lowercase"}] if cfg.get("do_lower_case", False) else []
    norms += [{"type": "Replace", "pattern": {"Regex": r"\s{2,}|[\n\r\t]"}, "content": " "}, {"type": "NFC"},
              {"type": "Strip", "strip_left": False, "strip_right": True}]
    scheme = "always" if cfg.get("add_prefix_space", True) else "first"
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": True}
    pre = ([{"type": "Punctuation", "behavior": "Isolated"}] if cfg.get("split_by_punct", False) else []) + [meta]
    ids = {**{p[0]: i for i, p in enumerate(tok.get("model", {}).get("vocab", []))},
           **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}

    def special(role: str) -> tuple[str, int]:
        value = cfg.get(f"{role}_token", f"[{role.upper()}]")
        token = value.get("content") if isinstance(value, dict) else str(value)
        return token, ids.get(token, 0)

    (cls, cls_id), (sep, sep_id) = special("cls"), special("sep")
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": sep, "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": sep, "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": sep, "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in ((cls, cls_id), (sep, sep_id))}}
    return {**tok, "normalizer": {"type": "Sequence", "normalizers": norms},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre}, "decoder": meta, "post_processor": post}


TOKENIZER_PIPELINES["DebertaV2Tokenizer"] = deberta_pipeline
TOKENIZER_PIPELINES["DebertaV2TokenizerFast"] = deberta_pipeline
MODEL_TOKENIZERS["deberta-v2"] = "DebertaV2Tokenizer"  # the hub's DeBERTa-v3 folders name no tokenizer class


# ---------------------------------------------------------------------------------------------
# The registry's record
# ---------------------------------------------------------------------------------------------
def _check(d: dict) -> None:
    terms = d.get("pos_att_type") or []
    terms = [x.strip() for x in terms.lower().split("|")] if isinstance(terms, str) else terms
    if not isinstance(terms, list) or any(t not in SCORE_TERMS for t in terms):
        raise ConfigError(f"pos_att_type must list 'c2p' and/or 'p2c'; got {str(d.get('pos_att_type'))[:40]!r}.")
    size, hidden, heads = d.get("attention_head_size"), d.get("hidden_size"), d.get("num_attention_heads")
    if size is not None and isinstance(hidden, int) and isinstance(heads, int) and heads and size * heads != hidden:
        raise ConfigError(f"attention_head_size {size} x {heads} heads differs from hidden_size {hidden}: "
                          f"bertlab's DeBERTa has heads that split hidden_size evenly.")
    if str(d.get("conv_act", "tanh")) not in CONV_ACTS:
        raise ConfigError(f"conv_act {str(d.get('conv_act'))[:20]!r} is not one of {', '.join(CONV_ACTS)}.")
    pooled = d.get("pooler_hidden_size")
    if pooled is not None and hidden is not None and pooled != hidden:
        raise ConfigError(f"pooler_hidden_size {pooled} differs from hidden_size {hidden}; bertlab's pooler keeps "
                          f"hidden_size.")


def _spec(d: dict, kwargs: dict) -> None:
    if d.get("embedding_size") is not None:
        kwargs["embedding_size"] = d["embedding_size"]


def _read_state(spec: BertConfig, state: dict) -> tuple[BertConfig, dict]:
    """Build the MLM head under the layout the file holds (hub checkpoints hold `lm_predictions` with a
    config that says nothing, which transformers reads as legacy); leave out absolute position embeddings
    in a file whose config adds none (position_biased_input false), as transformers does. The
    replaced-token detector (`mask_predictions.*`) that DeBERTa-v3 files carry is read as the RTD head."""
    if spec.extra.get("position_biased_input", True) is False:
        unused = "deberta.embeddings.position_embeddings."
        dropped = [k for k in state if k.startswith(unused)]
        if dropped:
            log.info("not read (position_biased_input is false; transformers leaves them unread too): %s",
                     ", ".join(dropped))
            state = {k: v for k, v in state.items() if not k.startswith(unused)}
    if "lm_predictions.lm_head.dense.weight" in state and "cls.predictions.transform.dense.weight" not in state:
        spec = spec.replace(extra={**spec.extra, "legacy": False})
    return spec, state


FAMILY = Family(
    name="deberta-v2",
    prefix="deberta",
    model_class=DebertaV2,
    fields=BERT_FIELDS,
    defaults={"vocab_size": 128100, "hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 24,
              "intermediate_size": 6144, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
              "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 0,
              "initializer_range": 0.02, "layer_norm_eps": 1e-7, "pad_token_id": 0},
    architectures={
        "DebertaV2Model": ((), None),
        "DebertaV2ForMaskedLM": (("mlm",), None),
        "DebertaV2ForSequenceClassification": ((), "sequence_classification"),
        "DebertaV2ForTokenClassification": ((), "token_classification"),
        "DebertaV2ForQuestionAnswering": ((), "question_answering"),
    },
    hook_paths={**bert_layer_hook_paths("deberta"),
                **{h: "deberta.encoder.layer.{i}.attention.self." for h in ("hook_c2c", "hook_c2p", "hook_p2c")}},
    head_keys={"mlm": ("cls.predictions.transform.dense.weight", "lm_predictions.lm_head.dense.weight"),
               "rtd": "mask_predictions.classifier.weight"},
    pooler_key="pooler.dense.weight",  # the ContextPooler, outside the encoder: only sentence classifiers have it
    tokenizer_kind="unigram",
    special_tokens={"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"},
    base_keys=("embeddings.", "encoder."),
    head_prefixes=("cls.", "lm_predictions.", "mask_predictions."),
    parameter_parts=(("deberta.embeddings.LayerNorm.", "norms outside the layers"),
                     ("deberta.embeddings.embed_proj.", "embedding projection"),
                     ("deberta.encoder.rel_embeddings.", "relative-position embeddings"),
                     ("deberta.encoder.LayerNorm.", "relative-position embeddings"),  # the rel_embeddings' norm
                     ("deberta.encoder.conv.", "convolution beside the first layer")),
    # transformers has no class for the detector: the encoder (and MLM head) are saved for its classes,
    # which leave `mask_predictions` unread (DebertaV2ForMaskedLM by name)
    unread_heads={("rtd",): "DebertaV2Model", ("mlm", "rtd"): "DebertaV2ForMaskedLM"},
    tied={"cls.predictions.decoder.weight": "deberta.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    check=_check,
    spec_hook=_spec,
    read_state=_read_state,
    title="DeBERTa",
    positions="relative",
    positions_note="Every attention layer scores each pair of tokens by what they say and, apart from that, by "
                   "their distance (disentangled attention: content-to-position and position-to-content terms "
                   "over relative position embeddings). DeBERTa-v3 adds no position embedding to the input "
                   "vector (a v2 checkpoint with position_biased_input does).",
    objective="replaced-token detection (DeBERTa-v3)",
    objective_about="ELECTRA's generator and discriminator, with gradient-disentangled embedding sharing: the "
                    "discriminator reads the generator's word embeddings without pulling on them, plus a "
                    "difference of its own",
    changes=("disentangled attention: content and relative position scored apart",
             "relative positions in log buckets", "no segment embeddings (v3)"),
)
DebertaV2.FAMILY = FAMILY
