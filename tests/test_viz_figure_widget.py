"""Figures in widgets (bertlab.viz.figure_widget): what a browser view of a FigureWidget draws.

A view draws the widget's synced state (`_widget_data`, `_widget_layout`) when it is made, and
then applies the edit messages (`_py2js_*`) that arrive while it lives. So after any edit the
synced state must be the figure the kernel holds, and it must be sent *before* the edit's
message (a view made between the two would otherwise draw the old figure and never catch up).
plotly's own FigureWidget leaves the synced state as the figure was built. (What the browser does
with slow-loading figures is tested in tests/browser/test_stale_charts.py.)"""

from __future__ import annotations

import json
import re

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest
from aio import run_in_thread

from bertlab.viz.figure_widget import SyncedFigureWidget, redraw, show_figure


class Wire:
    """Records the state updates a widget sends to the browser, in order."""

    def __init__(self, widget: widgets.Widget) -> None:
        self.sent: list[dict] = []
        real = widget._send

        def spy(msg, buffers=None):
            if msg.get("method") == "update":
                self.sent.append(msg["state"])
            return real(msg, buffers)

        widget._send = spy

    def keys(self) -> list[str]:
        return [k for state in self.sent for k in state]


def drawn_by_a_new_view(widget: go.FigureWidget) -> go.Figure:
    """The figure a browser view made now would draw: the synced state, as the browser gets it."""
    state = widget.get_state()
    return go.Figure(data=state["_widget_data"], layout=state["_widget_layout"])


def bars(tokens: list[str], title: str) -> go.Figure:
    fig = go.Figure(go.Bar(x=[0.5, 0.3, 0.2][: len(tokens)], y=tokens, orientation="h"))
    fig.update_layout(title=title, annotations=[dict(text=title, x=0.5, y=1, showarrow=False)])
    return fig


def test_after_a_redraw_a_new_view_draws_the_new_figure_and_the_sync_comes_first():
    box = widgets.VBox()
    widget = show_figure(box, bars(["house", "mother", "man"], "[MASK] at token 6"))
    wire = Wire(widget)
    assert show_figure(box, bars(["city", "capital", "republic"], "[MASK] at token 4")) is widget  # in place
    assert widget.data[0].y == ("city", "capital", "republic")  # the kernel's figure
    drawn = drawn_by_a_new_view(widget)
    assert drawn.data[0].y == ("city", "capital", "republic")
    assert drawn.layout.title.text == "[MASK] at token 4"
    assert drawn.layout.annotations[0].text == "[MASK] at token 4"
    keys = wire.keys()
    assert "_py2js_update" in keys  # the views alive now are told
    assert keys.index("_widget_data") < keys.index("_py2js_update")
    assert keys.index("_widget_layout") < keys.index("_py2js_update")


def test_every_kind_of_edit_keeps_the_synced_state_current():
    widget = SyncedFigureWidget(bars(["a", "b"], "one"))
    widget.data[0].y = ["c", "d"]  # restyle, outside a batch
    assert drawn_by_a_new_view(widget).data[0].y == ("c", "d")
    widget.layout.title.text = "two"  # relayout
    assert drawn_by_a_new_view(widget).layout.title.text == "two"
    widget.add_trace(go.Scatter(x=[1], y=[2]))  # addTraces
    assert [t.type for t in drawn_by_a_new_view(widget).data] == ["bar", "scatter"]
    widget.data = widget.data[1:]  # deleteTraces
    assert [t.type for t in drawn_by_a_new_view(widget).data] == ["scatter"]
    redraw(widget, go.Figure(go.Scatter(x=[3], y=[4])))
    assert drawn_by_a_new_view(widget).data[0].x == (3,)


def test_a_figure_filled_after_it_was_made_is_not_blank_in_a_new_view():
    widget = SyncedFigureWidget()
    widget.add_trace(go.Bar(x=[1, 2], y=["a", "b"], orientation="h"))
    assert [t.type for t in drawn_by_a_new_view(widget).data] == ["bar"]


@pytest.mark.usefixtures("one_thread")
def test_a_mask_edit_reaches_a_view_made_after_it(default_model):
    from bertlab.analysis.mask import fill_mask
    from bertlab.panels.mask import MaskPanel

    panel = MaskPanel(*default_model)
    chart = panel.fill_box.children[0]
    panel.text.value = "Paris is the [MASK] of France."
    assert panel.fill_box.children[0] is chart  # redrawn in place, not replaced
    want = [c.token for c in fill_mask(*default_model, "Paris is the [MASK] of France.", 5)[0].candidates]
    assert list(chart.data[0].y) == want
    assert list(drawn_by_a_new_view(chart).data[0].y) == want  # was the default sentence's guesses


@pytest.mark.usefixtures("one_thread")
def test_an_attention_layer_move_reaches_a_view_made_after_it(default_model):
    from bertlab.panels.attention import AttentionPanel

    panel = AttentionPanel(*default_model)
    panel.layer.value = 1
    assert panel.figure.layout.title.text.startswith("Layer 1")
    assert drawn_by_a_new_view(panel.figure).layout.title.text.startswith("Layer 1")


# -- plotly's widget code, once per page ---------------------------------------------------------
def test_figures_import_plotlys_code_from_the_server_when_it_serves_it(monkeypatch):
    from bertlab.settings import PLOTLY_BUNDLE_ENV, PLOTLY_BUNDLE_PATH

    monkeypatch.delenv(PLOTLY_BUNDLE_ENV, raising=False)
    inline = SyncedFigureWidget()._esm
    assert len(inline) > 1_000_000  # the whole bundle, sent with every figure (Jupyter, notebooks)
    assert json.dumps(str(go.FigureWidget._esm)) in inline and "globalThis[" in inline  # evaluated once per page
    monkeypatch.setenv(PLOTLY_BUNDLE_ENV, PLOTLY_BUNDLE_PATH)
    shim = SyncedFigureWidget()._esm
    assert len(shim) < 3_000 and f'"{PLOTLY_BUNDLE_PATH}"' in shim and "await (import(" in shim
    for module in (inline, shim):  # plotly's model and view, each view's listeners removed with it
        assert "new FigureView(seen, el)" in module and "model.off(name, callback)" in module
        assert "export { FigureModel, FigureView }" in module


def test_plotlys_bundle_still_has_what_the_figure_module_wraps():
    """The figure module reaches into plotly's widget code by name: FigureModel.prototype.initialize
    (called once while plotly makes its model), FigureView(model, el).perform_render() and its
    remove(), listeners added with model.on. A plotly that renames them must fail here, not in a
    browser. (tests/browser/test_jupyterlab.py checks the whole in JupyterLab.)"""
    code = str(go.FigureWidget._esm)
    assert re.search(r"export\{[^}]*\bas FigureModel\b[^}]*\bas FigureView\b[^}]*\bas default\}", code)
    assert re.search(r"initialize\(\w+\)\{\w+=new \w+\(\w+\.model,\w+\),\w+\.initialize\(\)\}", code)
    assert "perform_render(){" in code and "remove(){" in code
    assert 'this.model.on("change:_py2js_update",()=>this.do_update())' in code


def test_a_swapped_out_figure_is_closed_at_the_next_swap_not_at_once():
    """Closing it at once raced its view (a resize or hover message to a closed comm: "No such comm")."""
    box = widgets.VBox([])
    first = show_figure(box, go.Figure(go.Bar(x=[1])))
    second = show_figure(box, go.Figure([go.Bar(x=[1]), go.Bar(x=[2])]))
    assert box.children == (second,) and first.comm is not None
    third = show_figure(box, go.Figure(go.Scatter(x=[1])))
    assert box.children == (third,) and first.comm is None and second.comm is not None


def test_the_server_serves_plotlys_widget_code_as_one_file():

    import tornado.httpclient
    import tornado.web

    from bertlab.serving.handlers import PLOTLY_BUNDLE, PlotlyBundleHandler

    async def fetch(paths):
        app = tornado.web.Application([(r"/bertlab/static/plotly-widgetbundle\.js()", PlotlyBundleHandler,
                                        {"path": str(PLOTLY_BUNDLE.parent)})])
        server = app.listen(0, address="127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        client = tornado.httpclient.AsyncHTTPClient()
        try:
            return [await client.fetch(f"http://127.0.0.1:{port}{p}", raise_error=False) for p in paths]
        finally:
            server.stop()

    ok, other = run_in_thread(fetch(["/bertlab/static/plotly-widgetbundle.js", "/bertlab/static/plotly.min.js"]))
    assert ok.code == 200 and ok.body == PLOTLY_BUNDLE.read_bytes()
    assert ok.headers["Content-Type"].startswith("text/javascript")
    assert other.code == 404  # nothing else of plotly's folder is reachable
