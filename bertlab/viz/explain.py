"""Attention beside attribution for one prediction, and the heads test (pure: results in, a figure out)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.attention_check import AttentionCheck
from bertlab.analysis.attribution import METHOD_NAMES, Attribution
from bertlab.viz.text import plain_text
from bertlab.viz.theme import NEUTRAL, OKABE_ITO, Theme, current, finish

ROW_HOVER = "%{x}<br>%{customdata:.4f}<extra>%{y}</extra>"


def _fmt(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:+.2f}"


def agreement_text(check: AttentionCheck) -> str:
    """One line: how well attention and rollout rank the words as the attribution does."""
    return (f"rank agreement with the attribution: attention ρ {_fmt(check.spearman_raw)}, "
            f"τ {_fmt(check.kendall_raw)}; rollout ρ {_fmt(check.spearman_rollout)}, τ {_fmt(check.kendall_rollout)}")


def heads_text(check: AttentionCheck) -> str:
    """One line: what switching off the credited heads did, against random heads."""
    h = check.heads
    if h is None:
        return ""
    word = check.tokens[check.top_attention]
    return (f"Switching off the {len(h.heads_off)} heads that attend most from {check.tokens[check.query]!r} to "
            f"{word!r} moves the probability {100 * h.base:.1f}% → {100 * h.ablated:.1f}% "
            f"({100 * h.change:+.1f} points); {len(h.heads_off)} random heads: {100 * h.random_mean:.1f}% "
            f"({100 * h.random_change:+.1f} points, mean of {len(h.random_draws)} draws).")


def plot_attention_check(check: AttentionCheck, attribution: Attribution, style: Theme | None = None) -> go.Figure:
    """Top: three rows over the input tokens — attention from the query (the chosen view), rollout,
    and the attribution — each scaled to its own largest size (attribution signed: red helps the
    prediction, blue works against it); special tokens in grey. Bottom: the probability with all
    heads on, with the credited heads off, and with random heads off."""
    t = style or current()
    n = len(check.tokens)
    labels = [f"{i}:{tok}" for i, tok in enumerate(check.tokens)]
    method = METHOD_NAMES.get(attribution.method, attribution.method)
    rows = [(f"attention ({check.view})", np.asarray(check.raw)), ("rollout (all layers)", np.asarray(check.rollout)),
            (method, np.asarray(check.attribution))]
    scored = np.asarray(check.scored, dtype=bool)
    z, raw = [], []
    for _, values in rows:
        size = np.abs(values[scored]).max() if scored.any() else 0.0
        scaled = values / size if size > 0 else values * 0.0
        z.append(np.where(scored, np.round(scaled, 4), np.nan))  # special tokens: no colour
        raw.append(np.round(values, 5))
    has_heads = check.heads is not None
    fig = make_subplots(rows=2 if has_heads else 1, cols=1, row_heights=[0.62, 0.38] if has_heads else [1.0],
                        vertical_spacing=0.3, subplot_titles=None)
    fig.add_trace(go.Heatmap(
        z=z, x=labels, y=[name for name, _ in rows], customdata=raw, hovertemplate=ROW_HOVER,
        colorscale=t.diverging, reversescale=True, zmid=0, zmin=-1, zmax=1, xgap=1, ygap=2,
        colorbar=dict(title=dict(text="scaled"), thickness=10, len=0.55, y=1.0, yanchor="top"),
    ), row=1, col=1)
    q = check.query
    fig.add_shape(type="rect", x0=q - 0.5, x1=q + 0.5, y0=-0.5, y1=2.5, line=dict(color="#000", width=2),
                  row=1, col=1)
    fig.update_xaxes(tickangle=-60 if n > 8 else 0, tickfont=dict(size=10 if n > 30 else 11), row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    if has_heads:
        h = check.heads
        names = ["all heads on", f"{len(h.heads_off)} credited heads off", f"{len(h.heads_off)} random heads off"]
        values = [h.base, h.ablated, h.random_mean]
        fig.add_trace(go.Bar(
            x=values, y=names, orientation="h", marker_color=[NEUTRAL, OKABE_ITO[1], OKABE_ITO[0]],
            text=[f"{100 * v:.1f}%" for v in values], textposition="auto", showlegend=False,
            hovertemplate="%{y}: %{x:.4f}<extra></extra>",
        ), row=2, col=1)
        top = min(1.0, max(values) * 1.3) or 1.0  # small probabilities stay readable
        fig.update_xaxes(range=[0, top], tickformat=".1%" if top < 0.1 else ".0%",
                         title_text=plain_text(attribution.target.name), row=2, col=1)
        fig.update_yaxes(autorange="reversed", row=2, col=1)
    title = (f"Does attention explain {plain_text(attribution.target.name)}?<br><sup>{agreement_text(check)}"
             + (f"; completeness gap {100 * attribution.completeness_gap:.2f}%" if attribution.method == "ig" else "")
             + "</sup>")
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), plot_bgcolor="white",
        width=int(min(1100, max(560, 160 + 28 * n))), height=430 if has_heads else 300,
        margin=dict(l=170, r=40, t=80, b=40),
    )
    return finish(fig, t, wide=True)


def explain_notes(a: Attribution, c: AttentionCheck) -> list[tuple[str, str]]:
    """What the student should know about an attribution and its check against the attention."""
    what = f"{METHOD_NAMES[a.method]} of {a.target.name} = {100 * a.value:.1f}%"
    if a.method == "ig":
        what += (f": the scores add up to {100 * a.total:+.2f} points, the change from the baseline "
                 f"({100 * a.baseline_value:.1f}%) is {100 * (a.value - a.baseline_value):+.2f} points "
                 f"(completeness gap {100 * a.completeness_gap:.2f}%, {a.steps} steps).")
    else:
        what += ": the gradient at the input times the input (no baseline, no completeness)."
    top_attr, top_att = c.tokens[c.top_attribution], c.tokens[c.top_attention]
    notes: list[tuple[str, str]] = [
        ("info", what),
        ("info", f"The attribution ranks {top_attr!r} first, the attention ({c.view}) {top_att!r}; "
                 f"{agreement_text(c)}."),
    ]
    if c.heads is not None:
        notes.append(("info", heads_text(c)))
    if a.warning:
        notes.append(("warning", a.warning))
    return notes
