"""Figures of the fine-tuning lab (pure: results in, a figure or an HTML string out).

Training and dev curves of several runs, the confusion matrix, class probabilities, entities
highlighted in the text, the answer highlighted in its paragraph with start/end probability
bars, and the [CLS] vectors before and after fine-tuning.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from bertlab.analysis.predict import AnswerResult, ClassPrediction, EntityPrediction, Relatedness, SpanPrediction
from bertlab.analysis.sample_size import examples_text, measured_on, too_few
from bertlab.tokenizer import DEFAULT_SPECIALS
from bertlab.training.loop import TrainEvent
from bertlab.training.run_state import FinetuneRun
from bertlab.viz.mask import empty_figure
from bertlab.viz.text import plain_text
from bertlab.viz.theme import OKABE_ITO, Theme, current, finish, labelled_points, plot_area, point_text

ENTITY_COLORS: dict[str, str] = {"PER": "#fdd49e", "ORG": "#a6cee3", "LOC": "#b2df8a", "MISC": "#d9c2e9"}
OTHER_ENTITY = "#e0e0e0"
ANSWER_COLOR, ALTERNATIVE_COLOR = "#ffd54f", "#fff3c4"
START_COLOR, END_COLOR = OKABE_ITO[0], OKABE_ITO[4]
DECIMALS = 4


# ---------------------------------------------------------------------------------------------
# Curves and confusion
# ---------------------------------------------------------------------------------------------
History = Sequence[Mapping[str, Any]]  # a loop history: dicts with kind "train" (loss) or "eval" (scores)


def plot_training_curves(runs: Mapping[str, History], metric: str, x: str = "step",
                         style: Theme | None = None, dev_examples: int | None = None) -> go.Figure:
    """Training loss (left) and dev `metric` (right) against `x` ("step" or "epoch"), one
    colour per run: e.g. {"full": history_a, "feature": history_b} (`FinetuneRun.history`, `dev_curves`).
    `dev_examples`: how many examples the dev figures were measured on (named in the title; a
    warning below a meaningful size). Shares (accuracy, F1: in 0..1, or 0..100 when `metric` names "%")
    keep a fixed full axis."""
    t = style or current()
    if not runs:
        return empty_figure("Fine-tune a model to see its curves.", t)
    if x not in ("step", "epoch"):
        raise ValueError(f"x must be 'step' or 'epoch'; got {x!r}.")
    dev_title = f"dev {metric}" + (f" ({examples_text(dev_examples)})" if dev_examples is not None else "")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["training loss", dev_title], horizontal_spacing=0.1)
    shares = True
    for n, (name, run) in enumerate(runs.items()):
        color = t.color(n)
        history = list(run)
        train = [h for h in history if h.get("kind") == "train"]
        evals = [h for h in history if h.get("kind") == "eval" and metric in h]
        top = 100.0 if "%" in metric else 1.0  # a share in percent or in 0..1
        shares = shares and all(0.0 <= h[metric] <= top for h in evals)
        fig.add_trace(go.Scatter(
            x=[h[x] for h in train], y=[round(h["loss"], DECIMALS) for h in train], mode="lines", name=name,
            legendgroup=name, line=dict(color=color),
            hovertemplate=f"{name}: {x} %{{x}}, loss %{{y:.4f}}<extra></extra>",
        ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=[h[x] for h in evals], y=[round(h[metric], DECIMALS) for h in evals], mode="lines+markers", name=name,
            legendgroup=name, showlegend=False, line=dict(color=color),
            hovertemplate=f"{name}: {x} %{{x}}, {metric} %{{y:.4g}}<extra></extra>",
        ), row=1, col=2)
    fig.update_xaxes(title_text=x)
    fig.update_yaxes(title_text="loss", rangemode="tozero", row=1, col=1)
    top = 100.0 if "%" in metric else 1.0
    fig.update_yaxes(title_text=metric, row=1, col=2, **({"range": [0, 1.02 * top]} if shares else {}))
    fig.update_layout(height=380, width=900, plot_bgcolor="white", margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(title=dict(text="run")))
    warning = too_few(dev_examples, "dev examples") if dev_examples is not None else ""
    if warning:
        fig.add_annotation(text=html.escape(warning), xref="paper", yref="paper", x=1, y=-0.22, showarrow=False,
                           xanchor="right", font=dict(color=t.warning, size=12))
        fig.update_layout(margin=dict(b=80))
    return finish(fig, t)


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], labels: Sequence[str], normalize: bool = True,
                          style: Theme | None = None) -> go.Figure:
    """Heatmap of counts (rows = gold label, columns = predicted); colour = share of each gold
    row when `normalize`, so that classes of different sizes compare. Cells show the counts."""
    t = style or current()
    counts = torch.tensor([list(r) for r in matrix], dtype=torch.float64)  # [gold, predicted]
    if counts.dim() != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] != len(labels):
        raise ValueError(f"a {len(labels)}x{len(labels)} matrix is needed for {len(labels)} labels; "
                         f"got shape {tuple(counts.shape)}.")
    shares = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)  # [gold, predicted]
    z = shares if normalize else counts
    n = int(counts.sum())
    accuracy = float(counts.diagonal().sum() / counts.sum().clamp(min=1))
    fig = go.Figure(go.Heatmap(
        z=[[round(float(v), DECIMALS) for v in row] for row in z], x=list(labels), y=list(labels),
        text=[[str(int(v)) for v in row] for row in counts], texttemplate="%{text}", colorscale=t.sequential,
        zmin=0, zmax=1 if normalize else None,
        customdata=[[round(float(v), DECIMALS) for v in row] for row in shares],
        hovertemplate="gold %{y}, predicted %{x}: %{text} (%{customdata:.1%} of the gold row)<extra></extra>",
        colorbar=dict(title=dict(text="share of row" if normalize else "count")),
    ))
    fig.update_layout(
        title=dict(text=f"Confusion matrix: accuracy {measured_on(accuracy, n, 'dev examples')}", font=dict(size=13)),
        xaxis=dict(title=dict(text="predicted"), side="bottom", type="category"),
        yaxis=dict(title=dict(text="gold"), autorange="reversed", type="category"),
        height=120 + 60 * len(labels), width=max(480, 220 + 80 * len(labels)), margin=dict(l=100, r=20, t=50, b=60),
    )
    warning = too_few(n, "dev examples")
    if warning:
        fig.add_annotation(text=html.escape(warning), xref="paper", yref="paper", x=0, y=-0.35, showarrow=False,
                           xanchor="left", font=dict(color=t.warning, size=12))
        fig.update_layout(height=fig.layout.height + 40, margin=dict(b=100))
    return finish(fig, t)


def plot_class_probabilities(pred: ClassPrediction, style: Theme | None = None) -> go.Figure:
    """Horizontal bars: the probability of each label, the chosen one highlighted."""
    t = style or current()
    colors = [START_COLOR if label == pred.label else "#bbbbbb" for label in pred.labels]
    fig = go.Figure(go.Bar(
        x=[round(p, DECIMALS) for p in pred.probabilities], y=pred.labels, orientation="h", marker_color=colors,
        text=[f"{100 * p:.1f}%" for p in pred.probabilities], textposition="auto",
        hovertemplate="%{y}: %{x:.3f}<extra></extra>",
    ))
    fig.update_layout(
        title=dict(text=f"The model says: {plain_text(pred.label)} ({100 * pred.probability:.1f}%)",
                   font=dict(size=14)),
        xaxis=dict(range=[0, 1], tickformat=".0%", title=dict(text="probability")),
        yaxis=dict(autorange="reversed", type="category"),
        height=110 + 40 * len(pred.labels), width=620, plot_bgcolor="white", margin=dict(l=120, r=20, t=50, b=50),
    )
    return finish(fig, t)


# ---------------------------------------------------------------------------------------------
# Entities and answers as HTML
# ---------------------------------------------------------------------------------------------
def _mark(text: str, color: str, title: str, label: str | None = None) -> str:
    tag = (f'<sup style="font-size:0.7em;font-weight:600;margin-left:3px;color:#333">{plain_text(label)}</sup>'
           if label else "")
    return (f'<mark title="{html.escape(title, quote=True)}" style="background:{color};padding:1px 3px;'
            f'border-radius:3px">{plain_text(text)}{tag}</mark>')


def _highlight(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """`text` as HTML with each (start, end, mark html) span replaced; spans must not overlap."""
    out, pos = [], 0
    for start, end, marked in sorted(spans):
        if start < pos:
            continue  # overlapping span: keep the first
        out.append(plain_text(text[pos:start]))
        out.append(marked)
        pos = end
    out.append(plain_text(text[pos:]))
    return "".join(out)


def entity_color(type_: str) -> str:
    return ENTITY_COLORS.get(type_, OTHER_ENTITY)


def entities_html(text: str, found: Sequence[EntityPrediction]) -> str:
    """The text with each entity on a background coloured by type (and its type after it),
    then a legend of the types. Safe HTML: the text is escaped."""
    spans = [(e.start_char, e.end_char, _mark(e.text, entity_color(e.type), f"{e.type} ({100 * e.score:.0f}%)",
                                               e.type)) for e in found]
    types = list(ENTITY_COLORS) + sorted({e.type for e in found} - set(ENTITY_COLORS))
    legend = " ".join(_mark(t, entity_color(t), t) for t in types)
    note = "" if found else '<p style="color:#777">No entities found.</p>'
    return (f'<div class="bertlab-entities" style="line-height:2;font-size:1.15em">{_highlight(text, spans)}</div>'
            f'{note}<div style="font-size:0.92em;margin-top:6px">{legend}</div>')


def answer_html(result: AnswerResult, alternatives: int = 2) -> str:
    """The paragraph with the best answer highlighted (and the next `alternatives` spans,
    lighter, where they do not overlap it), the question above it."""
    spans = []
    if result.text:
        spans.append((result.start_char, result.end_char,
                      _mark(result.text, ANSWER_COLOR, f"answer ({100 * result.probability:.0f}%)")))
    for rank, span in enumerate(result.top_k[1 : 1 + alternatives], start=2):
        if span.end_char <= result.start_char or span.start_char >= result.end_char:
            spans.append((span.start_char, span.end_char,
                          _mark(span.text, ALTERNATIVE_COLOR, f"answer #{rank} ({100 * span.probability:.0f}%)")))
    verdict = (f"<b>Answer:</b> {plain_text(result.text)} ({100 * result.probability:.0f}%)" if result.text
               else "<b>No answer span found.</b>")
    return (f'<div class="bertlab-answer" style="font-size:1.15em;line-height:1.7">'
            f'<p><b>Q:</b> {plain_text(result.question)}</p><p>{verdict}</p>'
            f'<p>{_highlight(result.context, spans)}</p></div>')


def plot_span_probabilities(result: AnswerResult, max_tokens: int = 120, style: Theme | None = None) -> go.Figure:
    """Bars over the context tokens: P(start) above, P(end) below; the answer's tokens outlined.
    Long paragraphs show the `max_tokens` tokens around the answer. As wide as its tokens: its box
    scrolls when the tab is narrower."""
    t = style or current()
    n = len(result.tokens)
    inside = [i for i, (a, b) in enumerate(result.offsets)
              if result.text and a < result.end_char and b > result.start_char]  # the answer's tokens
    centre = inside[0] if inside else max(range(n), key=result.start_probs.__getitem__)
    lo = max(0, min(centre - max_tokens // 2, n - max_tokens))
    idx = list(range(lo, min(n, lo + max_tokens)))
    labels = [f"{i} {result.tokens[i]}" for i in idx]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["P(answer starts here)", "P(answer ends here)"])
    for row, (probs, color) in enumerate(((result.start_probs, START_COLOR), (result.end_probs, END_COLOR)), start=1):
        fig.add_trace(go.Bar(
            x=labels, y=[round(probs[i], DECIMALS) for i in idx], marker_color=color, showlegend=False,
            marker_line=dict(color=["black" if i in inside else color for i in idx],
                             width=[2 if i in inside else 0 for i in idx]),
            hovertemplate="%{x}: %{y:.3f}<extra></extra>",
        ), row=row, col=1)
        fig.update_yaxes(range=[0, 1], tickformat=".0%", row=row, col=1)
    fig.update_xaxes(type="category", tickangle=-60, row=2, col=1)
    fig.update_layout(height=460, width=max(620, 14 * len(idx)), plot_bgcolor="white", bargap=0.1,
                      margin=dict(l=60, r=20, t=50, b=110))
    return finish(fig, t, wide=len(idx) > 60)


# ---------------------------------------------------------------------------------------------
# [CLS] before and after
# ---------------------------------------------------------------------------------------------
def plot_cls_pca(
    panels: Mapping[str, torch.Tensor],
    labels: Sequence[str],
    texts: Sequence[str] | None = None,
    explained: Mapping[str, torch.Tensor] | None = None,
    style: Theme | None = None,
    cls_token: str = DEFAULT_SPECIALS["cls"],
) -> go.Figure:
    """Side-by-side scatters of 2-D [CLS] projections (e.g. {"before": pts, "after": pts},
    each [n, 2] from `pca_2d`), one colour per gold label; hover shows the text, and the theme's
    `labelled_points` points farthest from the centre of each panel carry the start of theirs (where it
    covers no other label).
    `cls_token`: the tokenizer's, for the titles."""
    t = style or current()
    if not panels:
        return empty_figure(f"Compute {plain_text(cls_token)} vectors first.", t)
    names = list(panels)
    titles = [plain_text(name) + (f" (PCA: {100 * float(explained[name].sum()):.0f}% of variance)"
                      if explained and name in explained else "") for name in names]
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=titles, horizontal_spacing=0.08)
    classes = list(dict.fromkeys(labels))
    width, height, margin = max(520, 430 * len(names)), 420, dict(l=60, r=20, t=80, b=50)
    area = plot_area(width, height, margin, t)
    each = (area[0] * (1 - 0.08 * (len(names) - 1)) / len(names), area[1])  # one panel's plot area, px
    for col, name in enumerate(names, start=1):
        pts = panels[name]
        if pts.dim() != 2 or pts.shape[1] != 2 or pts.shape[0] != len(labels):
            raise ValueError(f"{name}: points must be [{len(labels)}, 2]; got {tuple(pts.shape)}.")
        drawn = None
        if texts is not None:
            short = [_cut(x, 18) for x in texts]
            drawn = point_text(short, labelled_points(pts.numpy(), t.labelled_points, labels=short, plot_px=each,
                                                      font_px=t.px(10), equal_axes=False))
        for c, cls in enumerate(classes):
            rows = [i for i, label in enumerate(labels) if label == cls]
            fig.add_trace(go.Scatter(
                x=[round(float(pts[i, 0]), DECIMALS) for i in rows],
                y=[round(float(pts[i, 1]), DECIMALS) for i in rows],
                mode="markers+text" if drawn is not None else "markers", name=str(cls), legendgroup=str(cls),
                showlegend=col == 1, marker=dict(color=t.color(c), size=7, opacity=0.75),
                text=[drawn[i] for i in rows] if drawn is not None else None, textposition="top center",
                textfont=dict(size=10, color=t.color(c)),
                customdata=[texts[i] for i in rows] if texts is not None else None,
                hovertemplate=(f"{cls}<br>%{{customdata}}<extra></extra>" if texts is not None
                               else f"{cls}<extra></extra>"),
            ), row=1, col=col)
        fig.update_xaxes(title_text="PC 1", zeroline=False, row=1, col=col)
        fig.update_yaxes(title_text="PC 2", zeroline=False, row=1, col=col)
    fig.update_layout(height=height, width=width, plot_bgcolor="white",
                      title=dict(text=f"{plain_text(cls_token)} vectors, coloured by gold label", font=dict(size=14)),
                      margin=margin, legend=dict(title=dict(text="label")))
    return finish(fig, t)


def _cut(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def progress_html(run: FinetuneRun, event: TrainEvent) -> str:
    """One line of a fine-tuning run (label, precision, history, metric, score) at a loop event: step, epoch,
    loss, speed, last dev score, time left."""
    parts = [f"<b>{html.escape(run.label)}</b>", f"step {event.step}/{event.total_steps}", f"epoch {event.epoch:.2f}"]
    if run.precision == "bf16":  # said, since a run's figures differ a little from an fp32 run's
        tip = "matrix products in bfloat16 (autocast); weights and optimizer in float32"
        parts.append(f'<span title="{tip}">bf16</span>')
    losses = [h["loss"] for h in run.history if h["kind"] == "train"]
    if losses:
        parts.append(f"loss {losses[-1]:.3f}")
    if event.examples_per_s:
        parts.append(f"{event.examples_per_s:.0f} examples/s")
    if run.score is not None:
        parts.append(f"dev {run.metric} {run.score:.3g}")
    if 0 < event.step < event.total_steps and event.kind not in ("end", "error"):
        left = event.elapsed_s / event.step * (event.total_steps - event.step)
        parts.append(f"~{left:.0f} s left")
    if event.kind == "end" and event.message:
        parts.append(html.escape(event.message))
    return " · ".join(parts)


def runs_html(runs: Sequence[FinetuneRun], shown: Callable[[str], str] = str) -> str:
    """A table of this session's runs: how each ended, its dev score, what it trained, where it is."""
    if not runs:
        return ""
    head = "".join(f'<th style="text-align:left;padding:2px 10px">{h}</th>'
                   for h in ("run", "status", "steps", "dev score", "trained parameters", "time", "saved in"))
    rows = []
    for r in runs:
        s = r.summary
        score = f"{r.metric} {r.score:.3g}" if r.score is not None else "–"
        trained = (f"{s['trainable_parameters'] / 1e6:.2f}M of {s['total_parameters'] / 1e6:.1f}M "
                   f"({100 * s['trainable_parameters'] / max(1, s['total_parameters']):.1f}%)" if s else "–")
        cells = (r.label, r.status, f"{r.step}/{r.total_steps or '?'}", score, trained,
                 f"{s['wall_time_s']:.0f} s" if s else "–", shown(s.get("saved_to") or r.checkpoint or "–"))
        rows.append("<tr>" + "".join(f'<td style="padding:2px 10px">{html.escape(str(c))}</td>' for c in cells)
                    + "</tr>")
    return (f'<table style="border-collapse:collapse;font-size:0.9em;margin:6px 0"><tr>{head}</tr>'
            f'{"".join(rows)}</table>')


def relatedness_html(pred: Relatedness, low: float = 1.0, high: float = 5.0) -> str:
    """The predicted relatedness as a number and a bar on SICK's scale (`low`..`high`)."""
    share = min(1.0, max(0.0, (pred.score - low) / (high - low)))
    bar = (f'<div style="width:min(100%, 420px);height:14px;background:#eeeeee;border-radius:3px">'
           f'<div style="width:{100 * share:.1f}%;height:14px;background:{START_COLOR};border-radius:3px"></div></div>')
    return (f"<div>Predicted relatedness: <b>{pred.score:.2f}</b> on SICK's scale ({low:g} = unrelated … "
            f"{high:g} = the same meaning)</div>{bar}")


def top_spans_html(spans: Sequence[SpanPrediction]) -> str:
    """The k best answer spans with their probabilities, as a small table."""
    rows = "".join(
        f'<tr><td style="padding:1px 8px">{i}</td><td style="padding:1px 8px">{html.escape(s.text)}</td>'
        f'<td style="padding:1px 8px;text-align:right">{100 * s.probability:.1f}%</td></tr>'
        for i, s in enumerate(spans, start=1)
    )
    return (f'<table style="font-size:0.9em;border-collapse:collapse"><tr><th>#</th><th style="text-align:left">'
            f'span</th><th>probability</th></tr>{rows}</table>' if spans else "")


USE_KINDS = {"sst2": "sentiment", "nli": "entailment", "sts": "relatedness, one number",
             "classification": "sentence classification",
             "ner": "named entities", "qa": "question answering"}


def using_html(name: str, kind: str, labels: Iterable[Any]) -> str:
    """The "Use it" header: the model's name, what its head does (`kind`, as `tasks.models.model_task`
    names it) and its labels when they are short enough to list."""
    listed = ", ".join(str(v) for v in labels)
    return (f"Using <b>{html.escape(name)}</b>: {USE_KINDS[kind]}"
            f"{f' ({html.escape(listed)})' if listed and len(listed) < 120 else ''}.")
