"""Plotly figures for masked-word prediction (pure: results in, a figure out)."""

from __future__ import annotations

import html
import math
from typing import Literal, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.analysis.mask import MaskPrediction, WordScore
from bertlab.inputs import echo
from bertlab.tokenizer import DEFAULT_SPECIALS, WORDPIECE_PREFIX, Tokenizer, join_wordpieces
from bertlab.viz.text import plain_text, plain_texts
from bertlab.viz.theme import HIDDEN_MARK, OKABE_ITO, Theme, current, finish

BAR = OKABE_ITO[5]  # sky blue
TRUE_BAR = OKABE_ITO[2]  # bluish green: the masked word's own piece, when it is among the guesses
# red: hard to guess, green: easy; through yellow, so that red-green colour blindness still sees
# dark-to-light (a plain red-to-green scale is one colour to a deuteranope)
STRIP_COLORS = [[0.0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#fddbc7"], [0.75, "#8fd18f"], [1.0, "#1a7f37"]]
SKIPPED_COLOR = "#d0d0d0"  # words that are not scored ([UNK], typed special tokens)
SKIPPED_WHY = {
    "unknown": "not in this model's vocabulary (reads as {unk}): not scored",  # {unk}: the tokenizer's
    "special": "a special token typed in the text: not scored",
}
Scale = Literal["probability", "log10"]
LOG10_FLOOR = -6.0  # log10 probabilities below this get the reddest colour
HELP = (  # {mask} and {pieces} are spelled by the model's tokenizer (`help_text`)
    "Click words to hide them (click again to show them), or type {mask} in the text and press Predict. "
    "Each chart lists the model's top guesses for one hidden piece; green is the piece that was really "
    "there. A word split into pieces ({pieces}) has only its first piece hidden unless "
    "whole-word masking is on. 'Mask each word in turn' hides every word once and colours it by how "
    "likely the model finds the true word (green: easy to guess back, red: hard)."
)


def plot_fill_mask(predictions: Sequence[MaskPrediction], style: Theme | None = None,
                   mask_token: str = DEFAULT_SPECIALS["mask"]) -> go.Figure:
    """Horizontal bars of the top-k guesses, one subplot per [MASK], most probable on top.
    A bar is green when it is the piece that was really there. `mask_token`: the tokenizer's, for the hint."""
    t = style or current()
    if not predictions:
        return empty_figure(f"Put {mask_token} in the text (or pick a word to hide) and press Predict.", t)
    n = len(predictions)
    fig = make_subplots(
        rows=n, cols=1, subplot_titles=[fill_mask_title(p) for p in predictions],
        vertical_spacing=min(0.12, 0.5 / n),
    )
    for row, pred in enumerate(predictions, start=1):
        fig.add_trace(
            go.Bar(
                **_bars(pred),
                orientation="h",
                textposition="auto",
                hovertemplate="<b>%{y}</b><br>probability %{x:.4g}<extra></extra>",
                showlegend=False,
            ),
            row=row, col=1,
        )
        fig.update_yaxes(autorange="reversed", type="category", row=row, col=1)
        fig.update_xaxes(rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="probability", row=n, col=1)
    k = max(len(p.candidates) for p in predictions)
    fig.update_layout(
        height=int(80 + n * (60 + 26 * k)), width=620, plot_bgcolor="white",
        margin=dict(l=120, r=20, t=60, b=50), bargap=0.25,
    )
    return finish(fig, t)


def _bars(pred: MaskPrediction) -> dict:
    """What one hidden piece's bar trace shows (its guesses, most probable first)."""
    return dict(
        x=[c.probability for c in pred.candidates],
        y=[c.token for c in pred.candidates],
        marker_color=[TRUE_BAR if c.token_id == pred.original_id else BAR for c in pred.candidates],
        text=[_percent(c.probability) for c in pred.candidates],
        name=pred.label,
    )


def update_fill_mask(fig: go.Figure, predictions: Sequence[MaskPrediction]) -> bool:
    """Show `predictions` in `fig`, a `plot_fill_mask` figure of as many hidden pieces and guesses each,
    by changing only its bars and subplot titles (one message on a FigureWidget: nothing else is sent).
    False, and `fig` untouched, when its shape differs: draw it with `plot_fill_mask` instead."""
    bars, titles = fig.data, fig.layout.annotations
    if not predictions or len(bars) != len(predictions) or len(titles) != len(predictions) or any(
            b.type != "bar" or len(b.y or ()) != len(p.candidates) for b, p in zip(bars, predictions)):
        return False
    with fig.batch_update():
        for bar, pred in zip(bars, predictions):
            new = _bars(pred)
            new["y"], new["name"] = plain_texts(new["y"]), plain_text(new["name"])  # as `finish` draws them
            bar.update(new)
        for title, pred in zip(titles, predictions):
            title.text = fill_mask_title(pred)
    return True


def fill_mask_title(pred: MaskPrediction) -> str:
    """Subplot title: which mask, and how the true piece fared when a word was hidden."""
    if pred.original_token is None:
        return plain_text(pred.label)
    return (
        f"{plain_text(pred.label)}: its probability {_percent(pred.original_probability or 0.0)}, "
        f"rank {pred.original_rank}"
    )


def plot_word_predictability(
    scores: Sequence[WordScore], per_row: int = 12, scale: Scale = "probability", style: Theme | None = None,
    unk_token: str = DEFAULT_SPECIALS["unk"],
) -> go.Figure:
    """A heat strip of the sentence: each word coloured by how well the model guesses it back
    when it is hidden (green: easy, red: hard); words that were not scored ([UNK], typed special
    tokens) in grey. Long sentences wrap every `per_row` words (8 in a full-width theme, whose
    words are larger). Always two heatmap traces."""
    t = style or current()
    if not scores:
        return empty_figure("Type a sentence and press Score.", t)
    if per_row < 1:
        raise ValueError(f"per_row must be 1 or more, not {per_row}.")
    if scale not in ("probability", "log10"):
        raise ValueError(f"scale must be 'probability' or 'log10', not {scale!r}.")
    if t.full_width:
        per_row = min(per_row, 8)
    z, text, custom = strip_grid(scores, per_row, scale)
    log_scale = scale == "log10"
    fig = go.Figure(
        go.Heatmap(
            z=z, text=text, customdata=custom,
            texttemplate="%{text}", textfont=dict(size=13),
            colorscale=STRIP_COLORS, zmin=LOG10_FLOOR if log_scale else 0.0, zmax=0.0 if log_scale else 1.0,
            xgap=2, ygap=2, hoverongaps=False,
            hovertemplate=(
                "<b>%{text}</b><br>probability %{customdata[0]}<br>rank %{customdata[1]}"
                "<br>model's guess: %{customdata[2]}<extra></extra>"
            ),
            colorbar=dict(title=dict(text="log10 P" if log_scale else "P(word)"), thickness=12),
        )
    )
    grey, why = skipped_grid(scores, per_row, unk_token)
    fig.add_trace(go.Heatmap(
        z=grey, text=text, customdata=why, texttemplate="%{text}", textfont=dict(size=13),
        colorscale=[[0, SKIPPED_COLOR], [1, SKIPPED_COLOR]], zmin=0, zmax=1, showscale=False,
        xgap=2, ygap=2, hoverongaps=False, name="not scored",
        hovertemplate="<b>%{text}</b><br>%{customdata}<extra></extra>",
    ))
    rows = len(z)
    title = "How predictable is each word? (each hidden in turn)"
    if any(not s.scored for s in scores):
        title += f"<br><sup>grey: not scored ({plain_text(unk_token)} or a typed special token)</sup>"
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)),
        height=int(110 + 46 * rows), width=max(420, 70 * min(per_row, len(scores)) + 120),
        xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"),
        plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10),
    )
    return finish(fig, t)


def strip_grid(
    scores: Sequence[WordScore], per_row: int, scale: Scale = "probability"
) -> tuple[list[list[float | None]], list[list[str]], list[list[list[str]]]]:
    """(z, words, hover data) laid out in rows of `per_row` words; blanks are None / ""."""
    rows = math.ceil(len(scores) / per_row)
    z: list[list[float | None]] = [[None] * per_row for _ in range(rows)]
    text = [[""] * per_row for _ in range(rows)]
    custom = [[["", "", ""] for _ in range(per_row)] for _ in range(rows)]
    for i, s in enumerate(scores):
        r, c = divmod(i, per_row)
        text[r][c] = s.word
        if s.scored:
            z[r][c] = strip_value(s, scale)
            custom[r][c] = [f"{s.probability:.3g}", str(s.rank), s.guess]
    return z, text, custom


def skipped_grid(scores: Sequence[WordScore], per_row: int, unk_token: str = DEFAULT_SPECIALS["unk"]
                 ) -> tuple[list[list[float | None]], list[list[str]]]:
    """(z: 1 where a word was not scored, else None; why it was not) in the layout of `strip_grid`."""
    rows = math.ceil(len(scores) / per_row)
    z: list[list[float | None]] = [[None] * per_row for _ in range(rows)]
    why = [[""] * per_row for _ in range(rows)]
    for i, s in enumerate(scores):
        if not s.scored:
            r, c = divmod(i, per_row)
            why[r][c] = SKIPPED_WHY.get(s.skipped or "", "not scored").format(unk=plain_text(unk_token))
            z[r][c] = 1.0
    return z, why


def strip_value(score: WordScore, scale: Scale = "probability") -> float:
    """The colour value of one word: its probability, or log10 of it (floored at LOG10_FLOOR)."""
    if scale == "log10":
        return max(LOG10_FLOOR, score.log_probability / math.log(10))
    return score.probability


def empty_figure(note: str, style: Theme | None = None) -> go.Figure:
    """A blank figure with a hint, for before the first result."""
    fig = go.Figure()
    fig.update_layout(
        height=240, width=620, plot_bgcolor="white",
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")],
    )
    return finish(fig, style)


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%" if p >= 0.001 else f"{p:.1e}"


def hidden_html(token: str) -> str:
    """A hidden piece (the mask token, or a word a question hides) marked in running text; escaped here."""
    return f'<span style="{HIDDEN_MARK}">{html.escape(token)}</span>'


def reads_html(tokens: list[str], tok: Tokenizer | None = None) -> str:
    """The input as the model reads it ([CLS]/[SEP] left out, pieces joined), hidden pieces marked.
    `tok` says which tokens are special and which pieces continue a word (default: WordPiece's)."""
    specials = dict(tok.special_tokens) if tok is not None else dict(DEFAULT_SPECIALS)
    mask_token, skipped = specials["mask"], {specials["cls"], specials["sep"], specials["pad"]}
    continues = tok.is_continuation if tok is not None else (lambda t: t.startswith(WORDPIECE_PREFIX))
    join = tok.join_pieces if tok is not None else join_wordpieces
    words: list[str] = []
    for t in tokens:
        if t in skipped:
            continue
        glue = continues(t) and bool(words)
        t = join(["_", t])[1:] if glue else t
        piece = hidden_html(t) if t == mask_token else html.escape(t)
        if glue:
            words[-1] += piece
        else:
            words.append(piece)
    return f'<div style="font-size:0.95em;margin:4px 0"><b>The model reads:</b> {" ".join(words)}</div>'


def help_text(tok: Tokenizer) -> str:
    """HELP spelled with `tok`: its mask token, and how it cuts a long word into pieces."""
    return HELP.format(mask=tok.mask_token, pieces=" ".join(tok.tokenize("tokenization")))


def score_notes(scores: list[WordScore], tok: Tokenizer) -> list[tuple[str, str]]:
    """What "mask each word in turn" found, and which words it could not score (and why)."""
    scored = [s for s in scores if s.scored]
    right = sum(s.correct for s in scored)
    notes: list[tuple[str, str]] = [(
        "info",
        (f"Each of the {len(scored)} words was hidden once (all of its pieces); the model's top guess "
         f"was the true word for {right} of them. Hover over a word to see its probability and the guess."),
    )]
    unknown = [s.word for s in scores if s.skipped == "unknown"]
    if unknown:
        shown = ", ".join(echo(w, 20) for w in unknown[:5]) + (", …" if len(unknown) > 5 else "")
        notes.append((
            "warning",
            (f"{len(unknown)} word(s) are not in this model's vocabulary ({shown}): the model reads each as "
             f"{tok.id_to_token(tok.unk_token_id)}, so they are unknown, not scored (grey)."),
        ))
    special = [s.word for s in scores if s.skipped == "special"]
    if special:
        notes.append((
            "info",
            (f"{', '.join(dict.fromkeys(special))} typed in the text are special tokens, not words: the model reads "
             "them as such, and they are not scored (grey)."),
        ))
    return notes


def guess_notes(predictions: Sequence[MaskPrediction], words: Sequence[str], hidden: set[int], whole_word: bool,
                tok: Tokenizer, unknown: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """What the student should know about these guesses, beyond the bars: `words` of the text, the
    `hidden` ones (by index), whether `whole_word` masking is on; `unknown`: the panel's note on pieces
    outside the vocabulary (bertlab.panels.base.unknown_notes)."""
    n = len(predictions)
    notes: list[tuple[str, str]] = [(
        "info",
        f"{n} hidden piece{'s' if n > 1 else ''}. "
        + ("They are guessed all at once, each without knowing the others' guesses. " if n > 1 else "")
        + "Green bars are the pieces that were really there.",
    )]
    if not whole_word:
        split = [w for w in sorted(hidden) if len(tok.tokenize(words[w])) > 1]
        if split:
            pieces = " ".join(tok.tokenize(words[split[0]]))
            notes.append((
                "info",
                (f"'{words[split[0]]}' is several pieces ({pieces}): only the first is hidden, so the "
                 "model still sees the rest. Tick whole-word masking to hide them all."),
            ))
    return notes + list(unknown)


def word_tip(tok: Tokenizer, word: str) -> tuple[str, bool]:
    """The tooltip of a word's button in the Mask tab, and whether the button is fixed (nothing to hide:
    the mask token typed in the text, a special token, a word outside the vocabulary)."""
    typed = word == tok.mask_token
    special = not typed and tok.token_to_id(word) in tok.special_ids  # e.g. [CLS] typed in the text
    unknown = not (typed or special) and tok.unk_token_id in tok.encode_ids([word])[0]
    tip = ("typed in the text: edit the text to remove it" if typed
           else f"{word} is a special token typed in the text, not a word: it cannot be hidden" if special
           else (f"not in this model's vocabulary (it reads as {tok.id_to_token(tok.unk_token_id)}): "
                 "the model cannot guess it") if unknown
           else f"hide or show '{word}'")
    return tip, typed or special or unknown
