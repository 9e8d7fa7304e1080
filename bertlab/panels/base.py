"""What every dashboard panel shares: a `.widget` to show and a message line for the student."""

from __future__ import annotations

import contextlib
import html
import logging
from collections.abc import Callable, Iterator
from typing import Literal

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Level = Literal["info", "warning", "error"]

_STYLE: dict[str, str] = {
    "info": "color:#1f3b57;background:#eef4fa;border-left:4px solid #4a90d9",
    "warning": "color:#5c3d00;background:#fff6e0;border-left:4px solid #e0a100",
    "error": "color:#6b0b0b;background:#fdecec;border-left:4px solid #d62728",
}


class Panel:
    """Base of one dashboard tab. Subclasses build their widgets in `__init__`, put
    `self.message` somewhere in `self.widget`, and wrap callbacks in `self.reporting()`."""

    title: str = ""
    teaches: str = ""  # one sentence for the README and the tab's help line

    def __init__(self) -> None:
        self.message = widgets.HTML(value="", layout=widgets.Layout(width="100%"))
        self.messages: list[tuple[Level, str]] = []
        # Set by the app: training tabs call it with (name, model, tok) when they made a model,
        # and the model joins the picker.
        self.model_made: Callable[[str, torch.nn.Module, Tokenizer], None] | None = None

    @property
    def widget(self) -> widgets.Widget:
        raise NotImplementedError

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """The picker switched model: recompute and redraw with it (same inputs)."""
        raise NotImplementedError

    def figures(self) -> dict[str, go.Figure]:
        """The figures on show now, by name, for the Export tab ({} when none)."""
        return {}

    def show_messages(self, messages: list[tuple[Level, str]]) -> None:
        """Replace the message line with these (level, plain text) notes; [] clears it."""
        self.messages = list(messages)
        self.message.value = "".join(note_html(level, text) for level, text in self.messages)

    def show_message(self, text: str, level: Level = "info") -> None:
        self.show_messages([(level, text)])

    @contextlib.contextmanager
    def reporting(self) -> Iterator[None]:
        """Turn an exception in a callback into a message in the panel, never a traceback."""
        try:
            yield
        except (ValueError, IndexError) as e:  # bad input: the message is meant for the student
            self.show_message(str(e), "error")
        except Exception as e:  # a bug: say so plainly, keep the traceback in the log
            log.exception("%s panel callback failed", self.title or type(self).__name__)
            self.show_message(
                f"Something went wrong ({type(e).__name__}: {e}). Try other input; "
                "if it keeps happening, report it with the text you typed.",
                "error",
            )


def note_html(level: Level, text: str) -> str:
    return (
        f'<div class="bertlab-note bertlab-{level}" style="{_STYLE[level]};'
        f'padding:4px 10px;margin:3px 0;border-radius:3px;line-height:1.4">{html.escape(text)}</div>'
    )


# -- figures in widgets -------------------------------------------------------------------------
def _changed(old: dict, new: dict) -> dict:
    """The entries of `new` that differ from `old`. plotly validates every property it is given,
    which is most of a redraw's time: giving it only what changed keeps slider moves cheap."""
    out = {}
    for key, value in new.items():
        try:
            same = key in old and bool(old[key] == value)
        except (ValueError, TypeError):  # arrays compare element-wise: count them as changed
            same = False
        if not same:
            out[key] = value
    return out


def redraw(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Show `fig` in `widget` in place: its traces and its layout (not the template)."""
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)  # the widget has the same one; re-sending it is slow
    shown = widget.layout.to_plotly_json()
    lists = {k: layout.pop(k, ()) for k in ("shapes", "annotations")}
    with widget.batch_update():
        if [t.type for t in widget.data] == [t.type for t in fig.data]:
            for old, new in zip(widget.data, fig.data):
                old.update(_changed(old.to_plotly_json(), new.to_plotly_json()), overwrite=True)
        else:
            widget.data = ()
            widget.add_traces(list(fig.data))
        widget.layout.update(_changed(shown, layout))
        # update() merges lists and never empties one: assign them whole (when they changed)
        for key, value in lists.items():
            if list(shown.get(key, ())) != list(value):
                setattr(widget.layout, key, value)


def show_figure(box: widgets.Box, fig: go.Figure) -> go.FigureWidget:
    """Show `fig` as the only child of `box`: redraw the FigureWidget there when its traces line up
    with the figure's (smooth in the browser), else swap in a new widget built from the complete
    figure (a FigureWidget filled after it was created shows up blank in Voila)."""
    old = box.children[0] if len(box.children) == 1 and isinstance(box.children[0], go.FigureWidget) else None
    if old is not None and fig.data and [t.type for t in old.data] == [t.type for t in fig.data]:
        redraw(old, fig)
        return old
    widget = go.FigureWidget(fig)
    box.children = (widget,)
    if old is not None:
        old.close()
    return widget

