"""Figures of the Family tab (pure: results of `bertlab.analysis.family` in, figures or HTML out):
how each tokenizer cuts the sentence, each model's guesses for the same hidden word, where the
parameters sit, ELECTRA's generator + discriminator on the sentence, and what a member changed in
attention (ModernBERT's local band beside full attention, DeBERTa's score terms of one head)."""

from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.family import (
    TERM_TITLES,
    AttentionReach,
    Distillation,
    ElectraPicture,
    MaskedWord,
    ModelView,
    ParameterCount,
    ScoreTerms,
    TokenCut,
)
from bertlab.viz.pretrain import dynamic_html
from bertlab.viz.text import plain_text
from bertlab.viz.theme import HELP_STYLE, MUTED, NEUTRAL, OKABE_ITO, Theme, current, finish

WORD_FILL = ("#dbe9f6", "#c6dbef")  # one-piece words, alternating (light blues)
SPLIT_FILL = ("#fdd9b5", "#f9c08b")  # words cut into several pieces, alternating (light oranges)
SPECIAL_FILL = "#e6e6e6"
CHAR_PX = 7.5  # px per character of a chip's label at the base font
PART_COLORS = {
    "word embeddings": OKABE_ITO[0], "position + segment embeddings": OKABE_ITO[5],
    "embedding projection": OKABE_ITO[3], "norms outside the layers": "#999999",
    "relative-position embeddings": OKABE_ITO[6], "convolution beside the first layer": OKABE_ITO[7],
    "encoder layers": OKABE_ITO[2], "pooler": OKABE_ITO[4],
    "pre-training heads": OKABE_ITO[1], "task head": NEUTRAL,
}
BAR, TRUE_BAR = OKABE_ITO[5], OKABE_ITO[2]
REPLACED, ORIGINAL = OKABE_ITO[1], NEUTRAL


def _short(text: str, n: int = 18) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _name(name: str, n: int = 28) -> str:
    """A model's name for a label: a folder by its last part ("…/roberta"), cut to `n` characters."""
    parts = [p for p in name.replace("\\", "/").split("/") if p]
    if name.startswith(("/", ".", "~")) and parts:
        name = "…/" + parts[-1]
    return _short(name, n)


# -- tokenizers --------------------------------------------------------------------------------------
def chip_layout(cut: TokenCut) -> tuple[list[float], list[float]]:
    """(start, width) of each piece's chip along a row, in base-font px: pieces of one word touch,
    words stand apart."""
    starts, widths, x = [], [], 0.0
    for i, p in enumerate(cut.pieces):
        if i and (p.starts_word or p.special or cut.pieces[i - 1].special):
            x += 10  # a gap between words
        w = 14 + CHAR_PX * len(_short(p.label))
        starts.append(x)
        widths.append(w)
        x += w + 1
    return starts, widths


def plot_token_cuts(rows: Sequence[tuple[str, TokenCut]], style: Theme | None = None) -> go.Figure:
    """One row of chips per model: its tokenizer's pieces of the sentence, in order. Pieces of one word
    touch and share a colour (orange when the word is cut into several pieces); special tokens grey."""
    t = style or current()
    fig = go.Figure()
    names = [f"<b>{plain_text(_name(name))}</b><br>{cut.kind_name} · {cut.num_tokens} tokens"
             for name, cut in rows]
    longest = 0.0
    for (name, cut), label in zip(rows, names):
        starts, widths = chip_layout(cut)
        longest = max(longest, (starts[-1] + widths[-1]) if starts else 0)
        counts: dict[int, int] = {}
        for p in cut.pieces:
            if p.word is not None:
                counts[p.word] = counts.get(p.word, 0) + 1
        fills = [SPECIAL_FILL if p.special else (SPLIT_FILL if counts.get(p.word, 1) > 1 else WORD_FILL)[p.word % 2]
                 for p in cut.pieces]
        hover = [f"<b>{plain_text(p.token)}</b>" + ("" if p.special else f"<br>covers {plain_text(repr(p.text))}"
                 + f"<br>word {p.word}" + (" · starts it" if p.starts_word else " · continues it"))
                 for p in cut.pieces]
        fig.add_trace(go.Bar(
            y=[label] * len(cut.pieces), x=widths, base=starts, orientation="h", width=0.62,
            marker=dict(color=fills, line=dict(color="#555", width=0.6)),
            text=[plain_text(_short(p.label)) for p in cut.pieces], textposition="inside",
            insidetextanchor="middle", textfont=dict(size=12, color="#111"), constraintext="none",
            customdata=hover, hovertemplate="%{customdata}<extra></extra>", name=name, showlegend=False,
        ))
    width = int(min(2400, max(560, longest + 230)))
    fig.update_layout(
        title=dict(text="How each tokenizer cuts the sentence (orange: a word cut into pieces)", font=dict(size=14)),
        height=90 + 62 * len(rows), width=width, barmode="overlay", plot_bgcolor="white",
        xaxis=dict(visible=False, range=[-4, longest + 4]),
        yaxis=dict(autorange="reversed", type="category", tickfont=dict(size=12)),
        margin=dict(l=200, r=10, t=50, b=10), uniformtext=dict(minsize=8, mode="show"),
    )
    return finish(fig, t, wide=True, markup=True)


# -- the masked word ---------------------------------------------------------------------------------
def masked_title(name: str, mw: MaskedWord) -> str:
    n = len(mw.pieces)
    pieces = " ".join(mw.labels)
    return (f"<b>{plain_text(_name(name, 24))}</b><br>'{plain_text(mw.word)}' = {n} piece{'s' if n != 1 else ''}: "
            f"{plain_text(_short(pieces, 30))}")


def plot_masked_words(rows: Sequence[tuple[str, MaskedWord | None, str]], style: Theme | None = None) -> go.Figure:
    """Side by side, each model's top-k for the first hidden piece of the same word (green: the piece
    really there). rows: (model name, its result or None, the note shown instead when None)."""
    t = style or current()
    n = max(len(rows), 1)
    titles = [masked_title(name, mw) if mw is not None else f"<b>{plain_text(_name(name, 24))}</b>"
              for name, mw, _ in rows]
    fig = make_subplots(rows=1, cols=n, subplot_titles=titles, horizontal_spacing=min(0.12, 0.4 / n))
    notes = []
    for col, (name, mw, note) in enumerate(rows, start=1):
        if mw is None:
            fig.add_trace(go.Bar(x=[], y=[], orientation="h", showlegend=False, name=name), row=1, col=col)
            fig.update_xaxes(visible=False, row=1, col=col)
            fig.update_yaxes(visible=False, row=1, col=col)
            axis = "" if col == 1 else str(col)
            notes.append(dict(text=plain_text(_short(note, 40)), showarrow=False, xref=f"x{axis} domain",
                              yref=f"y{axis} domain", x=0.5, y=0.5, font=dict(size=12, color="#555")))
            continue
        pred = mw.first
        labels = mw.guess_labels[0]
        y = [f"{plain_text(_short(lab, 14))}" + "\u200b" * i for i, lab in enumerate(labels)]  # unique rows
        fig.add_trace(go.Bar(
            x=[round(c.probability, 5) for c in pred.candidates], y=y, orientation="h",
            marker_color=[TRUE_BAR if c.token_id == pred.original_id else BAR for c in pred.candidates],
            text=[f"{100 * c.probability:.1f}%" for c in pred.candidates], textposition="auto",
            customdata=[plain_text(c.token) for c in pred.candidates],
            hovertemplate="<b>%{customdata}</b><br>probability %{x:.4g}<extra></extra>", name=name, showlegend=False,
        ), row=1, col=col)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=col)
        fig.update_xaxes(rangemode="tozero", tickformat=".1%", nticks=4, row=1, col=col)
    fig.update_layout(
        title=dict(text="The same hidden word, each model's top guesses (green: the piece really there)",
                   font=dict(size=14)),
        height=340, width=max(560, 270 * n), plot_bgcolor="white", margin=dict(l=90, r=20, t=110, b=40),
        annotations=list(fig.layout.annotations) + notes,
    )
    for a in fig.layout.annotations[: len(rows)]:
        a.font = dict(size=12)
    return finish(fig, t, markup=True)


# -- parameters --------------------------------------------------------------------------------------
def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{int(n)}"


def depth_text(pc: ParameterCount) -> str:
    """"12 layers" / "12 layers, 1 stored (shared)", and "embeddings 128 → 768" when factorised."""
    text = f"{pc.layers} layers"
    if pc.shared:
        text += f", {pc.stored_layers} stored (shared)"
    if pc.factorised:
        text += f" · embeddings {pc.embedding_size} → {pc.hidden_size}"
    return text


def plot_parameters(rows: Sequence[tuple[str, ParameterCount]], style: Theme | None = None) -> go.Figure:
    """Stacked bars, one per model: its parameters by where they sit (embeddings, the factorised
    embeddings' projection, the encoder's layers, heads). A shared encoder's layers count once; a faint
    bar behind shows what separate layers and full-width embeddings would hold."""
    t = style or current()
    names = [f"<b>{plain_text(_name(name))}</b><br>{depth_text(pc)}" for name, pc in rows]
    fig = go.Figure()
    ghost = [pc.total - pc.parts["encoder layers"] - pc.parts["word embeddings"] - pc.parts["embedding projection"]
             + pc.unshared_encoder + max(pc.unfactorised_embeddings, pc.parts["word embeddings"]) for _, pc in rows]
    shapes = [dict(type="rect", xref="x", yref="y", x0=0, x1=g, y0=i - 0.4, y1=i + 0.4, layer="below",
                   line=dict(color=NEUTRAL, width=1.5, dash="dot"), fillcolor="rgba(0,0,0,0)")
              for i, (g, (_, pc)) in enumerate(zip(ghost, rows)) if g > pc.total * 1.001]
    for part, color in PART_COLORS.items():
        x = [pc.parts[part] for _, pc in rows]
        if not any(x):
            continue
        fig.add_trace(go.Bar(
            y=names, x=x, orientation="h", name=part, marker_color=color, width=0.55,
            hovertemplate=f"{part}: %{{x:,}} parameters<extra></extra>",
        ))
    fig.update_layout(
        barmode="stack", title=dict(text="Parameters and where they sit", font=dict(size=14)),
        height=190 + 70 * len(rows), width=860, plot_bgcolor="white",
        xaxis=dict(title=dict(text="parameters" + ("<br>dotted: with a layer per depth and full-width embeddings"
                                                   if shapes else "")), tickformat="~s", gridcolor="#eee",
                   range=[0, 1.45 * max([1, *ghost, *(pc.total for _, pc in rows)])]),
        yaxis=dict(autorange="reversed", type="category"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), margin=dict(l=230, r=70, t=110, b=80),
        shapes=shapes,
        annotations=[dict(x=max(pc.total, g), y=label, text=f" {_count(pc.total)}"
                          + (f" (dotted: {_count(g)} unshared)" if g > pc.total * 1.001 else ""),
                          showarrow=False, xanchor="left", font=dict(size=12))
                     for label, g, (_, pc) in zip(names, ghost, rows)],
    )
    return finish(fig, t, markup=True)


# -- ELECTRA ------------------------------------------------------------------------------------------
def plot_electra(pic: ElectraPicture, style: Theme | None = None) -> go.Figure:
    """ELECTRA on the sentence: the pieces the discriminator read (the generator's samples in place of the
    masked ones), a bar of its P(replaced) for each; vermilion where the piece really was replaced. Above
    each masked piece's label: the piece it replaced ("was ...")."""
    t = style or current()
    idx = [i for i, s in enumerate(pic.special) if not s]
    x = [f"{i}. {plain_text(_short(pic.corrupted[i], 12))}"
         + (f"<br><i>was {plain_text(_short(pic.tokens[i], 10))}</i>" if pic.masked[i] else "") for i in idx]
    p = [round(pic.p_replaced[i], 4) for i in idx]
    colors = [REPLACED if pic.replaced[i] else ORIGINAL for i in idx]
    hover = [(f"{plain_text(pic.tokens[i])} → {plain_text(pic.sampled[i] or '')} "
              f"(generator's P {pic.sample_probability[i]:.2f})" if pic.masked[i] else plain_text(pic.tokens[i]))
             + (" · replaced" if pic.replaced[i] else " · original") for i in idx]
    fig = go.Figure(go.Bar(
        x=x, y=p, marker=dict(color=colors, line=dict(color=["#111" if pic.masked[i] else "rgba(0,0,0,0)"
                                                             for i in idx], width=1.5)),
        text=[f"{100 * v:.0f}%" for v in p], textposition="outside", customdata=hover,
        hovertemplate="%{customdata}<br>P(replaced) %{y:.3f}<extra></extra>", showlegend=False,
    ))
    real = sum(pic.replaced[i] for i in idx)
    fig.update_layout(
        title=dict(text=f"ELECTRA: the generator replaced {real} of {sum(pic.masked)} masked pieces; the "
                        f"discriminator flags {len(pic.flagged)} (P > 50%), right on "
                        f"{100 * pic.accuracy:.0f}% of pieces",
                   font=dict(size=14)),
        yaxis=dict(range=[0, 1.12], tickformat=".0%", title=dict(text="P(replaced)")),
        xaxis=dict(type="category", tickangle=-45 if len(x) > 10 else 0),
        height=380, width=max(560, 48 * len(x) + 140), plot_bgcolor="white",
        margin=dict(l=60, r=20, t=60, b=110),
        shapes=[dict(type="line", x0=0, x1=1, xref="paper", y0=0.5, y1=0.5, line=dict(dash="dot", width=1))],
    )
    return finish(fig, t, wide=True, markup=True)


# -- objectives ---------------------------------------------------------------------------------------
def objective_html(view: ModelView, extra: str = "") -> str:
    """A card: the model's family, its pre-training objective, and that objective on the sentence."""
    o = view.objective
    lines = [f'<div style="font-weight:600">{plain_text(_name(view.name, 60))}</div>',
             f'<div style="{MUTED};font-size:0.9em">{plain_text(view.family)} · '
             f'<b>{plain_text(o.name)}</b></div>' if o else "",
             f'<div style="font-size:0.9em;margin:2px 0 4px">{plain_text(o.about)}</div>' if o else ""]
    if view.positions:
        lines.append(f'<div style="font-size:0.9em;margin:0 0 4px">Positions: {plain_text(view.positions)}.</div>')
    if o is not None and o.changes:  # what the member changed in the architecture (its family module says)
        lines.append('<div style="font-size:0.9em;margin:0 0 4px">Architecture: '
                     + "; ".join(plain_text(c) for c in o.changes) + ".</div>")
    mw = view.masked
    if mw is not None:
        guess = " ".join(labels[0] for labels in mw.guess_labels)
        rank = f", the real piece ranks {mw.rank}" if mw.rank is not None else ""
        lines.append(f"<div>MLM: '{plain_text(mw.word)}' hidden as {len(mw.pieces)}× "
                     f"{plain_text(mw.mask_token)}: top guess <b>{plain_text(guess)}</b>{rank}.</div>")
    pair = view.pair
    if pair is not None:
        what = "A before B" if pair.task == "sop" else "B follows A"
        lines.append(
            f"<div>{pair.task.upper()} on the halves A = {plain_text(repr(_short(pair.a, 40)))}, "
            f"B = {plain_text(repr(_short(pair.b, 40)))}: P({what}) <b>{100 * pair.in_order:.0f}%</b> in order, "
            f"<b>{100 * pair.swapped:.0f}%</b> swapped"
            + (" (a trained SOP head says high, then low)." if pair.task == "sop" else
               " (NSP was trained on real next sentences against random ones, so it judges topic more than order).")
            + "</div>")
    return (f'<div class="bl-objective" style="flex:1 1 260px;min-width:240px;max-width:460px;border:1px solid '
            f'#ddd;border-radius:4px;padding:6px 10px;margin:4px;line-height:1.45">{"".join(lines)}{extra}</div>')


def distillation_html(d: Distillation, teacher: str) -> str:
    """DistilBERT's soft-target loss on the hidden word, against `teacher`, with both top guesses."""
    def guesses(top: Sequence[tuple[str, float]]) -> str:
        return ", ".join(f"{plain_text(t)} {100 * p:.0f}%" for t, p in top)

    return (f'<div style="margin-top:4px">Distillation on \'{plain_text(d.word)}\' against '
            f"{plain_text(_name(teacher, 40))} (the teacher): soft-target cross-entropy <b>{d.cross_entropy:.2f}</b> "
            f"nats, of which KL(teacher ‖ student) <b>{d.kl:.2f}</b> is what the student could still learn "
            f"(the rest, {d.teacher_entropy:.2f}, is the teacher's own uncertainty).<br>"
            f"teacher: {guesses(d.teacher_top)}<br>student: {guesses(d.student_top)}</div>")


def objectives_html(cards: Sequence[str]) -> str:
    return f'<div style="display:flex;flex-wrap:wrap;align-items:stretch">{"".join(cards)}</div>'


# -- what a member changed in attention -----------------------------------------------------------
def _matrix_axes(fig: go.Figure, labels: Sequence[str], panels: int) -> None:
    """Positions as coordinates (a piece may repeat), the pieces as tick labels, queries top to bottom."""
    n = len(labels)
    for i in range(1, panels + 1):
        axis = dict(tickmode="array", tickvals=list(range(n)), ticktext=list(labels), showgrid=False,
                    zeroline=False, tickfont=dict(size=10 if n <= 30 else 8))
        fig.update_xaxes(axis, tickangle=-60 if n > 8 else 0, title=dict(text="key"), row=1, col=i)
        fig.update_yaxes(axis, autorange="reversed", showticklabels=i == 1,
                         title=dict(text="query" if i == 1 else ""), row=1, col=i)


def plot_attention_reach(name: str, reach: AttentionReach, style: Theme | None = None) -> go.Figure:
    """Which keys each query may read: a global layer (every key) beside a local layer (a band of
    ±window tokens), with the model's layers listed by kind."""
    t = style or current()
    n = len(reach.labels)
    layers = {kind: ", ".join(str(i) for i, k in enumerate(reach.kinds) if k == kind) for kind in ("global", "local")}
    titles = ((f"global layers ({layers['global'] or 'none'}): every key to the left",
               f"local layers ({layers['local']}): itself and {reach.window} tokens back") if reach.causal else
              (f"global layers ({layers['global'] or 'none'}): every key",
               f"local layers ({layers['local']}): ±{reach.window} tokens"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.08)
    for col, allowed in ((1, reach.full), (2, reach.local)):
        fig.add_trace(go.Heatmap(
            z=allowed.to(int).tolist(), x=list(range(n)), y=list(range(n)), zmin=0, zmax=1, showscale=False,
            colorscale=[[0, "#f2f2f2"], [1, OKABE_ITO[0]]], xgap=1 if n <= 40 else 0, ygap=1 if n <= 40 else 0,
            hovertemplate="query %{y} → key %{x}: %{z}<extra></extra>"), row=1, col=col)
    _matrix_axes(fig, reach.labels, 2)
    fig.update_layout(title=dict(text=f"{plain_text(_name(name))}: which keys a query may read (blue)",
                                 font=dict(size=14)),
                      height=int(min(620, max(360, 180 + 14 * n))), width=860, plot_bgcolor="white",
                      margin=dict(l=90, r=30, t=90, b=90))
    return finish(fig, t)


def plot_score_terms(name: str, st: ScoreTerms, style: Theme | None = None) -> go.Figure:
    """One head's attention scores taken apart, side by side on one colour scale: content → content,
    content → position, position → content (their sum, plus the mask, goes into the softmax)."""
    t = style or current()
    terms = list(st.terms.items())
    n = len(st.labels)
    top = max([float(z.abs().max()) for _, z in terms] + [1e-6])
    fig = make_subplots(rows=1, cols=len(terms), subplot_titles=[TERM_TITLES[k] for k, _ in terms],
                        horizontal_spacing=0.05)
    for col, (key, z) in enumerate(terms, start=1):
        fig.add_trace(go.Heatmap(
            z=z.tolist(), x=list(range(n)), y=list(range(n)), zmin=-top, zmax=top, zmid=0, colorscale="RdBu_r",
            showscale=col == len(terms), colorbar=dict(title=dict(text="score"), thickness=12),
            hovertemplate=f"{TERM_TITLES[key]}: query %{{y}} → key %{{x}}: %{{z:.3f}}<extra></extra>"),
            row=1, col=col)
    _matrix_axes(fig, st.labels, len(terms))
    fig.update_layout(title=dict(text=f"{plain_text(_name(name))}: the score terms of layer {st.layer}, head {st.head}",
                                 font=dict(size=14)),
                      height=int(min(560, max(340, 160 + 12 * n))), width=900, plot_bgcolor="white",
                      margin=dict(l=90, r=30, t=90, b=90))
    return finish(fig, t)


def card_extra(view: ModelView, draws: Sequence | str | None = None,
               distilled: tuple[str, Distillation] | None = None) -> str:
    """What a model's objective card adds (HTML): RoBERTa's dynamic masks (`draws`: the sentence masked in
    three epochs, bertlab.training.preview.dynamic_draws, or why it could not be), DistilBERT's depth and its
    distillation loss (`distilled`: its teacher's name and the loss), a note for the others."""
    o = view.objective
    if o is None:
        return ""
    if o.demo == "dynamic":
        if isinstance(draws, str):
            return f'<div style="{MUTED}">{html.escape(draws)}</div>'
        return ('<div style="margin-top:4px">The same sentence in three epochs, each with a new mask:</div>'
                + dynamic_html(draws))
    if o.demo == "rtd":
        return ('<div style="margin-top:4px">'
                + ("The generator: a small MLM that proposes replacements." if o.role == "generator"
                   else "The discriminator: see its verdict per piece below.") + "</div>")
    if o.demo == "distil":
        depth = (f'<div style="margin-top:4px">{view.params.layers} layers: half of its teacher\'s depth (BERT '
                 "base has 12).</div>")
        if distilled is not None:
            teacher, d = distilled
            return depth + distillation_html(d, teacher)
        return depth
    if o.pair_task is None and o.demo == "pair":
        return f'<div style="{MUTED}">This checkpoint has no sentence-pair head to show.</div>'
    return ""


def kinds_html(kinds: dict[str, str]) -> str:
    """One line per tokenizer kind on show: its name and what it does."""
    return "".join(f'<div style="{HELP_STYLE}"><b>{html.escape(k)}</b>: {html.escape(note)}.</div>'
                   for k, note in kinds.items())


def followed_text(picked: str, before: str, kept: Sequence[int]) -> str:
    """What the Family tab says when Model 1 followed the picker from `before` to `picked` (`kept`: the
    other slots, numbered from 1, that still show `before`)."""
    where = (f"it is still Model {kept[0]}" if kept else
             "pick it as Model 2, 3 or 4 to keep it in the comparison")
    return f"Model 1 now shows {picked}, the model picked above; it showed {before} before: {where}."
