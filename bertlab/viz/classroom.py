"""The class's guesses beside the model's probabilities (pure: counts and probabilities in, a figure out)."""

from __future__ import annotations

import html
from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bertlab.viz.mask import hidden_html
from bertlab.viz.theme import MUTED, NEUTRAL, OKABE_ITO, Theme, current, finish

# Colour-blind safe (the theme's palette), and kept apart on a washed-out projector.
SHARED = OKABE_ITO[0]  # a guess the model also ranks (left) / a model answer some student gave (right)
ALONE = NEUTRAL  # a guess outside the model's list / a model answer nobody gave
TOP = OKABE_ITO[2]  # the model's top answer, on both sides
MAX_GUESS_BARS = 15  # more distinct guesses are summed into one "other" bar


def plot_class_guesses(
    counts: Sequence[tuple[str, int]],
    model: Sequence[tuple[str, float]],
    show_model: bool = True,
    title: str = "",
    style: Theme | None = None,
) -> go.Figure:
    """Two bar charts side by side: how many students gave each guess (left, most frequent on top)
    and the model's probability for each of its answers (right; a note instead while `show_model`
    is False). Guesses are matched to the model's answers case-insensitively: green is the model's
    top answer, blue an answer on both sides, grey one on one side only. Drawn with `style` (default:
    the theme in use, so projector mode scales it and lets it fill the page)."""
    t = style or current()
    model_keys = {a.casefold(): i for i, (a, _) in enumerate(model)}
    guessed = {g.casefold() for g, _ in counts}
    shown = list(counts[:MAX_GUESS_BARS])
    rest = sum(n for _, n in counts[MAX_GUESS_BARS:])
    if rest:
        shown.append((f"other ({len(counts) - MAX_GUESS_BARS})", rest))
    total = sum(n for _, n in counts)

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.22, subplot_titles=[
        f"The class's guesses ({total} answer{'s' if total != 1 else ''})",
        f"The model's top {len(model)}" if show_model else "The model's answer (hidden until you reveal)",
    ])
    fig.add_trace(go.Bar(  # a guess that is one of the model's answers is spelled as the model spells it
        x=[n for _, n in shown], y=[_spelled(g, model, model_keys) for g, _ in shown], orientation="h",
        marker_color=[_colour(model_keys.get(g.casefold())) for g, _ in shown],
        text=[str(n) for _, n in shown], textposition="auto", name="students",
        hovertemplate="<b>%{y}</b><br>%{x} student(s)<extra></extra>", showlegend=False,
    ), row=1, col=1)
    answers = list(model) if show_model else []
    fig.add_trace(go.Bar(
        x=[p for _, p in answers], y=[a for a, _ in answers], orientation="h",
        marker_color=[TOP if i == 0 else SHARED if a.casefold() in guessed else ALONE
                      for i, (a, _) in enumerate(answers)],
        text=[f"{p:.0%}" if p >= 0.01 else f"{p:.1%}" for _, p in answers], textposition="auto", name="model",
        hovertemplate="<b>%{y}</b><br>probability %{x:.3f}<extra></extra>", showlegend=False,
    ), row=1, col=2)
    if not shown:
        _note(fig, "x domain", "No answers yet")
    if not show_model:
        _note(fig, "x2 domain", "Reveal to show it to everyone")
    rows = max(len(shown), len(answers), 2)
    fig.update_yaxes(autorange="reversed", type="category", automargin=True)
    fig.update_xaxes(rangemode="tozero")
    fig.update_xaxes(title_text="students", dtick=1 if total <= 10 else None, row=1, col=1)
    fig.update_xaxes(title_text="probability", range=[0, 1] if len(model) <= 2 else None, row=1, col=2)
    fig.update_layout(
        title=dict(text=title, x=0.01) if title else None,
        height=int(140 + 28 * rows), width=880, plot_bgcolor="white", bargap=0.25,
        margin=dict(l=10, r=20, t=80 if title else 50, b=50),
    )
    return finish(fig, t)


def _spelled(guess: str, model: Sequence[tuple[str, float]], keys: dict[str, int]) -> str:
    i = keys.get(guess.casefold())
    return guess if i is None else model[i][0]


def _colour(model_index: int | None) -> str:
    return ALONE if model_index is None else TOP if model_index == 0 else SHARED


def _note(fig: go.Figure, xref: str, text: str) -> None:
    fig.add_annotation(text=text, xref=xref, yref="y domain" if xref.startswith("x ") else "y2 domain",
                       x=0.5, y=0.5, showarrow=False, font=dict(size=14, color="#666"))


def question_html(text: str, mask_token: str | None, text_b: str | None = None, ask: str | None = None) -> str:
    """The class question as a student's tab shows it: a pair question (`ask` given) as A, B and the
    question asked; else the text with each mask token marked (`mask_token`, None: plain). Escaped here."""
    style = "font-size:1.15em;margin:4px 0"
    if ask is not None:
        return (f'<div style="{style}"><b>A:</b> {html.escape(text)}<br><b>B:</b> {html.escape(text_b or "")}'
                f"</div><div>{html.escape(ask)}</div>")
    if not mask_token:
        return f'<div style="{style}">{html.escape(text)}</div>'
    mark = hidden_html(mask_token)
    return f'<div style="{style}">{mark.join(html.escape(p) for p in text.split(mask_token))}</div>'


def question_status_html(q: Any, answers: int, tab: str) -> str:
    """The teacher's line about the live question `q` (a classroom.store.Question, None: none is live):
    its number, the students' `tab`, whether it is revealed, its text and how many `answers` came in."""
    if q is None:
        return '<div style="margin:6px 0">No question is live. Write one and push it to the class.</div>'
    state = "revealed to all" if q.revealed else "live, the model's answer hidden from students"
    what = html.escape(q.text) if q.kind == "mask" else f"A: {html.escape(q.text)} · B: {html.escape(q.text_b or '')}"
    return (f'<div style="margin:6px 0"><b>Question {q.id}</b> ({tab} tab, {state}): {what} — '
            f'<b class="bertlab-answer-count">{answers}</b> answer{"s" if answers != 1 else ""}</div>')


def queue_html(rows: Sequence[tuple[int, str, str, str]]) -> str:
    """The class training queue as the teacher sees it: its (id, label, state, owner) rows in order."""
    if not rows:
        return f'<div style="{MUTED}">No training runs are queued or running.</div>'
    lines = "".join(f"<tr><td>{n}</td><td>{html.escape(label)}</td><td>{html.escape(owner) or '–'}</td>"
                    f"<td>{html.escape(state)}</td></tr>" for n, (_, label, state, owner) in enumerate(rows, 1))
    head = "<tr><th>#</th><th>run</th><th>whose</th><th>state</th></tr>"
    return f'<table class="bertlab-queue-table">{head}{lines}</table>'
