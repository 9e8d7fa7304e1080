"""Plotly figures for next-sentence prediction (pure: results in, a figure out)."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from bertlab.analysis.nsp import CLS, SEP, A, AttentionMass, B, NSPResult
from bertlab.viz.theme import NEUTRAL, OKABE_ITO, Theme, current, finish

IS_NEXT, NOT_NEXT = OKABE_ITO[2], "#bbbbbb"
GROUP_COLORS = {A: OKABE_ITO[0], B: OKABE_ITO[4], CLS: NEUTRAL, SEP: "#c7c7c7"}  # colour-blind safe
GROUP_NAMES = {A: "sentence A", B: "sentence B"}  # special tokens are named by their own spelling


PAIR_WORDS = {  # pair head -> (bar, yes, no, verdict yes, verdict no, probability)
    "nsp": ("NSP", "B follows A (IsNext)", "B is random (NotNext)", "B follows A", "B looks random", "P(IsNext)"),
    "sop": ("sentence order", "A before B (in order)", "B before A (swapped)", "A comes before B",
            "the order is swapped", "P(A before B)"),
}


def plot_nsp_probability(result: NSPResult, style: Theme | None = None, task: str = "nsp") -> go.Figure:
    """One stacked bar: P(B follows A) in green, P(B is random) in grey; a line at 50 %.
    task "sop": ALBERT's sentence order, P(A comes before B) (its head's index 0, as NSP's)."""
    t = style or current()
    p = result.is_next_probability
    bar, yes, no, said_yes, said_no, prob = PAIR_WORDS[task]
    fig = go.Figure()
    for name, value, color in ((yes, p, IS_NEXT), (no, 1 - p, NOT_NEXT)):
        fig.add_trace(
            go.Bar(
                x=[value], y=[bar], orientation="h", name=name, marker_color=color,
                text=[f"{100 * value:.1f}%"], textposition="inside", insidetextanchor="middle",
                hovertemplate=f"{name}: %{{x:.3f}}<extra></extra>",
            )
        )
    verdict = said_yes if result.is_next else said_no
    fig.update_layout(
        barmode="stack", height=190, width=620, plot_bgcolor="white",
        title=dict(text=f"The model thinks {verdict}: {prob} = {100 * p:.1f}%", font=dict(size=14)),
        xaxis=dict(range=[0, 1], tickformat=".0%", title=dict(text="probability")),
        yaxis=dict(visible=False),
        legend=dict(orientation="h", y=-0.6, traceorder="normal"),
        margin=dict(l=20, r=20, t=50, b=20),
        shapes=[dict(type="line", x0=0.5, x1=0.5, y0=0, y1=1, yref="paper", line=dict(dash="dot", width=1))],
    )
    return finish(fig, t)


def plot_attention_mass(mass: AttentionMass, sources: Sequence[str] = (A, B, CLS),
                        style: Theme | None = None) -> go.Figure:
    """Stacked bars per layer, one panel per group of attending tokens: the share of its
    attention that lands on A, B, [CLS] and [SEP] (mean over heads and over its tokens)."""
    t = style or current()
    sources = [s for s in sources if s in mass.groups]
    if not sources:
        raise ValueError(f"none of the groups to show are in this result ({', '.join(mass.groups)}).")
    # Panels side by side sharing one y axis, laid out by hand: make_subplots is slow enough that a
    # student would feel it on every new sentence.
    n, gap = len(sources), 0.04
    width = (1 - gap * (n - 1)) / n
    domains = [(i * (width + gap), i * (width + gap) + width) for i in range(n)]
    layers = list(range(mass.num_layers))
    traces, layout_axes, titles = [], {}, []
    for col, source in enumerate(sources, start=1):
        axis = "x" if col == 1 else f"x{col}"
        for target in mass.groups:
            share = mass.share(source, target)  # [layers]
            traces.append(go.Bar(
                x=layers, y=[round(float(v), 4) for v in share], name=f"to {GROUP_NAMES.get(target, target)}",
                marker_color=GROUP_COLORS.get(target), legendgroup=target, showlegend=col == 1,
                xaxis=axis, yaxis="y",
                hovertemplate=(
                    f"layer %{{x}}: {GROUP_NAMES.get(source, source)} → "
                    f"{GROUP_NAMES.get(target, target)} %{{y:.1%}}<extra></extra>"
                ),
            ))
        layout_axes["xaxis" if col == 1 else f"xaxis{col}"] = dict(
            domain=domains[col - 1], anchor="y", title_text="layer", tickmode="linear", dtick=1,
        )
        titles.append(dict(
            text=f"from {GROUP_NAMES.get(source, source)}", x=sum(domains[col - 1]) / 2, y=1.0, xref="paper",
            yref="paper", xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=16),
        ))
    fig = go.Figure(traces)
    fig.update_layout(
        **layout_axes,
        yaxis=dict(range=[0, 1], tickformat=".0%", title_text="share of attention", anchor="x"),
        annotations=titles, barmode="stack", bargap=0.15, height=380, width=max(520, 260 * n),
        plot_bgcolor="white", title=dict(text="Where attention goes, layer by layer (mean over heads)",
                                         font=dict(size=14)),
        margin=dict(l=60, r=20, t=70, b=50),
    )
    return finish(fig, t)


SOP_NOTE = ("This model's pair head is ALBERT's sentence order (SOP): it was trained on two sentences that follow "
            "each other, given in order or swapped, and says whether A comes before B; not whether B is a random "
            "sentence. Try Swap A ↔ B.")


def pair_notes(mass: AttentionMass, cls_token: str, sep_token: str, no_pair_head: str | None = None,
               sop: bool = False, no_segments: str | None = None, warning: str | None = None,
               unknown: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """What the student should know about a sentence pair, beyond the pictures: what the model lacks
    (`no_pair_head`, `no_segments`: bertlab.panels.base.lacks), whether its pair head is ALBERT's sentence
    order (`sop`), the attention between A and B, the input's `warning`, and `unknown` (the panel's note
    on pieces outside the vocabulary)."""
    a_to_b, a_to_a = float(mass.share(A, B).mean()), float(mass.share(A, A).mean())
    b_to_a, b_to_b = float(mass.share(B, A).mean()), float(mass.share(B, B).mean())
    notes: list[tuple[str, str]] = [("warning", no_pair_head)] if no_pair_head else []
    if sop:
        notes.append(("info", SOP_NOTE))
    if no_segments:
        notes.append(("info", no_segments))
    notes.append((
        "info",
        (f"Averaged over the {mass.num_layers} layers, sentence A puts {a_to_b:.0%} of its attention on B "
         f"and {a_to_a:.0%} on itself; B puts {b_to_a:.0%} on A and {b_to_b:.0%} on itself "
         f"(the rest goes to {cls_token} and {sep_token})."),
    ))
    if warning:
        notes.append(("warning", warning))
    return notes + list(unknown)
