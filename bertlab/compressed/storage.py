"""A compressed model's folder: written by `save_compressed`, read back by `bertlab.load`.

The folder is a Hugging Face layout (config.json, model.safetensors, tokenizer files) whose config.json
carries the keys of `bertlab.compressed.structure`: `pruned_heads` ({"layer": [original head indices
removed]}, Hugging Face's convention) and `bertlab_quantization` (format QUANT_FORMAT: which Linear
modules and embedding tables are int8). Each int8 tensor `T` is stored as int8 under its own name, with
`T_scale` (float32, one per output row) beside it: value = int8 × scale (symmetric, zero point 0).
Biases, LayerNorms and the heads stay float32. Loading rebuilds the pruned shapes and the int8 layers,
checks keys and shapes strictly, and gives exactly the model that was saved.

This module sits beside `bertlab.loading`, which calls it for the folders it marks.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from bertlab.compressed.structure import (
    PRUNED_KEY,
    QUANT_FORMAT,
    QUANT_KEY,
    CompressError,
    apply_int8,
    dequantize_rows,
    describe_compression,
    int8_parts,
    is_compressed,
    is_int8_linear,
    prune_heads,
    quantization_info,
    quantize_rows,
)
from bertlab.config import ConfigError
from bertlab.families import spec_from_hf
from bertlab.families.core import few, key_problems, tied_in, ties_decoder
from bertlab.families.core import normalise_keys as family_normalise_keys
from bertlab.weights import CheckpointError, LoadReport, read_weights

SCALE_SUFFIX = "_scale"


# ---------------------------------------------------------------------------------------------
# Saving and loading a compressed folder
# ---------------------------------------------------------------------------------------------
def compressed_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of a compressed folder's model.safetensors: int8 where `bertlab_quantization`
    says, with their `_scale` rows; float32 elsewhere; tied copies left out."""
    info = quantization_info(model) or {}
    emb = set((info.get("embeddings") or {}).get("tensors", ()))
    state: dict[str, torch.Tensor] = {}
    int8_modules = {n for n, m in model.named_modules() if is_int8_linear(m)}
    for name, m in model.named_modules():
        if name in int8_modules:
            q, scale, bias = int8_parts(m)
            state[f"{name}.weight"], state[f"{name}.weight{SCALE_SUFFIX}"] = q.contiguous(), scale.contiguous()
            if bias is not None:
                state[f"{name}.bias"] = bias.detach().float().contiguous()
    for key, value in model.state_dict().items():
        if key.split("._packed_params")[0] in int8_modules or any(key == f"{n}.scale" or key == f"{n}.zero_point"
                                                                 for n in int8_modules):
            continue
        if key in emb:
            q, scale = quantize_rows(value)
            state[key], state[key + SCALE_SUFFIX] = q, scale
        else:
            state[key] = value.detach().contiguous().cpu()
    for tied in tied_in(model.family.family, model):  # stored once, as the word embeddings (if tied)
        state.pop(tied, None)
    return state


def save_compressed(model: nn.Module, tokenizer: Any, folder: str | os.PathLike) -> Path:
    """Write a compressed model (config.json with its compression keys, model.safetensors with int8
    tensors, tokenizer files) into `folder`; `bertlab.load(folder)` reads it back exactly."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.hf_config() if hasattr(model, "hf_config") else model.config.to_hf_dict()
    state = compressed_state(model)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".model.safetensors.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"format": "pt", "bertlab": "compressed (see config.json)"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / "model.safetensors")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(folder)
    return folder


def folder_is_compressed(folder: str | os.PathLike) -> bool:
    """Whether `folder`'s config.json names pruned heads or int8 weights."""
    try:
        d = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and bool(d.get(QUANT_KEY) or d.get(PRUNED_KEY))


def load_compressed(folder: str | os.PathLike, source: str | None = None) -> tuple[nn.Module, LoadReport]:
    """The model a compressed folder holds, built with its pruned shapes and int8 layers and checked
    strictly (equal key sets and shapes), in eval mode."""
    folder = Path(folder)
    path = folder / "config.json"
    d = json.loads(path.read_text(encoding="utf-8"))
    try:
        family, spec = spec_from_hf(d)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e
    info = d.get(QUANT_KEY) or {}
    if info and info.get("format") != QUANT_FORMAT:
        raise CheckpointError(f"{path}: {QUANT_KEY} format {str(info.get('format'))[:20]!r} is not one this "
                              f"bertlab reads (format {QUANT_FORMAT}); compress the model again.")
    weights_file, raw = read_weights(folder)
    state = family_normalise_keys(family, raw, ties_decoder(spec))  # an untied decoder keeps its own weight
    linears = list((info.get("linear") or {}).get("modules", ()))
    embeddings = list((info.get("embeddings") or {}).get("tensors", ()))
    int8: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in [f"{n}.weight" for n in linears] + embeddings:
        q, scale = state.pop(key, None), state.pop(key + SCALE_SUFFIX, None)
        if q is None or scale is None or q.dtype != torch.int8 or scale.shape != q.shape[:1]:
            raise CheckpointError(f"{weights_file}: {key} should be int8 with a {key}{SCALE_SUFFIX} row of "
                                  f"scales ({QUANT_KEY} in config.json names it); the folder is damaged.")
        int8[key] = (q, scale)
    bad = [k for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"{weights_file}: {few(bad)} are not floating point and not named in "
                              f"config.json's {QUANT_KEY}; the folder is damaged.")
    pooler = family.pooler_key
    extra = {k: v for k, v in spec.extra.items() if k != PRUNED_KEY}  # prune_heads below records it again
    spec = spec.replace(add_pooler=pooler is not None and (pooler in state or pooler in int8), extra=extra)
    with torch.device("meta"):
        model = family.model_class(spec)
    try:
        prune_heads(model, {int(k): v for k, v in (d.get(PRUNED_KEY) or {}).items()})
    except CompressError as e:
        raise CheckpointError(f"{path}: {PRUNED_KEY}: {e}") from e
    # the int8 Linears' float shapes stand in for their weights in the strict check
    for name in linears:
        q, _ = int8[f"{name}.weight"]
        state[f"{name}.weight"] = torch.empty(q.shape, device="meta")
    for key in embeddings:
        state[key] = torch.empty(int8[key][0].shape, device="meta")
    tied = set(tied_in(family, model))
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in tied}
    problems = key_problems(expected, state)
    if problems:
        raise CheckpointError(f"{weights_file} does not fit its config.json: " + "; ".join(problems) + ".")
    for key in list(state):
        if state[key].is_meta:
            del state[key]
    real = {k: v.float() for k, v in state.items()}
    for key in embeddings:  # assign real tensors before tying
        real[key] = dequantize_rows(*int8[key])
    missing = [k for k in model.state_dict() if k not in real and k not in tied]
    for name in linears:  # biases came in `real`; the weight comes with the int8 module below
        missing = [k for k in missing if k != f"{name}.weight"]
    _load_partial(model, real)
    apply_int8(model, {n: int8[f"{n}.weight"] for n in linears}, {})
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"{weights_file}: {few(left)} got no value from the file.")
    model.eval()
    heads = tuple(model.config.pretraining_heads)
    report = LoadReport(source or str(folder), folder, weights_file, heads, model.config.task)
    report.notes.append(describe_compression(model))
    model.load_report = report
    return model, report


def _load_partial(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Assign `state`'s tensors (already checked against the model's keys and shapes)."""
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise CheckpointError(f"unexpected weights: {few(result.unexpected_keys)}")


__all__ = ["SCALE_SUFFIX", "compressed_state", "folder_is_compressed", "is_compressed", "load_compressed",
           "save_compressed"]
