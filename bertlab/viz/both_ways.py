"""Both ways vs left to right, drawn: per model (a row) one head's attention pattern (full or triangular),
the grid of positions each position may read (the model's own mask), and its top-k for the picked word."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.both_ways import BothWays, Side
from bertlab.viz.text import plain_text
from bertlab.viz.theme import OKABE_ITO, Theme, current, finish


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def side_titles(side: Side) -> list[str]:
    """The row's three panel titles: pattern (full or triangular), what it may read, its guess."""
    shape = "triangular (left only)" if side.causal else "full (both sides)"
    return [plain_text(f"{_short(side.name, 22)}: attention, {shape}"),
            "what each position may read",
            plain_text(f"guesses {side.reads}{_rank(side)}")]


def _rank(side: Side) -> str:
    g = side.guess
    return "" if g is None or g.original_rank is None else f" (true #{g.original_rank})"


def plot_both_ways(result: BothWays, style: Theme | None = None) -> go.Figure:
    """Two rows (encoder, causal model) × three panels (pattern, reach grid, top-k bars)."""
    t = style or current()
    sides = (result.encoder, result.causal)
    fig = make_subplots(rows=2, cols=3, subplot_titles=[s for side in sides for s in side_titles(side)],
                        horizontal_spacing=0.09, vertical_spacing=0.16, column_widths=[0.36, 0.36, 0.28])
    for row, side in enumerate(sides, start=1):
        n = len(side.labels)
        gaps = 1 if n <= 40 else 0
        fig.add_trace(go.Heatmap(
            z=side.pattern.tolist(), x=list(range(n)), y=list(range(n)), zmin=0, zmax=1, colorscale="Blues",
            showscale=row == 1, colorbar=dict(title=dict(text="weight"), thickness=12, len=0.4, y=0.8, x=1.02),
            xgap=gaps, ygap=gaps, hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra></extra>"), row=row, col=1)
        fig.add_trace(go.Heatmap(
            z=side.reach.to(int).tolist(), x=list(range(n)), y=list(range(n)), zmin=0, zmax=1, showscale=False,
            colorscale=[[0, "#f2f2f2"], [1, OKABE_ITO[0]]], xgap=gaps, ygap=gaps,
            hovertemplate="position %{y} may read %{x}: %{z}<extra></extra>"), row=row, col=2)
        labels = list(side.labels)  # finish() escapes tick labels and data
        for col in (1, 2):
            axis = dict(tickmode="array", tickvals=list(range(n)), ticktext=labels, showgrid=False, zeroline=False,
                        tickfont=dict(size=10 if n <= 30 else 8))
            fig.update_xaxes(axis, tickangle=-60 if n > 8 else 0, row=row, col=col)
            fig.update_yaxes(axis, autorange="reversed", row=row, col=col)
        if side.position is not None:  # the picked word's row in both grids
            for col in (1, 2):
                fig.add_hline(y=side.position, line=dict(color=OKABE_ITO[5], width=1, dash="dot"), row=row, col=col)
        if side.guess is not None:
            cands = side.guess.candidates
            fig.add_trace(go.Bar(
                x=[c.probability for c in cands][::-1], y=list(side.guess_labels)[::-1],
                orientation="h", marker_color=OKABE_ITO[1 if side.causal else 4], showlegend=False,
                hovertemplate="%{y}: %{x:.3f}<extra></extra>"), row=row, col=3)
            fig.update_xaxes(title=dict(text="probability"), rangemode="tozero", row=row, col=3)
        else:
            fig.add_trace(go.Bar(x=[], y=[], showlegend=False), row=row, col=3)  # same traces every time
            fig.update_xaxes(visible=False, row=row, col=3)
            fig.update_yaxes(visible=False, row=row, col=3)
    fig.update_annotations(font=dict(size=12))  # the panel titles
    n = max(len(s.labels) for s in sides)
    fig.update_layout(title=dict(text=plain_text(f"Both ways vs left to right: layer {result.layer}, head "
                                                 f"{result.head}; the word {result.word.text!r}"),
                                 font=dict(size=14)),
                      height=int(min(1100, max(640, 260 + 26 * n))), width=1000, plot_bgcolor="white",
                      margin=dict(l=90, r=90, t=90, b=90))
    return finish(fig, t)
