"""An int8 BERT compiled for inference: `Int8Engine`.

At batch 1 an int8 BERT spends as long in Python (each module's call, each hook point, each packed weight
handed from Python to its kernel) as in its matmuls. When nobody watches (no hook, no gradient, eval mode),
`BertModel` lets its `engine` run the embeddings, the layers and the pooler instead: the same kernels
(fbgemm's dynamic-int8 Linear on the same packed weights, `scaled_dot_product_attention` on the same mask,
the same lookups, LayerNorms and activation) in the same order, compiled once with TorchScript, so the
outputs are the modules' own to the last bit. Anything the engine cannot run exactly (a hook, a masked
head, a few rows asked, a layer that is not an int8 BERT layer, an adapter, autocast) goes through the
modules as before; embeddings of another kind (RoBERTa's positions, ELECTRA's projection) run as modules
and the rest compiled.

The engine holds no weights of its own: it reads the modules' packed weights and LayerNorm parameters, and
is rebuilt when one of them is replaced (a Linear swapped, a LayerNorm given a new parameter). A copied or
pickled model gets a fresh engine that builds itself from the copy.
"""

from __future__ import annotations

import logging
import operator
import warnings
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.nn.modules import module as _torch_module

from bertlab.model import (
    ACT_ERF,
    ACT_RELU,
    ACT_TANH,
    AttentionHooks,
    BertEmbeddings,
    BertLayer,
    BertModel,
    activation_kind,
)
from bertlab.model import extended_mask as additive_mask

log = logging.getLogger(__name__)


# Moved here from bertlab.model / bertlab.hooks (issue 47: the model core uses no private torch API and has no
# fused int8 projection path); only this engine still reads them.
def one_projection(query: nn.Module, key: nn.Module, value: nn.Module) -> nn.Module | None:
    """The Linear whose output rows are query's, key's and value's, in that order, when the three are
    rows of one (`bertlab.compressed.structure.Int8Rows`); else None."""
    fused = getattr(query, "fused", None)
    if fused is None or getattr(key, "fused", None) is not fused or getattr(value, "fused", None) is not fused:
        return None
    return fused


def hook_tables(modules) -> list[dict]:
    """The tables in which torch keeps these modules' hooks (filled and emptied in place, never replaced)."""
    return [t for m in modules for t in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks,
                                         m._backward_pre_hooks)]


def any_hooked(tables: list[dict]) -> bool:
    """True when a hook is in one of these tables (`hook_tables`) or registered for every module."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks
                or _torch_module._global_backward_hooks or _torch_module._global_backward_pre_hooks) or any(tables)


def compiled(module: nn.Module) -> nn.Module:
    """`module` compiled with TorchScript (its deprecation note silenced), or `module` itself where TorchScript
    fails or is gone: the same arithmetic, run from Python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.jit.script(module)
        except Exception as err:
            log.debug("%s not compiled (%s): it runs uncompiled", type(module).__name__, err)
            return module


class _Layer(nn.Module):
    """One post-LN BERT layer with int8 Linears: the arithmetic of `BertLayer`'s modules on the fused path."""

    def __init__(self, layer: BertLayer):
        super().__init__()
        att, out = layer.attention, layer.output
        fused = one_projection(att.self.query, att.self.key, att.self.value)
        self.qkv = fused._packed_params._packed_params  # [3 * heads * d_head, d_model] (query, key, value rows)
        self.o = att.output.dense._packed_params._packed_params
        self.up = layer.intermediate.dense._packed_params._packed_params
        self.down = out.dense._packed_params._packed_params
        self.ln1_weight, self.ln1_bias = att.output.LayerNorm.weight, att.output.LayerNorm.bias
        self.ln2_weight, self.ln2_bias = out.LayerNorm.weight, out.LayerNorm.bias
        self.eps1, self.eps2 = float(att.output.LayerNorm.eps), float(out.LayerNorm.eps)
        self.n_heads, self.d_head = int(att.self.n_heads), int(att.self.d_head)
        self.act = activation_kind(layer.intermediate.act_name)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, seq, d_model = x.shape[0], x.shape[1], x.shape[2]
        qkv = torch.ops.quantized.linear_dynamic(x, self.qkv, True)  # [batch, seq, 3 * heads * d_head]; reduce_range
        qkv = qkv.view(batch, seq, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # [3, batch, head, seq, d_head]
        z = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)  # [batch, head, seq, d_head]
        attn = torch.ops.quantized.linear_dynamic(z.transpose(1, 2).flatten(2), self.o, True)  # [batch, seq, d_model]
        mid = F.layer_norm(attn + x, [d_model], self.ln1_weight, self.ln1_bias, self.eps1)
        h = torch.ops.quantized.linear_dynamic(mid, self.up, True)  # [batch, seq, d_mlp]
        if self.act == 0:
            h = F.gelu(h)
        elif self.act == 1:
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        down = torch.ops.quantized.linear_dynamic(h, self.down, True)
        return F.layer_norm(down + mid, [d_model], self.ln2_weight, self.ln2_bias, self.eps2)


assert (ACT_ERF, ACT_TANH, ACT_RELU) == (0, 1, 2), "_Layer.forward branches on these codes"


class _Stack(nn.Module):
    def __init__(self, layers: list[BertLayer]):
        super().__init__()
        self.layers = nn.ModuleList(_Layer(layer) for layer in layers)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return x


class _Embeddings(nn.Module):
    """`BertEmbeddings`' arithmetic in evaluation: word + position (+ segment), LayerNorm."""

    def __init__(self, emb: BertEmbeddings):
        super().__init__()
        self.word, self.position = emb.word_embeddings.weight, emb.position_embeddings.weight
        types = emb.token_type_embeddings
        self.has_types = types is not None
        self.types = types.weight if types is not None else emb.position_embeddings.weight  # unread without types
        self.offset = int(emb.position_offset)
        self.ln_weight, self.ln_bias, self.eps = emb.LayerNorm.weight, emb.LayerNorm.bias, float(emb.LayerNorm.eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) + self.offset  # [seq]
        total = F.embedding(input_ids, self.word) + F.embedding(positions, self.position)  # [batch, seq, d_model]
        if self.has_types:
            total = total + F.embedding(token_type_ids, self.types)
        return F.layer_norm(total, [total.shape[2]], self.ln_weight, self.ln_bias, self.eps)


class _ModuleEmbeddings(nn.Module):
    """Embeddings `_Embeddings` cannot run: the engine runs the modules' and calls `_Model.body`."""

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("these embeddings run as modules: call body()")


class _Int8Pooler(nn.Module):
    def __init__(self, dense: nn.Module):
        super().__init__()
        self.dense = dense._packed_params._packed_params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.ops.quantized.linear_dynamic(x[:, 0], self.dense, True))  # [batch, d_model]


class _FloatPooler(nn.Module):
    def __init__(self, dense: nn.Linear):
        super().__init__()
        self.weight, self.bias = dense.weight, dense.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(x[:, 0], self.weight, self.bias))  # [batch, d_model]


class _Model(nn.Module):
    """Embeddings (when `_Embeddings` can run them), layers and pooler (when there is one)."""

    def __init__(self, model: BertModel):
        super().__init__()
        self.has_embeddings = _plain_embeddings(model)
        self.embeddings = _Embeddings(model.embeddings) if self.has_embeddings else _ModuleEmbeddings()
        self.stack = _Stack(list(model.encoder.layer))
        dense = model.pooler.dense if model.pooler is not None else None
        self.has_pooler = dense is not None
        if isinstance(dense, DynamicLinear):
            self.pooler = _Int8Pooler(dense)
        elif dense is not None:
            self.pooler = _FloatPooler(dense)
        else:
            self.pooler = nn.Identity()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.body(self.embeddings(input_ids, token_type_ids), mask)

    @torch.jit.export
    def body(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layers and the pooler on embeddings x [batch, seq, d_model]."""
        x = self.stack(x, mask)
        pooled: torch.Tensor | None = None
        if self.has_pooler:
            pooled = self.pooler(x)
        return x, pooled


def _plain_embeddings(model: BertModel) -> bool:
    emb = model.embeddings
    return (type(emb) is BertEmbeddings and model.embeddings_project is None
            and all(m is None or (m.max_norm is None and not m.sparse)
                    for m in (emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings))
            and type(emb.LayerNorm) is nn.LayerNorm)


def _runnable(layer: nn.Module) -> bool:
    """Whether `_Layer` computes exactly what this layer's modules compute."""
    if type(layer) is not BertLayer:
        return False
    att, out = layer.attention, layer.output
    fused = one_projection(att.self.query, att.self.key, att.self.value)
    linears = (fused, att.output.dense, layer.intermediate.dense, out.dense)
    return (all(isinstance(m, DynamicLinear) for m in linears)
            and fused.out_features == 3 * att.self.n_heads * att.self.d_head
            and att.output.adapter is None and out.adapter is None
            and all(type(m) is nn.LayerNorm for m in (att.output.LayerNorm, out.LayerNorm)))


Slot = tuple[dict, str]  # (one of torch's tables of a module: `_modules`, `_parameters`, `__dict__`; a name in it)


def _slots(model: BertModel) -> list[Slot]:
    """Where the compiled model's parts sit: the modules, parameters and packed weights whose replacement makes it
    stale. Built once; checked on every call by identity (`Int8Engine._current`), without `nn.Module.__getattr__`."""
    slots: list[Slot] = [(model._modules, "embeddings"), (model._modules, "embeddings_project"),
                         (model._modules, "pooler"), (model._modules, "encoder")]
    emb = model._modules["embeddings"]
    for name, child in emb._modules.items():
        slots += [(emb._modules, name)] + [(child._parameters, p) for p in child._parameters]
    pooler = model._modules.get("pooler")
    if pooler is not None:
        slots += _linear_slots(pooler._modules, "dense")
    layers = model._modules["encoder"]._modules["layer"]._modules
    slots.append((layers, str(len(layers))))  # a layer appended
    for i, layer in enumerate(layers.values()):
        slots.append((layers, str(i)))
        if type(layer) is not BertLayer:
            continue
        att, out, up = layer._modules["attention"], layer._modules["output"], layer._modules["intermediate"]
        own, written = att._modules["self"]._modules, att._modules["output"]._modules
        slots += [(layer._modules, "attention"), (layer._modules, "output"), (layer._modules, "intermediate"),
                  (att._modules, "self"), (att._modules, "output"), (own, "query"), (own, "key"), (own, "value"),
                  (written, "adapter"), (out._modules, "adapter"), (written, "LayerNorm"), (out._modules, "LayerNorm")]
        fused = own["query"].__dict__.get("fused")
        if isinstance(fused, nn.Module):
            slots += [(own["query"].__dict__, "fused"), *_packed_slots(fused)]
        for table, name in ((written, "dense"), (up._modules, "dense"), (out._modules, "dense")):
            slots += _linear_slots(table, name)
        for norm in (written["LayerNorm"], out._modules["LayerNorm"]):
            slots += [(norm._parameters, "weight"), (norm._parameters, "bias")]
    return slots


def _linear_slots(table: dict, name: str) -> list[Slot]:
    linear = table.get(name)
    slots: list[Slot] = [(table, name)]
    if isinstance(linear, nn.Module):
        slots += [(linear._parameters, p) for p in linear._parameters] + _packed_slots(linear)
    return slots


def _packed_slots(linear: nn.Module) -> list[Slot]:
    """A dynamic-int8 Linear's packed weights (`set_weight_bias` replaces them)."""
    packed = linear._modules.get("_packed_params")
    return [(linear._modules, "_packed_params")] + ([(packed.__dict__, "_packed_params")] if packed is not None else [])


def _unchanged(built: _Built) -> bool:
    """Whether every slot still holds what the engine was built from: looked up and compared by identity in C
    (`map` over `dict.get` and `operator.is_`), with no Python call per slot (every call of the model reads all
    of them, a few hundred for a 6-layer model)."""
    return all(map(operator.is_, map(dict.get, built.tables, built.names), built.parts))


class _Built(NamedTuple):
    """What an engine built, and from what: replaced at once, so a call on another thread sees all of one."""

    tables: list[dict]  # where the parts it was built from sit (`_slots`): each slot's table ...
    names: list[str]  # ... and its name there
    parts: list[Any]  # what was in those slots then
    model: Any  # the compiled `_Model`, or None: this model cannot run here
    has_embeddings: bool  # the compiled model runs the embeddings too (read here, not from the compiled module)
    hooks: list[dict]  # the hook tables of every module of the model: a hook in any sends the call back
    attention: list[AttentionHooks]  # the modules with an attention path to respect


class Int8Engine:
    """`BertModel.engine` for int8 models: runs the model compiled (see the module's docstring) when that gives
    the modules' own outputs, else returns None and the modules run."""

    def __init__(self) -> None:
        self._built: _Built | None = None

    def __deepcopy__(self, memo: dict) -> Int8Engine:  # the copy builds its own from the copied modules
        return Int8Engine()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __call__(self, model: BertModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(sequence output [batch, seq, d_model], pooled [batch, d_model] or None) of `BertModel.forward`, or
        None when the modules must run it."""
        if (torch.is_grad_enabled() or model.training or model.packing == "always" or input_ids.device.type != "cpu"
                or torch.is_autocast_enabled("cpu")):
            return None
        built = self._current(model)
        eager = any(m.attn_implementation == "eager" for m in built.attention)
        if built.model is None or any_hooked(built.hooks) or eager:
            return None  # not an int8 BERT; a hook watches; a lesson asked for the eager attention path
        mask = additive_mask(attention_mask, torch.float32)
        if built.has_embeddings:
            return built.model(input_ids, token_type_ids, mask)
        x = model.embeddings(input_ids, token_type_ids)
        if model.embeddings_project is not None:
            x = model.embeddings_project(x)
        if x.dtype != torch.float32:
            return None
        return built.model.body(x, mask)

    def _current(self, model: BertModel) -> _Built:
        built = self._built
        if built is None or not _unchanged(built):
            slots = _slots(model)
            modules = list(model.modules())
            tables, names = (list(column) for column in zip(*slots))
            compiled_model = _build(model)
            built = self._built = _Built(
                tables, names, list(map(dict.get, tables, names)), compiled_model,
                compiled_model is not None and compiled_model.has_embeddings,
                hook_tables(modules), [m for m in modules if isinstance(m, AttentionHooks)])
        return built


def _build(model: BertModel) -> nn.Module | None:
    """The model compiled (`_Model`), or None when its layers are not all int8 BERT layers."""
    if not len(model.encoder.layer) or not all(_runnable(layer) for layer in model.encoder.layer):
        return None
    return compiled(_Model(model).eval())


def attach_int8_engine(model: nn.Module) -> nn.Module:
    """Give every `BertModel` in the model an `Int8Engine` (it runs only where its layers are int8 BERT layers
    and nobody watches). In place."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.engine = Int8Engine()
    return model


__all__ = ["Int8Engine", "attach_int8_engine", "compiled"]
