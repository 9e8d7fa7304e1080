"""Plotly figures for masked-word prediction (pure: results in, a figure out)."""

from __future__ import annotations

import math
from typing import Literal, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.mask import MaskPrediction, WordScore

BAR = "#4a90d9"
TRUE_BAR = "#2ca02c"  # the masked word's own piece, when it is among the guesses
STRIP_COLORS = "RdYlGn"  # red: hard to guess, green: easy
Scale = Literal["probability", "log10"]
LOG10_FLOOR = -6.0  # log10 probabilities below this get the reddest colour


def plot_fill_mask(predictions: Sequence[MaskPrediction]) -> go.Figure:
    """Horizontal bars of the top-k guesses, one subplot per [MASK], most probable on top.
    A bar is green when it is the piece that was really there."""
    if not predictions:
        return empty_figure("Put [MASK] in the text (or pick a word to hide) and press Predict.")
    n = len(predictions)
    fig = make_subplots(
        rows=n, cols=1, subplot_titles=[fill_mask_title(p) for p in predictions],
        vertical_spacing=min(0.12, 0.5 / n),
    )
    for row, pred in enumerate(predictions, start=1):
        tokens = [c.token for c in pred.candidates]
        fig.add_trace(
            go.Bar(
                x=[c.probability for c in pred.candidates],
                y=tokens,
                orientation="h",
                marker_color=[TRUE_BAR if c.token_id == pred.original_id else BAR for c in pred.candidates],
                text=[_percent(c.probability) for c in pred.candidates],
                textposition="auto",
                hovertemplate="<b>%{y}</b><br>probability %{x:.4g}<extra></extra>",
                name=pred.label,
                showlegend=False,
            ),
            row=row, col=1,
        )
        fig.update_yaxes(autorange="reversed", type="category", row=row, col=1)
        fig.update_xaxes(rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="probability", row=n, col=1)
    k = max(len(p.candidates) for p in predictions)
    fig.update_layout(
        height=int(80 + n * (60 + 26 * k)), width=620, plot_bgcolor="white",
        margin=dict(l=120, r=20, t=60, b=50), bargap=0.25,
    )
    return fig


def fill_mask_title(pred: MaskPrediction) -> str:
    """Subplot title: which mask, and how the true piece fared when a word was hidden."""
    if pred.original_token is None:
        return pred.label
    return (
        f"{pred.label}: its probability {_percent(pred.original_probability or 0.0)}, "
        f"rank {pred.original_rank}"
    )


def plot_word_predictability(
    scores: Sequence[WordScore], per_row: int = 12, scale: Scale = "probability"
) -> go.Figure:
    """A heat strip of the sentence: each word coloured by how well the model guesses it back
    when it is hidden (green: easy, red: hard). Long sentences wrap every `per_row` words."""
    if not scores:
        return empty_figure("Type a sentence and press Score.")
    if per_row < 1:
        raise ValueError(f"per_row must be 1 or more, not {per_row}.")
    if scale not in ("probability", "log10"):
        raise ValueError(f"scale must be 'probability' or 'log10', not {scale!r}.")
    z, text, custom = strip_grid(scores, per_row, scale)
    log_scale = scale == "log10"
    fig = go.Figure(
        go.Heatmap(
            z=z, text=text, customdata=custom,
            texttemplate="%{text}", textfont=dict(size=13),
            colorscale=STRIP_COLORS, zmin=LOG10_FLOOR if log_scale else 0.0, zmax=0.0 if log_scale else 1.0,
            xgap=2, ygap=2, hoverongaps=False,
            hovertemplate=(
                "<b>%{text}</b><br>probability %{customdata[0]}<br>rank %{customdata[1]}"
                "<br>model's guess: %{customdata[2]}<extra></extra>"
            ),
            colorbar=dict(title=dict(text="log10 P" if log_scale else "P(word)"), thickness=12),
        )
    )
    rows = len(z)
    fig.update_layout(
        title=dict(text="How predictable is each word? (each hidden in turn)", font=dict(size=14)),
        height=int(110 + 46 * rows), width=max(420, 70 * min(per_row, len(scores)) + 120),
        xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"),
        plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10),
    )
    return fig


def strip_grid(
    scores: Sequence[WordScore], per_row: int, scale: Scale = "probability"
) -> tuple[list[list[float | None]], list[list[str]], list[list[list[str]]]]:
    """(z, words, hover data) laid out in rows of `per_row` words; blanks are None / ""."""
    rows = math.ceil(len(scores) / per_row)
    z: list[list[float | None]] = [[None] * per_row for _ in range(rows)]
    text = [[""] * per_row for _ in range(rows)]
    custom = [[["", "", ""] for _ in range(per_row)] for _ in range(rows)]
    for i, s in enumerate(scores):
        r, c = divmod(i, per_row)
        z[r][c] = strip_value(s, scale)
        text[r][c] = s.word
        custom[r][c] = [f"{s.probability:.3g}", str(s.rank), s.guess]
    return z, text, custom


def strip_value(score: WordScore, scale: Scale = "probability") -> float:
    """The colour value of one word: its probability, or log10 of it (floored at LOG10_FLOOR)."""
    if scale == "log10":
        return max(LOG10_FLOOR, score.log_probability / math.log(10))
    return score.probability


def empty_figure(note: str) -> go.Figure:
    """A blank figure with a hint, for before the first result."""
    fig = go.Figure()
    fig.update_layout(
        height=240, width=620, plot_bgcolor="white",
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")],
    )
    return fig


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%" if p >= 0.001 else f"{p:.1e}"
