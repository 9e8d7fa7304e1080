"""Figures of the compression lab (pure: plain results in, a figure or an HTML string out).

The pruning curve (task score against heads kept), the distillation curves (the student's
training loss and dev score), and the comparison of a session's variants: one table and one
plot of CPU latency × score, each marker's area the model's size.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.viz.mask import empty_figure
from bertlab.viz.theme import MUTED, Theme, current, finish

DECIMALS = 4
METHOD_ORDER = ("original", "int8", "pruned", "distilled")


def plot_prune_curve(points: Sequence[Mapping[str, Any]], metric: str = "accuracy", keep: int | None = None,
                     style: Theme | None = None) -> go.Figure:
    """Dev `metric` against heads kept (points: dicts with heads_kept, fraction, score); a dashed
    line at `keep`, the heads a pruned model keeps."""
    t = style or current()
    if not points:
        return empty_figure("Prune a fine-tuned model to see its score against the heads it keeps.", t)
    fig = go.Figure(go.Scatter(
        x=[p["heads_kept"] for p in points], y=[round(p["score"], DECIMALS) for p in points], mode="lines+markers",
        line=dict(color=t.color(0)), name=metric,
        customdata=[round(100 * p["fraction"]) for p in points],
        hovertemplate=f"%{{x}} heads (%{{customdata}} %) kept: {metric} %{{y:.3f}}<extra></extra>",
    ))
    if keep is not None:
        fig.add_vline(x=keep, line=dict(dash="dash", color="#777"), annotation_text="pruned model")
    fig.update_layout(height=340, width=620, plot_bgcolor="white", margin=dict(l=60, r=20, t=40, b=50),
                      title=dict(text=f"dev {metric} with the least important heads switched off"),
                      xaxis=dict(title="attention heads kept", autorange="reversed"),
                      yaxis=dict(title=metric, rangemode="tozero"))
    return finish(fig, t)


def plot_distill_curves(history: Sequence[Mapping[str, Any]], metric: str = "accuracy",
                        teacher: float | None = None, style: Theme | None = None) -> go.Figure:
    """The student's training loss (left) and dev `metric` (right) by step, with the teacher's
    dev score as a dashed line (history: the loop's entries, kind train/eval)."""
    t = style or current()
    train = [h for h in history if h.get("kind") == "train" and h.get("loss") is not None]
    evals = [h for h in history if h.get("kind") == "eval" and metric in h]
    if not train and not evals:
        return empty_figure("Distil a fine-tuned model to see the student learn.", t)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["student's loss (soft + hard)", f"dev {metric}"],
                        horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=[h["step"] for h in train], y=[round(h["loss"], DECIMALS) for h in train],
                             mode="lines", name="student", line=dict(color=t.color(0)),
                             hovertemplate="step %{x}: loss %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[h["step"] for h in evals], y=[round(h[metric], DECIMALS) for h in evals],
                             mode="lines+markers", name="student", showlegend=False, line=dict(color=t.color(0)),
                             hovertemplate=f"step %{{x}}: {metric} %{{y:.3f}}<extra></extra>"), row=1, col=2)
    if teacher is not None:
        fig.add_hline(y=teacher, line=dict(dash="dash", color="#777"), annotation_text="teacher", row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_layout(height=340, width=900, plot_bgcolor="white", margin=dict(l=60, r=20, t=50, b=50))
    return finish(fig, t)


def _size(v: Mapping[str, Any]) -> float:
    return v["disk_mb"] if v.get("disk_mb") is not None else v["memory_mb"]


def plot_variants(variants: Sequence[Mapping[str, Any]], batch: int = 1, style: Theme | None = None) -> go.Figure:
    """CPU latency at `batch` (x, ms) against score (y), one marker per variant, its area the model's
    size (MB, on disk when saved, else in memory); one colour per method. When no variant has a score (a
    model without a task head is not scored), size is the y axis; variants without one among scored ones
    are named under the plot instead of drawn at no height."""
    t = style or current()
    key = f"latency_ms_b{batch}"
    rows = [v for v in variants if v.get(key) is not None]
    if not rows:
        return empty_figure("Compress a model: every variant of this session appears here.", t)
    scored = [v for v in rows if v.get("score") is not None]
    unscored = [v for v in rows if v.get("score") is None]
    by_size = not scored  # nothing scored: size against latency
    drawn = rows if by_size else scored
    biggest = max(_size(v) for v in rows) or 1.0
    fig = go.Figure()
    methods = [m for m in METHOD_ORDER if any(v["method"] == m for v in drawn)]
    methods += sorted({v["method"] for v in drawn} - set(methods))
    for n, method in enumerate(methods):
        mine = [v for v in drawn if v["method"] == method]
        fig.add_trace(go.Scatter(
            x=[round(v[key], 2) for v in mine],
            y=[round(_size(v), 1) if by_size else round(v["score"], DECIMALS) for v in mine],
            mode="markers+text", name=method, text=[v.get("label", v["name"]) for v in mine],
            textposition="top center",
            marker=dict(color=t.color(n), size=[8 + 40 * math.sqrt(_size(v) / biggest) for v in mine],
                        line=dict(color="white", width=1)),
            customdata=[[round(_size(v), 1), v["heads"], v["layers"], html.escape(v["name"])] for v in mine],
            hovertemplate=("%{customdata[3]}: %{x} ms, " + ("" if by_size else "score %{y:.3f}, ")
                           + "%{customdata[0]} MB, %{customdata[2]} layers, %{customdata[1]} heads<extra></extra>"),
        ))
    if by_size:
        title = f"size × CPU latency, batch {batch} (not scored: the model has no task head)"
        yaxis = dict(title="size (MB)", rangemode="tozero")
    else:
        title = f"size (marker area) × CPU latency × score, batch {batch}"
        yaxis = dict(title="score on held-out examples")
    fig.update_layout(height=380, width=720, plot_bgcolor="white", margin=dict(l=60, r=20, t=40, b=50),
                      title=dict(text=title), xaxis=dict(title=f"CPU latency, batch {batch} (ms)", rangemode="tozero"),
                      yaxis=yaxis, legend=dict(title=dict(text="method")))
    if unscored and not by_size:
        names = ", ".join(html.escape(v.get("label", v["name"])) for v in unscored)
        fig.add_annotation(text=f"not scored, so not drawn: {names}", xref="paper", yref="paper", x=0, y=-0.22,
                           showarrow=False, xanchor="left", font=dict(size=11))
        fig.update_layout(margin=dict(l=60, r=20, t=40, b=80), height=400)
    return finish(fig, t)


def _cell(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def comparable(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two rows' scores were measured on the same held-out examples (so a difference means something)."""
    return a.get("eval_key", "") == b.get("eval_key", "")


def within_noise(a: Mapping[str, Any], b: Mapping[str, Any], batch: int) -> bool:
    """Whether the two rows' latency ranges at `batch` overlap: their speed ratio is then within timing noise."""
    ra, rb = a.get(f"latency_range_b{batch}"), b.get(f"latency_range_b{batch}")
    return bool(ra and rb) and ra[0] <= rb[1] and rb[0] <= ra[1]


def _latency(v: Mapping[str, Any], batch: int, fmt: str) -> str:
    median, spread = v.get(f"latency_ms_b{batch}"), v.get(f"latency_range_b{batch}")
    if median is None:
        return "–"
    return format(median, fmt) + (f" ({format(spread[0], fmt)}–{format(spread[1], fmt)})" if spread else "")


def _speedup(v: Mapping[str, Any], base: Mapping[str, Any], batch: int) -> str:
    key = f"latency_ms_b{batch}"
    if not base or not v.get(key) or not base.get(key):
        return "–"
    ratio = format(base[key] / v[key], ".2f")
    return f"{ratio} (noise)" if within_noise(v, base, batch) else ratio


def variants_html(variants: Sequence[Mapping[str, Any]]) -> str:
    """One table row per variant: size, latency, score, and the ratios to the original of its run."""
    if not variants:
        return ""
    head = ("<tr><th>model</th><th>method</th><th>layers</th><th>heads</th><th>size (MB)</th>"
            "<th>in memory (MB)</th><th>× original</th><th>latency b1 (ms)</th><th>speed-up b1</th>"
            "<th>latency b32 (ms)</th><th>speed-up b32</th><th>score</th><th>scored on</th><th>Δ score</th></tr>")
    rows = []
    for v in variants:
        base = v.get("baseline") or {}
        ratio = _size(v) / _size(base) if base else None
        delta = (v["score"] - base["score"]) * 100 if base and v.get("score") is not None and \
            base.get("score") is not None and comparable(v, base) else None
        scored_on = f"{v['eval_examples']:,}" if v.get("eval_examples") is not None else "–"
        rows.append(
            f"<tr><td>{html.escape(v['name'])}</td><td>{html.escape(v['method'])}</td><td>{v['layers']}</td>"
            f"<td>{v['heads']}</td><td>{_cell(_size(v), '.1f')}</td><td>{_cell(v.get('memory_mb'), '.1f')}</td>"
            f"<td>{_cell(ratio, '.2f')}</td>"
            f"<td>{_latency(v, 1, '.1f')}</td><td>{_speedup(v, base, 1)}</td>"
            f"<td>{_latency(v, 32, '.0f')}</td><td>{_speedup(v, base, 32)}</td>"
            f"<td>{_cell(v.get('score'), '.3f')}</td><td>{scored_on}</td><td>{_cell(delta, '+.1f')}</td></tr>")
    whys = "".join(f'<div style="font-size:0.9em"><b>{html.escape(v["name"])}</b>: {html.escape(v["why"])}</div>'
                   for v in variants if v.get("why"))
    # words whole (the page's HTML widget breaks them anywhere in a narrow column): a wide table scrolls instead
    style = "border-collapse:collapse;font-size:0.9em;word-break:normal;overflow-wrap:normal"
    return (f'<div style="overflow-x:auto;max-width:100%"><table class="bertlab-compress-table" style="{style}" '
            f'cellpadding="4">{head}{"".join(rows)}</table></div>'
            f'<div style="{MUTED};font-size:0.85em">Size: the saved weights (in memory when not saved); '
            "× original and Δ score (points) against the model it came from, Δ only between scores on the same "
            "held-out examples; latency on this machine's CPU, median of a few batches (fastest–slowest in "
            "brackets): a speed-up marked (noise) lies within that spread; each model is timed once a "
            f"session.</div>{whys}")


def peer_text(peer: Mapping[str, Any], torch_row: Mapping[str, Any], shown: Callable[[str], str] = str) -> str:
    """What the ONNX Runtime row of an int8 model says beside torch's: both timings (taken in turns on the same
    sentences), both scores on the same held-out examples, and the file to deploy."""
    parts = [f"ONNX Runtime runs the same int8 model in {peer['latency_ms_b1']:.1f} ms at batch 1, torch's int8 "
             f"in {torch_row['latency_ms_b1']:.1f} ms (timed in turns on the same sentences)"]
    if peer.get("score") is not None and torch_row.get("score") is not None:
        parts.append(f"{peer['metric']} {peer['score']:.3f} against torch's {torch_row['score']:.3f} on the same "
                     f"{peer['eval_examples']:,} held-out examples")
    deploy = f"; the file to deploy: {shown(peer['folder'])}" if peer.get("folder") else ""
    return ", ".join(parts) + deploy + "."


__all__ = ["comparable", "peer_text", "plot_distill_curves", "plot_prune_curve", "plot_variants", "variants_html",
           "within_noise"]


def made_text(row: Mapping[str, Any], shown: Callable[[str], str] = str) -> str:
    """What a new variant's row says against its original's (`row["baseline"]`): its size, its speed-up at
    batch 1 (or that the timings cannot tell), its score change on the same held-out examples, where it
    was saved (`shown` names the folder for the student) and what a pruned model cannot show."""
    base = row["baseline"] or {}
    parts = [f"{row['name']}: {row['disk_mb'] or row['memory_mb']:.1f} MB"]
    if base.get("latency_ms_b1") and row.get("latency_ms_b1"):
        noise = " (within the timings' spread: no clear difference)" if within_noise(row, base, 1) else ""
        parts.append(f"{base['latency_ms_b1'] / row['latency_ms_b1']:.2f}× the original's speed (batch 1){noise}")
    if row.get("score") is not None and base.get("score") is not None and comparable(row, base):
        parts.append(f"{row['metric']} {row['score']:.3f} ({(row['score'] - base['score']) * 100:+.1f} points, "
                     f"both on the same {row['eval_examples']:,} held-out examples)")
    saved = f"; saved in {shown(row['folder'])}" if row.get("folder") else ""
    text = ", ".join(parts) + saved + ". It joins the model list."
    if row.get("why"):
        text += " " + row["why"]
    if row["method"] == "pruned":
        text += (" Its layers now have different numbers of heads: the Attention and Ablation tabs, which draw "
                 "every layer's heads side by side, need the full set and will say they cannot show it.")
    return text
