"""Every figure on show in the tabs is in the Export tab's list ("every figure on show exportable"): each tab is
opened in the app, its slow figures drawn too (head effects, patching, the neuron view, the attribution section),
and every plotly figure with data in its widget tree must be one the Export tab lists."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

from bertlab.panels.app import TABS, App
from bertlab.panels.state import ModelState

TRAINING = {"Pre-training", "Fine-tuning", "Compression"}  # their figures come from runs: tested in their own files


def on_show(widget: widgets.Widget):
    """The figure widgets with data in `widget`'s tree (hidden branches left out)."""
    if getattr(widget.layout, "display", None) == "none":
        return
    if isinstance(widget, go.FigureWidget):
        if widget.data:
            yield widget
        return
    for child in getattr(widget, "children", ()) or ():
        yield from on_show(child)


@pytest.fixture(scope="module")
def app(default_model, tmp_path_factory):
    from bertlab.settings import data_dir

    if not (data_dir() / "conll2003").is_dir():
        pytest.skip("the shared data (BERTLAB_DATA) is not present")
    return App(ModelState(*default_model, name="offline default"))


@pytest.mark.parametrize("title", [t for t, _ in TABS if t not in TRAINING | {"Export"}])
def test_every_figure_on_show_is_in_the_export_list(app, title):
    index = [t for t, _ in TABS].index(title)
    app.tabs.selected_index = index
    panel = app.panels[title]
    if title == "Ablation":
        panel.effects_button.click()
    if title == "What it knows":
        panel.patch_button.click()
        panel.neuron_button.click()
    explain = getattr(panel, "explain", None)
    if explain is not None:
        explain.toggle.value = True
    shown = list(on_show(panel.widget))
    assert shown, f"the {title} tab shows no figure"
    listed = {f"{title}: {name}": fig for name, fig in panel.figures().items()}
    assert set(listed) <= set(app.figures())
    titles = {str(fig.layout.title.text) for fig in listed.values()}
    missing = [str(fig.layout.title.text) for fig in shown if str(fig.layout.title.text) not in titles]
    assert not missing, f"on show in {title} but not exportable: {missing}"
