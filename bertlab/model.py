"""bertlab's BERT: Hugging Face's module layout and weight names, with hook points.

Read top-down, in the order data flows: embeddings, attention, one layer, the encoder, the heads. Every
HookPoint carries its shape in a comment. Attention has two implementations that give the same numbers, chosen
once per model as transformers' `attn_implementation` is: "eager" materialises the scores and the pattern
(what a hook on `hook_scores` / `hook_pattern` reads: `model.hooks` switches to it while such a hook is on),
"sdpa" is torch's fused `scaled_dot_product_attention` (the default). A decoder (config.is_decoder, HF's
`BertLMHeadModel`) is the same BERT with a causal mask added to its padding mask (`bertlab.masks.causal_mask`).

What only makes training faster (unpadding, the last layer on the rows the heads read) is decided in
`bertlab.fast`; these modules only take its values (`unpadded`, `rows`) as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from bertlab import fast, masks
from bertlab.config import BertConfig
from bertlab.hooks import (
    HookPoint,
)

AttnImplementation = Literal["eager", "sdpa"]
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


class MissingHeadError(RuntimeError):
    """The model has no head for what was asked (e.g. mask prediction without an MLM head)."""


ACT_ERF, ACT_TANH, ACT_RELU = 0, 1, 2  # the feed-forward activations: erf GELU, tanh GELU, ReLU


def activation_kind(name: str) -> int:
    """config.json's hidden_act -> ACT_ERF, ACT_TANH or ACT_RELU (any other name: ReLU)."""
    if name == "gelu":
        return ACT_ERF
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return ACT_TANH
    return ACT_RELU


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """config.json's hidden_act -> the function (transformers' ACT2FN for the names BERT families use)."""
    kind = activation_kind(name)
    if kind == ACT_ERF:
        return F.gelu
    if kind == ACT_TANH:
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


# ---------------------------------------------------------------------------------------------
# Embeddings: token + segment + position, summed, normalised.   HF: bert.embeddings.*
# ---------------------------------------------------------------------------------------------
class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, width, padding_idx=cfg.pad_token_id)  # [vocab, d]
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, width)  # [positions, d]
        # type_vocab_size 0 (DistilBERT): no segment embeddings at all
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.LayerNorm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.position_offset = cfg.position_offset
        self.hook_word = HookPoint()  # [batch, seq, d_model]
        self.hook_token_type = HookPoint()  # [batch, seq, d_model]
        self.hook_position = HookPoint()  # [batch, seq, d_model]
        self.hook_sum = HookPoint()  # [batch, seq, d_model] before LayerNorm
        self.hook_out = HookPoint()  # [batch, seq, d_model] normalised sum

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[seq] (or [batch, seq]) position of each token; families override (RoBERTa counts non-padding)."""
        return torch.arange(input_ids.shape[1], device=input_ids.device) + self.position_offset

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        word = self.hook_word(self.word_embeddings(input_ids))
        position = self.hook_position(self.position_embeddings(self.position_ids(input_ids)).expand_as(word))
        total = word + position
        if self.token_type_embeddings is not None:
            total = total + self.hook_token_type(self.token_type_embeddings(token_type_ids))
        total = self.hook_sum(total)
        return self.hook_out(self.dropout(self.LayerNorm(total)))


# ---------------------------------------------------------------------------------------------
# Self-attention.   HF: bert.encoder.layer.N.attention.self.{query,key,value}, .output.{dense,LayerNorm}
# ---------------------------------------------------------------------------------------------
def extended_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[batch, seq] of 1 (read) / 0 (padding) -> additive [batch, 1, 1, seq] (0 or the dtype's min), as
    transformers' `get_extended_attention_mask`; None when nothing is padded (looked at on the CPU only: on a
    GPU the look would wait for the device, and a mask of zeros costs less)."""
    if attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all())):
        return None
    keep = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - keep) * torch.finfo(dtype).min


class AttentionHooks(nn.Module):
    """The hook points of one logical attention layer and its implementation ("eager" or "sdpa", set for the
    whole model by `FamilyModel.set_attn_implementation` and `FamilyModel.hooks` in bertlab.families.core). A
    family's attention module inherits them; ALBERT keeps one set per depth because its layer is shared."""

    EAGER_HOOKS = ("hook_scores", "hook_pattern")  # hook points only the eager implementation computes

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.d_head = cfg.head_dim
        self.attn_implementation: AttnImplementation = "sdpa"
        self.hook_q = HookPoint()  # [batch, seq, head, d_head]
        self.hook_k = HookPoint()  # [batch, seq, head, d_head]
        self.hook_v = HookPoint()  # [batch, seq, head, d_head]
        self.hook_scores = HookPoint()  # [batch, head, query, key] scaled, masked, pre-softmax
        self.hook_pattern = HookPoint()  # [batch, head, query, key]
        self.hook_z = HookPoint()  # [batch, seq, head, d_head] each head's weighted values

    def uses_eager(self) -> bool:
        return self.attn_implementation == "eager"

    def needs_eager(self) -> bool:
        """True when a hook is on a point only the eager implementation computes."""
        return any(getattr(self, name).active for name in self.EAGER_HOOKS)


def eager_attention(hp: AttentionHooks, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None, dropout: nn.Dropout) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head) + mask) v, through `hp.hook_scores` and `hp.hook_pattern`.
    q [batch, head, query, d_head], k and v [batch, head, key, d_head], mask additive
    -> [batch, head, query, d_head]."""
    scores = (q * hp.d_head**-0.5) @ k.transpose(-1, -2)  # [batch, head, query, key]
    if mask is not None:
        scores = scores + mask
    pattern = hp.hook_pattern(hp.hook_scores(scores).softmax(dim=-1))
    return dropout(pattern) @ v


def sdpa_attention(hp: AttentionHooks, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None, dropout: nn.Dropout) -> torch.Tensor:
    """The same product through torch's fused `scaled_dot_product_attention` (no pattern is materialised)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout.p if dropout.training else 0.0)


ATTENTION_FUNCTIONS = {"eager": eager_attention, "sdpa": sdpa_attention}


def attend(
    hp: AttentionHooks, x: torch.Tensor, query: nn.Module, key: nn.Module, value: nn.Module,
    mask: torch.Tensor | None, head_mask: torch.Tensor | None, dropout: nn.Dropout,
    x_query: torch.Tensor | None = None, unpadded: fast.Unpadded | None = None,
) -> torch.Tensor:
    """Multi-head self-attention of x [batch, seq, d_model] through `hp`'s hook points; returns
    z [batch, seq, head, d_head]. Shared by every family's layer. x_query [batch, n, d_model]: only those
    positions ask (z is [batch, n, head, d_head]); keys and values still come from every position of x.
    unpadded: x is a batch's real tokens [1, tokens, d_model] (`bertlab.fast.unpad_input`): q, k and v are
    padded back for the scores (mask: `unpadded.additive`) and z comes back as [1, tokens, head, d_head]."""

    def heads(t: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if unpadded is not None:
            t = fast.pad_output(t, unpadded)  # [batch, seq, d_model]
        return hook(t.view(*t.shape[:2], hp.n_heads, hp.d_head)).transpose(1, 2)  # [batch, head, seq, d_head]

    q = heads(query(x if x_query is None else x_query), hp.hook_q)
    k = heads(key(x), hp.hook_k)
    v = heads(value(x), hp.hook_v)
    z = ATTENTION_FUNCTIONS[hp.attn_implementation](hp, q, k, v, mask, dropout)  # [batch, head, seq, d_head]
    if head_mask is not None:  # [head]: 0 switches a head off (same as scaling its pattern)
        z = z * head_mask.to(z.dtype).view(1, -1, 1, 1)
    z = hp.hook_z(z.transpose(1, 2))  # [batch, seq, head, d_head]
    return z if unpadded is None else fast.repack(z, unpadded)


def write_heads(z: torch.Tensor, dense: nn.Linear, hook_result: HookPoint, n_heads: int) -> torch.Tensor:
    """The output projection of z [batch, seq, head, d_head] -> [batch, seq, d_model]; fills
    `hook_result` ([batch, seq, head, d_model], each head's write without bias) only when read."""
    if hook_result.active:
        weight = dense.weight() if callable(dense.weight) else dense.weight  # quantized Linear: a method
        if weight.is_quantized:
            weight = weight.dequantize()
        w = weight.reshape(-1, n_heads, z.shape[-1]).to(z.dtype)  # [d_model, head, d_head]
        hook_result(torch.einsum("bshe,mhe->bshm", z, w))
    return dense(z.flatten(2))


class BertSelfAttention(AttentionHooks):
    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.attention_probs_dropout_prob)  # on the pattern

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
        x_query: torch.Tensor | None = None, unpadded: fast.Unpadded | None = None,
    ) -> torch.Tensor:
        return attend(self, x, self.query, self.key, self.value, mask, head_mask, self.dropout, x_query, unpadded)


class Adapter(nn.Module):
    """Houlsby bottleneck adapter: x + up(gelu(down(x))); starts as (almost) the identity."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.down = nn.Linear(cfg.hidden_size, cfg.adapter_size)
        self.up = nn.Linear(cfg.adapter_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.gelu(self.down(x)))


class BertSelfOutput(nn.Module):
    """Output projection of attention, (adapter,) residual add, LayerNorm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None
        self.hook_result = HookPoint()  # [batch, seq, head, d_model] each head's write (no bias)
        self.hook_attn_out = HookPoint()  # [batch, seq, d_model] all heads + bias

    def forward(self, z: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        out = self.hook_attn_out(self.dropout(write_heads(z, self.dense, self.hook_result, self.n_heads)))
        if self.adapter is not None:
            out = self.adapter(out)
        return self.LayerNorm(out + resid)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                rows: torch.Tensor | None = None, unpadded: fast.Unpadded | None = None) -> torch.Tensor:
        """rows [batch, n]: only those positions ask and are written ([batch, n, d_model]); keys and values
        from all."""
        if rows is not None:
            asked = take_rows(x, rows)
            return self.output(self.self(x, mask, head_mask, asked), asked)
        return self.output(self.self(x, mask, head_mask, None, unpadded), x)


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [batch, seq, d] at positions rows [batch, n]: [batch, n, d]."""
    return x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


# ---------------------------------------------------------------------------------------------
# Feed-forward and one layer.   HF: bert.encoder.layer.N.{intermediate,output}.*
# ---------------------------------------------------------------------------------------------
class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act_name = cfg.hidden_act
        self.act = activation(cfg.hidden_act)
        self.hook_post = HookPoint()  # [batch, seq, d_mlp] after the activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hook_post(self.act(self.dense(x)))


class BertLayerOutput(nn.Module):
    """Feed-forward down-projection, residual add, LayerNorm (HF: `layer.N.output`)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.adapter = Adapter(cfg) if cfg.adapter_size else None
        self.hook_mlp_out = HookPoint()  # [batch, seq, d_model]

    def forward(self, h: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        out = self.hook_mlp_out(self.dropout(self.dense(h)))
        if self.adapter is not None:
            out = self.adapter(out)
        return self.LayerNorm(out + resid)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertLayerOutput(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, seq, d_model] input to the layer
        self.hook_resid_mid = HookPoint()  # [batch, seq, d_model] after attention (+ residual, LN)
        self.hook_resid_post = HookPoint()  # [batch, seq, d_model] after the MLP (+ residual, LN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                rows: torch.Tensor | None = None, unpadded: fast.Unpadded | None = None) -> torch.Tensor:
        """rows [batch, n]: the layer's output at those positions alone, [batch, n, d_model] (`BertAttention`).
        unpadded: x is the batch's real tokens [1, tokens, d_model], and so is the output."""
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(self.attention(x, mask, head_mask, rows, unpadded))
        return self.hook_resid_post(self.output(self.intermediate(mid), mid))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                rows: torch.Tensor | None = None, unpadded: fast.Unpadded | None = None) -> torch.Tensor:
        """rows [batch, n]: the last layer computes those positions alone: returns [batch, n, d_model].
        unpadded: x and the output are the real tokens [1, tokens, d_model] (with rows: the last layer pads
        back first and returns [batch, n, d_model])."""
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            if unpadded is not None and rows is not None and i == last:  # a few rows ask: back to [batch, seq]
                x, mask, unpadded = fast.pad_output(x, unpadded), unpadded.additive, None
            x = layer(x, mask, None if head_mask is None else head_mask[i], rows if i == last else None, unpadded)
        return x

    def watched(self) -> bool:
        """True when a hook reads (or changes) something in any layer."""
        return any(m.active for m in self.modules() if isinstance(m, HookPoint))

    def last_layer_watched(self) -> bool:
        """True when a hook reads (or changes) something in the last layer, whose positions it then sees."""
        return any(m.active for m in self.layer[-1].modules() if isinstance(m, HookPoint))


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # [batch, d_model] from [CLS]


class BertModel(nn.Module):
    """Embeddings + encoder (+ pooler): HF `BertModel`, stored under `bert.` in full models."""

    def __init__(self, cfg: BertConfig, embeddings: nn.Module | None = None):
        super().__init__()
        self.config = cfg
        self.embeddings = embeddings if embeddings is not None else BertEmbeddings(cfg)
        # factorised embeddings (ELECTRA's name): embedding_size -> hidden_size before the first layer
        factorised = cfg.embedding_size not in (None, cfg.hidden_size)
        self.embeddings_project = nn.Linear(cfg.embedding_size, cfg.hidden_size) if factorised else None
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if cfg.add_pooler else None
        self.packing: fast.Packing = "cpu"  # the unpadding switch (`bertlab.fast`); False: the reference path

    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq]
        token_type_ids: torch.Tensor | None = None,  # [batch, seq]
        attention_mask: torch.Tensor | None = None,  # [batch, seq] 1 = token, 0 = padding
        head_mask: torch.Tensor | None = None,  # [layer, head]
        rows: torch.Tensor | None = None,  # [batch, n] (`bertlab.fast.asked_rows`)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sequence output [batch, seq, d_model], pooled [batch, d_model] or None). rows: the last layer computes
        those positions alone (row 0 of each is what the pooler reads) and the sequence output is
        [batch, n, d_model]; taken only when no hook watches the last layer (hooks there see every position)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        if rows is not None and (not len(self.encoder.layer) or self.encoder.last_layer_watched()
                                 or self.config.is_decoder):  # a decoder's mask differs row by row
            rows = None
        if self.config.is_decoder:  # HF's BertLMHeadModel: each position reads itself and its left, no padding
            mask = masks.causal_mask(input_ids.shape[1], x.dtype, x.device, attention_mask)
        else:
            mask = extended_mask(attention_mask, x.dtype)
        if len(self.encoder.layer) and fast.unpads(self.packing, self.training, attention_mask, head_mask,
                                                   self.encoder.watched()):
            packed, where = fast.unpad_input(x, attention_mask, mask)
            x = self.encoder(packed, where.additive, None, rows, where)
            x = x if rows is not None else fast.pad_output(x, where)  # a last layer on a few rows came back padded
        else:
            x = self.encoder(x, mask, head_mask, rows)
        return x, (self.pooler(x) if self.pooler is not None else None)


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """MLM head: transform, then the decoder tied to the word embeddings, plus a bias. Untied
    (config.json's tie_word_embeddings false) the decoder is a Linear of its own, bias included, as in HF."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.tied = decoder_is_tied(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=not self.tied)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tied else self.decoder.bias
        return F.linear(self.transform(x), self.decoder.weight, bias)  # [..., vocab]


def decoder_is_tied(cfg: BertConfig) -> bool:
    """Whether an MLM decoder is the word embeddings (config.json's tie_word_embeddings, default true)."""
    return cfg.extra.get("tie_word_embeddings", True) is not False


class BertPreTrainingHeads(nn.Module):
    """HF `cls`: `predictions` (MLM) and/or `seq_relationship` (NSP)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg) if "mlm" in cfg.pretraining_heads else None
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2) if "nsp" in cfg.pretraining_heads else None


class ClassificationHead(nn.Module):
    """Sentence classifier on the first token: dense, activation, out_proj (RoBERTa: tanh, ELECTRA: gelu)."""

    def __init__(self, cfg: BertConfig, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = nn.Dropout(classifier_dropout(cfg))
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.num_labels)
        self.act = act

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        x = self.dropout(seq[:, 0])
        return self.out_proj(self.dropout(self.act(self.dense(x))))  # [batch, labels]


def classifier_dropout(cfg: BertConfig) -> float:
    """HF's classifier dropout: config.json's classifier_dropout, else hidden_dropout_prob."""
    return cfg.extra.get("classifier_dropout") or cfg.hidden_dropout_prob


def add_task_heads(model: nn.Module, cfg: BertConfig, dropout_p: float | None = None,
                   sentence_act: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Give `model` the head of `cfg.task` under HF's names: `dropout` + `classifier` (a Linear) for
    token classification and for sequence classification of the pooled output; `qa_outputs` for
    question answering. With `sentence_act`, sequence classification is a `ClassificationHead` on
    the first token instead (RoBERTa: tanh, ELECTRA: gelu). dropout_p: default `classifier_dropout`."""
    if cfg.task == "sequence_classification" and sentence_act is not None:
        model.classifier = ClassificationHead(cfg, sentence_act)
    elif cfg.task in ("sequence_classification", "token_classification"):
        model.dropout = nn.Dropout(classifier_dropout(cfg) if dropout_p is None else dropout_p)
        model.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)
    elif cfg.task == "question_answering":
        model.qa_outputs = nn.Linear(cfg.hidden_size, 2)


def task_logits(out: ModelOutput, model: nn.Module, seq: torch.Tensor, pooled: torch.Tensor | None) -> None:
    """Fill `out` from the head `add_task_heads` gave `model`: classification into `logits`
    ([batch, labels] from `pooled`, or from `seq` through a ClassificationHead; [batch, seq, labels]),
    question answering into `start_logits` / `end_logits` ([batch, seq]). No task: nothing."""
    task = model.config.task
    if task == "sequence_classification" and isinstance(model.classifier, ClassificationHead):
        out.logits = model.classifier(seq)
    elif task == "sequence_classification":
        out.logits = model.classifier(model.dropout(pooled))
    elif task == "token_classification":
        out.logits = model.classifier(model.dropout(seq))
    elif task == "question_answering":
        start, end = model.qa_outputs(seq).unbind(-1)
        out.start_logits, out.end_logits = start.contiguous(), end.contiguous()


@dataclass
class ModelOutput:
    """What a forward pass returns; fields without a head stay None."""

    last_hidden_state: torch.Tensor  # [batch, seq, d_model]
    pooler_output: torch.Tensor | None = None  # [batch, d_model]
    mlm_logits: torch.Tensor | None = None  # [batch, seq, vocab], or [n, vocab] at mlm_positions
    nsp_logits: torch.Tensor | None = None  # [batch, 2]: 0 = IsNext, 1 = NotNext
    logits: torch.Tensor | None = None  # [batch, labels] or [batch, seq, labels]
    start_logits: torch.Tensor | None = None  # [batch, seq]
    end_logits: torch.Tensor | None = None  # [batch, seq]
    rtd_logits: torch.Tensor | None = None  # [batch, seq] ELECTRA discriminator: > 0 = "replaced"

