"""Figures of a replayed run: the followed words (or classes) across the snapshots, and one frame's view
drawn with the figure builder of the tab it comes from."""

from __future__ import annotations

import plotly.graph_objects as go

from bertlab.analysis.replay import Replay, ReplayFrame
from bertlab.viz.ablation import plot_logit_lens
from bertlab.viz.attention import plot_attention_heatmap
from bertlab.viz.finetune import plot_class_probabilities
from bertlab.viz.mask import empty_figure, plot_fill_mask
from bertlab.viz.similarity import plot_token_similarity
from bertlab.viz.text import plain_text
from bertlab.viz.theme import Theme, current, finish, share_tickformat

DECIMALS = 4
VIEWS = ("Mask", "Attention", "Embeddings", "Logit lens")


def plot_trajectory(replay: Replay, step: int, style: Theme | None = None) -> go.Figure:
    """The followed words' probability at the mask (or each class's probability) at every snapshot, one
    line each; snapshots are evenly spaced (they are log-spaced in steps) and a line marks `step`."""
    t = style or current()
    lines = replay.trajectory()
    if not lines:
        return empty_figure("Nothing to follow: the model has no MLM head and no sentence classifier.", t)
    x = list(range(len(replay.steps)))
    fig = go.Figure()
    for i, (label, values) in enumerate(lines.items()):
        fig.add_trace(go.Scatter(
            x=x, y=[float(f"{v:.{DECIMALS}g}") for v in values], mode="lines+markers", name=label,
            line=dict(color=t.color(i)), customdata=replay.steps,
            hovertemplate=f"<b>{plain_text(label)}</b><br>step %{{customdata}}: %{{y:.3~%}}<extra></extra>",
        ))
    what = "probability at the mask" if replay.tracked else "class probability"
    fig.update_layout(
        title=dict(text=f"The probe over training: {what}", font=dict(size=14)),
        xaxis=dict(title="step (snapshots)", tickmode="array", tickvals=x, ticktext=[str(s) for s in replay.steps]),
        yaxis=dict(title="probability", rangemode="tozero",
                   tickformat=share_tickformat([v for values in lines.values() for v in values])),
        shapes=[marker(replay, step)], height=300, width=620, plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=50), legend=dict(title=dict(text="word" if replay.tracked else "class")),
    )
    return finish(fig, t)


def marker(replay: Replay, step: int) -> dict:
    """The vertical line at `step`'s snapshot."""
    i = replay.steps.index(step)
    return dict(type="line", xref="x", yref="paper", x0=i, x1=i, y0=0, y1=1, line=dict(color="#555", dash="dot"))


def plot_frame(replay: Replay, frame: ReplayFrame, view: str, layer: int = 0, head: int = 0, stage: int = 0,
               style: Theme | None = None) -> go.Figure:
    """One snapshot's `view` (one of VIEWS) as its tab draws it, titled with the step."""
    t = style or current()
    if view == "Mask":
        if frame.mask is not None:
            fig = plot_fill_mask([frame.mask], t)
        elif frame.classes is not None:
            fig = plot_class_probabilities(frame.classes, t)
        else:
            return empty_figure(_why(replay, "Nothing to guess"), t)
    elif view == "Attention":
        fig = plot_attention_heatmap(frame.attention, layer, head, t)
    elif view == "Embeddings":
        fig = plot_token_similarity(frame.similarity, stage, t)
    elif view == "Logit lens":
        if frame.lens is None:
            return empty_figure(_why(replay, "No logit lens"), t)
        fig = plot_logit_lens(frame.lens, t)
    else:
        raise ValueError(f"view must be one of {VIEWS}; got {view!r}.")
    title = fig.layout.title.text or ""
    fig.update_layout(title_text=f"step {frame.step}: {title}" if title else f"step {frame.step}")
    return fig


def _why(replay: Replay, what: str) -> str:
    return f"{what}: {replay.notes[0]}" if replay.notes else what
