"""bertlab's BERT: Hugging Face's module layout and weight names, with hook points.

Read top-down, in the order data flows: embeddings, attention, one layer, the encoder, the heads. Every
HookPoint carries its shape in a comment. Attention has two implementations that give the same numbers, chosen
once per model as transformers' `attn_implementation` is: "eager" materialises the scores and the pattern
(what a hook on `hook_scores` / `hook_pattern` reads: `model.hooks` switches to it while such a hook is on),
"sdpa" is torch's fused `scaled_dot_product_attention` (the default).

What only makes training faster (unpadding, the last layer on the rows the heads read) is decided in
`bertlab.fast`; these modules only take its values (`unpadded`, `rows`) as arguments.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal

import torch
import torch.nn.functional as F
from torch import nn

from bertlab import fast
from bertlab.config import BertConfig, ConfigError
from bertlab.hooks import (
    ActivationCache,
    GradHookFn,
    HookFn,
    HookPoint,
    NameFilter,
    hooks,
    name_hook_points,
    select,
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
    whole model by `HookedModel.set_attn_implementation` and by `HookedModel.hooks`). A family's attention
    module inherits them; ALBERT keeps one set per depth because its layer is shared."""

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
        # (model, input_ids, token_type_ids, attention_mask) -> (sequence output, pooled), or None to run the
        # modules: the model compiled for inference (`bertlab.compressed.engine`: an int8 model's). Asked only
        # for whole sequences and no masked heads.
        self.engine: Callable[..., tuple[torch.Tensor, torch.Tensor | None] | None] | None = None

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
        if self.engine is not None and rows is None and head_mask is None:
            out = self.engine(self, input_ids, token_type_ids, attention_mask)
            if out is not None:
                return out
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        if rows is not None and (not len(self.encoder.layer) or self.encoder.last_layer_watched()):
            rows = None
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


# ---------------------------------------------------------------------------------------------
# What every family's whole model shares: hooks, caching, the attention path, its family
# ---------------------------------------------------------------------------------------------
class HookedModel(nn.Module):
    """Base of every family's whole model (`Bert` here, the others in `bertlab.families`).
    Subclasses set `self.hook_points = name_hook_points(self)` at the end of `__init__`."""

    config: BertConfig
    hook_points: dict[str, HookPoint]
    # The family record (bertlab.families.core.Family) of the class: its family module sets it where it
    # builds the record, so the model core never imports the families (they import it).
    FAMILY: Any

    @classmethod
    def check_family(cls, config: BertConfig) -> None:
        """Refuse (ConfigError) a config of another family: each family's model class builds its own."""
        if not hasattr(cls, "FAMILY"):  # the family modules hand each class its record when they are imported
            raise ConfigError(f"{cls.__name__} has no family record yet: import bertlab.families (bertlab.load "
                              f"and bertlab.training do) before building a model from its class.")
        if config.model_type != cls.FAMILY.name:
            raise ConfigError(f"model_type {str(config.model_type)[:40]!r} is not {cls.FAMILY.name!r}: a "
                              f"{cls.__name__} builds {cls.FAMILY.display} models "
                              f"only (bertlab.load builds any model by its config.json's model_type).")

    def _init_weights(self, m: nn.Module) -> None:
        """HF's initialisation of one module (`self.apply(self._init_weights)`): normal(0, initializer_range)
        weights, zero biases and padding row, LayerNorms at identity."""
        std = self.config.initializer_range
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, Adapter):  # near-identity start (Houlsby et al. 2019); runs after its Linears
            nn.init.normal_(m.down.weight, std=1e-3)
            nn.init.normal_(m.up.weight, std=1e-3)

    def tie_weights(self) -> None:
        """Re-link weights the model shares (BERT's MLM decoder and word embeddings); nothing by default."""

    def lens_input(self, states: torch.Tensor) -> torch.Tensor:
        """Every stage's stream as the MLM head expects it (the logit lens): states [stage, ..., d_model],
        stage 0 the embeddings and the last the encoder's output. Post-norm families (BERT's) hand the
        head normalised streams already: the identity. A pre-norm family normalises the intermediate
        stages with its final norm."""
        return states

    @property
    def family(self):
        """The model's family protocol (`bertlab.families.ModelFamily`): logical layers, hook
        names, special tokens, word boundaries."""
        return self.FAMILY.bind(self.config)

    def hook_names(self) -> list[str]:
        return list(self.hook_points)

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[NameFilter, HookFn]],
              bwd_hooks: Iterable[tuple[NameFilter, GradHookFn]] = ()) -> Iterator["HookedModel"]:
        """`with model.hooks([(names, fn)], bwd_hooks=[(names, grad_fn)]):` — hooks are removed on exit,
        whatever happens. A backward hook gets (gradient, name) when the block's backward pass runs. While a
        hook is on a point only eager attention computes (the scores, the pattern), the model runs eager."""
        with hooks(self.hook_points, fwd_hooks, bwd_hooks):
            attention = [m for m in self.modules() if isinstance(m, AttentionHooks)]
            before = [m.attn_implementation for m in attention]
            eager = any(m.needs_eager() for m in attention)
            try:
                if eager:
                    self.set_attn_implementation("eager")
                yield self
            finally:
                for m, impl in zip(attention, before):
                    m.attn_implementation = impl

    def run_with_cache(
        self, *args, names: NameFilter = None, layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None, dtype: torch.dtype | None = None, **kwargs
    ) -> tuple[ModelOutput, ActivationCache]:
        """Forward pass that also returns the activations at `names` (default: all hook points).

        layers: keep only the names of these layers (and none outside layers). heads: keep only
        these heads of `hook_scores` / `hook_pattern` ([batch, len(heads), query, key], in that
        order). dtype: store
        floating activations in it (e.g. torch.float16: half the memory). The outputs do not change."""
        picked = select(self.hook_points, names)
        if layers is not None:
            wanted = {self._layer_index(i) for i in layers}
            picked = [n for n in picked if self.family.layer_of(n) in wanted]
        head_list = None if heads is None else [int(h) for h in heads]
        cache = ActivationCache(layers=self.family)

        def store(x: torch.Tensor, name: str) -> None:
            per_head = name.endswith(("hook_pattern", "hook_scores"))
            if head_list is not None and per_head and x.shape[1] != len(head_list):
                x = x[:, head_list]  # a family whose attention computes every head
            x = x.detach()
            cache[name] = x.to(dtype) if dtype is not None and x.is_floating_point() else x

        if head_list is not None:
            self._check_heads(head_list, [m for m in self.modules() if isinstance(m, AttentionHooks)])
        with self.hooks([(picked, store)]):
            out = self(*args, **kwargs)
        return out, cache

    def _layer_index(self, i: int) -> int:
        n = self.family.num_layers
        if not -n <= int(i) < n:
            raise IndexError(f"layer {i} does not exist: this model has layers 0..{n - 1}.")
        return int(i) % n

    @staticmethod
    def _check_heads(heads: list[int], attention: list[AttentionHooks]) -> None:
        n = min((m.n_heads for m in attention), default=0)
        bad = [h for h in heads if not 0 <= h < n]
        if bad:
            raise IndexError(f"head {bad[0]} does not exist: each layer has heads 0..{n - 1}.")

    def set_attn_implementation(self, name: AttnImplementation) -> None:
        """Every attention layer's implementation: "sdpa" (the default) or "eager" (transformers' names)."""
        if name not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {name!r}.")
        for m in self.modules():
            if isinstance(m, AttentionHooks):
                m.attn_implementation = name


# ---------------------------------------------------------------------------------------------
# The whole model
# ---------------------------------------------------------------------------------------------
class Bert(HookedModel):
    """A BERT encoder with whichever heads its config names; HF weight names throughout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.check_family(config)
        if config.embedding_size not in (None, config.hidden_size):
            raise ConfigError(
                f"embedding_size {config.embedding_size} differs from hidden_size {config.hidden_size}: BERT has no "
                f"embedding projection (ALBERT and ELECTRA do: set model_type to one of them)."
            )
        needs_pooler = "nsp" in config.pretraining_heads or config.task == "sequence_classification"
        if needs_pooler and not config.add_pooler:
            config = config.replace(add_pooler=True)
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config) if config.pretraining_heads else None
        self._build_task_head()
        if not any(p.is_meta for p in self.parameters()):  # on meta, every weight comes from a file
            self.apply(self._init_weights)
        self.tie_weights()
        self.hook_points = name_hook_points(self)

    def _build_task_head(self) -> None:
        cfg = self.config
        if cfg.task in ("sequence_classification", "token_classification") and cfg.num_labels < 1:
            raise ValueError(f"a {cfg.task} head needs labels: set config.id2label.")
        add_task_heads(self, cfg)

    def tie_weights(self) -> None:
        if self.has_mlm and self.cls.predictions.tied:
            self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    # -- what it has ------------------------------------------------------------------------
    @property
    def has_mlm(self) -> bool:
        return self.cls is not None and self.cls.predictions is not None

    @property
    def has_nsp(self) -> bool:
        return self.cls is not None and self.cls.seq_relationship is not None

    @property
    def has_rtd(self) -> bool:
        """Replaced-token detection is ELECTRA's (bertlab.families.electra); BERT never has it."""
        return False

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under the names transformers writes: a tied decoder stored once (as the word
        embeddings), a bare encoder (HF's BertModel) without its prefix."""
        tied = set(self.family.family.tied) if self.has_mlm and self.cls.predictions.tied else set()
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if k not in tied}
        if self.config.architecture == "BertModel":
            prefix = self.family.prefix + "."
            state = {k.removeprefix(prefix): v for k, v in state.items()}
        return state

    def hf_config(self) -> dict:
        """config.json's dict (what transformers reads back)."""
        return self.config.to_hf_dict()

    def describe(self) -> str:
        """One line for the UI: size and heads."""
        c = self.config
        heads = [h.upper() for h in c.pretraining_heads] + ([c.task.replace("_", " ")] if c.task else [])
        n = sum(p.numel() for p in self.parameters()) / 1e6
        return (
            f"{c.num_hidden_layers} layers, {c.hidden_size} wide, {c.num_attention_heads} heads, "
            f"{n:.1f}M parameters; heads: {', '.join(heads) if heads else 'none (encoder only)'}"
        )

    def with_heads(
        self,
        pretraining_heads: Iterable[str] = (),
        task: str | None = None,
        id2label: dict[int, str] | None = None,
        adapter_size: int | None = -1,
    ) -> "Bert":
        """A new model with this one's encoder weights (copied) and fresh heads (and adapters) where new.
        adapter_size: -1 keeps this model's adapters, None removes them, N adds N-wide ones."""
        cfg = self.config.replace(
            pretraining_heads=tuple(pretraining_heads), task=task, id2label=dict(id2label or {}),
            adapter_size=self.config.adapter_size if adapter_size == -1 else adapter_size,
        )
        new = Bert(cfg)
        ours, theirs = self.state_dict(), new.state_dict()
        kept = {k: v for k, v in ours.items() if k in theirs}
        fresh = set(theirs) - set(kept)
        encoder = tuple(f"{self.family.prefix}.{part}" for part in ("embeddings", "encoder"))
        if any(k.startswith(encoder) and ".adapter." not in k for k in fresh):
            raise RuntimeError(f"with_heads lost encoder weights: {sorted(fresh)[:3]}")
        theirs.update(kept)  # encoder and any heads both models have; new heads stay freshly initialised
        new.load_state_dict(theirs)
        new.tie_weights()
        return new

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
        self._check_input(input_ids, token_type_ids)
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
        if not len(self.bert.encoder.layer) or self.bert.encoder.last_layer_watched():
            return None, None
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

    def _check_input(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq]; got shape {tuple(input_ids.shape)}.")
        limit = self.config.max_position_embeddings - self.config.position_offset
        if input_ids.shape[1] > limit:
            raise ValueError(
                f"the input is {input_ids.shape[1]} tokens long; this model reads at most {limit}. "
                f"Encode with the model's tokenizer, which cuts long texts with a warning."
            )
        if token_type_ids is None or token_type_ids.device.type != "cpu":  # a GPU's max would wait for the device
            return
        if int(token_type_ids.max()) >= self.config.type_vocab_size:
            raise ValueError(f"this model has {self.config.type_vocab_size} segment type(s); got a segment id "
                             f"{int(token_type_ids.max())}.")

    def require(self, head: str) -> None:
        """Raise a MissingHeadError a student can act on when `head` ("mlm" or "nsp") is absent."""
        what = {"mlm": "masked-word prediction (MLM)", "nsp": "next-sentence prediction (NSP)",
                "sop": "sentence-order prediction (SOP, an ALBERT head)",
                "rtd": "replaced-token detection (an ELECTRA discriminator head)"}
        if head not in what:
            raise ValueError(f"unknown head {head!r}; heads are {', '.join(what)}.")
        if not {"mlm": self.has_mlm, "nsp": self.has_nsp}.get(head, False):
            what = what[head]
            raise MissingHeadError(
                f"this model has no {head.upper()} head, so {what} is not available. "
                f"Train one in the pre-training tab, or load a checkpoint that has it (e.g. bert-base-uncased)."
            )

