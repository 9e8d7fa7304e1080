"""Switch one of the old tree's speed devices off (BERTLAB_OFF=name[,name]) for the device ablation."""
import os

_off = set(filter(None, os.environ.get("BERTLAB_OFF", "").split(",")))
if _off:
    import contextlib

    import torch
    from torch import nn

    import bertlab.families  # noqa: F401  (Bert.FAMILY)
    import bertlab.model as m
    import bertlab.training.loop as loop

    if "dropout_bypass" in _off:  # eval-mode Dropout goes through nn.Module.__call__
        m.Dropout.__call__ = nn.Module.__call__
    if "dropout_scale" in _off:  # Dropout draws its mask with F.dropout (bernoulli_)
        m.Dropout.forward = nn.Dropout.forward
    if "head_major" in _off:  # attention with dropout on a CPU goes through SDPA, no _HeadMajor/_PaddedHeadMajor
        m._cpu_dropout_attention = lambda *a, **k: False
    if "stacked_projection" in _off:  # q, k, v from three matmuls, no _stacked_projection / _PaddedHeadMajor
        m._plain_linears = lambda *a: False
    if "grad_table" in _off:  # the embedding's ordinary backward
        m.lookup = lambda table, ids, owner: table(ids)
    if "grad_scale" in _off:  # clip_grad_norm_ then step(), no optimizer.grad_scale
        def clip_and_step(optimizer, params, max_norm):
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
            optimizer.step()
            return norm
        loop.clip_and_step = clip_and_step
    if "heap" in _off:  # glibc's defaults: no mallopt, no HeapCreep trims
        loop.kept_heap = contextlib.nullcontext

        class _NoCreep:
            def __init__(self, *a, **k):
                pass

            def after_step(self):
                pass
        loop.HeapCreep = _NoCreep
    if "packing" in _off:
        m.BertModel._packs = lambda self, *a, **k: False
    if "cls_only" in _off:
        m.Bert._asked_rows = lambda self, *a, **k: (None, None)
