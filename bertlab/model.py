"""bertlab's BERT: Hugging Face module layout and weight names, with hook points.

Read top-down: embeddings, attention, one layer, the encoder, the heads, the whole model.
Every HookPoint carries its shape in a comment. Two attention paths give the same numbers:
the eager one materialises the pattern (used when a hook reads scores/pattern), the fused
`scaled_dot_product_attention` is used otherwise. While training with dropout on a CPU the eager one runs too
(on q, k and v laid out head by head), so that the pattern's mask is `Dropout`'s (`dropout_scale`), not SDPA's.
"""

from __future__ import annotations

import math
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import BertConfig, ConfigError
from bertlab.hooks import (
    ActivationCache,
    GradHookFn,
    HookFn,
    HookPoint,
    NameFilter,
    hooks,
    module_hooked,
    name_hook_points,
    reads_only,
    select,
)

AttentionPath = Literal["auto", "eager", "sdpa"]


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


def _activation(name: str):
    kind = activation_kind(name)
    if kind == ACT_ERF:
        return F.gelu
    if kind == ACT_TANH:
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------
def dropout_scale(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout's multiplier for x (its shape and dtype): 0 with probability p, else 1 / (1 - p), as `F.dropout`
    scales. Two 16-bit draws come from each 32-bit random integer (its low half uniform on the int16s, its high
    half on [0, 2**15): the integers are drawn on [0, 2**31)), each compared with p's share of its range, so the
    rate holds to within 2**-16 of p: on a CPU that costs far less than `bernoulli_`, which `F.dropout` draws its
    mask with there (the pre-training profile's dropout column, bench/results/pretrain.json, measures both)."""
    n = x.numel()
    draws = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()  # uniform on [0, 2**31)
    halves = draws.view(torch.int16).view(-1, 2)  # [n / 2, 2]: both halves of each draw
    low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
    scale = torch.empty(halves.shape, dtype=x.dtype, device=x.device)
    torch.ge(halves[:, low], round(p * 2**16) - 2**15, out=scale[:, low])  # 1 (kept) or 0
    torch.ge(halves[:, high], round(p * 2**15), out=scale[:, high])
    return scale.view(-1)[:n].view(x.shape).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` (same p, the kept elements scaled by 1 / (1 - p), no weights) whose mask, while training on a
    CPU, is `dropout_scale`'s; elsewhere (a GPU's fused kernel), in place or at p = 1 it is `F.dropout`'s. In eval
    mode, with no hook to run, a call hands its input back without nn.Module's call machinery (as a `HookPoint`
    does): a layer calls two or three of them, and at batch 1 each call costs about what a small kernel does."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or module_hooked(self):
            return super().__call__(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not 0.0 < self.p < 1.0 or self.inplace or x.device.type != "cpu":
            return super().forward(x)
        return x * dropout_scale(x, self.p)


# ---------------------------------------------------------------------------------------------
# Embeddings: token + segment + position, summed, normalised.
# ---------------------------------------------------------------------------------------------
_ROW_GRADIENTS = threading.local()


@contextmanager
def row_gradients() -> Iterator[None]:
    """While inside, in this thread, a `GradTable` zeroes only the rows written since it was last zeroed and tells
    `clip_and_step` which rows to read. bertlab's training loop steps inside: it knows every write to a gradient
    between a backward and the next zeroing (its clip and fused step only scale the gradients, which keeps zero
    rows zero, and a non-finite norm taints the tables). Outside (anyone's own loop), a table is zeroed whole."""
    before = getattr(_ROW_GRADIENTS, "on", False)
    _ROW_GRADIENTS.on = True
    try:
        yield
    finally:
        _ROW_GRADIENTS.on = before


class GradTable:
    """An embedding table's gradient kept between training steps, and the rows written into it since it was last
    zeroed. A batch touches a few hundred of a vocabulary's rows: inside `row_gradients`, zeroing those rows alone
    and reading only them for the gradient's norm (`clip_and_step`) saves two passes over the whole table each
    step. Clean while nothing but `add` wrote to the tensor (its version counter says so) inside `row_gradients`;
    `taint` marks it otherwise, and the next zeroing then zeroes all of it."""

    def __init__(self, like: torch.Tensor):
        self.tensor = torch.zeros_like(like)
        self.tensor._bertlab_grad_table = self  # type: ignore[attr-defined]  # how clip_and_step finds it
        self.rows: list[torch.Tensor] = []  # ids added since the last zeroing
        self.version: int | None = None  # the tensor's version after the last write known to keep zero rows zero

    @staticmethod
    def of(grad: torch.Tensor) -> GradTable | None:
        """The table whose kept tensor `grad` is, if any."""
        table = getattr(grad, "_bertlab_grad_table", None)
        return table if table is not None and table.tensor is grad else None

    def clean(self) -> bool:
        """Whether the rows not in `rows` are all zeros (no write but `add`'s since the last zeroing)."""
        return self.version is not None and self.tensor._version == self.version

    def taint(self) -> None:
        """Something may have written any row (a non-finite clip): the next zeroing zeroes all of it."""
        self.version = None

    def zeroed(self) -> torch.Tensor:
        """The tensor, all zeros: the rows written since the last zeroing, or all of it when unsure."""
        by_rows = getattr(_ROW_GRADIENTS, "on", False)
        if not (by_rows and self.clean()):
            self.tensor.zero_()
        elif self.rows:
            self.tensor.index_fill_(0, torch.cat(self.rows), 0.0)
        self.rows = []
        self.version = self.tensor._version if by_rows else None
        return self.tensor

    def add(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """tensor[ids] += values (repeated ids add up), recorded."""
        clean = self.clean()
        self.tensor.index_add_(0, ids, values)
        if clean:
            self.rows.append(ids)
            self.version = self.tensor._version

    def touched(self) -> torch.Tensor | None:
        """The rows that may be non-zero (each once), or None when any row may be."""
        if not self.clean():
            return None
        return torch.unique(torch.cat(self.rows)) if self.rows else self.tensor.new_empty(0, dtype=torch.long)


class _LookupIntoGrad(torch.autograd.Function):
    """`F.embedding` whose backward adds the looked-up rows' gradients into the table's `.grad` in place (set to
    `table`'s kept tensor, zeroed, when it is None) instead of returning a fresh [vocab, d] gradient: on a CPU a
    fresh table of gradients is new memory every step, mapped page by page. The same sums as the ordinary
    backward."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None,  # type: ignore[override]
                table: GradTable) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.table = weight, padding_idx, table
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        weight, flat, table = ctx.weight, ids.reshape(-1), ctx.table
        rows = grad.reshape(flat.shape[0], -1)  # [tokens, d]
        if ctx.padding_idx is not None:  # the padding row gets no gradient, as F.embedding's backward
            rows = rows * (flat != ctx.padding_idx).unsqueeze(1).to(rows.dtype)
        if weight.grad is None:
            weight.grad = table.zeroed()
        if weight.grad is table.tensor:
            table.add(flat, rows.to(weight.grad.dtype))
        else:  # another gradient got there first (a tied decoder's): add into it
            weight.grad.index_add_(0, flat, rows.to(weight.grad.dtype))
        return None, None, None, None


def lookup(table: nn.Embedding, ids: torch.Tensor, owner: nn.Module) -> torch.Tensor:
    """`table(ids)`; while `owner` trains a table on the CPU, the backward accumulates into one gradient kept
    between steps (`GradTable`), dropped when `owner` goes to evaluation."""
    w = table.weight
    plain = table.max_norm is None and not table.sparse and not table.scale_grad_by_freq
    busy = w.grad is not None and (w.grad.shape != w.shape or w.grad.dtype != w.dtype or w.grad.is_sparse)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not (owner.training and torch.is_grad_enabled() and w.requires_grad and w.device.type == "cpu" and plain
            and not busy and not distributed):
        return table(ids)
    kept = getattr(owner, "_grad_buffer", None)
    if kept is None or kept.tensor.shape != w.shape or kept.tensor.dtype != w.dtype:
        kept = owner._grad_buffer = GradTable(w)
    return _LookupIntoGrad.apply(ids, w, table.padding_idx, kept)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        width = cfg.embedding_size or cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, width, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, width)
        # type_vocab_size 0 (DistilBERT): no segment embeddings at all
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.LayerNorm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.position_offset = cfg.position_offset
        self.hook_word = HookPoint()  # [batch, seq, d_model]
        self.hook_token_type = HookPoint()  # [batch, seq, d_model]
        self.hook_position = HookPoint()  # [batch, seq, d_model]
        self.hook_sum = HookPoint()  # [batch, seq, d_model] before LayerNorm
        self.hook_out = HookPoint()  # [batch, seq, d_model] normalised sum
        self._grad_buffer: GradTable | None = None  # the word table's gradient while training (`lookup`)

    def train(self, mode: bool = True) -> BertEmbeddings:
        if not mode:
            self._grad_buffer = None  # evaluation: the training buffer's memory goes back
        return super().train(mode)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[seq] (or [batch, seq]) position of each token; families override (RoBERTa counts non-padding)."""
        return torch.arange(input_ids.shape[1], device=input_ids.device) + self.position_offset

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        word = self.hook_word(lookup(self.word_embeddings, input_ids, self))
        position = self.hook_position(self.position_embeddings(self.position_ids(input_ids)).expand_as(word))
        total = word + position
        if self.token_type_embeddings is not None:
            total = total + self.hook_token_type(self.token_type_embeddings(token_type_ids))
        total = self.hook_sum(total)
        return self.hook_out(self.dropout(self.LayerNorm(total)))


# ---------------------------------------------------------------------------------------------
# Self-attention
# ---------------------------------------------------------------------------------------------
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention returning (output, pattern).
    q, k, v: [batch, head, seq, d_head]; mask: additive, broadcastable to [batch, head, q, k]."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    pattern = scores.softmax(dim=-1)
    return pattern @ v, pattern


class AttentionHooks(nn.Module):
    """The hook points of one logical attention layer and its path choice. A family's attention
    module inherits them; ALBERT keeps one set per depth because its layer is shared."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.d_head = cfg.head_dim
        self.path: AttentionPath = "auto"
        self.hook_q = HookPoint()  # [batch, seq, head, d_head]
        self.hook_k = HookPoint()  # [batch, seq, head, d_head]
        self.hook_v = HookPoint()  # [batch, seq, head, d_head]
        self.hook_scores = HookPoint()  # [batch, head, query, key] scaled, masked, pre-softmax
        self.hook_pattern = HookPoint()  # [batch, head, query, key]
        self.hook_z = HookPoint()  # [batch, seq, head, d_head] each head's weighted values
        # heads whose scores/pattern a cache reads (set by run_with_cache while it runs): None = all heads
        self.capture_heads: list[int] | None = None

    def uses_eager(self) -> bool:
        if self.path == "auto":
            return (self.hook_scores.active or self.hook_pattern.active) and not self.side_pattern()
        return self.path == "eager"

    def side_pattern(self) -> bool:
        """Only caches read the pattern, and only some heads': the fused path makes the output and
        those heads' scores/pattern are computed beside it (`attend`)."""
        if self.path != "auto" or self.capture_heads is None:
            return False
        points = (self.hook_scores, self.hook_pattern)
        return any(p.active for p in points) and all(reads_only(p) for p in points)


class Packing:
    """The real tokens of a padded batch, packed: the encoder's linears, LayerNorms and feed-forward then run on
    [1, tokens, d] with no padding in them, and attention pads q, k and v back to [batch, seq] for the scores
    (MosaicBERT and ModernBERT train this way). `BertModel` packs while training, when no hook is watching."""

    def __init__(self, attention_mask: torch.Tensor, dtype: torch.dtype, index: torch.Tensor | None = None):
        self.batch, self.seq = attention_mask.shape
        # flat positions of the real tokens: `index` when the host found them (`PackingPlan`), else looked up here
        # (on a GPU, nonzero waits for the device)
        self.index = index if index is not None else attention_mask.reshape(-1).nonzero().squeeze(1)
        self.additive = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, ...] -> [1, tokens, ...]."""
        return x.reshape(self.batch * self.seq, *x.shape[2:]).index_select(0, self.index)[None]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, tokens, ...] -> [batch, seq, ...], zeros at the padding."""
        flat = x.new_zeros(self.batch * self.seq, *x.shape[2:]).index_copy_(0, self.index, x[0])  # in place: an
        # out-of-place index_copy would copy the fresh zeros first
        return flat.view(self.batch, self.seq, *x.shape[2:])


class PackingPlan:
    """What the host knows of a batch's padding before the batch moves to a GPU: its share of padding and the
    flat positions of its real tokens, found on the CPU mask before the forward. `BertModel` asked with that very
    mask on the device (`packing_plan`) packs without waiting for the device (`nonzero` on a GPU tensor does), and
    drops the mask when nothing is padded (bench/results/packing_cuda.json measures both on an H100)."""

    def __init__(self, cpu_mask: torch.Tensor, device_mask: torch.Tensor):
        self.mask = device_mask
        flat = cpu_mask.reshape(-1)
        self._index_cpu = flat.nonzero().squeeze(1)
        self.padding = 1.0 - len(self._index_cpu) / max(1, flat.numel())
        self._index: torch.Tensor | None = None

    @property
    def index(self) -> torch.Tensor:
        """The real tokens' flat positions, on the mask's device (copied there at the first ask)."""
        if self._index is None:
            self._index = self._index_cpu.to(self.mask.device, non_blocking=True)
        return self._index


_PLANS = threading.local()


@contextmanager
def packing_plan(cpu_mask: torch.Tensor | None, device_mask: torch.Tensor | None) -> Iterator[PackingPlan | None]:
    """While inside, a `BertModel` of this thread given `device_mask` (the same tensor) packs from the host's
    plan (on a CPU both masks are one tensor, and the plan only finds once what `Packing` would). A no-op without
    masks, or with a host mask that is not on the CPU or not the device mask's shape."""
    if cpu_mask is None or device_mask is None or cpu_mask.device.type != "cpu" or cpu_mask.shape != device_mask.shape:
        yield None
        return
    plan = PackingPlan(cpu_mask, device_mask)
    before = getattr(_PLANS, "plan", None)
    _PLANS.plan = plan
    try:
        yield plan
    finally:
        _PLANS.plan = before


def _plan_for(attention_mask: torch.Tensor) -> PackingPlan | None:
    plan = getattr(_PLANS, "plan", None)
    return plan if plan is not None and plan.mask is attention_mask else None


def _head_major(t: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """t [batch, seq, n * d_model] -> [n, batch, head, seq, d_head], contiguous (one permuting copy)."""
    return t.view(*t.shape[:2], -1, n_heads, d_head).permute(2, 0, 3, 1, 4).contiguous()


class _HeadMajor(torch.autograd.Function):
    """t [batch, seq, n * d_model] (n tensors side by side: q, k and v, or one of them) -> [n, batch, head, seq,
    d_head], contiguous; its backward lays the gradient back out in one permuting copy (autograd's own backward of
    `.contiguous()` on the permuted view, through a reshape of a strided gradient, was slower on a CPU)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:  # type: ignore[override]
        ctx.shape = t.shape
        return _head_major(t, n_heads, d_head)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad.permute(1, 3, 0, 2, 4).reshape(ctx.shape), None, None


class _PaddedHeadMajor(torch.autograd.Function):
    """Packed q, k and v side by side (y [1, tokens, 3 * d_model]) -> q, k and v, each [batch, head, seq, d_head]
    and contiguous, zeros at the padding: `Packing.pad` then `_HeadMajor`, with a backward that lays each gradient
    back out token by token into one buffer and reads the real tokens' rows from it (autograd's, through `unbind`
    and the padding, stacked the three gradients first: one more pass over the padded batch)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, packing: Packing, n_heads: int, d_head: int):  # type: ignore[override]
        ctx.packing, ctx.shape = packing, y.shape
        q, k, v = _head_major(packing.pad(y), n_heads, d_head)  # [batch, head, seq, d_head] each
        return q, k, v

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):  # type: ignore[override]
        packing = ctx.packing
        some = next(g for g in grads if g is not None)
        batch, n_heads, seq, d_head = some.shape
        buf = some.new_empty(batch, seq, len(grads), n_heads, d_head)  # token by token, q, k and v side by side
        for j, g in enumerate(grads):
            if g is None:
                buf[:, :, j].zero_()
            else:
                buf[:, :, j].copy_(g.permute(0, 2, 1, 3))
        return buf.view(batch * seq, -1).index_select(0, packing.index).view(ctx.shape), None, None, None


def _cpu_dropout_attention(hp: AttentionHooks, dropout: nn.Dropout, x: torch.Tensor) -> bool:
    """Whether `attend` trains through its eager products, whose `Dropout` draws the pattern's mask with
    `dropout_scale`: training with attention dropout on a CPU, the path left to bertlab ("auto") and no hook
    reading the scores or the pattern. SDPA, given a dropout there, takes its math path, which draws the mask
    with `bernoulli_` and checks the scores for rows of -inf at every call."""
    return (dropout.training and 0.0 < dropout.p < 1.0 and x.device.type == "cpu" and torch.is_grad_enabled()
            and hp.path == "auto" and not hp.uses_eager() and not hp.side_pattern())


def attend(
    hp: AttentionHooks, x: torch.Tensor, query: nn.Module, key: nn.Module, value: nn.Module,
    mask: torch.Tensor | None, head_mask: torch.Tensor | None, dropout: nn.Dropout,
    x_query: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-head self-attention of x [batch, seq, d_model] through `hp`'s hook points;
    returns z [batch, seq, head, d_head]. Shared by every family's layer. With `x_query`
    [batch, n, d_model], only those positions ask (z is [batch, n, head, d_head]); keys and
    values still come from every position of x."""

    packing = mask if isinstance(mask, Packing) else None  # x is [1, tokens, d]: pad q, k, v for the scores
    if packing is not None:
        mask = packing.additive
    padded = packing.pad if packing is not None else (lambda t: t)

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(*t.shape[:2], hp.n_heads, hp.d_head)  # [batch, seq, head, d_head]

    sizes = [query.out_features, key.out_features, value.out_features]
    fused = one_projection(query, key, value)
    cpu_dropout = _cpu_dropout_attention(hp, dropout, x) and head_mask is None
    head_major = x_query is None and len(set(sizes)) == 1 and (packing is None or _plain_linears(query, key, value))
    if cpu_dropout and head_major:
        # training on a CPU: q, k and v laid out head by head, so that the products below read them as they lie;
        # packed, from one matmul, padded back and laid out in one copy each (unpacked, three matmuls measured faster)
        if packing is not None:  # [batch, head, seq, d_head] each
            heads = _PaddedHeadMajor.apply(_stacked_projection(x, query, key, value), packing, hp.n_heads, hp.d_head)
        else:
            heads = [_HeadMajor.apply(lin(x), hp.n_heads, hp.d_head).squeeze(0) for lin in (query, key, value)]
        q, k, v = (hook(t.transpose(1, 2)).transpose(1, 2) for hook, t in zip((hp.hook_q, hp.hook_k, hp.hook_v), heads))
    else:
        if fused is not None:  # q, k and v are rows of one Linear (an int8 model's): one matmul for the three
            qx, kx, vx = (padded(t) for t in fused(x).split(sizes, dim=-1))
            qx = qx if x_query is None else padded(query(x_query))
        elif packing is not None and x_query is None and _plain_linears(query, key, value):
            # packed training: q, k and v from one matmul, padded back in one copy
            qx, kx, vx = padded(_stacked_projection(x, query, key, value)).split(sizes, dim=-1)
        else:
            qx, kx, vx = (padded(t) for t in (query(x if x_query is None else x_query), key(x), value(x)))
        q = hp.hook_q(split(qx)).transpose(1, 2)  # [batch, head, seq, d_head]
        k = hp.hook_k(split(kx)).transpose(1, 2)
        v = hp.hook_v(split(vx)).transpose(1, 2)
    if cpu_dropout or hp.uses_eager():
        scores = (q * hp.d_head**-0.5) @ k.transpose(-1, -2)  # scale the small tensor, not [q, k]
        if mask is not None:
            scores += mask
        scores = hp.hook_scores(scores)
        if _softmax_in_place(hp, scores):  # a capture: the pattern takes the scores' memory, not a fresh [q, k]
            pattern = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
        else:
            pattern = scores.softmax(dim=-1)
        pattern = hp.hook_pattern(pattern)
        z = dropout(pattern) @ v  # [batch, head, seq, d_head]
    else:
        p = dropout.p if dropout.training else 0.0
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        if hp.side_pattern():  # caches read a few heads: their pattern only, nothing else changes
            heads = hp.capture_heads
            scores = (q[:, heads] * hp.d_head**-0.5) @ k[:, heads].transpose(-1, -2)  # [batch, asked, q, k]
            if mask is not None:
                scores += mask
            hp.hook_pattern(hp.hook_scores(scores).softmax(dim=-1))
    if head_mask is not None:  # [head]: 0 switches a head off (same as scaling its pattern)
        z = z * head_mask.to(z.dtype).view(1, -1, 1, 1)
    z = hp.hook_z(z.transpose(1, 2))  # [batch, seq, head, d_head]
    return z if packing is None else packing.pack(z)


def _softmax_in_place(hp: AttentionHooks, scores: torch.Tensor) -> bool:
    """Whether the eager path may write the pattern over the scores: on a CPU (where it was measured; a GPU keeps
    its caching allocator's blocks and its own kernels), no graph is being recorded (a recorded graph may hold the
    scores), nothing reads the scores, and they are fp32 outside autocast (which computes softmax in fp32 from lower
    precision). Capturing one layer's patterns at 512 tokens then maps one [batch, head, 512, 512] tensor instead of
    two, each of them fresh pages that cost about what the layer's products do (bench/results/forward_capture.json
    measures the views)."""
    return (scores.device.type == "cpu" and not torch.is_grad_enabled() and not hp.hook_scores.active
            and scores.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"))


def one_projection(query: nn.Module, key: nn.Module, value: nn.Module) -> nn.Module | None:
    """The Linear whose output rows are query's, key's and value's, in that order, when the three are
    rows of one (`bertlab.compressed.structure.Int8Rows`); else None."""
    fused = getattr(query, "fused", None)
    if fused is None or getattr(key, "fused", None) is not fused or getattr(value, "fused", None) is not fused:
        return None
    return fused


def _stacked_projection(x: torch.Tensor, query: nn.Linear, key: nn.Linear, value: nn.Linear) -> torch.Tensor:
    """q, k and v of x side by side ([..., 3 * d_model]) from one matmul of the three Linears' stacked weights."""
    weight = torch.cat([query.weight, key.weight, value.weight])  # [3 * d_model, d_model]
    return F.linear(x, weight, torch.cat([query.bias, key.bias, value.bias]))


def _plain_linears(*modules: nn.Module) -> bool:
    """Whether every module is a plain `nn.Linear` with a bias (its weights can be stacked into one matmul)."""
    return all(type(m) is nn.Linear and m.bias is not None for m in modules)


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
        self.dropout = Dropout(cfg.attention_probs_dropout_prob)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
        x_query: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return attend(self, x, self.query, self.key, self.value, mask, head_mask, self.dropout, x_query)


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
        self.dropout = Dropout(cfg.hidden_dropout_prob)
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
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows [batch, n]: only those positions ask and are written ([batch, n, d_model]); keys and values
        from all."""
        if rows is not None:
            asked = take_rows(x, rows)
            return self.output(self.self(x, mask, head_mask, asked), asked)
        return self.output(self.self(x, mask, head_mask), x)


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [batch, seq, d] at positions rows [batch, n]: [batch, n, d]."""
    return x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


# ---------------------------------------------------------------------------------------------
# Feed-forward and one layer
# ---------------------------------------------------------------------------------------------
class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act_name = cfg.hidden_act
        self.act = _activation(cfg.hidden_act)
        self.hook_post = HookPoint()  # [batch, seq, d_mlp] after the activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hook_post(self.act(self.dense(x)))


class BertLayerOutput(nn.Module):
    """Feed-forward down-projection, residual add, LayerNorm (HF: `layer.N.output`)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
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
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows [batch, n]: the layer's output at those positions alone, [batch, n, d_model] (`BertAttention`)."""
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(self.attention(x, mask, head_mask, rows))
        return self.hook_resid_post(self.output(self.intermediate(mid), mid))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, head_mask: torch.Tensor | None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows [batch, n]: the last layer computes those positions alone: returns [batch, n, d_model]."""
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            if isinstance(mask, Packing) and rows is not None and i == last:  # a few rows ask: back to [batch, seq]
                x, mask = mask.pad(x), mask.additive
            x = layer(x, mask, None if head_mask is None else head_mask[i], rows if i == last else None)
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
        # pack the real tokens (`Packing`): "cpu" while training on a CPU (the default: faster there, and slower
        # than the padded path on an H100, bench/results/packing_cuda.json); True while training on any device;
        # "always" in evaluation too, on any device (the outputs at the padding are then zeros); False: never
        self.packing: bool | Literal["cpu", "always"] = "cpu"
        # (model, input_ids, token_type_ids, attention_mask) -> (sequence output, pooled), or None to run the
        # modules: the model compiled for inference (`bertlab.compressed.engine`: an int8 model's). Asked only
        # for whole sequences and no masked heads.
        self.engine: Callable[..., tuple[torch.Tensor, torch.Tensor | None] | None] | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """rows [batch, n] (positions; row 0 of each is what the pooler reads): the last layer computes those
        positions alone and the sequence output is [batch, n, d_model]. Taken only when no hook watches the
        last layer (hooks there see every position)."""
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
        plan = _plan_for(attention_mask) if attention_mask is not None else None
        if plan is not None and plan.padding == 0.0:
            attention_mask = None  # the host saw no padding: no mask (on a GPU, SDPA may then take its flash kernel)
        if self._packs(attention_mask, head_mask, plan):
            packing = Packing(attention_mask, x.dtype, plan.index if plan is not None else None)
            x = self.encoder(packing.pack(x), packing, None, rows)
            x = x if rows is not None else packing.pad(x)  # a last layer on a few rows came back padded already
        else:
            x = self.encoder(x, additive_mask(attention_mask, x.dtype), head_mask, rows)
        return x, (self.pooler(x) if self.pooler is not None else None)

    def _packs(self, attention_mask: torch.Tensor | None, head_mask: torch.Tensor | None,
               plan: PackingPlan | None = None) -> bool:
        """Pack the real tokens (`Packing`) while training a batch with padding (by default, "cpu", on a CPU
        alone), unless a hook watches a layer (hooks see [batch, seq] shapes) or heads are masked. Evaluation
        keeps the padded path, whose outputs at the padding equal transformers' too, unless `packing` is
        "always". `plan`: the host's look at this mask (`packing_plan`); without one, a GPU mask is not looked
        at (that waits for the device) and is packed whenever packing is asked for there."""
        if attention_mask is None or head_mask is not None or not len(self.encoder.layer):
            return False
        on_cpu = attention_mask.device.type == "cpu"
        if self.packing != "always" and not (self.training and self.packing and (on_cpu or self.packing is True)):
            return False
        if plan is None and on_cpu and bool(attention_mask.all()):
            return False
        return not self.encoder.watched()


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[batch, seq] of 1 (read) / 0 (padding) -> additive [batch, 1, 1, seq]; None when nothing is padded (looked
    at on the CPU only: on a GPU the look would wait for the device, and a mask of zeros costs less)."""
    if attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all())):
        return None
    keep = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - keep) * torch.finfo(dtype).min


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _activation(cfg.hidden_act)
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
        self.dropout = Dropout(classifier_dropout(cfg))
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
        model.dropout = Dropout(classifier_dropout(cfg) if dropout_p is None else dropout_p)
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
        whatever happens. A backward hook gets (gradient, name) when the block's backward pass runs."""
        with hooks(self.hook_points, fwd_hooks, bwd_hooks):
            yield self

    def run_with_cache(
        self, *args, names: NameFilter = None, layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None, dtype: torch.dtype | None = None, **kwargs
    ) -> tuple[ModelOutput, ActivationCache]:
        """Forward pass that also returns the activations at `names` (default: all hook points).

        layers: keep only the names of these layers (and none outside layers). heads: keep only
        these heads of `hook_scores` / `hook_pattern` ([batch, len(heads), query, key], in that
        order); the attention runs fused and only those heads' patterns are computed. dtype: store
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

        store.reads_only = True
        attention = [m for m in self.modules() if isinstance(m, AttentionHooks)]
        if head_list is not None:
            self._check_heads(head_list, attention)
        try:
            for m in attention:  # only a subset is worth computing on the side
                m.capture_heads = head_list if head_list is not None and len(head_list) < m.n_heads else None
            with self.hooks([(picked, store)]):
                out = self(*args, **kwargs)
        finally:
            for m in attention:
                m.capture_heads = None
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

    def set_attention_path(self, path: AttentionPath) -> None:
        """"auto" (eager only when the pattern is read), or force "eager" / "sdpa"."""
        if path not in ("auto", "eager", "sdpa"):
            raise ValueError(f"attention path must be auto, eager or sdpa; got {path!r}.")
        for m in self.modules():
            if isinstance(m, AttentionHooks):
                m.path = path


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
        """(rows [batch, n] the last layer may compute alone, which of them the MLM head reads [batch, n] bool),
        or (None, None) when the heads read more, or a hook watches the last layer. Rows are [CLS] then each
        sequence's MLM positions in order, filled up to the longest with other positions (computed, unread)."""
        if not len(self.bert.encoder.layer) or self.bert.encoder.last_layer_watched():
            return None, None
        batch = input_ids.shape[0]
        cls = torch.zeros(batch, 1, dtype=torch.long, device=input_ids.device)
        if self.reads_first_only():
            return cls, None
        if mlm_positions is None or not self.has_mlm or self.config.task is not None:
            return None, None
        counts = mlm_positions.sum(1)  # [batch]
        n = int(counts.max()) if counts.numel() else 0
        order = torch.sort(mlm_positions.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :n]
        read = torch.arange(n, device=input_ids.device) < counts[:, None]  # [batch, n]
        return torch.cat([cls, order], 1), torch.cat([torch.zeros_like(cls, dtype=torch.bool), read], 1)

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
        if token_type_ids is None:
            return
        if token_type_ids.device.type != "cpu":  # reading the max would wait for the device every forward
            types = self.config.type_vocab_size
            torch._assert_async(token_type_ids.max() < types, f"this model has {types} segment type(s); got more")
        elif int(token_type_ids.max()) >= self.config.type_vocab_size:
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


# Public names for the families' modules (bertlab.families), which build on these blocks.
activation_fn = _activation
