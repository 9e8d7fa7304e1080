"""Figures of what fine-tuning changed, runs side by side: attention (JSD per head), representations (CKA
and mean cosine per layer) and a 1-D loss-landscape slice around each fine-tuned model."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.finetune_diff import FinetuneDiff, LossSlice
from bertlab.viz.mask import empty_figure
from bertlab.viz.text import plain_text
from bertlab.viz.theme import Theme, current, finish

DECIMALS = 6  # CKA and cosine stay near 1 after a short run: their changes are in the 4th decimal
EMPTY = "Fine-tune a model (full, feature-based or adapters) to see what changed."


def plot_attention_change(diffs: Mapping[str, FinetuneDiff], style: Theme | None = None) -> go.Figure:
    """One layer x head heatmap per run: the mean Jensen-Shannon divergence (bits) between each head's
    attention before and after fine-tuning, on one colour scale for all runs."""
    t = style or current()
    if not diffs:
        return empty_figure(EMPTY, t)
    names = list(diffs)
    top = max(float(d.attention_jsd.max()) for d in diffs.values())
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[plain_text(n) for n in names],
                        horizontal_spacing=0.06)
    for i, name in enumerate(names, start=1):
        z = np.round(diffs[name].attention_jsd.numpy(), DECIMALS)  # [layer, head]
        layers, heads = z.shape
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(heads)), y=list(range(layers)), colorscale=t.sequential, zmin=0.0,
            zmax=max(top, 1e-6), showscale=i == len(names), colorbar=dict(title=dict(text="JSD (bits)"), thickness=12),
            hovertemplate=f"{plain_text(name)}<br>layer %{{y}}, head %{{x}}<br>JSD %{{z:.4f}} bits<extra></extra>",
            xgap=1, ygap=1,
        ), row=1, col=i)
        fig.update_xaxes(title_text="head", row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i, title_text="layer" if i == 1 else None)
    fig.update_layout(title=dict(text="How much each head's attention changed (Jensen–Shannon divergence)",
                                 font=dict(size=14)),
                      height=340, width=min(1100, 260 + 280 * len(names)), plot_bgcolor="white",
                      margin=dict(l=60, r=20, t=80, b=50))
    return finish(fig, t)


def plot_representation_change(diffs: Mapping[str, FinetuneDiff], style: Theme | None = None) -> go.Figure:
    """Per stage (embeddings, layer 0, ...): linear CKA (left) and mean cosine (right) between the token
    vectors before and after, one line per run; 1 = unchanged."""
    t = style or current()
    if not diffs:
        return empty_figure(EMPTY, t)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["linear CKA", "mean cosine"], horizontal_spacing=0.12)
    for i, (name, d) in enumerate(diffs.items()):
        x = d.stage_names
        for col, values in ((1, d.cka), (2, d.cosine)):
            fig.add_trace(go.Scatter(
                x=x, y=np.round(values.numpy(), DECIMALS), mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, line=dict(color=t.color(i)),
                hovertemplate=f"{plain_text(name)}: %{{x}}, %{{y:.4f}}<extra></extra>",
            ), row=1, col=col)
    fig.update_yaxes(title_text="similarity to the base (1 = same)")
    fig.update_layout(title=dict(text="How much the representations changed, layer by layer", font=dict(size=14)),
                      height=360, width=900, plot_bgcolor="white", margin=dict(l=60, r=20, t=80, b=60),
                      legend=dict(title=dict(text="run")))
    return finish(fig, t)


def plot_loss_slices(slices: Mapping[str, LossSlice], style: Theme | None = None) -> go.Figure:
    """The loss along one filter-normalised random direction around each fine-tuned model (alpha = 0 is the
    model itself), one line per run."""
    t = style or current()
    if not slices:
        return empty_figure(EMPTY, t)
    fig = go.Figure()
    for i, (name, s) in enumerate(slices.items()):
        fig.add_trace(go.Scatter(
            x=[round(a, DECIMALS) for a in s.alphas], y=[round(v, DECIMALS) for v in s.losses], mode="lines+markers",
            name=name, line=dict(color=t.color(i)),
            hovertemplate=f"{plain_text(name)}: alpha %{{x:.2f}}, loss %{{y:.4f}}<extra></extra>",
        ))
    fig.update_layout(title=dict(text="Loss around each fine-tuned model (1-D slice, filter-normalised direction)",
                                 font=dict(size=14)),
                      xaxis=dict(title="alpha (step along the direction)"), yaxis=dict(title="dev loss"),
                      height=340, width=620, plot_bgcolor="white", margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(title=dict(text="run")))
    return finish(fig, t)
