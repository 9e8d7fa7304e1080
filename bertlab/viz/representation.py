"""Figures of the input representation (pure: a Representation in, a figure out)."""

from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from bertlab.analysis.representation import Representation
from bertlab.tokenizer import DEFAULT_SPECIALS, WORD_START_MARK, Tokenizer, join_wordpieces
from bertlab.viz.theme import (
    NEUTRAL,
    OKABE_ITO,
    Theme,
    current,
    finish,
    labelled_points,
    plot_area,
    point_text,
)

PART_COLORS: dict[str, str] = {  # colour-blind safe (bertlab.viz.theme.OKABE_ITO)
    "token": OKABE_ITO[0],
    "segment": OKABE_ITO[1],
    "position": OKABE_ITO[2],
    "sum": NEUTRAL,
    "normalised": OKABE_ITO[3],
}
PART_LABELS: dict[str, str] = {
    "token": "token embedding",
    "segment": "segment embedding",
    "position": "position embedding",
    "sum": "sum (before LayerNorm)",
    "normalised": "normalised sum (after LayerNorm)",
}
HELP = (
    "Each token's input vector is its <b>token</b> embedding (one per vocabulary piece) + its "
    "<b>segment</b> embedding (A or B) + its <b>position</b> embedding (0, 1, 2, …); LayerNorm then "
    "rescales the sum. {continuation} Click a legend entry to "
    "show or hide a part (the normalised sum starts hidden: it is much longer than the others). The map "
    "is one shared linear projection, so each sum point is its token + segment + position points added."
)
DECIMALS = 4
PROJECTION_SIZE = (720, 560)  # px on the normal page: the 2-D map of the parts
PROJECTION_MARGIN = dict(l=60, r=20, t=80, b=60)
BAR_PX = 8  # px on the normal page per bar of the norms chart (a 19-token pair's 5 parts fit a 1024 px window)
MIN_BAR_PX = 5  # px: a bar narrower than this is hard to hover; the chart scrolls instead
POINT_FONT = 10  # px on the normal page: a point's label


def _labels(rep: Representation) -> list[str]:
    """Unique category labels "i piece" (a sentence may repeat a piece)."""
    return [f"{i} {t}" for i, t in enumerate(rep.labels)]


def table_rows(rep: Representation) -> dict[str, list[str]]:
    """The rows of the input table, one entry per token: what `plot_input_table` shows."""
    return {
        "piece": list(rep.labels),
        "segment": ["A" if s == 0 else "B" for s in rep.segment_ids],
        "position": [str(p) for p in rep.position_ids],
        "word": ["–" if w is None else str(w) for w in rep.word_ids],
        "id": [str(i) for i in rep.ids],
    }


CHAR_PX = 9  # px per character of a 12 px cell, with room to spare
CELL_PAD_PX = 16


def table_column_px(rows: dict[str, list[str]]) -> list[int]:
    """The width in px of each column of the input table: the row names', then each token's, as wide as its
    longest cell (a long piece, a five-digit id) so that nothing overlaps or is cut."""
    names = max(len(name) for name in rows)
    tokens = len(next(iter(rows.values()), []))
    return [CHAR_PX * names + CELL_PAD_PX] + [
        max(45, CHAR_PX * max(len(cells[i]) for cells in rows.values()) + CELL_PAD_PX) for i in range(tokens)]


def plot_input_table(rep: Representation, style: Theme | None = None) -> go.Figure:
    """The BERT-paper picture as a table: one column per token; rows piece / segment / position /
    word / id; cells tinted by segment (blue = A, orange = B). As wide as its tokens: its box
    scrolls when the tab is narrower."""
    t = style or current()
    rows = table_rows(rep)
    fill = [t.segment_fill[min(s, 1)] for s in rep.segment_ids]
    columns = [[name for name in rows]] + [[rows[name][i] for name in rows] for i in range(len(rep.tokens))]
    widths = table_column_px(rows)
    fig = go.Figure(
        go.Table(
            header=dict(values=["", *[str(i) for i in range(len(rep.tokens))]], fill_color="#dddddd",
                        align="center", font=dict(size=11)),
            cells=dict(values=columns, fill_color=[["#f5f5f5"] * len(rows)] + [[f] * len(rows) for f in fill],
                       align="center", font=dict(size=12), height=26),
            columnwidth=widths,
        )
    )
    fig.update_layout(
        title=dict(text=f"What the model reads: {rep.tokenizer or 'its'} pieces, segments, positions",
                   font=dict(size=14)),
        width=20 + sum(widths),  # never squeezed: plotly shrinks every column of a narrower table (its box scrolls)
        height=230,
        margin=dict(l=10, r=10, t=40, b=10),
    )
    return finish(fig, t, wide=True)


def plot_part_norms(rep: Representation, parts: Sequence[str] | None = None, style: Theme | None = None,
                    hidden: Sequence[str] = ()) -> go.Figure:
    """Grouped bars: the L2 norm of each part for each token (x = tokens, one colour per part); the parts
    of `hidden` are in the legend, off until clicked. As wide as its tokens (at least the tab's width in
    projector mode): its box scrolls."""
    t = style or current()
    parts = list(parts or rep.norms)
    for p in parts:
        rep.part(p)  # a clear error for an unknown part
    x = _labels(rep)
    width = int(min(1400, max(600, 120 + BAR_PX * len(parts) * len(x))))
    fig = go.Figure(
        [
            go.Bar(
                name=PART_LABELS.get(p, p),
                x=x,
                y=np.round(rep.norms[p].numpy(), DECIMALS),
                marker_color=PART_COLORS.get(p),
                hovertemplate="%{x}<br>" + PART_LABELS.get(p, p) + ": norm %{y:.3f}<extra></extra>",
                **({"visible": "legendonly"} if p in hidden else {}),
            )
            for p in parts
        ]
    )
    fig.update_layout(
        barmode="group",
        title=dict(text="How long is each part? (L2 norm per token)", font=dict(size=14)),
        xaxis=dict(title="token", tickmode="array", tickvals=x, ticktext=list(rep.labels), tickangle=-45),
        yaxis=dict(title="norm", rangemode="tozero"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        width=width,
        height=430,
        margin=dict(l=60, r=20, t=80, b=90),
        plot_bgcolor="white",
    )
    # a figure as wide as the tab while its bars keep MIN_BAR_PX; wider than that, its box scrolls
    return finish(fig, t, wide=120 * t.scale + MIN_BAR_PX * len(parts) * len(x) > t.page_width)


def plot_part_projection(rep: Representation, style: Theme | None = None) -> go.Figure:
    """Scatter of the projected parts in their shared 2-D basis, one colour per part. The points
    farthest from the origin (the longest vectors; the theme's `labelled_points` per part) carry their
    token on the picture where it does not cover another label; hovering shows every point's. The
    basis is not centred, so sum = token + segment + position holds in the picture too."""
    t = style or current()
    parts = list(rep.projected_parts)
    xy_all = np.round(rep.projection[: len(parts)].numpy(), DECIMALS).reshape(-1, 2)  # [part * seq, 2]
    n = len(rep.labels)
    keep = labelled_points(xy_all, t.labelled_points * len(parts), centre=(0.0, 0.0),
                           labels=list(rep.labels) * len(parts), font_px=t.px(POINT_FONT),
                           plot_px=plot_area(*PROJECTION_SIZE, PROJECTION_MARGIN, t))
    traces = []
    for i, p in enumerate(parts):
        xy = xy_all[i * n:(i + 1) * n]  # [seq, 2]
        traces.append(
            go.Scatter(
                name=PART_LABELS.get(p, p),
                x=xy[:, 0],
                y=xy[:, 1],
                mode="markers+text",
                text=point_text(rep.labels, [j - i * n for j in keep if i * n <= j < (i + 1) * n]),
                customdata=[[j, tok] for j, tok in enumerate(rep.labels)],
                textposition="top center",
                textfont=dict(size=POINT_FONT, color=PART_COLORS.get(p)),
                marker=dict(size=8, color=PART_COLORS.get(p)),
                hovertemplate=("%{customdata[0]} <b>%{customdata[1]}</b><br>(%{x:.2f}, %{y:.2f})<extra>"
                               + p + "</extra>"),
            )
        )
    e = rep.explained.tolist()
    fig = go.Figure(traces)
    fig.update_layout(
        title=dict(text="The parts in 2-D (shared projection)", font=dict(size=14)),
        xaxis=dict(title=f"direction 1 ({100 * e[0]:.0f}% of squared norm)", zeroline=True, zerolinecolor="#ccc"),
        yaxis=dict(title=f"direction 2 ({100 * e[1]:.0f}%)", zeroline=True, zerolinecolor="#ccc",
                   scaleanchor="x"),  # equal units: distances in the picture are distances in the map
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        width=PROJECTION_SIZE[0],
        height=PROJECTION_SIZE[1],
        plot_bgcolor="white",
        margin=PROJECTION_MARGIN,
    )
    return finish(fig, t)


def help_text(tok: Tokenizer, kind: str = "") -> str:
    """HELP with the tokenizer's kind (`kind`, as the family names it) and how its pieces are marked:
    WordPiece marks a piece that continues a word ("##"); byte-level BPE and SentencePiece mark a piece
    that starts one (stored as "Ġ" / "▁", drawn as WORD_START_MARK)."""
    prefix = tok.continuing_prefix
    if prefix:
        how = f"“{html.escape(prefix)}” marks a piece that continues the word before it."
    else:
        how = (f"“{WORD_START_MARK}” marks a piece that starts a word (a space before it; the tokenizer stores "
               "the mark as Ġ or ▁); a piece without it continues the word before it, except at the start of "
               "the text, where the table's word row says which word each piece belongs to.")
    named = f"This model's tokenizer is {html.escape(kind)}. " if kind else ""
    return HELP.format(continuation=named + how)


def split_words(rep: Representation, tok: Tokenizer | None = None) -> list[str]:
    """Words cut into several pieces, as "word → piece piece …" (e.g. "clueless → clue ##less",
    "clueless → ␣clue less"): pieces as drawn; `tok` joins the stored pieces (default: WordPiece's rule)."""
    join = tok.join_pieces if tok is not None else join_wordpieces
    groups: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for piece, shown, segment, word in zip(rep.tokens, rep.labels, rep.segment_ids, rep.word_ids):
        if word is not None:
            groups.setdefault((segment, word), []).append((piece, shown))
    return [
        join([p for p, _ in pieces]) + " → " + " ".join(s for _, s in pieces)
        for pieces in groups.values() if len(pieces) > 1
    ]


def input_notes(rep: Representation, max_shown: int, pair_asked: bool = False,
                tok: Tokenizer | None = None, segments: str | None = None,
                positions: str | None = None, unknown: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """What the student should know about this input, beyond the pictures (special tokens as `tok`
    spells them; default: WordPiece's). `segments`, `positions`: what the model lacks there
    (`lacks(model, "segment_embeddings")`, `lacks(model, "position_embeddings")`), None when it has those embeddings;
    `unknown`: the panel's note on pieces outside the vocabulary (bertlab.panels.base.unknown_notes)."""
    specials = tok.special_tokens if tok is not None else DEFAULT_SPECIALS
    n = len(rep.tokens)
    pair = "two sentences: A is segment 0 (blue), B is segment 1 (orange)" if rep.text_b else "one sentence"
    if rep.text_b and segments:
        pair = "two sentences"
    out: list[tuple[str, str]] = [("info", f"{n} tokens, {pair}.")]
    if segments and (rep.text_b or pair_asked):
        out.append(("info", segments))
    if positions:
        out.append(("info", positions))
    split = split_words(rep, tok)
    if split:
        shown = "; ".join(split[:6]) + ("; …" if len(split) > 6 else "")
        kind = f"{rep.tokenizer} " if rep.tokenizer else ""
        out.append(("info", f"{len(split)} word(s) became several {kind}pieces: {shown}."))
    if pair_asked and rep.text_b is None:
        out.append(("info", "Sentence B is blank, so only sentence A is read (all segment 0)."))
    if specials["mask"] in rep.tokens:
        out.append(("info", f"{specials['mask']} is an ordinary vocabulary piece here, with its own token embedding."))
    out += unknown
    if rep.warning:
        out.append(("warning", rep.warning))
    if n > max_shown:
        out.append(("warning", f"The pictures show the first {max_shown} of the {n} tokens."))
    return out
