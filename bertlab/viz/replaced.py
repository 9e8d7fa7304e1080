"""The ELECTRA discriminator's verdict on a text: one bar per word, P(replaced)."""

from __future__ import annotations

import plotly.graph_objects as go

from bertlab.analysis.replaced import ReplacedTokens
from bertlab.viz.theme import NEUTRAL, OKABE_ITO, Theme, current, finish

REPLACED, ORIGINAL = OKABE_ITO[1], NEUTRAL


def plot_replaced(result: ReplacedTokens, style: Theme | None = None) -> go.Figure:
    """Bars of P(replaced) per word, in text order: vermilion above 50 % ("replaced?"), grey below."""
    t = style or current()
    labels = [f"{i + 1}. {w}" for i, (w, _) in enumerate(result.words)]  # numbered: repeated words stay apart
    p = [round(p, 4) for _, p in result.words]
    fig = go.Figure(go.Bar(
        x=labels, y=p, marker_color=[REPLACED if v > 0.5 else ORIGINAL for v in p],
        text=[f"{100 * v:.0f}%" for v in p], textposition="outside",
        hovertemplate="<b>%{x}</b><br>P(replaced) %{y:.3f}<extra></extra>", showlegend=False,
    ))
    n = len(result.flagged)
    fig.update_layout(
        title=dict(text=f"Replaced? The discriminator flags {n} word{'s' if n != 1 else ''} (P > 50%)",
                   font=dict(size=14)),
        yaxis=dict(range=[0, 1.1], tickformat=".0%", title=dict(text="P(replaced)")),
        xaxis=dict(type="category", tickangle=-45 if len(labels) > 12 else 0),
        height=320, width=max(420, 36 * len(labels) + 120), plot_bgcolor="white",
        margin=dict(l=50, r=20, t=50, b=80),
        shapes=[dict(type="line", x0=0, x1=1, xref="paper", y0=0.5, y1=0.5, line=dict(dash="dot", width=1))],
    )
    return finish(fig, t)
