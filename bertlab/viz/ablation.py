"""Figures of head ablation and the logit lens (pure: a result in, a figure out)."""

from __future__ import annotations

import html
import math

import numpy as np
import plotly.graph_objects as go

from bertlab.analysis.ablation import AblationResult, HeadEffects, LogitLens
from bertlab.viz.text import plain_text
from bertlab.viz.theme import FAINT, Theme, current, finish

DECIMALS = 4


def plot_head_effects(effects: HeadEffects, style: Theme | None = None) -> go.Figure:
    """Layer x head heatmap of the change in the target's log-probability when that head alone is
    switched off (red = the head helped: switching it off lowers the target)."""
    t = style or current()
    z = np.round(effects.effects.numpy(), DECIMALS)  # [layer, head]
    layers, heads = z.shape
    bound = float(max(np.abs(z).max(), 1e-6))
    ranks = effects.ranks.numpy()
    custom = np.stack([np.round(effects.log_probs.numpy(), DECIMALS), ranks], axis=-1)  # [layer, head, 2]
    q = effects.query
    fig = go.Figure(
        go.Heatmap(
            z=z, x=list(range(heads)), y=list(range(layers)), customdata=custom,
            colorscale=t.diverging, zmin=-bound, zmax=bound, zmid=0.0,
            hovertemplate=(
                "layer %{y}, head %{x} off<br>change %{z:+.3f} nats<br>"
                "log-prob %{customdata[0]:.3f}, rank %{customdata[1]}<extra></extra>"
            ),
            colorbar=dict(title=dict(text="Δ log-prob"), thickness=12),
            xgap=1, ygap=1,
        )
    )
    fig.update_layout(
        title=dict(
            text=f"Switching off one head: change in log P(“{plain_text(q.target)}”) at {plain_text(q.mask_token)} "
                 f"(now {effects.base_log_prob:.2f})",
            font=dict(size=14),
        ),
        xaxis=dict(title="head", tickmode="array", tickvals=list(range(heads)), constrain="domain"),
        yaxis=dict(title="layer", tickmode="array", tickvals=list(range(layers)), autorange="reversed",
                   scaleanchor="x", constrain="domain"),
        width=int(min(900, 220 + 40 * heads)), height=int(min(700, 160 + 40 * layers)),
        margin=dict(l=60, r=20, t=60, b=50), plot_bgcolor="white",
    )
    return finish(fig, t)


def lens_row_labels(lens: LogitLens) -> list[str]:
    """One y label per stage: its name and the target's rank there."""
    return [f"{name} · “{lens.query.target}” #{int(r)}" for name, r in zip(lens.stage_names, lens.target_ranks)]


def plot_logit_lens(lens: LogitLens, style: Theme | None = None) -> go.Figure:
    """Stage x top-k table as a heatmap: each cell is a predicted piece, coloured by its probability;
    each row label gives the target's rank at that stage."""
    t = style or current()
    probs = np.round(lens.top_probs.numpy(), DECIMALS)  # [stage, k]
    stages, k = probs.shape
    rows = lens_row_labels(lens)
    target_p = np.round(lens.target_log_probs.exp().numpy(), DECIMALS)
    custom = np.empty((stages, k, 2), dtype=object)
    custom[:, :, 0] = np.array(rows, dtype=object)[:, None]
    custom[:, :, 1] = target_p[:, None]
    fig = go.Figure(
        go.Heatmap(
            z=probs, x=[f"#{i + 1}" for i in range(k)], y=list(range(stages)),
            text=lens.top_tokens, texttemplate="%{text}", textfont=dict(size=12),
            customdata=custom, colorscale=t.sequential, zmin=0.0, zmax=float(max(probs.max(), 1e-6)),
            hovertemplate=(
                "%{customdata[0]}<br><b>%{text}</b>: p = %{z:.3f}<br>"
                "target p = %{customdata[1]:.4f}<extra></extra>"
            ),
            colorbar=dict(title=dict(text="probability"), thickness=12),
            xgap=1, ygap=1,
        )
    )
    title = (f"Next-token lens after {plain_text(lens.query.mask_token)}: the LM head's top guesses for the token "
             "that follows, after each stage" if lens.next_token else
             f"Logit lens at {plain_text(lens.query.mask_token)}: the MLM head's top predictions after each stage")
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)),
        xaxis=dict(side="top"),  # no axis title: it would sit on the figure title
        yaxis=dict(tickmode="array", tickvals=list(range(stages)), ticktext=rows, autorange="reversed"),
        width=int(min(1100, 320 + 110 * k)), height=int(160 + 42 * stages),
        margin=dict(l=260, r=20, t=80, b=30), plot_bgcolor="white",
    )
    return finish(fig, t)


def summary_html(result: AblationResult) -> str:
    """The target's log-probability with all heads on and with the chosen ones off, and the top-k of each."""
    q, esc = result.query, html.escape
    base = f"log P(“{esc(q.target)}”) = <b>{result.base_log_prob:.2f}</b> (rank {result.base_rank}) with every head on"
    if not result.heads_off:
        lines = [base + ". Click heads above to switch them off."]
    else:
        names = ", ".join(f"L{la}H{h}" for la, h in result.heads_off[:12])
        more = f" and {len(result.heads_off) - 12} more" if len(result.heads_off) > 12 else ""
        colour = "#d62728" if result.change < 0 else "#1f77b4"
        lines = [
            base + ";",
            (f"with {len(result.heads_off)} head(s) off ({esc(names)}{more}): <b>{result.ablated_log_prob:.2f}</b> "
             f"(rank {result.ablated_rank}), change <b style=\"color:{colour}\">{result.change:+.2f} nats</b> "
             f"(probability ×{math.exp(result.change):.3g})."),
        ]
    tops = top_html("all heads on", result.base_top)
    if result.heads_off:
        tops += top_html("chosen heads off", result.ablated_top)
    return (
        f'<div style="line-height:1.6">{"<br>".join(lines)}</div>'
        f'<div style="display:flex;gap:2em;margin-top:4px">{tops}</div>'
    )


def top_html(title: str, top: list[tuple[str, float]]) -> str:
    rows = "".join(f"<li>{html.escape(piece)} <span style='{FAINT}'>{p:.3f}</span></li>" for piece, p in top)
    return f'<div><i>{html.escape(title)}</i><ol style="margin:2px 0">{rows}</ol></div>'


def ablation_notes(result: AblationResult, mask_token: str, guessed: bool = False,
                   unknown: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """What the student should know about this input, beyond the numbers (`guessed`: no target was
    given; `unknown`: the panel's note on pieces outside the vocabulary, bertlab.panels.base.unknown_notes)."""
    q = result.query
    why = " (no target given: the model's own top guess)" if guessed else ""
    notes: list[tuple[str, str]] = [
        ("info", f"{len(q.tokens)} tokens; following “{q.target}”{why} at the {mask_token} (token {q.position}).")
    ]
    if q.warning:
        notes.append(("warning", q.warning))
    return notes + (unknown or [])
