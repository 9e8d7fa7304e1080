"""Figures of what the layers know (pure: results in, figures out): probe accuracy per stage for several
properties with their control tasks, the scalar mix's weights, the activation-patching grid, the neuron view
of one head, corpus neighbours, and a predicted dependency tree against the gold one.

Student text (tokens, words, sentences) is drawn as typed: `finish` escapes the data strings, and the titles
that carry student text escape it where they are built (`plain_text`); the neighbour table, which bolds a
piece itself, escapes its cells here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.neighbours import Neighbour
from bertlab.analysis.neurons import NeuronView
from bertlab.analysis.patching import PatchingGrid
from bertlab.analysis.probes import ProbeResult
from bertlab.analysis.structural import StructuralResult, TreePrediction
from bertlab.viz.text import plain_text
from bertlab.viz.theme import NEUTRAL, Theme, current, finish

DECIMALS = 4
PROPERTY_TITLES = {"pos": "part of speech", "chunk": "chunk", "ner": "named entity", "upos": "UPOS",
                   "deprel": "dependency relation", "tree": "tree (UUAS)"}


def _round(values: Sequence[float] | None) -> list[float | None]:
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), DECIMALS)
            for v in (values or [])]


def plot_probe_layers(results: Sequence[ProbeResult | StructuralResult], style: Theme | None = None) -> go.Figure:
    """Accuracy against stage, one colour per property (solid: the probe; dashed: its control task; the
    scalar mix's accuracy as a dotted level line); a property scored otherwise (named entities: macro accuracy)
    names its measure in the legend and the axis; the structural probe's UUAS (and Spearman, dotted)."""
    t = style or current()
    fig = go.Figure()
    stages = results[0].stages if results else []
    for i, r in enumerate(results):
        colour = t.color(i)
        if isinstance(r, StructuralResult):
            name = PROPERTY_TITLES["tree"]
            fig.add_scatter(x=stages, y=_round(r.uuas), mode="lines+markers", name=name, line=dict(color=colour))
            fig.add_scatter(x=stages, y=_round(r.spearman), mode="lines", name="tree (distance Spearman)",
                            line=dict(color=colour, dash="dot"))
            if r.mix_weights is not None and not math.isnan(r.mix_uuas):
                fig.add_scatter(x=[stages[0], stages[-1]], y=[round(r.mix_uuas, DECIMALS)] * 2, mode="lines",
                                name=f"{name}: scalar mix (UUAS)", line=dict(color=colour, dash="dashdot", width=1))
            continue
        name = PROPERTY_TITLES.get(r.prop, r.prop)
        if r.measure != "accuracy":  # the legend says which measure: macro accuracy for named entities
            name = f"{name} ({r.measure})"
        sel = _round(r.selectivity) if r.selectivity is not None else [None] * len(stages)
        fig.add_scatter(x=stages, y=_round(r.accuracy), mode="lines+markers", name=name, line=dict(color=colour),
                        customdata=sel, hovertemplate=f"{name}<br>%{{x}}: %{{y:.3f}}<br>selectivity "
                                                      f"%{{customdata:.3f}}<extra></extra>")
        if r.control_accuracy is not None:
            fig.add_scatter(x=stages, y=_round(r.control_accuracy), mode="lines", name=f"{name}: control task",
                            line=dict(color=colour, dash="dash"))
        if not math.isnan(r.mix_accuracy):
            fig.add_scatter(x=[stages[0], stages[-1]], y=[round(r.mix_accuracy, DECIMALS)] * 2, mode="lines",
                            name=f"{name}: scalar mix", line=dict(color=colour, dash="dot", width=1))
    fig.update_layout(
        title=dict(text="What each layer knows: probe accuracy on held-out sentences", font=dict(size=14)),
        xaxis=dict(title="stage (features read after…)"),
        yaxis=dict(title=" / ".join(dict.fromkeys(["accuracy"] + [r.measure for r in results
                                                                    if isinstance(r, ProbeResult)])),
                   range=[0, 1.02]),
        width=760, height=420, margin=dict(l=60, r=20, t=60, b=60), plot_bgcolor="white",
        legend=dict(font=dict(size=11)),
    )
    return finish(fig, t)


def plot_mix_weights(results: Sequence[ProbeResult | StructuralResult], style: Theme | None = None) -> go.Figure:
    """The scalar mix's softmax weight of each stage, one bar group per property (the tree probe's too)."""
    def name(r: ProbeResult | StructuralResult) -> str:
        prop = PROPERTY_TITLES["tree"] if isinstance(r, StructuralResult) else PROPERTY_TITLES.get(r.prop, r.prop)
        return f"{prop} (γ = {r.mix_gamma:.2f})"

    groups = [(name(r), r.stages, r.mix_weights) for r in results if r.mix_weights is not None and len(r.mix_weights)]
    return plot_layer_weights(groups, "Weighted features: the scalar mix's weight of each stage", style)


def plot_layer_weights(groups: Sequence[tuple[str, Sequence[str], Sequence[float]]], title: str,
                       style: Theme | None = None) -> go.Figure:
    """Softmax weights over the stages as bars, one group per (name, stage names, weights); `title` is drawn
    as given (escape student text before)."""
    t = style or current()
    fig = go.Figure()
    for i, (name, stages, weights) in enumerate(groups):
        fig.add_bar(x=list(stages), y=_round(weights), name=name, marker_color=t.color(i))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), showlegend=True,
        barmode="group", xaxis=dict(title="stage"), yaxis=dict(title="softmax weight", rangemode="tozero"),
        width=760, height=340, margin=dict(l=60, r=20, t=60, b=60), plot_bgcolor="white",
    )
    return finish(fig, t)


def plot_patching(grid: PatchingGrid, style: Theme | None = None) -> go.Figure:
    """Rows (stages, layers or heads) × tokens: the share of the clean logit difference each patch restores."""
    t = style or current()
    z = np.round(grid.recovery.numpy(), DECIMALS)
    tokens = [f"{i}: {tok}" for i, tok in enumerate(grid.inp.tokens)]  # escaped by finish
    finite = z[np.isfinite(z)]
    bound = float(max(1.0, np.abs(finite).max() if finite.size else 1.0))
    what = {"residual": "the residual stream", "attention": "attention output", "mlp": "MLP output",
            "heads": "one head's output"}[grid.kind]
    fig = go.Figure(go.Heatmap(
        z=z, x=tokens, y=grid.rows, colorscale=t.diverging, zmin=-bound, zmax=bound, zmid=0.0, xgap=1, ygap=1,
        hovertemplate="%{y}, token %{x}<br>recovery %{z:.3f}<extra></extra>",
        colorbar=dict(title=dict(text="recovery"), thickness=12),
    ))
    fig.update_layout(
        title=dict(text=f"Patching {what}: share of “{plain_text(grid.inp.answer)}” − "
                        f"“{plain_text(grid.inp.wrong)}” restored (clean {grid.clean_diff:+.2f}, "
                        f"corrupted {grid.corrupt_diff:+.2f})", font=dict(size=13)),
        xaxis=dict(title="token (clean sentence)", tickangle=-45),
        yaxis=dict(title="", autorange="reversed"),
        width=int(min(1100, 220 + 42 * len(tokens))), height=int(min(720, 200 + 32 * len(grid.rows))),
        margin=dict(l=90, r=20, t=70, b=110), plot_bgcolor="white",
    )
    return finish(fig, t, wide=True)


def plot_neuron_view(view: NeuronView, style: Theme | None = None) -> go.Figure:
    """Query vector of the chosen token, every token's key, their elementwise product, and the scores
    (bars: score; the softmax weight in the hover)."""
    t = style or current()
    tokens = [f"{i}: {tok}" for i, tok in enumerate(view.tokens)]  # escaped by finish
    d = view.q.shape[0]
    fig = make_subplots(rows=1, cols=4, column_widths=[0.06, 0.36, 0.36, 0.22], shared_yaxes=True,
                        horizontal_spacing=0.02,
                        subplot_titles=("q", "k (each token)", "q × k", "score = Σ ÷ √d"))
    bound = float(max(view.k.abs().max(), view.q.abs().max(), 1e-6))
    pb = float(max(view.product.abs().max(), 1e-6))
    q = np.round(view.q.numpy(), DECIMALS)[:, None].T  # [1, d]
    fig.add_heatmap(z=q, y=[tokens[view.query]], x=list(range(d)), colorscale=t.diverging, zmin=-bound, zmax=bound,
                    showscale=False, hovertemplate="q[%{x}] = %{z:.3f}<extra></extra>", row=1, col=1)
    fig.add_heatmap(z=np.round(view.k.numpy(), DECIMALS), y=tokens, x=list(range(d)), colorscale=t.diverging,
                    zmin=-bound, zmax=bound, showscale=False,
                    hovertemplate="%{y}<br>k[%{x}] = %{z:.3f}<extra></extra>", row=1, col=2)
    fig.add_heatmap(z=np.round(view.product.numpy(), DECIMALS), y=tokens, x=list(range(d)), colorscale=t.diverging,
                    zmin=-pb, zmax=pb, showscale=False,
                    hovertemplate="%{y}<br>q·k[%{x}] = %{z:.3f}<extra></extra>", row=1, col=3)
    fig.add_bar(x=np.round(view.scores.numpy(), DECIMALS), y=tokens, orientation="h", marker_color=t.color(0),
                customdata=np.round(view.weights.numpy(), DECIMALS),
                hovertemplate="%{y}<br>score %{x:.3f}<br>weight %{customdata:.3f}<extra></extra>", row=1, col=4)
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11))
    fig.update_yaxes(autorange="reversed", col=1, row=1, showticklabels=True)
    fig.update_xaxes(showticklabels=False, col=2)
    fig.update_xaxes(showticklabels=False, col=3)
    fig.update_layout(
        title=dict(text=f"Layer {view.layer}, head {view.head}: why “{plain_text(view.tokens[view.query])}” "
                        f"attends where it does", font=dict(size=14)),
        width=960, height=int(min(800, 160 + 24 * len(tokens))), margin=dict(l=110, r=20, t=80, b=30),
        plot_bgcolor="white", showlegend=False,
    )
    return finish(fig, t)


def plot_neighbours(neighbours: Sequence[Neighbour], word: str, stage_name: str,
                    style: Theme | None = None) -> go.Figure:
    """The neighbours, best first: piece, cosine and its sentence with the piece in bold."""
    t = style or current()
    rows = []
    for n in neighbours:
        ctx = [plain_text(tok) for tok in n.context]
        ctx[n.position] = f"<b>{ctx[n.position]}</b>"
        rows.append((plain_text(n.piece), f"{n.score:.3f}", " ".join(ctx[1:-1])))
    cols = list(zip(*rows)) if rows else [[], [], []]
    fig = go.Figure(go.Table(
        columnwidth=[90, 60, 600],
        header=dict(values=["piece", "cosine", "in its sentence"], fill_color="#eef4fa", align="left"),
        cells=dict(values=[list(c) for c in cols], align="left", height=26),
    ))
    fig.update_layout(title=dict(text=f"Nearest corpus tokens to “{plain_text(word)}” ({plain_text(stage_name)})",
                                 font=dict(size=14)),
                      width=900, height=int(min(720, 120 + 30 * max(1, len(rows)))),
                      margin=dict(l=10, r=10, t=50, b=10))
    return finish(fig, t, markup=True)  # the cells bold the piece: every student string escaped above


def _arcs(edges: Sequence[tuple[int, int]], up: bool) -> tuple[list[float | None], list[float | None]]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for i, j in edges:
        theta = np.linspace(0, math.pi, 24)
        mid, r = (i + j) / 2, (j - i) / 2
        xs += list(mid - r * np.cos(theta)) + [None]
        h = 0.35 + 0.25 * (j - i)
        ys += list((1 if up else -1) * h * np.sin(theta)) + [None]
    return xs, ys


def plot_tree(pred: TreePrediction, style: Theme | None = None) -> go.Figure:
    """The words on a line; above: the probe's tree (minimum spanning tree of its distances); below: the gold
    tree when there is one (green: an edge in both, orange: only in one)."""
    t = style or current()
    gold = set(pred.gold or [])
    ours = set(pred.edges)
    fig = go.Figure()
    has_gold = pred.gold is not None
    for edges, up, name, colour in (
        (sorted(ours & gold), True, "probe: also in gold", t.color(2)),
        (sorted(ours - gold), True, "probe: not in gold" if has_gold else "probe", t.color(1 if has_gold else 0)),
        (sorted(gold & ours), False, "gold: found", t.color(2)),
        (sorted(gold - ours), False, "gold: missed", NEUTRAL),
    ):
        if edges:
            x, y = _arcs(edges, up)
            fig.add_scatter(x=x, y=y, mode="lines", name=name, line=dict(color=colour, width=2), hoverinfo="skip")
    n = len(pred.words)
    fig.add_scatter(x=list(range(n)), y=[0] * n, mode="text", text=list(pred.words), textfont=dict(size=12),
                    hoverinfo="skip", showlegend=False)
    found = len(ours & gold)
    score = f" · UUAS {found}/{len(gold)}" if pred.gold is not None and gold else ""
    fig.update_layout(
        title=dict(text=f"Structural probe at stage {pred.stage}: its tree (above)"
                        + (" and the gold tree (below)" if pred.gold is not None else "") + score, font=dict(size=14)),
        xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white",
        width=int(min(1400, 200 + 60 * n)), height=420, margin=dict(l=20, r=20, t=60, b=20),
        legend=dict(orientation="h", y=-0.05),
    )
    return finish(fig, t, wide=True)
