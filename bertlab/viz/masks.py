"""Plotly figures of attention masks (pure: the grids of `bertlab.analysis.attention_masks` in, a figure out)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.attention_masks import MasksResult
from bertlab.analysis.window_cost import WindowTiming
from bertlab.viz.theme import Theme, current, finish, matrix_ticks

READ, HIDDEN = "#2b6cb0", "#f1f3f5"  # a key the query may read / may not
MASK_SCALE = [[0.0, HIDDEN], [0.5, HIDDEN], [0.5, READ], [1.0, READ]]  # two colours, no ramp
MASK_HOVER = "query %{y} <b>%{customdata[0]}</b> → key %{x} <b>%{customdata[1]}</b><br>%{customdata[2]}<extra></extra>"
COLUMNS = 3
PANEL = 250  # px: one small grid's side on the normal page


def _labels(tokens: list[str]) -> list[str]:
    """Tick labels: the tokens themselves, a blank one quoted (positions are the coordinates, so repeats stay apart)."""
    return [t if t.strip() else repr(t) for t in tokens]


def mask_title(result: MasksResult, name: str) -> str:
    """"Causal (GPT): 120 / 225 pairs" — the title and the attention's work against n²."""
    m = result.mask(name)
    return f"{m.title}: {m.allowed_pairs} / {result.n ** 2} pairs"


def _cells(result: MasksResult, name: str) -> np.ndarray:
    """customdata [query, key, (query label, key label, verdict)] of one mask's grid."""
    labels = np.array(_labels(result.labels), dtype=object)
    n, allowed = result.n, result.mask(name).allowed.numpy()
    cells = np.empty((n, n, 3), dtype=object)
    cells[:, :, 0], cells[:, :, 1] = labels[:, None], labels[None, :]
    cells[:, :, 2] = np.where(allowed, "may read", "hidden")
    if name == "LSH buckets":
        b = result.buckets.numpy()
        cells[:, :, 2] = [[f"{cells[q, k, 2]} (buckets {b[q]} and {b[k]})" for k in range(n)] for q in range(n)]
    return cells


def _mask_trace(result: MasksResult, name: str, gaps: bool) -> go.Heatmap:
    n = result.n
    return go.Heatmap(z=result.mask(name).allowed.numpy().astype(np.int8), x=list(range(n)), y=list(range(n)),
                      customdata=_cells(result, name), hovertemplate=MASK_HOVER, colorscale=MASK_SCALE, zmin=0,
                      zmax=1, showscale=False, xgap=1 if gaps else 0, ygap=1 if gaps else 0)


def _segment_lines(result: MasksResult, axes: list[str]) -> list[dict]:
    """Dotted lines between sentences A and B on each grid (`axes`: "", "2", ...); none for one sentence."""
    s, n = result.sentence_b_start, result.n
    if s is None:
        return []
    line = dict(color="#d62728", width=1.2, dash="dot")
    return [shape for a in axes for shape in (
        dict(type="line", xref=f"x{a}", yref=f"y{a}", x0=s - 0.5, x1=s - 0.5, y0=-0.5, y1=n - 0.5, line=line),
        dict(type="line", xref=f"x{a}", yref=f"y{a}", x0=-0.5, x1=n - 0.5, y0=s - 0.5, y1=s - 0.5, line=line))]


def _token_axes(fig: go.Figure, result: MasksResult, side: float, t: Theme, rows: int, cols: int) -> None:
    """Token labels on both axes of every grid, queries top to bottom."""
    vals, text, font = matrix_ticks(_labels(result.labels), side, t)
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            fig.update_xaxes(tickmode="array", tickvals=vals, ticktext=text, tickfont=dict(size=font), showgrid=False,
                             zeroline=False, tickangle=-60 if result.n > 8 else 0, constrain="domain", row=r, col=c)
            fig.update_yaxes(tickmode="array", tickvals=vals, ticktext=text, tickfont=dict(size=font), showgrid=False,
                             zeroline=False, autorange="reversed", constrain="domain", row=r, col=c)


def plot_masks(result: MasksResult, style: Theme | None = None) -> go.Figure:
    """The six masks as small grids (rows: queries, columns: keys; blue: may read), two rows of three,
    each titled with its pairs read out of n²; a pair's sentences split by dotted lines."""
    t = style or current()
    names = [m.name for m in result.masks]
    rows = -(-len(names) // COLUMNS)
    fig = make_subplots(rows=rows, cols=COLUMNS, subplot_titles=[mask_title(result, nm) for nm in names],
                        horizontal_spacing=0.09, vertical_spacing=0.2)
    for i, name in enumerate(names):
        fig.add_trace(_mask_trace(result, name, result.n <= 24), row=i // COLUMNS + 1, col=i % COLUMNS + 1)
    for i in range(len(names)):  # each grid square: its y axis follows its own x axis
        axis = "" if i == 0 else str(i + 1)
        fig.layout[f"yaxis{axis}"].scaleanchor = f"x{axis}"
    _token_axes(fig, result, PANEL, t, rows, COLUMNS)
    for note in fig.layout.annotations:
        note.font = dict(size=12)
    fig.update_layout(width=COLUMNS * (PANEL + 80) + 60, height=rows * (PANEL + 110) + 40,
                      margin=dict(l=70, r=20, t=50, b=70), plot_bgcolor="white", showlegend=False,
                      shapes=_segment_lines(result, ["" if i == 0 else str(i + 1) for i in range(len(names))]))
    return finish(fig, t)


def plot_masked_head(result: MasksResult, name: str, pattern: np.ndarray, layer: int, head: int,
                     style: Theme | None = None) -> go.Figure:
    """Mask `name` beside what one head of the model attends to when it runs under that mask
    (`pattern`: [query, key] weights of layer `layer`, head `head`; zero outside the mask)."""
    t = style or current()
    n = result.n
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14, subplot_titles=[
        mask_title(result, name), f"Layer {layer}, head {head} run under this mask"])
    fig.add_trace(_mask_trace(result, name, n <= 24), row=1, col=1)
    cells = _cells(result, name)[:, :, :2]
    fig.add_trace(go.Heatmap(
        z=np.round(np.asarray(pattern, dtype=np.float32), 4), x=list(range(n)), y=list(range(n)), customdata=cells,
        hovertemplate="query %{y} <b>%{customdata[0]}</b> → key %{x} <b>%{customdata[1]}</b><br>weight %{z:.3f}"
                      "<extra></extra>",
        colorscale=t.sequential, zmin=0.0, colorbar=dict(title=dict(text="weight"), thickness=12),
        xgap=1 if n <= 24 else 0, ygap=1 if n <= 24 else 0), row=1, col=2)
    fig.layout.yaxis.scaleanchor, fig.layout.yaxis2.scaleanchor = "x", "x2"
    side = int(min(420, max(300, 150 + 10 * n)))
    _token_axes(fig, result, side, t, 1, 2)
    for note in fig.layout.annotations:
        note.font = dict(size=13)
    fig.update_layout(width=2 * side + 220, height=side + 150, margin=dict(l=90, r=20, t=60, b=90),
                      plot_bgcolor="white", shapes=_segment_lines(result, ["", "2"]))
    return finish(fig, t)


def plot_window_timing(rows: list[WindowTiming], window: int, heads: int = 12, d_head: int = 64,
                       style: Theme | None = None) -> go.Figure:
    """Milliseconds of one attention call (`heads` × `d_head`) against the length (both axes log): full attention
    and the sliding window (±`window`), as timed on this machine; the hover adds the pairs each scores."""
    t = style or current()
    fig = go.Figure()
    for i, (name, key, pairs) in enumerate((("full attention (fused SDPA)", "full_ms", "full_pairs"),
                                            (f"sliding window ±{window} (banded)", "banded_ms", "banded_pairs"))):
        fig.add_trace(go.Scatter(
            x=[r.seq for r in rows], y=[round(getattr(r, key), 2) for r in rows], mode="lines+markers", name=name,
            customdata=[getattr(r, pairs) for r in rows], line=dict(color=t.color(i), width=t.px(2)),
            hovertemplate="%{x} tokens: %{y:.1f} ms<br>%{customdata:,} query-key pairs<extra>" + name + "</extra>"))
    fig.update_layout(
        title=dict(text=f"One attention call on this machine ({heads} heads × {d_head}, float32, one thread)",
                   font=dict(size=14)),
        xaxis=dict(title=dict(text="tokens (n)"), type="log", tickvals=[r.seq for r in rows]),
        yaxis=dict(title=dict(text="ms (median)"), type="log"), width=640, height=380,
        margin=dict(l=70, r=20, t=60, b=60), legend=dict(orientation="h", y=-0.25), plot_bgcolor="white")
    return finish(fig, t)
