"""An int8 model for deployment: exported to ONNX and run by ONNX Runtime, the peer a teacher would serve with.

    missing = onnx_missing()                         # None, or the sentence to show when onnxruntime is absent
    files = export_int8(small, tok, "runs/int8")     # model.onnx (float) and model-int8.onnx beside the weights
    peer = OnnxRuntimeModel(files.int8, small)       # called as a model: peer(ids, types, mask).logits

The float graph holds bertlab's own int8 weights as float (int8 × scale: the values the int8 model multiplies
by), and ONNX Runtime's dynamic quantization (int8 weights, one symmetric scale per output row) rounds them back
to the same int8 values; its activations are quantized per batch, as torch's are. The graph's one output is
the task head's logits. Optional: `pip install "bert-classroom-lab[onnx]"` (onnx, onnxruntime).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertlab.compressed.structure import (
    CompressError,
    dequantize_rows,
    int8_parts,
    is_int8_linear,
    quantization_info,
)
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

ONNX_MISSING = ("ONNX Runtime is not installed, so the int8 model was not exported to ONNX nor timed with it: "
                'install it with pip install "bert-classroom-lab[onnx]" (the onnx and onnxruntime packages) to '
                "compare.")
INPUTS = ("input_ids", "token_type_ids", "attention_mask")
OPSET = 17


def onnx_missing() -> str | None:
    """None when onnx and onnxruntime can be imported; else the sentence that says how to install them."""
    if all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime")):
        return None
    return ONNX_MISSING


def float_twin(model: nn.Module) -> nn.Module:
    """A float copy of an int8 model: each int8 Linear becomes an nn.Linear holding int8 × scale, the values
    the int8 layer multiplies by (the embeddings are float already). Eval mode."""
    twin = copy.deepcopy(model).eval()
    for name, module in list(twin.named_modules()):
        if not is_int8_linear(module):
            continue
        q, scale, bias = int8_parts(module)
        linear = nn.Linear(q.shape[1], q.shape[0], bias=bias is not None)
        with torch.no_grad():
            linear.weight.copy_(dequantize_rows(q, scale))
            if bias is not None:
                linear.bias.copy_(bias)
        parent, _, attr = name.rpartition(".")
        setattr(twin.get_submodule(parent) if parent else twin, attr, linear)
    return twin


class _Logits(nn.Module):
    """The model's task-head logits from (input_ids, token_type_ids, attention_mask): the exported graph."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, token_type_ids, attention_mask).logits


@dataclass
class OnnxFiles:
    float: Path  # the float graph (bertlab's int8 weights as float)
    int8: Path  # the same after ONNX Runtime's dynamic int8


def export_int8(model: nn.Module, tok: Tokenizer, folder: str | Path) -> OnnxFiles:
    """Write `model` (an int8 model with a task head) to `folder` as model.onnx and model-int8.onnx."""
    missing = onnx_missing()
    if missing:
        raise CompressError(missing)
    if not quantization_info(model):
        raise CompressError("only an int8 model is exported here: quantize it first.")
    if getattr(model.config, "task", None) is None:
        raise CompressError("this model has no task head: its ONNX graph would have no logits to give.")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = OnnxFiles(folder / "model.onnx", folder / "model-int8.onnx")
    example = tok.encode_batch(["an example sentence to trace .", "and a second one"], max_length=32)
    args = tuple(getattr(example, n) for n in INPUTS)
    twin = _Logits(float_twin(model))
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's notes on tracing
        torch.onnx.export(twin, args, str(files.float), input_names=list(INPUTS), output_names=["logits"],
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in INPUTS}, opset_version=OPSET, dynamo=False)
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's "consider pre-processing" note
    try:
        quantize_dynamic(str(files.float), str(files.int8), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])  # the encoder's products; the heads' Gemm stays float
    finally:
        logging.getLogger().setLevel(quiet)
    return files


class OnnxRuntimeModel(nn.Module):
    """An ONNX Runtime session called as a model: `peer(ids, types, mask).logits` [batch, labels] or
    [batch, seq, labels], on the CPU with torch's thread count. `source` gives its config and family (what
    scoring reads); it holds no weights of its own."""

    def __init__(self, path: str | Path, source: nn.Module, threads: int | None = None):
        super().__init__()
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads or torch.get_num_threads(), 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        self.config, self.family = source.config, source.family
        self.device_anchor = nn.Parameter(torch.empty(0), requires_grad=False)  # on the CPU, as scoring asks

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, **_: object) -> types.SimpleNamespace:
        given = {"input_ids": input_ids, "token_type_ids": token_type_ids if token_type_ids is not None
                 else torch.zeros_like(input_ids),
                 "attention_mask": attention_mask if attention_mask is not None else torch.ones_like(input_ids)}
        feed = {n: given[n].cpu().numpy() for n in self.names}
        return types.SimpleNamespace(logits=torch.from_numpy(self.session.run(None, feed)[0]))


__all__ = ["ONNX_MISSING", "OnnxFiles", "OnnxRuntimeModel", "export_int8", "float_twin", "onnx_missing"]
