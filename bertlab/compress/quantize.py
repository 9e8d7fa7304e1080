"""Dynamic int8 quantization of any loaded model (Zafrir et al. 2019, Q8BERT, without the training).

    small = quantize(model)            # a copy: the encoder's Linear layers run int8 matmuls
    small(ids, types, mask)            # same API, same hooks; outputs within int8 rounding of fp32

Each weight row of every encoder Linear gets its own scale (symmetric per-channel int8); the
activations are quantized on the fly, per batch, by the int8 kernel (`torch.ao.nn.quantized.dynamic`,
fbgemm/x86 on CPU). The embedding tables are rounded to int8 per row too, which shrinks the saved
folder; in memory they stay float32 (a lookup gains nothing from int8). Heads and LayerNorms stay
float32. The format on disk is in `bertlab.compressed.storage`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from bertlab.compressed.structure import (
    QUANT_FORMAT,
    QUANT_KEY,
    CompressError,
    apply_int8,
    quantizable_embeddings,
    quantizable_linears,
    quantization_info,
    quantize_rows,
)
from bertlab.runtime import model_device


def quantize(model: nn.Module, embeddings: bool = True) -> nn.Module:
    """A dynamic-int8 copy of `model` (CPU, eval mode); `model` itself is unchanged.
    embeddings: also round the embedding tables to int8 per row (smaller folder on disk)."""
    if quantization_info(model):
        raise CompressError("this model is quantized already: pick the float model to quantize.")
    if model_device(model).type != "cpu":
        raise CompressError("int8 quantization runs on the CPU: move the model to the CPU first (model.cpu()).")
    if torch.backends.quantized.engine not in ("x86", "fbgemm", "qnnpack", "onednn"):
        raise CompressError(f"this torch has no int8 kernel engine ({torch.backends.quantized.engine}).")
    q = copy.deepcopy(model).eval()
    linears = quantizable_linears(q)
    with torch.no_grad():
        lin = {name: quantize_rows(q.get_submodule(name).weight) for name in linears}
        emb = {name: quantize_rows(q.get_parameter(name)) for name in quantizable_embeddings(q)} if embeddings else {}
    apply_int8(q, lin, emb)
    q.config = q.config.replace(extra={**q.config.extra, QUANT_KEY: {
        "format": QUANT_FORMAT,
        "method": "dynamic int8",
        "linear": {"scheme": "int8 per output row, symmetric (zero point 0); activations int8 per batch at "
                             "run time", "modules": linears},
        "embeddings": {"scheme": "int8 per row, symmetric; float32 in memory", "tensors": sorted(emb)},
    }})
    for p in q.parameters():
        p.requires_grad = False
    return q


__all__ = ["quantize"]
