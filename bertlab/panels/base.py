"""What every dashboard panel shares: a `.widget` to show and a message line for the student."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import html
import json
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.classroom.questions import AnswerHeld
from bertlab.model import MissingHeadError
from bertlab.service_client import ClassServiceError
from bertlab.settings import plotly_bundle_path
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

    _busy_text: str | None = None  # set while `busy()` runs: the sign on top of the message line

    @contextlib.contextmanager
    def busy(self, *buttons: widgets.Widget, text: str = "Working…") -> Iterator[None]:
        """A busy sign (spinner and `text`) on the message line, and `buttons` disabled, while the
        block runs: for anything that may take more than half a second. Nested calls keep the outer sign."""
        if self._busy_text is not None:
            yield
            return
        was = [(b, b.disabled) for b in buttons]
        self._busy_text = text
        for b, _ in was:
            b.disabled = True
        self.show_messages(self.messages)
        try:
            yield
        finally:
            self._busy_text = None
            for b, disabled in was:
                b.disabled = disabled
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


def run_button(description: str = "Show", tooltip: str = "Run the model") -> widgets.Button:
    """The primary button that runs the tab's computation on its inputs."""
    return widgets.Button(description=description, button_style="primary", tooltip=tooltip)


NEEDS = ("mlm_head", "pair_head", "segment_embeddings", "position_embeddings")


def lacks(model: torch.nn.Module, need: str) -> str | None:
    """What `model` lacks for `need`, in a sentence a student can act on; None when it has it.
    need: "mlm_head" (to guess hidden words), "pair_head" (an NSP or SOP head, to judge a sentence
    pair), "segment_embeddings" (which tell sentence A from B), "position_embeddings" (added to the input;
    without them, what the model uses instead, as its family says it). Every tab says it this one way."""
    family = model.family
    if need == "mlm_head":
        if model.has_mlm:
            return None
        why = (" It is an ELECTRA discriminator: it was trained to spot replaced tokens instead (the Mask tab "
               "shows that)." if getattr(model, "has_rtd", False) else "")
        return (f"This {family.name} model has no MLM head, so it cannot guess hidden words.{why} Pick a model "
                "that has one in the model list, or train one in the Pre-training tab.")
    if need == "pair_head":
        if model.has_nsp:
            return None
        return (f"This {family.name} model has no sentence-pair head (neither BERT's next-sentence prediction nor "
                "ALBERT's sentence order), so it cannot judge whether B follows A; what needs only the encoder "
                "(the attention) still works. Pick a BERT or ALBERT model, or train an NSP head in the "
                "Pre-training tab.")
    if need == "segment_embeddings":
        if family.has_segments:
            return None
        return (f"This {family.name} model has no segment embeddings: it reads A and B as one text, told apart "
                "only by the separator token between them (no segment vector is added to any token).")
    if need == "position_embeddings":
        return None if family.has_position_embeddings else family.positions_note
    raise ValueError(f"unknown need {need!r}; needs are {', '.join(NEEDS)}.")


def pair_task(model: torch.nn.Module) -> str | None:
    """"sop" (ALBERT's sentence order: is A before B?), "nsp" (does B follow A?), or None."""
    return model.family.pair_task if model.has_nsp else None


def unknown_notes(tokens: Sequence[str], unk_token: str, meaning: str = "") -> list[tuple[Level, str]]:
    """A warning when pieces of `tokens` are outside the vocabulary (each read as `unk_token`), with what
    that means for the tab (`meaning`); [] when there are none. Every tab says it this one way."""
    unknown = sum(1 for t in tokens if t == unk_token)
    if not unknown:
        return []
    meaning = f": {meaning}" if meaning else ""
    return [("warning", f"{unknown} piece(s) are not in this model's vocabulary and read as {unk_token} (emoji and "
                        f"rare symbols often are){meaning}.")]


def note_html(level: Level, text: str) -> str:
    return (
        f'<div class="bertlab-note bertlab-{level}" style="{_STYLE[level]};'
        f'padding:4px 10px;margin:3px 0;border-radius:3px;line-height:1.4">{html.escape(text)}</div>'
    )


# -- figures in widgets -------------------------------------------------------------------------
# The ES module of every figure widget: plotly's widget code, with one flaw of it mended. plotly's
# FigureView registers its listeners on the figure's model and never removes them, so once a view
# is gone (a panel swapped it off its stage, JupyterLab cleared or re-drew an output) every later
# edit of the figure still runs that dead view's `Plotly.update` on a purged element: "Error setting
# state: Cannot read properties of undefined (reading 'length')" in the browser console. Here each
# view sees the model through a proxy that records its listeners, and they go when the view goes.
# plotly's code comes from one URL when the page's server serves it (`bertlab serve`: fetched and
# evaluated once per page); elsewhere (JupyterLab, a notebook) it travels inside this module as a
# string and is evaluated once per page too.
_FIGURE_MODULE = """const bundle = await (%s);
const { FigureModel, FigureView } = bundle;

export default () => {
  const plotly = bundle.default();  // plotly's own {initialize, render}, one per figure
  let figure;  // plotly's FigureModel of this figure, caught while plotly makes it
  return {
    initialize(context) {
      const initialize = FigureModel.prototype.initialize;
      FigureModel.prototype.initialize = function () { figure = this; return initialize.call(this); };
      try { return plotly.initialize(context); } finally { FigureModel.prototype.initialize = initialize; }
    },
    render({ model, el }) {
      if (!figure) return plotly.render({ model, el });
      const listeners = [];  // this view's, removed with it
      const seen = Object.create(figure);
      seen.on = (name, callback) => { model.on(name, callback); listeners.push([name, callback]); };
      const view = new FigureView(seen, el);
      view.perform_render();
      return () => {
        for (const [name, callback] of listeners) model.off(name, callback);
        view.remove();
      };
    },
  };
};
export { FigureModel, FigureView };
"""
_SERVED = """import(new URL(((c) => (c && JSON.parse(c.textContent).baseUrl) || "/")(
  document.getElementById("jupyter-config-data")).replace(/\\/?$/, "/") + %s, document.baseURI).href)"""
_INLINE = """globalThis[%s] ??= import(URL.createObjectURL(new Blob([%s], { type: "text/javascript" })))"""


@functools.cache
def figure_module(path: str | None) -> str:
    """The figure widgets' ES module: plotly's code imported from `path` (under the page's base URL)
    when the page's server serves it there, else carried inline (`path` None)."""
    if path:
        return _FIGURE_MODULE % (_SERVED % json.dumps(path))
    code = str(go.FigureWidget._esm)  # plotly's widget bundle (anywidget reads the file)
    key = "bertlab-plotly-" + hashlib.sha1(code.encode()).hexdigest()[:12]  # one evaluation per page and version
    return _FIGURE_MODULE % (_INLINE % (json.dumps(key), json.dumps(code)))


class SyncedFigureWidget(go.FigureWidget):
    """A plotly FigureWidget whose synced state follows its edits, so that a browser view made at
    any time draws the figure as the kernel has it. Every panel makes its figure widgets with it.

    plotly's FigureWidget syncs the whole figure (`_widget_data`, `_widget_layout`) only when it is
    built; each later edit goes out as a one-off `_py2js_*` message that only the views alive at that
    moment apply (the browser-side model keeps the figure as built). A view made after an edit (a
    figure filled before it was shown, a tab drawn late, a page still loading) drew the figure as
    built and never caught up. Here each edit first re-syncs the whole figure, then sends its
    message: a view made before applies the message, a view made after draws the synced figure.
    (The charts that stayed stale under load had a second cause, in anywidget's front end: see
    the anywidget pin in pyproject.toml and tests/browser/test_stale_charts.py.)"""

    def __init__(self, *args, **kwargs) -> None:
        self._esm = figure_module(plotly_bundle_path())  # read by anywidget's __init__, instead of the class's
        super().__init__(*args, **kwargs)

    def _sync_state(self) -> None:
        self._widget_layout = copy.deepcopy(self._layout_obj._props)
        self._widget_data = copy.deepcopy(self._data)

    def _send_update_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_update_msg(*args, **kwargs)

    def _send_restyle_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_restyle_msg(*args, **kwargs)

    def _send_relayout_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_relayout_msg(*args, **kwargs)

    def _send_addTraces_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_addTraces_msg(*args, **kwargs)

    def _send_deleteTraces_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_deleteTraces_msg(*args, **kwargs)

    def _send_moveTraces_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_moveTraces_msg(*args, **kwargs)

    def _send_animate_msg(self, *args, **kwargs) -> None:
        self._sync_state()
        super()._send_animate_msg(*args, **kwargs)


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


def _gone(old: dict, new: dict, keep: tuple[str, ...]) -> dict:
    """The entries of `old` that `new` does not set, as None (which resets them): a redraw leaves nothing
    of the figure before it (a title, tick labels) over the new one."""
    return {key: None for key in old if key not in new and key not in keep}


def redraw(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Show `fig` in `widget` in place: its traces and its layout (not the template); what the figure
    before set and this one does not is reset."""
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)  # the widget has the same one; re-sending it is slow
    shown = widget.layout.to_plotly_json()
    lists = {k: layout.pop(k, ()) for k in ("shapes", "annotations")}
    with widget.batch_update():
        if [t.type for t in widget.data] == [t.type for t in fig.data]:
            for old, new in zip(widget.data, fig.data):
                was, now = old.to_plotly_json(), new.to_plotly_json()
                old.update({**_gone(was, now, ("type", "uid", "visible")), **_changed(was, now)}, overwrite=True)
        else:
            widget.data = ()
            widget.add_traces(list(fig.data))
        widget.layout.update({**_gone(shown, layout, ("template", *lists)), **_changed(shown, layout)},
                             overwrite=True)
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
    widget = SyncedFigureWidget(fig)
    box.children = (widget,)
    if old is not None:
        close_later(box, old)
    return widget


_left_boxes: weakref.WeakKeyDictionary[widgets.Box, widgets.Widget] = weakref.WeakKeyDictionary()


def close_later(box: widgets.Box, old: widgets.Widget) -> None:
    """`old` has just left `box`: close the widget that left it the time before, and keep `old` until
    next time. Closing `old` at once races its view, which may still be talking to the kernel for a
    moment (a resize, a hover): each of its messages then arrives at a closed comm, and JupyterLab's
    log shows "No such comm". By the next swap the page has long dropped that view."""
    before = _left_boxes.get(box)
    _left_boxes[box] = old
    if before is not None and before is not old:
        before.close()


# -- the busy sign ------------------------------------------------------------------------------
_SPIN = "bertlab-spin"


def busy_html(text: str = "Working…") -> str:
    """A spinner (CSS only: no icon font, nothing fetched) and `text`, for anything that takes a while."""
    return (
        f"<style>@keyframes {_SPIN}{{to{{transform:rotate(360deg)}}}}</style>"
        f'<div class="bertlab-busy" style="color:#1f3b57;padding:4px 10px;margin:3px 0">'
        f'<span style="display:inline-block;width:0.9em;height:0.9em;margin-right:0.5em;vertical-align:-0.1em;'
        f"border:2px solid #4a90d9;border-right-color:transparent;border-radius:50%;"
        f'animation:{_SPIN} 0.8s linear infinite"></span>{html.escape(text)}</div>'
    )
