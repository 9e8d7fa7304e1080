"""Pre-training objectives side by side: each run's own loss, its MLM accuracy and the probe sentence's
P(target) against the step, one colour per run, on one figure; and a table of their SST-2 scores."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.training.objectives import OBJECTIVES
from bertlab.viz.mask import empty_figure
from bertlab.viz.theme import OKABE_ITO, Theme, current, finish, share_tickformat

DECIMALS = 6  # probe probabilities are small early on
PANELS = (("own_loss", "the objective's own loss (log)"), ("mlm_acc", "MLM accuracy (training batches)"),
          ("probe_p", "probe: P(target word)"))


def _xy(points: Sequence[Mapping[str, float | None]], key: str) -> tuple[list[int], list[float]]:
    kept = [p for p in points if p.get(key) is not None]
    return [int(p["step"]) for p in kept], [round(float(p[key]), DECIMALS) for p in kept]


def run_label(name: str, objective: str | None = None) -> str:
    """"electra (replaced-token loss)": a run's legend entry."""
    found = OBJECTIVES.get(objective or name)
    own = found.loss_name if found is not None else None
    return f"{name} ({own} loss)" if own else name


def plot_objective_curves(runs: Mapping[str, Sequence[Mapping[str, float | None]]], title: str = "",
                          objectives: Mapping[str, str] | None = None, style: Theme | None = None) -> go.Figure:
    """`runs`: run name -> points (dicts with "step" and any of "own_loss", "mlm_acc", "probe_p").
    `objectives`: run name -> objective name (for the legend; default: the run name). ELECTRA's MLM
    accuracy is its small generator's."""
    t = style or current()
    if not any(_xy(points, key)[0] for points in runs.values() for key, _ in PANELS):
        return empty_figure("Pre-train with two or more objectives to compare them here.", t)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[name for _, name in PANELS], horizontal_spacing=0.08)
    for i, (name, points) in enumerate(runs.items()):
        color = OKABE_ITO[i % len(OKABE_ITO)]
        label = run_label(name, (objectives or {}).get(name))
        for col, (key, _) in enumerate(PANELS, start=1):
            x, y = _xy(points, key)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line={"color": color}, name=label, legendgroup=name,
                                     showlegend=col == 1,
                                     hovertemplate=f"{html.escape(name)} step %{{x}}: %{{y:.4g}}<extra></extra>"),
                          row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    for col, (key, _) in enumerate(PANELS[1:], start=2):
        values = [v for points in runs.values() for v in _xy(points, key)[1]]
        fig.update_yaxes(rangemode="tozero", tickformat=share_tickformat(values), row=1, col=col)
    fig.update_xaxes(title_text="step", rangemode="tozero")
    fig.update_layout(
        title={"text": title or "Pre-train with two or more objectives to compare them here", "font": {"size": 14}},
        height=380, width=980, plot_bgcolor="white", margin={"l": 50, "r": 20, "t": 70, "b": 50},
        legend={"orientation": "h", "y": -0.25},
    )
    return finish(fig, t)


def scores_html(rows: Sequence[Mapping[str, object]]) -> str:
    """A small table: run, objective, steps, SST-2 accuracy fine-tuned and of the linear probe on frozen
    features (or what is pending)."""
    if not rows:
        return ""
    cells = "".join(
        f"<tr><td>{html.escape(str(r['run']))}</td><td>{html.escape(str(r.get('objective', '')))}</td>"
        f"<td style='text-align:right'>{r.get('steps', '')}</td>"
        f"<td style='text-align:right'>{_acc(r.get('accuracy'))}</td>"
        f"<td style='text-align:right'>{_acc(r.get('probe'))}</td></tr>" for r in rows)
    return ("<table style='border-collapse:collapse'><tr><th>run</th><th>objective</th><th>steps</th>"
            "<th>SST-2 accuracy, fine-tuned</th><th>SST-2 accuracy, linear probe (frozen)</th></tr>"
            f"{cells}</table>")


def _acc(value: object) -> str:
    return f"{100 * float(value):.1f} %" if isinstance(value, (int, float)) else html.escape(str(value or "–"))
