"""The model picker's card: what the model on show is, its size and which heads it has."""

from __future__ import annotations

import html

import torch

from bertlab import hub
from bertlab.analysis.classics import ClassicResult, classics_line
from bertlab.settings import in_hub_cache
from bertlab.viz.theme import OFF_TEXT, OK_TEXT, help_html

REAL_BERT = ("A real BERT for a lesson: <code>bertlab download bert-base-uncased</code> once online, then "
             "<code>bertlab serve --class N --model bert-base-uncased</code> offline.")


def model_card(model: torch.nn.Module, name: str, classics: list[ClassicResult] | None = None,
               real_bert: bool = False) -> str:
    """HTML: what the current model is and which heads it has (the picker's card); names escaped.
    `classics`: how it guesses the lectures' examples (`guess_classics`; None: not shown); `real_bert`:
    say how to have a real BERT for a lesson (on the offline default's card)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) / 1e6
    task = html.escape((c.task or "").replace("_", " "))
    labels = ", ".join(str(v) for v in (c.id2label or {}).values())

    def mark(ok: bool, what: str) -> str:
        colour, sign = (OK_TEXT, "✓") if ok else (OFF_TEXT, "✗")
        return f'<span style="{colour};margin-right:12px">{sign} {what}</span>'

    pair = "SOP head (sentence order)" if model.family.pair_task == "sop" else "NSP head"
    next_word = getattr(model, "has_lm", False)
    if model.family.causal or next_word:  # its head guesses the next word, not a masked one
        reads = "reads left to right" if model.family.causal else "reads both ways: it can see the word"
        # (a next-token BERT's head is its MLM head, trained to guess the next word: the Mask tab guesses that)
        heads = mark(next_word, f"next-word head ({reads})") + mark(False, "MLM head") + mark(model.has_nsp, pair)
    else:
        heads = mark(model.has_mlm, "MLM head") + mark(model.has_nsp, pair)
    if getattr(model, "has_rtd", False):
        heads += mark(True, "replaced-token head (ELECTRA)")
    named = f": {task}" if task else ""
    named += f" ({html.escape(labels)})" if labels and len(labels) < 80 else ""
    heads += mark(bool(task), f"task head{named}")
    return (
        f'<div style="line-height:1.6"><b>{html.escape(name)}</b> · {c.num_hidden_layers} layers · '
        f"{c.hidden_size} wide · {c.num_attention_heads} heads · {n:.1f} M parameters · "
        f"vocabulary {c.vocab_size:,} · up to {c.max_position_embeddings} tokens<br>{heads}{_classics(classics)}"
        f"{'<br>' + REAL_BERT if real_bert else ''}</div>"
    )


def _classics(results: list[ClassicResult] | None) -> str:
    """The card's line on the lectures' examples, each sentence and the model's top guesses in its tooltip."""
    if not results:
        return ""
    tip = "\n".join(f"{'✓' if r.hit else '✗'} {r.sentence} → {', '.join(r.top)}" for r in results)
    good = sum(r.hit for r in results) >= 0.75 * len(results)
    return (f'<span style="{OK_TEXT if good else OFF_TEXT}" title="{html.escape(tip)}" '
            f'class="bertlab-classics">{html.escape(classics_line(results), quote=False)}</span>')


PICK_HUB = "— recommended hub models —"


def hub_options(confined: bool) -> list[tuple[str, str]]:
    """(label, name) of the recommended hub models, each marked cached or not (no network)."""
    out = [(PICK_HUB, "")]
    for m in hub.RECOMMENDED:
        here = in_hub_cache(m.name)
        mark = " ✓ cached" if here else (" ✗ not on this server" if confined else "")
        out.append((f"{m.name} · {m.about}{mark}", m.name))
    return out


def model_lacks(model: torch.nn.Module) -> list[str]:
    """The pre-training heads a model lacks, in words ("MLM head", "NSP or SOP head")."""
    out = []
    if not model.has_mlm and not getattr(model, "has_rtd", False):
        out.append("MLM head")
    if not model.has_nsp:
        out.append("NSP or SOP head")
    return out


def small_note(text: str) -> str:
    """A short line of plain text in the help style, inline."""
    return help_html(html.escape(text), "span")
