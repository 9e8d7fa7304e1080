"""Head pruning: score every attention head, remove the least important ones for real.

    scores = head_importance(model, batches)          # [layer, head], Michel et al. 2019
    small = prune(model, scores, keep=0.5)            # a copy with half the heads (smaller matrices)
    curve = accuracy_curve(model, scores, eval_set)   # task accuracy against heads kept

Importance (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?"): put a gate
ξ_h = 1 on each head's output z and average |∂L/∂ξ_h| over labelled examples; each layer's
scores are then divided by their L2 norm, as in the paper. The gates are hooks on `hook_z`
(the same place `head_mask` acts), so it works on any family and on a model pruned before.
Switching a head off there equals removing it (tested to 1e-5).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.compressed.structure import CompressError, heads_per_layer, is_int8_linear, kept_heads, prune_heads
from bertlab.runtime import eval_mode, model_device

Progress = Callable[[int, int], None]


# ---------------------------------------------------------------------------------------------
# Importance
# ---------------------------------------------------------------------------------------------
def _gate(gate: torch.Tensor, z: torch.Tensor, name: str) -> torch.Tensor:
    """z [batch, seq, head, d_head] times one gate per head [head]."""
    return z * gate.to(z.dtype)[None, None, :, None]


def _task_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The task head's loss on a collated batch (classification: cross-entropy over labels)."""
    out = model(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    if out.logits is None:
        raise CompressError("head importance needs a task head (e.g. an SST-2 classifier): fine-tune the model first.")
    logits = out.logits.float()
    labels = batch["labels"]
    if logits.dim() == 3:  # token classification: [batch, seq, labels]
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    return F.cross_entropy(logits, labels)


def head_importance(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], normalise: bool = True,
                    progress: Progress | None = None, cancel: threading.Event | None = None) -> list[torch.Tensor]:
    """Michel et al.'s importance of each head: mean |∂loss/∂gate| over `batches` (collated task
    batches with labels). Returns one tensor per layer ([heads of that layer], float32), each
    divided by its L2 norm when `normalise`. The model's weights get no gradient and stay as they are."""
    if any(is_int8_linear(m) for m in model.modules()):
        raise CompressError("score heads on the float model (int8 layers have no gradients): prune, then quantize.")
    fam = model.family
    batches = list(batches)
    device = model_device(model)
    gates = [torch.ones(n, device=device, requires_grad=True) for n in heads_per_layer(model)]
    total = [torch.zeros(len(g)) for g in gates]
    needs = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        with eval_mode(model), model.hooks([(fam.hook_name(i, "hook_z"), partial(_gate, g))
                                            for i, g in enumerate(gates)]):
            for done, batch in enumerate(batches, 1):
                if cancel is not None and cancel.is_set():
                    break
                batch = {k: v.to(device) for k, v in batch.items()}
                loss = _task_loss(model, batch)
                grads = torch.autograd.grad(loss, gates)
                for t, g in zip(total, grads):
                    t += g.detach().abs().cpu() * len(batch["labels"])
                if progress is not None:
                    progress(done, len(batches))
    finally:
        for p, n in zip(model.parameters(), needs):
            p.requires_grad_(n)
    n = max(1, sum(len(b["labels"]) for b in batches))
    scores = [t / n for t in total]
    if normalise:
        scores = [s / s.norm().clamp(min=1e-12) for s in scores]
    return scores


# ---------------------------------------------------------------------------------------------
# Choosing and removing heads
# ---------------------------------------------------------------------------------------------
def heads_to_prune(model: nn.Module, scores: Sequence[torch.Tensor], keep: float | int) -> dict[int, list[int]]:
    """{layer: original head indices} of the least important heads, so that `keep` of the model's heads
    stay (a fraction in (0, 1], or a count). Global ranking; every layer keeps its best head."""
    kept = kept_heads(model)
    total = sum(len(k) for k in kept)
    n_keep = round(keep * total) if isinstance(keep, float) else int(keep)
    if not 1 <= n_keep <= total:
        raise CompressError(f"keep must leave between 1 and {total} heads (a fraction such as 0.5, or a count); "
                            f"got {keep}.")
    n_keep = max(n_keep, len(kept))  # one head per layer at least
    if len(scores) != len(kept) or any(len(s) != len(k) for s, k in zip(scores, kept)):
        raise CompressError("the head scores do not fit this model's heads: score the model you prune.")
    ranked = sorted(((float(s[pos]), layer, pos) for layer, s in enumerate(scores) for pos in range(len(s))),
                    reverse=True)
    best = {(layer, int(torch.as_tensor(scores[layer]).argmax())) for layer in range(len(kept))}
    chosen = set(best)
    for _, layer, pos in ranked:
        if len(chosen) >= n_keep:
            break
        chosen.add((layer, pos))
    out: dict[int, list[int]] = {}
    for layer, heads in enumerate(kept):
        gone = [h for pos, h in enumerate(heads) if (layer, pos) not in chosen]
        if gone:
            out[layer] = gone
    return out


def prune(model: nn.Module, scores: Sequence[torch.Tensor], keep: float | int) -> nn.Module:
    """A copy of `model` without its least important heads (see `heads_to_prune`), in eval mode."""
    small = copy.deepcopy(model)
    small.config = small.config.replace(extra=copy.deepcopy(small.config.extra))
    return prune_heads(small, heads_to_prune(model, scores, keep)).eval()


def head_mask_hooks(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> list[tuple[str, Callable]]:
    """Hooks that switch `heads` ({layer: original indices}) off at `hook_z`: the reference a pruned
    model must equal."""
    fam = model.family
    hooks = []
    for layer, kept in enumerate(kept_heads(model)):
        off = set(heads.get(layer, ()))
        if off:
            gate = torch.tensor([0.0 if h in off else 1.0 for h in kept], device=model_device(model))
            hooks.append((fam.hook_name(layer, "hook_z"), partial(_gate, gate)))
    return hooks


# ---------------------------------------------------------------------------------------------
# The curve: task accuracy against heads kept
# ---------------------------------------------------------------------------------------------
@dataclass
class CurvePoint:
    heads_kept: int
    fraction: float  # of the model's heads
    score: float  # the task's main metric (accuracy for SST-2), 0-1


def accuracy_curve(model: nn.Module, scores: Sequence[torch.Tensor], evaluate: Callable[[nn.Module], float],
                   fractions: Sequence[float] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
                   on_point: Callable[[CurvePoint], None] | None = None,
                   cancel: threading.Event | None = None) -> list[CurvePoint]:
    """`evaluate(model) -> score` with the least important heads switched off, for each fraction of
    heads kept (switching off equals pruning, and needs no copy). `on_point` sees each point as it comes."""
    total = sum(heads_per_layer(model))
    points: list[CurvePoint] = []
    for fraction in fractions:
        if cancel is not None and cancel.is_set():
            break
        gone = heads_to_prune(model, scores, fraction) if fraction < 1 else {}
        with model.hooks(head_mask_hooks(model, gone)):
            score = float(evaluate(model))
        point = CurvePoint(total - sum(len(v) for v in gone.values()), fraction, score)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


__all__ = ["CurvePoint", "accuracy_curve", "head_importance", "head_mask_hooks", "heads_to_prune", "prune"]
