"""Plotly figures of attention patterns (pure: a result in, a figure out)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from bertlab.analysis.attention import AttentionResult
from bertlab.viz.theme import Theme, current, finish, help_html, matrix_ticks

BAND_COLOR = "#D55E00"  # Okabe & Ito's vermillion: the local band's outline and note, on blue or on Cividis
HOVER = (
    "query %{y} <b>%{customdata[0]}</b> → key %{x} <b>%{customdata[1]}</b>"
    "<br>weight %{z:.3f}<extra></extra>"
)


def heatmap_title(layer: int, head: int) -> str:
    return f"Layer {layer}, head {head}: how much each token (row) attends to each token (column)"


def heatmap_marks(result: AttentionResult, layer: int, style: Theme | None = None) -> dict:
    """The layout parts that change with the layer (drawn in the theme, not scaled again by `finish`):
    the lines between sentences A and B, and on a model with local layers (ModernBERT) the band that a
    local layer's queries may read, outlined, with a note saying how far each token sees; a global
    layer of such a model says that every token sees every token."""
    t = style or current()
    n = len(result.tokens)
    shapes = _segment_lines(result, n, t)
    window = result.window(layer)
    note = ""
    if window is not None:
        whole = n - 1 <= window
        sees = f"itself and the {window} tokens before it" if result.causal else f"±{window} tokens"
        note = (f"local layer: each token sees {sees}"
                + (" (here: the whole input)" if whole else " (outlined; weights outside are 0)"))
        if not whole:
            shapes.append(dict(type="path", path=_band_path(n, window, result.causal), xref="x", yref="y",
                               layer="above", line=dict(color=BAND_COLOR, width=t.px(2), dash="dash"),
                               fillcolor="rgba(0,0,0,0)"))
    elif any(w is not None for w in result.windows):
        note = ("global layer: every token sees every token before it" if result.causal else
                "global layer: every token sees every token")
    annotations = [dict(text=note, showarrow=False, x=0, y=1, xref="paper", yref="paper", xanchor="left",
                        yanchor="bottom", yshift=t.px(4), font=dict(size=t.px(12), color=BAND_COLOR))] if note else []
    return dict(shapes=shapes, annotations=annotations)


def heatmap_z(result: AttentionResult, layer: int, head: int) -> np.ndarray:
    """The weights of one head as a [query, key] float32 array, rounded to 4 decimals
    (plenty for a colour, and it keeps what goes to the browser small)."""
    return np.round(result.pattern(layer, head).numpy(), 4).astype(np.float32)


def plot_attention_heatmap(result: AttentionResult, layer: int, head: int,
                           style: Theme | None = None) -> go.Figure:
    """Heatmap of one head: query tokens on y (top to bottom), key tokens on x.

    Positions, not token strings, are the coordinates (a sentence may hold the same token
    twice); the tick labels show the tokens (every k-th when they would overlap) and the hover
    shows both tokens and the weight. `style`: the theme (default: the one in use).
    """
    t = style or current()
    n = len(result.tokens)
    labels = _labels(result.labels)
    pairs = np.empty((n, n, 2), dtype=object)  # [query, key, (query label, key label)]
    pairs[:, :, 0] = np.array(labels, dtype=object)[:, None]
    pairs[:, :, 1] = np.array(labels, dtype=object)[None, :]
    fig = go.Figure(
        go.Heatmap(
            z=heatmap_z(result, layer, head),
            x=list(range(n)),
            y=list(range(n)),
            customdata=pairs,
            hovertemplate=HOVER,
            colorscale=t.sequential,
            zmin=0.0,
            showscale=True,
            colorbar=dict(title=dict(text="weight"), thickness=12),
            xgap=1 if n <= 40 else 0,
            ygap=1 if n <= 40 else 0,
        )
    )
    fig.update_layout(_layout(result, labels, layer, head, t))
    finish(fig, t)
    fig.update_layout(heatmap_marks(result, layer, t))
    return fig


def _layout(result: AttentionResult, labels: list[str], layer: int, head: int, t: Theme) -> dict:
    n = len(labels)
    side = int(min(760, max(480, 200 + 12 * n)))  # px (normal page); grows with the tokens, capped
    vals, text, font = matrix_ticks(labels, side, t)
    axis = dict(
        tickmode="array",
        tickvals=vals,
        ticktext=text,
        tickfont=dict(size=font),  # normal-page sizes here and below: finish() scales them
        showgrid=False,
        zeroline=False,
        visible=True,
    )
    return dict(
        title=dict(text=heatmap_title(layer, head), font=dict(size=14), x=0.5, xanchor="center"),
        xaxis=dict(axis, title=dict(text="key (attended to)"), side="bottom", tickangle=-60 if n > 8 else 0,
                   constrain="domain"),
        yaxis=dict(axis, title=dict(text="query (attending)"), autorange="reversed",
                   scaleanchor="x", constrain="domain"),
        width=side + 160,
        height=side + 60,
        margin=dict(l=100, r=20, t=70 if result.windows and any(w is not None for w in result.windows) else 50,
                    b=100),
        plot_bgcolor="white",
    )


def empty_heatmap(note: str = "Type a sentence and press Show.", style: Theme | None = None) -> go.Figure:
    """A placeholder with the same single heatmap trace, for before the first result."""
    t = style or current()
    fig = go.Figure(go.Heatmap(z=[[]], colorscale=t.sequential, showscale=False))
    fig.update_layout(
        width=580, height=300, plot_bgcolor="white",
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")],
    )
    return finish(fig, t)


def _segment_lines(result: AttentionResult, n: int, t: Theme) -> list[dict]:
    """Thin lines between sentence A and sentence B (none for a single sentence)."""
    s = result.sentence_b_start
    if s is None:
        return []
    line = dict(color="#d62728", width=1.5 * t.scale, dash="dot")
    return [
        dict(type="line", x0=s - 0.5, x1=s - 0.5, y0=-0.5, y1=n - 0.5, line=line),
        dict(type="line", x0=-0.5, x1=n - 0.5, y0=s - 0.5, y1=s - 0.5, line=line),
    ]


def _band_path(n: int, window: int, causal: bool = False) -> str:
    """An SVG path (data coordinates: cell centres at 0..n-1) around the cells |query - key| <= window
    of an n x n grid (causal: and key <= query): down its right edge, back up its left edge."""
    right, left = [], []
    for q in range(n):
        hi, lo = min(n - 1, q + (0 if causal else window)) + 0.5, max(0, q - window) - 0.5
        right += [(hi, q - 0.5), (hi, q + 0.5)]
        left += [(lo, q - 0.5), (lo, q + 0.5)]
    points = right + left[::-1]
    return "M " + " L ".join(f"{x:g},{y:g}" for x, y in points) + " Z"


def _labels(tokens: list[str]) -> list[str]:
    """Tick labels: the tokens themselves (plotly keeps repeats apart because the
    coordinates are positions)."""
    return [t if t.strip() else repr(t) for t in tokens]


def attention_notes(result: AttentionResult) -> list[tuple[str, str]]:
    """What the student should know about this input, beyond the picture (the panel adds the note on
    pieces outside the vocabulary)."""
    n = len(result.tokens)
    pair = " (two sentences, split by the dotted red lines)" if result.sentence_b_start is not None else ""
    notes: list[tuple[str, str]] = [
        ("info", f"{n} tokens{pair}; {result.num_layers} layers × {result.num_heads} heads.")
    ]
    if result.warning:
        notes.append(("warning", result.warning))
    return notes


# What each view of the Attention tab shows, and how to read it (its help line).
VIEW_HELP = {
    "Heatmap": (
        "Rows are the tokens that look (queries), columns the tokens they look at (keys); "
        "each row sums to 1. Change the text and press Show, or move the sliders."
    ),
    "Head view": (
        "Each line joins a token (left) to a token it attends to (right); darker = more weight. "
        "Hover a token to see only its lines; click the coloured chips to overlay heads."
    ),
    "Model view": (
        "Every head of every layer at a glance (rows = layers, columns = heads). "
        "Click a thumbnail to open it in the head view."
    ),
    "Rollout": (
        "Left: the layer's attention averaged over heads. Right: attention rollout, which follows the "
        "attention (plus the residual connection) down through the layers to the input tokens."
    ),
    "bertviz": (
        "The bertviz library's own views, with its JavaScript read from installed packages (no network). "
        "They keep their own layer and head controls."
    ),
    "Masks": (
        "Which keys each query may read under six designs: BERT (both ways), GPT (left to right), UniLM "
        "(source both ways, target left to right), Longformer (a window and global tokens), Reformer (hashed "
        "buckets) and Transformer-XL (its segment and the previous one). Each grid is the mask the code applies."
    ),
}


def view_help(view: str) -> str:
    """The help line (HTML) under the Attention tab's `view` ("Heatmap", "Head view", ...)."""
    return help_html(VIEW_HELP[view])
