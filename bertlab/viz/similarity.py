"""Figures of embeddings and similarity (pure: a result in, a figure out)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from bertlab.analysis.sentences import CosineScore, SentenceSimilarity
from bertlab.analysis.similarity import TokenSimilarity, WordAcrossContexts, WordProjection
from bertlab.viz.text import plain_text
from bertlab.viz.theme import (
    NEUTRAL,
    Theme,
    current,
    finish,
    labelled_points,
    matrix_ticks,
    plot_area,
    point_text,
)

DECIMALS = 4


def plot_token_similarity(sim: TokenSimilarity, stage: int, style: Theme | None = None) -> go.Figure:
    """Heatmap of token x token cosine similarity at `stage`, on a fixed -1..1 scale so stages compare;
    on long inputs every k-th token is labelled (all on hover). `style`: the theme (default: in use)."""
    t = style or current()
    z = np.round(sim.matrix(stage).numpy(), DECIMALS)  # [seq, seq]
    n = len(sim.tokens)
    labels = [t if t.strip() else repr(t) for t in sim.tokens]
    pairs = np.empty((n, n, 2), dtype=object)
    pairs[:, :, 0] = np.array(labels, dtype=object)[:, None]
    pairs[:, :, 1] = np.array(labels, dtype=object)[None, :]
    side = int(min(760, max(420, 200 + 12 * n)))
    vals, text, font = matrix_ticks(labels, side, t)
    axis = dict(tickmode="array", tickvals=vals, ticktext=text, tickfont=dict(size=font), showgrid=False,
                zeroline=False)
    fig = go.Figure(
        go.Heatmap(
            z=z, x=list(range(n)), y=list(range(n)), customdata=pairs,
            hovertemplate="%{customdata[0]} · %{customdata[1]}<br>cosine %{z:.3f}<extra></extra>",
            colorscale=t.diverging, reversescale=True, zmin=-1.0, zmax=1.0, zmid=0.0,
            colorbar=dict(title=dict(text="cosine"), thickness=12),
        )
    )
    fig.update_layout(
        title=dict(text=f"Cosine similarity between tokens, {_stage_title(sim.stage_names, stage)}",
                   font=dict(size=14)),
        xaxis=dict(axis, tickangle=-60 if n > 8 else 0, constrain="domain"),
        yaxis=dict(axis, autorange="reversed", scaleanchor="x", constrain="domain"),
        width=side + 160, height=side + 60, margin=dict(l=100, r=20, t=50, b=100), plot_bgcolor="white",
    )
    return finish(fig, t)


def word_lines(result: WordAcrossContexts) -> dict[str, np.ndarray]:
    """The lines of `plot_word_across_layers`, by legend name: [stage] each."""
    lines: dict[str, np.ndarray] = {}
    if result.same_sense is not None:
        lines["same sense"] = result.same_sense.numpy()
    if result.different_sense is not None:
        lines["different senses"] = result.different_sense.numpy()
    if result.senses is None:
        lines["all pairs of contexts"] = result.all_pairs.numpy()
    lines["random token pairs (baseline)"] = result.baseline.mean.numpy()
    return {k: np.round(v, DECIMALS) for k, v in lines.items()}


def plot_word_across_layers(result: WordAcrossContexts, style: Theme | None = None) -> go.Figure:
    """Mean cosine of the word's vectors across contexts, per stage: same-sense pairs,
    different-sense pairs (or all pairs without senses), against the random-pair baseline."""
    t = style or current()
    styles = {  # told apart by dash as well as colour
        "same sense": dict(color=t.color(2), width=3),
        "different senses": dict(color=t.color(1), width=3, dash="dot"),
        "all pairs of contexts": dict(color=t.color(0), width=3),
        "random token pairs (baseline)": dict(color=NEUTRAL, dash="dash", width=2),
    }
    lines = word_lines(result)
    fig = go.Figure(
        [
            go.Scatter(
                name=name, x=result.stage_names, y=y, mode="lines+markers", line=styles[name],
                hovertemplate="%{x}: mean cosine %{y:.3f}<extra>" + name + "</extra>",
            )
            for name, y in lines.items()
        ]
    )
    lowest = min(0.0, float(min(v.min() for v in lines.values())) - 0.05)
    fig.update_layout(
        title=dict(text=f"“{plain_text(result.word)}” across {len(result.contexts)} contexts: "
                        "how similar are its vectors?",
                   font=dict(size=14)),
        xaxis=dict(title="stage (embeddings, then the output of each layer)"),
        yaxis=dict(title="mean cosine similarity", range=[lowest, 1.02]),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        width=760, height=460, plot_bgcolor="white", margin=dict(l=60, r=20, t=80, b=60),
    )
    return finish(fig, t)


def plot_word_projection(proj: WordProjection, stage: int, style: Theme | None = None) -> go.Figure:
    """Scatter of the words' contextual vectors at `stage` in 2-D (centred PCA), one colour per word;
    the theme's `labelled_points` points farthest from the centre carry "word (sentence)" on the
    picture, and hovering any point shows its sentence."""
    t = style or current()
    if not 0 <= stage < proj.points.shape[0]:
        raise IndexError(f"stage {stage} does not exist: use 0 (embeddings) to {proj.points.shape[0] - 1}.")
    xy = np.round(proj.points[stage].numpy(), DECIMALS)  # [point, 2]
    names = [f"{w} ({proj.sentence_index[j] + 1})" for j, w in enumerate(proj.words)]
    shown = labelled_points(xy, t.labelled_points, labels=names, font_px=t.px(11),
                            plot_px=plot_area(720, 540, dict(l=60, r=20, t=60, b=60), t))
    text = point_text(names, shown)
    traces = []
    for i, word in enumerate(dict.fromkeys(proj.words)):
        idx = [j for j, w in enumerate(proj.words) if w == word]
        traces.append(
            go.Scatter(
                name=word, x=xy[idx, 0], y=xy[idx, 1], mode="markers+text",
                text=[text[j] for j in idx], textposition="top center",
                textfont=dict(size=11, color=t.color(i)),
                marker=dict(size=11, color=t.color(i), line=dict(width=1, color="white")),
                customdata=[[proj.sentence_index[j] + 1, _short(proj.sentences[proj.sentence_index[j]])] for j in idx],
                hovertemplate="<b>" + word + "</b> in sentence %{customdata[0]}:<br>%{customdata[1]}<extra></extra>",
            )
        )
    e = proj.explained[stage].tolist()
    fig = go.Figure(traces)
    fig.update_layout(
        title=dict(text=f"Contextual vectors in 2-D, {_stage_title(proj.stage_names, stage)}", font=dict(size=14)),
        xaxis=dict(title=f"PC 1 ({100 * e[0]:.0f}% of variance)", zeroline=False),
        yaxis=dict(title=f"PC 2 ({100 * e[1]:.0f}%)", zeroline=False, scaleanchor="x"),
        width=720, height=540, plot_bgcolor="white", margin=dict(l=60, r=20, t=60, b=60),
    )
    return finish(fig, t)


def plot_sentence_similarity(result: SentenceSimilarity, style: Theme | None = None) -> go.Figure:
    """Horizontal bars: the cosine of the first sentence's embedding with each other sentence's, in the order
    typed (the most similar one highlighted), on a fixed axis up to 1 so that inputs compare."""
    t = style or current()
    labels = [f"{i}. {_short(o, 60)}" for i, o in enumerate(result.others, start=2)]
    best = max(range(len(result.cosines)), key=result.cosines.__getitem__)
    colors = [t.color(0) if i == best else NEUTRAL for i in range(len(result.cosines))]
    fig = go.Figure(go.Bar(
        x=[round(c, DECIMALS) for c in result.cosines], y=labels, orientation="h", marker_color=colors,
        text=[f"{c:.2f}" for c in result.cosines], textposition="auto",
        customdata=[_short(o) for o in result.others],
        hovertemplate="%{customdata}<br>cosine %{x:.3f}<extra></extra>",
    ))
    low = min(0.0, min(result.cosines))
    fig.update_layout(
        title=dict(text=f"Cosine with “{plain_text(_short(result.sentence, 70))}”<br><sup>mean-pooled last-layer "
                        "vectors, each sentence encoded alone</sup>", font=dict(size=14)),
        xaxis=dict(title="cosine", range=[low - 0.05 if low < 0 else 0, 1.0]),
        yaxis=dict(autorange="reversed", type="category"),
        width=760, height=max(260, 120 + 34 * len(labels)), plot_bgcolor="white",
        margin=dict(l=20, r=20, t=80, b=50),
    )
    fig.update_yaxes(automargin=True)
    return finish(fig, t)


def sentence_notes(result: SentenceSimilarity) -> list[tuple[str, str]]:
    """The closest sentence, and any sentence cut to the model's limit."""
    best, cosine = result.ranked()[0]
    out: list[tuple[str, str]] = [("info", f"Closest: “{_short(best, 70)}” (cosine {cosine:.2f}). Each sentence "
                                           "is encoded alone; its token vectors of the last layer are averaged.")]
    return out + [("warning", w) for w in result.warnings]


def score_html(score: CosineScore, where: str, head: dict[str, float] | None = None) -> str:
    """The cosine's Pearson and Spearman on `score.pairs` scored pairs from `where`, as one line; with `head`
    (a fine-tuned sts model's pearson, spearman and mse on the same pairs), a second line beside it."""
    out = (f"Cosine against people's relatedness on <b>{score.pairs:,}</b> pairs of {plain_text(where)}: "
           f"Pearson <b>{score.pearson:.3f}</b>, Spearman <b>{score.spearman:.3f}</b>.")
    if head is not None:
        out += (f"<br>This model's regression head on the same pairs (both sentences read together): Pearson "
                f"<b>{head['pearson']:.3f}</b>, Spearman <b>{head['spearman']:.3f}</b>, squared error "
                f"{head['mse']:.3f}.")
    return out


def _stage_title(names: list[str], stage: int) -> str:
    return "at the embeddings" if stage == 0 else f"after {names[stage]}"


def _short(text: str, n: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def token_notes(sim: TokenSimilarity, max_shown: int, unknown: Sequence[tuple[str, str]] = ()
                ) -> list[tuple[str, str]]:
    """What the student should know about the token × token matrix (`unknown`: the panel's note on pieces
    outside the vocabulary, bertlab.panels.base.unknown_notes)."""
    n = len(sim.tokens)  # >= 3: [CLS] ... [SEP]
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    first, last = (float(sim.matrices[s][off_diagonal].mean()) for s in (0, -1))
    out: list[tuple[str, str]] = [
        ("info", (f"{n} tokens. Mean cosine between two different tokens: {first:.2f} at the embeddings, "
                  f"{last:.2f} after the last layer.")),
    ]
    out += unknown
    if sim.warning:
        out.append(("warning", sim.warning))
    if n > max_shown:
        out.append(("warning", (f"The matrix shows the first {max_shown} of the {n} tokens (each computed "
                                "with the whole text as context).")))
    return out


def word_notes(result: WordAcrossContexts) -> list[tuple[str, str]]:
    """The word's pieces, the numbers after the last layer, and notes from the analysis."""
    pieces = " ".join(result.pieces)
    how = "" if len(result.pieces) == 1 else f" It is {len(result.pieces)} pieces ({pieces}): its vector is their mean."
    last = {name: round(float(v[-1]), 2) for name, v in word_lines(result).items()}
    numbers = ", ".join(f"{name} {v:.2f}" for name, v in last.items())
    out: list[tuple[str, str]] = [
        ("info", f"“{result.word}” in {len(result.contexts)} contexts.{how} After the last layer: {numbers}."),
    ]
    out.extend(("info", note) for note in result.notes)
    return out


def map_notes(proj: WordProjection) -> list[tuple[str, str]]:
    """How many points each word gave."""
    counts = {w: proj.words.count(w) for w in dict.fromkeys(proj.words)}
    found = ", ".join(f"“{w}” {c}×" for w, c in counts.items())
    out: list[tuple[str, str]] = [("info", f"{len(proj.words)} points: {found}. The map is refitted at each stage.")]
    if len(proj.words) < 3:
        out.append(("warning", "Two points always lie on one line: add sentences for a more telling map."))
    return out

