"""What a compressed model is, in memory: pruned heads (smaller attention matrices, per-layer head
counts) and int8 Linear layers, with the config keys that record them. `bertlab.compressed.storage`
writes and reads them; `quantize` and `prune` make them.

- `pruned_heads` (config.extra, saved in config.json): {"layer": [original head indices removed]},
  Hugging Face's convention; `num_attention_heads` stays the original count.
- `bertlab_quantization` (QUANT_FORMAT): which Linear modules run int8 and which embedding tables
  were rounded to int8 (symmetric, one scale per row: value = int8 × scale).

In memory, the query, key and value of an attention layer that runs through `bertlab.model.attend`
share one int8 Linear (their rows stacked, `Int8Rows`): one int8 matmul instead of three, with the same
numbers (each row keeps its scale, and the three read the same quantized input). On disk they stay
three tensors under their checkpoint names.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

QUANT_KEY = "bertlab_quantization"
PRUNED_KEY = "pruned_heads"
QUANT_FORMAT = 1
QMAX = 127  # symmetric int8: -127..127 (the -128 code is never used)
# Names of the query/key/value Linears in the attention module that holds a layer's hook_q, and of
# the output projection in the module that holds its hook_result, across the families.
QKV_NAMES = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"), ("query_proj", "key_proj", "value_proj"),
             ("Wqkv",))  # Wqkv: q, k, v in one Linear
# Projections beside q/k/v that also give each head its own rows, when the attention module has them:
# DeBERTa's keys and queries of the relative positions (without share_att_key).
PER_HEAD_ROWS = ("pos_key_proj", "pos_query_proj")
# The q/k/v names of the attention modules that run through `bertlab.model.attend`, which calls their
# shared int8 Linear once (`Int8Rows`). Others (DeBERTa's query_proj, ...) keep three int8 Linears.
FUSED_QKV_NAMES = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"))
OUT_NAMES = ("dense", "out_lin", "Wo")


class CompressError(ValueError):
    """A model that cannot be compressed this way, or a compressed folder that does not fit; the
    message says what to do."""


# ---------------------------------------------------------------------------------------------
# int8 tensors
# ---------------------------------------------------------------------------------------------
def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of a 2-d float tensor: (int8 [rows, cols], scale float32 [rows]),
    w ≈ int8 × scale[:, None]. A row of zeros gets scale 1."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))  # [rows]
    q = torch.clamp(torch.round(w / scale[:, None]), -QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [rows, cols] of an int8 tensor and its per-row scale."""
    return q.float() * scale.float()[:, None]


class Int8Linear(DynamicLinear):
    """torch's dynamic-int8 Linear (`torch.ao.nn.quantized.dynamic.Linear`: the same packed weights, the same
    kernel, activations quantized per call to 7 bits as torch's module does), calling its kernel directly,
    without the module's per-call version and dtype checks: at batch 1 a layer's matmul is small and they show."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, True)  # reduce_range
        return y if y.dtype == x.dtype else y.to(x.dtype)


def int8_linear(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """A dynamic-int8 Linear (float in, float out, int8 matmul) holding exactly these int8 weights."""
    with warnings.catch_warnings():  # torch warns about its quantized tensors' future on every call
        warnings.filterwarnings("ignore", message=".*quantiz.*")
        out_features, in_features = q.shape
        layer = Int8Linear(in_features, out_features, bias_=bias is not None, dtype=torch.qint8)
        zero = torch.zeros(out_features, dtype=torch.int64)
        # the float values these int8 rows stand for, quantized back onto the same integers and scales
        qweight = torch.quantize_per_channel(dequantize_rows(q, scale), scale.double(), zero, 0, torch.qint8)
        layer.set_weight_bias(qweight, None if bias is None else bias.detach().float().contiguous())
    return layer


class Int8Rows(nn.Module):
    """Rows [start, stop) of a fused dynamic-int8 Linear, as a Linear of their own: the query, key or
    value of a layer whose three projections run as one int8 matmul (`fuse_int8_qkv`). Holds no
    weights itself: the fused layer is not a child module, so state dicts, sizes and saved folders
    see each projection's rows once, under its own name (`int8_parts`)."""

    def __init__(self, fused: nn.Module, start: int, stop: int):
        super().__init__()
        object.__setattr__(self, "fused", fused)  # shared by the layer's q, k and v; not registered
        self.start, self.stop = start, stop
        self.in_features, self.out_features = fused.in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)[..., self.start:self.stop]  # [..., out_features]

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.stop} of an int8 Linear({self.fused.in_features}, {self.fused.out_features})"


def is_int8_linear(m: nn.Module) -> bool:
    return isinstance(m, (DynamicLinear, Int8Rows))


def int8_parts(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(int8 weight [out, in], scale float32 [out], bias or None) of a dynamic-int8 Linear (or of its
    rows, for `Int8Rows`)."""
    if isinstance(m, Int8Rows):
        q, scale, bias = int8_parts(m.fused)
        rows = slice(m.start, m.stop)
        return q[rows], scale[rows], None if bias is None else bias[rows]
    w, b = m._weight_bias()
    if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        scale = w.q_per_channel_scales().float()
    else:  # a per-tensor layer (e.g. made by torch.ao's quantize_dynamic): one scale for every row
        scale = torch.full((w.shape[0],), float(w.q_scale()))
    return w.int_repr(), scale, b


# ---------------------------------------------------------------------------------------------
# Where each layer's heads live (any family with one attention module per layer)
# ---------------------------------------------------------------------------------------------
def _module_of_hook(model: nn.Module, hook_name: str) -> nn.Module:
    return model.get_submodule(hook_name.rsplit(".", 1)[0])


def attention_parts(model: nn.Module, layer: int) -> tuple[nn.Module, list[str], nn.Module, str, nn.Module]:
    """(attention module, its q/k/v attribute names, output module, its projection's name, hook module)
    of logical layer `layer`. The hook module carries `n_heads`."""
    fam = model.family
    hp = _module_of_hook(model, fam.hook_name(layer, "hook_q"))
    out_mod = _module_of_hook(model, fam.hook_name(layer, "hook_result"))
    qkv = next((list(names) for names in QKV_NAMES if all(hasattr(hp, n) for n in names)), None)
    out = next((n for n in OUT_NAMES if isinstance(getattr(out_mod, n, None), nn.Module)), None)
    if qkv is None or out is None:
        raise CompressError(f"this {fam.name} model keeps its attention weights outside its layers (one layer "
                            f"shared across depth): its heads cannot be pruned one layer at a time.")
    return hp, qkv, out_mod, out, hp


def heads_per_layer(model: nn.Module) -> list[int]:
    """How many heads each logical layer has now (after any pruning)."""
    fam = model.family
    return [int(_module_of_hook(model, fam.hook_name(i, "hook_q")).n_heads) for i in range(fam.num_layers)]


def pruned_heads(model: nn.Module) -> dict[int, list[int]]:
    """{layer: original head indices removed} (empty when nothing was pruned)."""
    raw = model.config.extra.get(PRUNED_KEY) or {}
    return {int(k): sorted(int(h) for h in v) for k, v in raw.items() if v}


def kept_heads(model: nn.Module) -> list[list[int]]:
    """For each layer, the original indices of the heads it still has, in order."""
    gone = pruned_heads(model)
    n = model.config.num_attention_heads
    return [[h for h in range(n) if h not in gone.get(i, ())] for i in range(model.family.num_layers)]


def _select(t: torch.Tensor, dim: int, idx: torch.Tensor) -> nn.Parameter:
    """`t`'s entries at `idx` along `dim`, as a new Parameter (shape only on the meta device)."""
    if t.is_meta:
        shape = list(t.shape)
        shape[dim] = len(idx)
        return nn.Parameter(torch.empty(shape, device="meta", dtype=t.dtype), t.requires_grad)
    return nn.Parameter(t.detach().index_select(dim, idx.to(t.device)).clone(), t.requires_grad)


def _take_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A Linear with only output rows `rows` of `linear`."""
    new = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None, device="meta")
    new.weight = _select(linear.weight, 0, rows)
    if linear.bias is not None:
        new.bias = _select(linear.bias, 0, rows)
    return new


def _take_columns(linear: nn.Linear, cols: torch.Tensor) -> nn.Linear:
    """A Linear reading only inputs `cols` of `linear` (same bias)."""
    new = nn.Linear(len(cols), linear.out_features, bias=linear.bias is not None, device="meta")
    new.weight = _select(linear.weight, 1, cols)
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias.detach().clone(), linear.bias.requires_grad)
    return new


def prune_heads(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove `heads` ({layer: original head indices}) from `model` in place, for real: the query,
    key and value matrices (and DeBERTa's position keys and queries) lose those heads' rows, the
    output projection their columns. Heads
    pruned before stay pruned; every layer must keep at least one head. Records the result in
    config.extra["pruned_heads"] (saved in config.json). Returns `model`. Float models only."""
    fam = model.family
    before = pruned_heads(model)
    kept_now = kept_heads(model)
    for layer, chosen in heads.items():
        if not 0 <= int(layer) < fam.num_layers:
            raise CompressError(f"layer {layer} does not exist: the model has {fam.num_layers} layers.")
        chosen = {int(h) for h in chosen}
        n = model.config.num_attention_heads
        bad = sorted(h for h in chosen if not 0 <= h < n)
        if bad:
            raise CompressError(f"heads {bad} do not exist: layers have heads 0..{n - 1}.")
        keep = [pos for pos, h in enumerate(kept_now[layer]) if h not in chosen]
        if len(keep) == len(kept_now[layer]):
            continue
        if not keep:
            raise CompressError(f"pruning would leave layer {layer} without heads: keep at least one per layer.")
        hp, qkv, out_mod, out, _ = attention_parts(model, layer)
        if any(is_int8_linear(getattr(hp, n)) for n in qkv):
            raise CompressError("prune before quantizing: this model's attention weights are int8 already.")
        d = hp.d_head
        idx = torch.tensor([pos * d + j for pos in keep for j in range(d)], dtype=torch.long)
        for name in qkv:
            parts = 3 if len(qkv) == 1 else 1  # a fused projection: the same rows of q, of k and of v
            width = getattr(hp, name).out_features // parts
            rows = torch.cat([idx + i * width for i in range(parts)])
            setattr(hp, name, _take_rows(getattr(hp, name), rows))
        for name in PER_HEAD_ROWS:
            if isinstance(getattr(hp, name, None), nn.Linear):
                setattr(hp, name, _take_rows(getattr(hp, name), idx))
        setattr(out_mod, out, _take_columns(getattr(out_mod, out), idx))
        hp.n_heads = len(keep)
        if hasattr(out_mod, "n_heads"):
            out_mod.n_heads = len(keep)
        before[int(layer)] = sorted(set(before.get(int(layer), [])) | (set(kept_now[layer]) & chosen))
    model.config.extra[PRUNED_KEY] = {str(k): v for k, v in sorted(before.items()) if v}
    return model


# ---------------------------------------------------------------------------------------------
# int8 structure
# ---------------------------------------------------------------------------------------------
def quantizable_linears(model: nn.Module) -> list[str]:
    """Names of the Linear layers dynamic int8 applies to: every Linear of the encoder (attention,
    feed-forward, pooler, projections), none of the heads (the MLM decoder is tied to the embeddings)."""
    prefix = model.family.prefix + "."
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith(prefix)]


def quantizable_embeddings(model: nn.Module) -> list[str]:
    """Parameter names of the embedding tables (stored int8 per row on disk)."""
    return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Embedding)]


def quantization_info(model: nn.Module) -> dict[str, Any] | None:
    return model.config.extra.get(QUANT_KEY)


def is_compressed(model: nn.Module) -> bool:
    """Whether `model` has pruned heads or int8 weights (saved by `save_compressed`, not save_pretrained)."""
    return bool(quantization_info(model)) or bool(pruned_heads(model))


def fuse_int8_qkv(model: nn.Module) -> nn.Module:
    """Give every attention module whose query, key and value are dynamic-int8 Linears (names in
    FUSED_QKV_NAMES) one int8 Linear of their stacked rows, and make the three `Int8Rows` of it. The
    outputs do not change. In place."""
    for module in list(model.modules()):
        for names in FUSED_QKV_NAMES:
            parts = [getattr(module, n, None) for n in names]
            if not all(isinstance(p, DynamicLinear) for p in parts):
                continue
            q, scale, bias = zip(*(int8_parts(p) for p in parts))
            if len({p.in_features for p in parts}) > 1 or len({b is None for b in bias}) > 1:
                continue
            fused = int8_linear(torch.cat(q), torch.cat(scale), None if bias[0] is None else torch.cat(bias))
            start = 0
            for name, p in zip(names, parts):
                setattr(module, name, Int8Rows(fused, start, start + p.out_features))
                start += p.out_features
    return model


def apply_int8(model: nn.Module, linears: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
               embeddings: Mapping[str, tuple[torch.Tensor, torch.Tensor]], fuse_qkv: bool = True) -> nn.Module:
    """Swap in dynamic-int8 Linears ({module name: (int8, scale)}, biases from the model) and set the
    embedding tables ({parameter name: (int8, scale)}) to their rounded float values. In place.
    fuse_qkv: run each layer's query, key and value as one int8 Linear (`fuse_int8_qkv`; same outputs)."""
    for name, (q, scale) in linears.items():
        old = model.get_submodule(name)
        bias = None if old.bias is None else old.bias
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, int8_linear(q, scale, bias))
    for name, (q, scale) in embeddings.items():
        module = model.get_submodule(name.removesuffix(".weight"))
        module.weight = nn.Parameter(dequantize_rows(q, scale).to(module.weight.device), requires_grad=False)
    if hasattr(model, "tie_weights"):  # the MLM decoder reads the (rounded) word embeddings
        model.tie_weights()
    return fuse_int8_qkv(model) if fuse_qkv else model

def describe_compression(model: nn.Module) -> str:
    """One line: what was done to this model."""
    parts = []
    gone = pruned_heads(model)
    if gone:
        total = model.config.num_attention_heads * model.family.num_layers
        parts.append(f"{total - sum(len(v) for v in gone.values())} of {total} attention heads kept")
    if quantization_info(model):
        parts.append("encoder Linear layers in int8 (dynamic), embeddings stored int8")
    return "; ".join(parts) or "not compressed"


__all__ = [
    "CompressError", "FUSED_QKV_NAMES", "Int8Linear", "Int8Rows", "OUT_NAMES", "PRUNED_KEY", "QKV_NAMES",
    "QUANT_FORMAT", "QUANT_KEY", "apply_int8", "attention_parts", "dequantize_rows", "describe_compression",
    "fuse_int8_qkv", "heads_per_layer", "int8_linear", "int8_parts", "is_compressed", "is_int8_linear", "kept_heads",
    "prune_heads", "pruned_heads", "quantizable_embeddings", "quantizable_linears", "quantization_info",
    "quantize_rows",
]
