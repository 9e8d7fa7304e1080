"""Plotly figures for next-sentence prediction (pure: results in, a figure out)."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.nsp import CLS, SEP, A, AttentionMass, B, NSPResult

IS_NEXT, NOT_NEXT = "#2ca02c", "#bbbbbb"
GROUP_COLORS = {A: "#4a90d9", B: "#e6842a", CLS: "#7f7f7f", SEP: "#c7c7c7"}
GROUP_NAMES = {A: "sentence A", B: "sentence B", CLS: "[CLS]", SEP: "[SEP]"}


def plot_nsp_probability(result: NSPResult) -> go.Figure:
    """One stacked bar: P(B follows A) in green, P(B is random) in grey; a line at 50 %."""
    p = result.is_next_probability
    fig = go.Figure()
    for name, value, color in (("B follows A (IsNext)", p, IS_NEXT), ("B is random (NotNext)", 1 - p, NOT_NEXT)):
        fig.add_trace(
            go.Bar(
                x=[value], y=["NSP"], orientation="h", name=name, marker_color=color,
                text=[f"{100 * value:.1f}%"], textposition="inside", insidetextanchor="middle",
                hovertemplate=f"{name}: %{{x:.3f}}<extra></extra>",
            )
        )
    verdict = "follows A" if result.is_next else "looks random"
    fig.update_layout(
        barmode="stack", height=190, width=620, plot_bgcolor="white",
        title=dict(text=f"The model thinks B {verdict}: P(IsNext) = {100 * p:.1f}%", font=dict(size=14)),
        xaxis=dict(range=[0, 1], tickformat=".0%", title=dict(text="probability")),
        yaxis=dict(visible=False),
        legend=dict(orientation="h", y=-0.6, traceorder="normal"),
        margin=dict(l=20, r=20, t=50, b=20),
        shapes=[dict(type="line", x0=0.5, x1=0.5, y0=0, y1=1, yref="paper", line=dict(dash="dot", width=1))],
    )
    return fig


def plot_attention_mass(mass: AttentionMass, sources: Sequence[str] = (A, B, CLS)) -> go.Figure:
    """Stacked bars per layer, one panel per group of attending tokens: the share of its
    attention that lands on A, B, [CLS] and [SEP] (mean over heads and over its tokens)."""
    sources = [s for s in sources if s in mass.groups]
    if not sources:
        raise ValueError(f"none of the groups to show are in this result ({', '.join(mass.groups)}).")
    fig = make_subplots(
        rows=1, cols=len(sources), shared_yaxes=True, horizontal_spacing=0.04,
        subplot_titles=[f"from {GROUP_NAMES.get(s, s)}" for s in sources],
    )
    layers = list(range(mass.num_layers))
    traces, cols = [], []
    for col, source in enumerate(sources, start=1):
        for target in mass.groups:
            share = mass.share(source, target)  # [layers]
            cols.append(col)
            traces.append(
                go.Bar(
                    x=layers, y=[round(float(v), 4) for v in share], name=f"to {GROUP_NAMES.get(target, target)}",
                    marker_color=GROUP_COLORS.get(target), legendgroup=target, showlegend=col == 1,
                    hovertemplate=(
                        f"layer %{{x}}: {GROUP_NAMES.get(source, source)} → "
                        f"{GROUP_NAMES.get(target, target)} %{{y:.1%}}<extra></extra>"
                    ),
                )
            )
        fig.update_xaxes(title_text="layer", tickmode="linear", dtick=1, row=1, col=col)
    fig.add_traces(traces, rows=[1] * len(traces), cols=cols)  # at once: add_trace per bar is slow
    fig.update_yaxes(range=[0, 1], tickformat=".0%", title_text="share of attention", row=1, col=1)
    fig.update_layout(
        barmode="stack", bargap=0.15, height=380, width=max(520, 260 * len(sources)), plot_bgcolor="white",
        title=dict(text="Where attention goes, layer by layer (mean over heads)", font=dict(size=14)),
        margin=dict(l=60, r=20, t=70, b=50),
    )
    return fig
