"""What every dashboard panel shares: a `.widget` to show and a message line for the student."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Literal

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.needs import NEEDS as NEEDS  # the tabs import these from the kit
from bertlab.analysis.needs import lacks as lacks
from bertlab.analysis.needs import pair_task as pair_task
from bertlab.classroom.questions import AnswerHeld
from bertlab.model import MissingHeadError
from bertlab.service_client import ClassServiceError
from bertlab.tokenizer import Tokenizer
from bertlab.viz.figure_widget import close_later
from bertlab.viz.theme import busy_html, note_html

log = logging.getLogger(__name__)

Level = Literal["info", "warning", "error"]


class Panel:
    """Base of one dashboard tab. Subclasses build their widgets in `__init__`, put
    `self.message` somewhere in `self.widget`, and wrap callbacks in `self.reporting()`."""

    title: str = ""
    teaches: str = ""  # one sentence for the docs and the tab's help line

    def __init__(self) -> None:
        self.message = widgets.HTML(value="", layout=widgets.Layout(width="100%"))
        self.messages: list[tuple[Level, str]] = []
        # Set by the app: training tabs call it with (name, model, tok) when they made a model,
        # and the model joins the picker.
        self.model_made: Callable[[str, torch.nn.Module, Tokenizer], None] | None = None
        # Set by the app: the picker's name of the model this tab last drew with (a tab not on show
        # keeps drawing the model before a switch until it is opened again); "" outside the app.
        self.model_name = ""

    _widget: widgets.Widget  # set by the subclass's __init__

    @property
    def widget(self) -> widgets.Widget:
        """The tab's root widget, to show."""
        return self._widget

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """The picker switched model: recompute and redraw with it (same inputs)."""
        raise NotImplementedError

    def figures(self) -> dict[str, go.Figure]:
        """The figures on show now, by name, for the Export tab ({} when none)."""
        return {}

    def made_with(self) -> dict[str, str]:
        """Figure name -> the model it was made with, for figures of `figures()` made with another model
        than the tab's (`model_name`), e.g. "Use it" with the model just fine-tuned; {} when none."""
        return {}

    def show_messages(self, messages: list[tuple[Level, str]]) -> None:
        """Replace the message line with these (level, plain text) notes; [] clears it."""
        self.messages = list(messages)
        sign = busy_html(self._busy_text) if self._busy_text else ""  # stays on top while busy
        self.message.value = sign + "".join(note_html(level, text) for level, text in self.messages)

    def show_message(self, text: str, level: Level = "info") -> None:
        self.show_messages([(level, text)])

    _holding = False  # True inside `hold()`: observers skip their redraw

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Change several widgets with one redraw after: the tab's observers return early while
        `self._holding` is set, and the tab redraws once when the block ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    _busy_text: str | None = None  # set while `busy()` runs: the sign on top of the message line

    @contextlib.contextmanager
    def busy(self, *buttons: widgets.Widget, text: str = "Working…") -> Iterator[None]:
        """A busy sign (spinner and `text`) on the message line, and `buttons` disabled, while the
        block runs: for anything that may take more than half a second. Nested calls keep the outer sign."""
        if self._busy_text is not None:
            yield
            return
        self._busy_text = text
        self.show_messages(self.messages)
        try:
            with disabled(*buttons):
                yield
        finally:
            self._busy_text = None
            self.show_messages(self.messages)

    @contextlib.contextmanager
    def reporting(self, *stale: widgets.Widget) -> Iterator[None]:
        """Turn an exception in a callback into a message in the panel, never a traceback. `stale`: the
        widgets that show the result the callback redraws; an exception empties them (`clear_view`), so
        that an old result never sits under the new message."""
        try:
            yield
        except Exception as e:
            clear_view(*stale)
            self.show_error(e)

    def offer_model(self, name: str, model: torch.nn.Module, tok: Tokenizer) -> list[tuple[Level, str]]:
        """Add a model this tab made to the picker (`model_made`); a warning note when that failed, else []."""
        if self.model_made is None:
            return []
        try:
            self.model_made(name, model, tok)
        except Exception as e:
            log.exception("adding %s to the model list failed", name)
            return [("warning", f"Could not add it to the model list ({type(e).__name__}: {e}).")]
        return []

    def unknown_notes(self, tokens: Sequence[str], meaning: str = "") -> list[tuple[Level, str]]:
        """`unknown_notes` for what this tab's tokenizer (`self.tok`) made of the text."""
        tok = self.tok
        return unknown_notes(tokens, tok.unk_token, meaning, tok.special_tokens.values())

    def show_error(self, e: Exception) -> None:
        """The message for an exception raised by a callback (the whole message line is replaced)."""
        if isinstance(e, MissingHeadError):  # the model lacks what was asked: say so plainly, it is no bug
            self.show_message(str(e), "warning")
        elif isinstance(e, AnswerHeld):  # the class question's answer, before the teacher's reveal
            self.show_message(str(e), "info")
        elif isinstance(e, (ValueError, IndexError)):  # bad input: the message is meant for the student
            self.show_message(str(e), "error")
        elif isinstance(e, ClassServiceError):  # the class service refused or is away: its message says what to do
            self.show_message(str(e), "warning")
        else:  # a bug: say so plainly, keep the traceback in the log
            log.error("%s panel callback failed", self.title or type(self).__name__, exc_info=e)
            self.show_message(
                f"Something went wrong ({type(e).__name__}: {e}). Try other input; "
                "if it keeps happening, report it with the text you typed.",
                "error",
            )


def clear_view(*views: widgets.Widget) -> None:
    """Empty widgets that show a result: a box loses its children (a figure widget among them is closed
    a moment later, see `close_later`), an HTML its text, an Output its output."""
    for view in views:
        if isinstance(view, widgets.Box):
            old = view.children
            view.children = ()
            for child in old:
                if isinstance(child, go.FigureWidget):
                    close_later(view, child)
        elif isinstance(view, widgets.Output):
            view.clear_output()
        elif isinstance(view, widgets.HTML):
            view.value = ""
        else:
            raise TypeError(f"clear_view cannot empty a {type(view).__name__}")


@contextlib.contextmanager
def disabled(*buttons: widgets.Widget) -> Iterator[None]:
    """Grey buttons out while a (slow) job runs, so a second click cannot start it again; each gets its
    own state back after."""
    was = [(b, b.disabled) for b in buttons]
    for b, _ in was:
        b.disabled = True
    try:
        yield
    finally:
        for b, state in was:
            b.disabled = state


WIDE = "min(100%, 720px)"  # the width of a text input: the whole tab on a phone, a line's length elsewhere


def sentence_pair(a: str, b: str = "", placeholder_a: str = "Type a sentence, then press Show",
                  placeholder_b: str = "optional second sentence",
                  both_areas: bool = False) -> tuple[widgets.Textarea, widgets.Text | widgets.Textarea]:
    """The sentence A / sentence B inputs of every tab that reads a pair: A a text area, B one line (or
    two equal areas, `both_areas`, where B matters as much as A). Both update on Enter or leaving the box."""
    height = "3.2em" if both_areas else "4.5em"
    text_a = widgets.Textarea(value=a, description="Sentence A", placeholder=placeholder_a, continuous_update=False,
                              layout=widgets.Layout(width=WIDE, height=height))
    kind = widgets.Textarea if both_areas else widgets.Text
    text_b = kind(value=b, description="Sentence B", placeholder=placeholder_b, continuous_update=False,
                  layout=widgets.Layout(width=WIDE, height=height if both_areas else None))
    return text_a, text_b


def labelled(kind: type[widgets.Widget], description: str, width: str, **kwargs) -> widgets.Widget:
    """A setting with its label in full before it (`kind`: BoundedIntText, Dropdown, ...), `width` wide."""
    return kind(description=description, style={"description_width": "initial"}, layout=widgets.Layout(width=width),
                **kwargs)


def run_button(description: str = "Show", tooltip: str = "Run the model") -> widgets.Button:
    """The primary button that runs the tab's computation on its inputs."""
    return widgets.Button(description=description, button_style="primary", tooltip=tooltip)


MOSTLY_UNKNOWN = 0.5  # above this share of its pieces read as unknown, a result says little about the text


def unknown_notes(tokens: Sequence[str], unk_token: str, meaning: str = "",
                  specials: Collection[str] = ()) -> list[tuple[Level, str]]:
    """A warning when pieces of `tokens` are outside the vocabulary (each read as `unk_token`), with what
    that means for the tab (`meaning`); a stronger one when most of the text's pieces (`tokens` less the
    `specials`, e.g. the tokenizer's [CLS] and [SEP]) are unknown, since then any result (a 100 % verdict
    too) says next to nothing about the text; [] when there are none. Every tab says it this one way."""
    unknown = sum(1 for t in tokens if t == unk_token)
    if not unknown:
        return []
    framing = set(specials) - {unk_token}
    pieces = sum(1 for t in tokens if t not in framing)
    if unknown > MOSTLY_UNKNOWN * pieces:
        return [("warning", f"Most of this input ({unknown} of {pieces} pieces) is not in this model's vocabulary "
                            f"and reads as {unk_token}, so the model sees almost nothing of the text: what this tab "
                            "shows says little about it. Type words in the model's language (emoji and rare "
                            "symbols often read as unknown).")]
    meaning = f": {meaning}" if meaning else ""
    return [("warning", f"{unknown} piece(s) are not in this model's vocabulary and read as {unk_token} (emoji and "
                        f"rare symbols often are){meaning}.")]


def input_notes(warning: str | None, tokens: Sequence[str], unk_token: str,
                meaning: str = "", specials: Collection[str] = ()) -> list[tuple[Level, str]]:
    """The notes on what the model read: the input's own `warning` (cut to fit, ...) and `unknown_notes`."""
    return ([("warning", warning)] if warning else []) + unknown_notes(tokens, unk_token, meaning, specials)
