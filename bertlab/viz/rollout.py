"""Raw attention beside attention rollout, as two heatmaps (pure: a result in, a figure out)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.rollout import RolloutResult
from bertlab.viz.theme import Theme, current, finish, matrix_ticks

HOVER = "query %{y} <b>%{customdata[0]}</b> → key %{x} <b>%{customdata[1]}</b><br>%{z:.3f}<extra></extra>"


def rollout_titles(result: RolloutResult, layer: int) -> tuple[str, str]:
    left = f"Raw attention, layer {layer} (mean of heads)"
    span = "layer 0" if layer == 0 else f"layers 0–{layer}"
    right = f"Rollout through {span}" + ("" if result.residual else " (no residual)")
    return left, right


def plot_rollout(result: RolloutResult, layer: int, style: Theme | None = None) -> go.Figure:
    """Two heatmaps, query tokens on y and key tokens on x: the head-averaged attention of
    `layer` (left) and the rollout from the input tokens up to `layer` (right).
    Each has its own colour bar (rollout is more spread out than one layer's attention).
    `style`: the theme (default: the one in use)."""
    t = style or current()
    layer = result.check_layer(layer)
    n = len(result.tokens)
    labels = [t if t.strip() else repr(t) for t in result.tokens]
    pairs = np.empty((n, n, 2), dtype=object)  # [query, key, (query token, key token)]
    pairs[:, :, 0] = np.array(labels, dtype=object)[:, None]
    pairs[:, :, 1] = np.array(labels, dtype=object)[None, :]
    fig = make_subplots(rows=1, cols=2, subplot_titles=rollout_titles(result, layer), horizontal_spacing=0.14)
    for col, z in enumerate((result.raw[layer], result.rollout[layer]), start=1):
        fig.add_trace(
            go.Heatmap(
                z=rollout_z(z), x=list(range(n)), y=list(range(n)), customdata=pairs, hovertemplate=HOVER,
                coloraxis="coloraxis" if col == 1 else "coloraxis2", xgap=1 if n <= 40 else 0,
                ygap=1 if n <= 40 else 0,
            ),
            row=1, col=col,
        )
    side = int(min(560, max(320, 120 + 10 * n)))  # px per heatmap
    _axes(fig, labels, side, t)
    colorbar = dict(thickness=10, len=0.9)
    fig.update_layout(
        coloraxis=dict(colorscale=t.sequential, cmin=0.0, colorbar=dict(colorbar, x=0.43, title=dict(text="raw"))),
        coloraxis2=dict(colorscale=t.sequential, cmin=0.0,
                        colorbar=dict(colorbar, x=1.0, title=dict(text="rollout"))),
        width=2 * side + 260, height=side + 160, plot_bgcolor="white",
        margin=dict(l=90, r=40, t=60, b=100),
        shapes=_segment_lines(result.sentence_b_start, n),
    )
    return finish(fig, t)


def rollout_z(values) -> np.ndarray:
    """[query, key] weights as float32, rounded to 4 decimals (small to send, plenty for a colour)."""
    return np.round(np.asarray(values, dtype=np.float32), 4)


def _axes(fig: go.Figure, labels: list[str], side: int, t: Theme) -> None:
    n = len(labels)
    vals, text, font = matrix_ticks(labels, side, t, margins=160)
    ticks = dict(tickmode="array", tickvals=vals, ticktext=text, tickfont=dict(size=font),
                 showgrid=False, zeroline=False)
    for col in (1, 2):
        fig.update_xaxes(ticks, tickangle=-60 if n > 8 else 0, title_text="key (attended to)",
                         constrain="domain", row=1, col=col)
        fig.update_yaxes(ticks, autorange="reversed", scaleanchor="x" if col == 1 else "x2",
                         constrain="domain", row=1, col=col)
    fig.update_yaxes(title_text="query (attending)", row=1, col=1)


def _segment_lines(b_start: int | None, n: int) -> list[dict]:
    """Dotted lines between sentence A and sentence B on both heatmaps (none for one sentence)."""
    if b_start is None:
        return []
    line = dict(color="#d62728", width=1.5, dash="dot")
    at = b_start - 0.5
    out = []
    for x, y in (("x", "y"), ("x2", "y2")):
        out.append(dict(type="line", xref=x, yref=y, x0=at, x1=at, y0=-0.5, y1=n - 0.5, line=line))
        out.append(dict(type="line", xref=x, yref=y, x0=-0.5, x1=n - 0.5, y0=at, y1=at, line=line))
    return out
