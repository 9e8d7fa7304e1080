"""The compression lab: smaller, faster models from a fine-tuned one, measured side by side.

    from bertlab.compress import quantize, prune, head_importance, distill, DistillConfig
    small = quantize(model)                          # dynamic int8 of the encoder's Linear layers
    scores = head_importance(model, batches)         # Michel et al. 2019
    fewer = prune(model, scores, keep=0.5)           # half the heads, removed for real
    result = distill(model, tok, DistillConfig(task="sst2", layers=3))   # a 3-layer student
    save_compressed(small, tok, "runs/int8")         # `bertlab.load("runs/int8")` reads it back

Modules: `quantize`, `prune`, `distill`, `measure` (size, latency, score), `onnx` (an int8 model exported to
ONNX and run by ONNX Runtime: the optional `onnx` extra), `lab` (the task's data and a session's variants for
the Compression tab and the CLI), `cli`. What a compressed model is, in memory and
on disk, lives below loading in `bertlab.compressed` (`structure`, `storage`).
Names are imported on first use: `import bertlab.compress` does not pull in the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "quantize": "quantize",
    "prune": "prune", "head_importance": "prune", "heads_to_prune": "prune", "accuracy_curve": "prune",
    "distill": "distill", "DistillConfig": "distill", "make_student": "distill",
    "save_compressed": "bertlab.compressed.storage", "load_compressed": "bertlab.compressed.storage",
    "prune_heads": "bertlab.compressed.structure", "CompressError": "bertlab.compressed.structure",
    "measure": "measure", "Variant": "measure",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        where = _WHERE[name]
        return getattr(importlib.import_module(where if "." in where else f"bertlab.compress.{where}"), name)
    raise AttributeError(f"module 'bertlab.compress' has no attribute {name!r}")


__all__ = sorted(_WHERE)
