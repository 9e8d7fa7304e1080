"""The model picker's card: what the model on show is, its size and which heads it has."""

from __future__ import annotations

import html

import torch

from bertlab.viz.theme import OFF_TEXT, OK_TEXT


def model_card(model: torch.nn.Module, name: str) -> str:
    """HTML: what the current model is and which heads it has (the picker's card); names escaped."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) / 1e6
    task = html.escape((c.task or "").replace("_", " "))
    labels = ", ".join(str(v) for v in (c.id2label or {}).values())

    def mark(ok: bool, what: str) -> str:
        colour, sign = (OK_TEXT, "✓") if ok else (OFF_TEXT, "✗")
        return f'<span style="{colour};margin-right:12px">{sign} {what}</span>'

    pair = "SOP head (sentence order)" if model.family.pair_task == "sop" else "NSP head"
    heads = mark(model.has_mlm, "MLM head") + mark(model.has_nsp, pair)
    if getattr(model, "has_rtd", False):
        heads += mark(True, "replaced-token head (ELECTRA)")
    named = f": {task}" if task else ""
    named += f" ({html.escape(labels)})" if labels and len(labels) < 80 else ""
    heads += mark(bool(task), f"task head{named}")
    return (
        f'<div style="line-height:1.6"><b>{html.escape(name)}</b> · {c.num_hidden_layers} layers · '
        f"{c.hidden_size} wide · {c.num_attention_heads} heads · {n:.1f} M parameters · "
        f"vocabulary {c.vocab_size:,} · up to {c.max_position_embeddings} tokens<br>{heads}</div>"
    )
