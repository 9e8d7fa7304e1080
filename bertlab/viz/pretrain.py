"""The pre-training tab's pure parts: one example as BERT sees it, sentence pairs, training curves.

- `mask_example` masks one text exactly as the training collator does (`masking.mask_tokens`, same
  never-masked and never-drawn ids), and `masked_example_html` shows it as three rows: the original
  pieces, what the model reads (the 80/10/10 cases coloured) and the labels it must predict;
- `strategies_html` lines up the same text under each strategy, `dynamic_html` the re-draws of
  RoBERTa's dynamic masking;
- `example_pairs` / `pairs_html`: NSP and SOP pairs made by `pairs.build_pairs`, with their labels;
- `plot_pretrain_curves`: MLM loss, MLM accuracy and NSP accuracy against the step.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.mask import Candidate
from bertlab.tokenizer import DEFAULT_SPECIALS, Tokenizer
from bertlab.training.masking import MaskKind
from bertlab.training.pairs import PairExample
from bertlab.training.preview import MaskedExample, PairDemo
from bertlab.viz.theme import MUTED, OKABE_ITO, Theme, current, finish

KIND_COLORS: dict[MaskKind, str] = {
    MaskKind.MASK: "#cfe2ff",  # blue: replaced by [MASK]
    MaskKind.RANDOM: "#ffd6a5",  # orange: replaced by a random token
    MaskKind.KEPT: "#c7f0c2",  # green: kept, but still predicted
}
KIND_NAMES: dict[MaskKind, str] = {
    MaskKind.NOT_CHOSEN: "none", MaskKind.MASK: "mask", MaskKind.RANDOM: "random", MaskKind.KEPT: "kept",
}
KIND_LEGEND: dict[MaskKind, str] = {
    MaskKind.MASK: "→ {mask} (80%)", MaskKind.RANDOM: "→ random token (10%)", MaskKind.KEPT: "kept as is (10%)",
}
STRATEGY_NAMES = {"token": "token (BERT)", "whole_word": "whole word", "span": "span (SpanBERT)",
                  "entity": "entity (ERNIE)", "phrase": "noun phrase"}
# what one masked unit of each strategy is (entity / phrase: a whole mention, or a word that fills the budget)
UNIT_NAMES = {"token": "token", "whole_word": "word", "span": "span", "entity": "entity or word",
              "phrase": "phrase or word"}
SEGMENT_COLORS = ("#eef4fa", "#fdf0e6")  # sentence A, sentence B
CURVES = (("mlm_loss", "MLM loss"), ("mlm_acc", "MLM accuracy"), ("nsp_acc", "NSP / SOP accuracy"))
NEXT_TOKEN_TITLES = ("next-token loss", "next-token accuracy")  # the first two curves of a next-token run
CURVE_COLORS = (OKABE_ITO[0], OKABE_ITO[2], OKABE_ITO[1])  # colour-blind safe (bertlab.viz.theme)
DECIMALS = 4


# ---------------------------------------------------------------------------------------------
# One example, masked
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# ... as HTML
# ---------------------------------------------------------------------------------------------
_CELL = "padding:1px 4px;border-radius:3px;font-family:monospace;font-size:0.92em;white-space:pre;min-height:1.3em"


def _cell(text: str | None, kind: MaskKind = MaskKind.NOT_CHOSEN, title: str = "") -> str:
    color = KIND_COLORS.get(kind, "transparent")
    shown = "·" if text is None else html.escape(text)
    faint = "color:#bbb;" if text is None else ""
    tip = f' title="{html.escape(title, quote=True)}"' if title else ""
    return f'<div style="{_CELL};{faint}background:{color}"{tip}>{shown}</div>'


def _tip(ex: MaskedExample, i: int) -> str:
    kind = ex.kinds[i]
    if kind == MaskKind.NOT_CHOSEN:
        return "not chosen: nothing to predict here"
    unit = UNIT_NAMES[ex.strategy]
    return f"{ex.tokens[i]!r} {KIND_LEGEND[kind].format(mask=ex.mask_token)}; {unit} {ex.units[i] + 1}"


def legend_html(ex: MaskedExample) -> str:
    """The three colours with how many positions got each."""
    items = [
        f'<span style="background:{KIND_COLORS[k]};padding:1px 6px;border-radius:3px;margin-right:8px">'
        f'{html.escape(KIND_LEGEND[k].format(mask=ex.mask_token))}: '
        f'<b data-count="{KIND_NAMES[k]}">{ex.count(k)}</b></span>'
        for k in (MaskKind.MASK, MaskKind.RANDOM, MaskKind.KEPT)
    ]
    eligible = ex.num_eligible
    return (f'<div style="margin:4px 0">{"".join(items)}<span style="{MUTED}">{ex.num_chosen} of {eligible} '
            f'tokens chosen ({100 * ex.rate:.0f}% rate)</span></div>')


def masked_example_html(ex: MaskedExample) -> str:
    """Three aligned rows: original pieces, what the model reads (coloured by case), the labels.

    Each token column carries ``data-kind`` (none / mask / random / kept) for tests and styling."""
    columns = []
    for i, (orig, seen, label, kind) in enumerate(zip(ex.tokens, ex.masked, ex.labels, ex.kinds)):
        tip = _tip(ex, i)
        columns.append(
            f'<div class="bl-tok" data-kind="{KIND_NAMES[kind]}" style="display:inline-flex;flex-direction:column;'
            f'margin:0 1px 6px 0">{_cell(orig, title=tip)}{_cell(seen, kind, tip)}{_cell(label, kind, tip)}</div>'
        )
    heads = "".join(_cell(h) for h in ("original", "model reads", "labels"))
    head = (f'<div style="display:inline-flex;flex-direction:column;margin-right:6px;{MUTED};'
            f'font-weight:600">{heads}</div>')
    return (f'<div class="bl-masked">{legend_html(ex)}<div style="display:flex;flex-wrap:wrap;align-items:flex-start">'
            f'{head}{"".join(columns)}</div></div>')


def _masked_line(ex: MaskedExample) -> str:
    return "".join(
        f'<span class="bl-tok" data-kind="{KIND_NAMES[k]}" title="{html.escape(_tip(ex, i), quote=True)}" '
        f'style="{_CELL};display:inline-block;margin:1px;background:{KIND_COLORS.get(k, "transparent")}">'
        f'{html.escape(seen)}</span>'
        for i, (seen, k) in enumerate(zip(ex.shown or ex.masked, ex.kinds))
    )


def _summary(ex: MaskedExample) -> str:
    units = len({u for u in ex.units if u >= 0})
    unit = UNIT_NAMES[ex.strategy]
    if units != 1:
        unit = {"entity": "entities or words", "phrase": "phrases or words"}.get(ex.strategy, unit + "s")
    return f"{ex.num_chosen} tokens in {units} {unit}"


def strategies_html(examples: Mapping[str, MaskedExample], untagged: Mapping[str, str] | None = None) -> str:
    """One row per strategy: the text as the model reads it, and how many tokens / units were chosen;
    `untagged`: strategy -> why it cannot mask this text (a row with that note instead)."""
    missing = "".join(
        f'<tr class="bl-strategy" data-strategy="{html.escape(name)}"><td style="padding:3px 8px;font-weight:600;'
        f'white-space:nowrap;vertical-align:top">{html.escape(STRATEGY_NAMES.get(name, name))}</td>'
        f'<td style="padding:3px 0;color:#666">{html.escape(why)}</td></tr>'
        for name, why in (untagged or {}).items()
    )
    rows = "".join(
        f'<tr class="bl-strategy" data-strategy="{html.escape(name)}"><td style="padding:3px 8px;font-weight:600;'
        f'white-space:nowrap;vertical-align:top">{html.escape(STRATEGY_NAMES.get(name, name))}<br>'
        f'<span style="font-weight:400;color:#666;font-size:0.85em">{_summary(ex)}</span></td>'
        f'<td style="padding:3px 0">{_masked_line(ex)}</td></tr>'
        for name, ex in examples.items()
    )
    return f'<table class="bl-strategies" style="border-collapse:collapse">{rows}{missing}</table>'


def dynamic_html(draws: Sequence[MaskedExample]) -> str:
    """One row per epoch: dynamic masking draws a new mask each time the text comes round."""
    rows = "".join(
        f'<tr class="bl-epoch"><td style="padding:3px 8px;font-weight:600;white-space:nowrap">epoch {e + 1}</td>'
        f'<td style="padding:3px 0">{_masked_line(ex)}</td></tr>'
        for e, ex in enumerate(draws)
    )
    return f'<table class="bl-dynamic" style="border-collapse:collapse">{rows}</table>'


# ---------------------------------------------------------------------------------------------
# Sentence pairs
# ---------------------------------------------------------------------------------------------
def pair_label_text(pair: PairExample, titles: Sequence[str] = ()) -> str:
    """What the label says, in words."""
    def title(i: int) -> str:
        return f"'{titles[i]}'" if i < len(titles) else f"document {i}"

    if pair.task == "nsp":
        if pair.label == 0:
            return f"label 0 = IsNext: B really follows A (both from {title(pair.doc_index)})"
        return (f"label 1 = NotNext: A is from {title(pair.doc_index)}, B is a random stretch of "
                f"{title(pair.b_doc_index)}")
    if pair.label == 0:
        return f"label 0 = in order: A then B, as in {title(pair.doc_index)}"
    return f"label 1 = swapped: B came before A in {title(pair.doc_index)}"


def pair_html(pair: PairExample, tok: Tokenizer, titles: Sequence[str] = ()) -> str:
    """[CLS] A [SEP] B [SEP] with the segments coloured, and the label in words."""
    tokens = tok.convert_ids_to_tokens(pair.input_ids)
    pieces = "".join(
        f'<span style="{_CELL};display:inline-block;margin:1px;background:{SEGMENT_COLORS[t]}" '
        f'title="segment {"AB"[t]}">{html.escape(token)}</span>'
        for token, t in zip(tokens, pair.token_type_ids)
    )
    color = "#2ca02c" if pair.label == 0 else "#d62728"
    label = (f'<div style="margin:2px 0 8px 0"><b style="color:{color}">{html.escape(pair.task.upper())} '
             f'{html.escape(pair_label_text(pair, titles))}</b> · {pair.num_a} + {pair.num_b} tokens</div>')
    return f'<div class="bl-pair" data-task="{pair.task}" data-label="{pair.label}">{pieces}{label}</div>'


def pairs_html(demo: PairDemo, tok: Tokenizer) -> str:
    """Every pair of the demo, NSP first; segment A is blue, B orange."""
    legend = (f'<div style="margin:4px 0;{MUTED}"><span style="background:{SEGMENT_COLORS[0]};padding:1px 6px">'
              f'segment A (type id 0)</span> <span style="background:{SEGMENT_COLORS[1]};padding:1px 6px">segment B '
              f'(type id 1)</span> · a pair too long for its length is trimmed one token at a time from either end, '
              f'so it may start or end inside a word</div>')
    return legend + "".join(pair_html(p, tok, demo.titles) for p in [*demo.nsp, *demo.sop])


# ---------------------------------------------------------------------------------------------
# Training: curves, progress, probe
# ---------------------------------------------------------------------------------------------
def curve_xy(points: Sequence[Mapping[str, float | None]], key: str) -> tuple[list[int], list[float]]:
    """Steps and rounded values of `key` in the points that have it."""
    kept = [p for p in points if p.get(key) is not None]
    return [int(p["step"]) for p in kept], [round(float(p[key]), DECIMALS) for p in kept]


def plot_pretrain_curves(points: Sequence[Mapping[str, float | None]], title: str = "",
                         style: Theme | None = None, no_pair: str | None = None, next_token: bool = False) -> go.Figure:
    """MLM loss, MLM accuracy and NSP/SOP accuracy against the step, one subplot each.

    `points`: dicts with "step" and any of "mlm_loss", "mlm_acc", "nsp_acc" (None or absent = no value).
    `no_pair`: why the NSP/SOP subplot stays empty (the run has no pair task), written inside it.
    `next_token`: the run predicts the next token (causal, peek): the first two are its loss and accuracy.
    Always three traces, so a live figure only needs new x/y."""
    t = style or current()
    names = [*NEXT_TOKEN_TITLES, CURVES[2][1]] if next_token else [name for _, name in CURVES]
    fig = make_subplots(rows=1, cols=3, subplot_titles=names, horizontal_spacing=0.08)
    for col, (key, name, color) in enumerate(zip([k for k, _ in CURVES], names, CURVE_COLORS), start=1):
        x, y = curve_xy(points, key)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", marker={"size": 4}, line={"color": color},
                                 name=name, showlegend=False,
                                 hovertemplate=f"step %{{x}}: {name} %{{y:.4g}}<extra></extra>"), row=1, col=col)
    fig.add_hline(y=0.5, line={"dash": "dot", "color": "#999"}, annotation_text="chance", row=1, col=3)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=2)
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=3)
    if no_pair:
        lines = textwrap.wrap(no_pair, 26, break_on_hyphens=False)  # inside one third of the figure's width
        fig.add_annotation(text="<br>".join(html.escape(line) for line in lines), xref="x3 domain",
                           yref="y3 domain", x=0.5, y=0.8,
                           showarrow=False, font={"color": "#666"},
                           name="no pair task")
    fig.update_xaxes(title_text="step", rangemode="tozero")
    fig.update_layout(
        title={"text": title or "Press Start: the curves fill in as the model learns", "font": {"size": 14}},
        height=330, width=960, plot_bgcolor="white", margin={"l": 50, "r": 20, "t": 70, "b": 50},
    )
    return finish(fig, t)


def probe_html(probe: str, rows: Sequence[tuple[int, Sequence[Candidate]]], max_rows: int = 8,
               mask_token: str = DEFAULT_SPECIALS["mask"]) -> str:
    """The probe's top guesses at each step it was read, newest first (`mask_token`: the tokenizer's)."""
    if not rows:
        return ""
    body = "".join(
        f'<tr class="bl-probe-row" data-step="{step}"><td style="padding:2px 8px;{MUTED}">step {step}</td>'
        + "".join(f'<td style="padding:2px 8px;font-family:monospace">{html.escape(c.token)} '
                  f'<span style="color:#888">{100 * c.probability:.1f}%</span></td>' for c in cands)
        + "</tr>"
        for step, cands in list(rows)[::-1][:max_rows]
    )
    return (f'<div style="margin:4px 0"><b>{html.escape(probe)}</b>: the top guesses for the '
            f'{html.escape(mask_token)}</div>'
            f'<table class="bl-probe" style="border-collapse:collapse">{body}</table>')
