"""Figures in widgets: a plotly FigureWidget whose browser views stay current (`SyncedFigureWidget`),
an in-place redraw (`redraw`), the swap of a box's figure (`show_figure`, `close_later`), and what a box
shows (`shown_figure`, `box_figures` for the Export tab). Every panel shows its figures through these."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import weakref
from collections.abc import Mapping

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.settings import plotly_bundle_path
from bertlab.viz.mask import empty_figure

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
        # The template is shared, not copied: the largest part of the layout, it is replaced (a theme
        # switch), never edited, so an edit's copy (and traitlets' comparison with the last) skips it.
        self._widget_layout = {key: value if key == "template" else copy.deepcopy(value)
                               for key, value in self._layout_obj._props.items()}
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



def show_or_clear(box: widgets.Box, fig: go.Figure | None) -> None:
    """`show_figure(box, fig)`, or an empty box when there is no figure (None)."""
    if fig is None:
        box.children = ()
    else:
        show_figure(box, fig)


def shown_figure(box: widgets.Box) -> go.FigureWidget | None:
    """The figure widget `box` shows (see `show_figure`), None when it shows none."""
    fig = box.children[0] if box.children else None
    return fig if isinstance(fig, go.FigureWidget) else None


def box_figures(boxes: Mapping[str, widgets.Box]) -> dict[str, go.Figure]:
    """Name -> a copy of the figure each box shows, for the boxes that show one with traces (a hint
    figure has none)."""
    shown = {name: shown_figure(box) for name, box in boxes.items()}
    return {name: go.Figure(fig) for name, fig in shown.items() if fig is not None and fig.data}


def figure_box(hint: str) -> widgets.Box:
    """A box that shows a figure, holding the hint that says how to get one."""
    return widgets.Box([SyncedFigureWidget(empty_figure(hint))])


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
