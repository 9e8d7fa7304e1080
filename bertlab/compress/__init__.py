"""The compression lab: smaller, faster models from a fine-tuned one, measured side by side.

    from bertlab.compress import quantize, prune, head_importance, distill, DistillConfig
    small = quantize(model)                          # dynamic int8 of the encoder's Linear layers
    scores = head_importance(model, batches)         # Michel et al. 2019
    fewer = prune(model, scores, keep=0.5)           # half the heads, removed for real
    result = distill(model, tok, DistillConfig(task="sst2", layers=3))   # a 3-layer student
    save_compressed(small, tok, "runs/int8")         # `bertlab.load("runs/int8")` reads it back

Modules: `structure` (pruned heads and int8 layers in memory), `storage` (the folder format; beside
`bertlab.loading`),
`quantize`, `prune`, `distill`, `measure` (size, latency, score), `lab` (the task's data and a
session's variants for the Compression tab and the CLI), `cli`.
Names are imported on first use, so that `bertlab.loading` can read a compressed folder through
`storage` without pulling in the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "quantize": "quantize",
    "prune": "prune", "head_importance": "prune", "heads_to_prune": "prune", "accuracy_curve": "prune",
    "distill": "distill", "DistillConfig": "distill", "make_student": "distill",
    "save_compressed": "storage", "load_compressed": "storage", "prune_heads": "structure",
    "CompressError": "structure",
    "measure": "measure", "Variant": "measure",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"bertlab.compress.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'bertlab.compress' has no attribute {name!r}")


__all__ = sorted(_WHERE)
