"""Figures of the input representation (pure: a Representation in, a figure out)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from bertlab.analysis.representation import Representation
from bertlab.viz.theme import (
    NEUTRAL,
    OKABE_ITO,
    Theme,
    current,
    finish,
    labelled_points,
    plot_area,
    point_text,
)

PART_COLORS: dict[str, str] = {  # colour-blind safe (bertlab.viz.theme.OKABE_ITO)
    "token": OKABE_ITO[0],
    "segment": OKABE_ITO[1],
    "position": OKABE_ITO[2],
    "sum": NEUTRAL,
    "normalised": OKABE_ITO[3],
}
PART_LABELS: dict[str, str] = {
    "token": "token embedding",
    "segment": "segment embedding",
    "position": "position embedding",
    "sum": "sum (before LayerNorm)",
    "normalised": "normalised sum (after LayerNorm)",
}
DECIMALS = 4
PROJECTION_SIZE = (720, 560)  # px on the normal page: the 2-D map of the parts
PROJECTION_MARGIN = dict(l=60, r=20, t=80, b=60)
BAR_PX = 8  # px on the normal page per bar of the norms chart (a 19-token pair's 5 parts fit a 1024 px window)
MIN_BAR_PX = 5  # px: a bar narrower than this is hard to hover; the chart scrolls instead
POINT_FONT = 10  # px on the normal page: a point's label


def _labels(rep: Representation) -> list[str]:
    """Unique category labels "i piece" (a sentence may repeat a piece)."""
    return [f"{i} {t}" for i, t in enumerate(rep.labels)]


def table_rows(rep: Representation) -> dict[str, list[str]]:
    """The rows of the input table, one entry per token: what `plot_input_table` shows."""
    return {
        "piece": list(rep.labels),
        "segment": ["A" if s == 0 else "B" for s in rep.segment_ids],
        "position": [str(p) for p in rep.position_ids],
        "word": ["–" if w is None else str(w) for w in rep.word_ids],
        "id": [str(i) for i in rep.ids],
    }


def plot_input_table(rep: Representation, style: Theme | None = None) -> go.Figure:
    """The BERT-paper picture as a table: one column per token; rows piece / segment / position /
    word / id; cells tinted by segment (blue = A, orange = B). As wide as its tokens: its box
    scrolls when the tab is narrower."""
    t = style or current()
    rows = table_rows(rep)
    fill = [t.segment_fill[min(s, 1)] for s in rep.segment_ids]
    columns = [[name for name in rows]] + [[rows[name][i] for name in rows] for i in range(len(rep.tokens))]
    fig = go.Figure(
        go.Table(
            header=dict(values=["", *[str(i) for i in range(len(rep.tokens))]], fill_color="#dddddd",
                        align="center", font=dict(size=11)),
            cells=dict(values=columns, fill_color=[["#f5f5f5"] * len(rows)] + [[f] * len(rows) for f in fill],
                       align="center", font=dict(size=12), height=26),
            columnwidth=[70] + [max(45, 9 * len(t)) for t in rep.labels],
        )
    )
    fig.update_layout(
        title=dict(text=f"What the model reads: {rep.tokenizer or 'its'} pieces, segments, positions",
                   font=dict(size=14)),
        width=int(min(1400, 120 + sum(max(45, 9 * len(t)) for t in rep.labels))),
        height=230,
        margin=dict(l=10, r=10, t=40, b=10),
    )
    return finish(fig, t, wide=True)


def plot_part_norms(rep: Representation, parts: Sequence[str] | None = None, style: Theme | None = None) -> go.Figure:
    """Grouped bars: the L2 norm of each part for each token (x = tokens, one colour per part).
    As wide as its tokens (at least the tab's width in projector mode): its box scrolls."""
    t = style or current()
    parts = list(parts or rep.norms)
    for p in parts:
        rep.part(p)  # a clear error for an unknown part
    x = _labels(rep)
    width = int(min(1400, max(600, 120 + BAR_PX * len(parts) * len(x))))
    fig = go.Figure(
        [
            go.Bar(
                name=PART_LABELS.get(p, p),
                x=x,
                y=np.round(rep.norms[p].numpy(), DECIMALS),
                marker_color=PART_COLORS.get(p),
                hovertemplate="%{x}<br>" + PART_LABELS.get(p, p) + ": norm %{y:.3f}<extra></extra>",
            )
            for p in parts
        ]
    )
    fig.update_layout(
        barmode="group",
        title=dict(text="How long is each part? (L2 norm per token)", font=dict(size=14)),
        xaxis=dict(title="token", tickmode="array", tickvals=x, ticktext=list(rep.labels), tickangle=-45),
        yaxis=dict(title="norm", rangemode="tozero"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        width=width,
        height=430,
        margin=dict(l=60, r=20, t=80, b=90),
        plot_bgcolor="white",
    )
    # a figure as wide as the tab while its bars keep MIN_BAR_PX; wider than that, its box scrolls
    return finish(fig, t, wide=120 * t.scale + MIN_BAR_PX * len(parts) * len(x) > t.page_width)


def plot_part_projection(rep: Representation, style: Theme | None = None) -> go.Figure:
    """Scatter of the projected parts in their shared 2-D basis, one colour per part. The points
    farthest from the origin (the longest vectors; the theme's `labelled_points` per part) carry their
    token on the picture where it does not cover another label; hovering shows every point's. The
    basis is not centred, so sum = token + segment + position holds in the picture too."""
    t = style or current()
    parts = list(rep.projected_parts)
    xy_all = np.round(rep.projection[: len(parts)].numpy(), DECIMALS).reshape(-1, 2)  # [part * seq, 2]
    n = len(rep.labels)
    keep = labelled_points(xy_all, t.labelled_points * len(parts), centre=(0.0, 0.0),
                           labels=list(rep.labels) * len(parts), font_px=t.px(POINT_FONT),
                           plot_px=plot_area(*PROJECTION_SIZE, PROJECTION_MARGIN, t))
    traces = []
    for i, p in enumerate(parts):
        xy = xy_all[i * n:(i + 1) * n]  # [seq, 2]
        traces.append(
            go.Scatter(
                name=PART_LABELS.get(p, p),
                x=xy[:, 0],
                y=xy[:, 1],
                mode="markers+text",
                text=point_text(rep.labels, [j - i * n for j in keep if i * n <= j < (i + 1) * n]),
                customdata=[[j, tok] for j, tok in enumerate(rep.labels)],
                textposition="top center",
                textfont=dict(size=POINT_FONT, color=PART_COLORS.get(p)),
                marker=dict(size=8, color=PART_COLORS.get(p)),
                hovertemplate=("%{customdata[0]} <b>%{customdata[1]}</b><br>(%{x:.2f}, %{y:.2f})<extra>"
                               + p + "</extra>"),
            )
        )
    e = rep.explained.tolist()
    fig = go.Figure(traces)
    fig.update_layout(
        title=dict(text="The parts in 2-D (shared projection)", font=dict(size=14)),
        xaxis=dict(title=f"direction 1 ({100 * e[0]:.0f}% of squared norm)", zeroline=True, zerolinecolor="#ccc"),
        yaxis=dict(title=f"direction 2 ({100 * e[1]:.0f}%)", zeroline=True, zerolinecolor="#ccc",
                   scaleanchor="x"),  # equal units: distances in the picture are distances in the map
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        width=PROJECTION_SIZE[0],
        height=PROJECTION_SIZE[1],
        plot_bgcolor="white",
        margin=PROJECTION_MARGIN,
    )
    return finish(fig, t)
