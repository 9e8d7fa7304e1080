"""The lab record: one offline HTML page of the session's tabs, made in the Export tab."""

from __future__ import annotations

import base64
import html
import re

import plotly.graph_objects as go
import pytest

from bertlab.panels.app import App
from bertlab.panels.export import ExportPanel
from bertlab.panels.state import ModelState
from bertlab.viz.attention_view import to_standalone_html
from bertlab.viz.export import remote_resources
from bertlab.viz.record import RecordHeader, RecordSection, lab_record_html
from bertlab.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")
PLOTLY_BANNER = re.compile(r"plotly\.js v\d")  # the first line of plotly.min.js


def test_the_page_inlines_plotly_once_escapes_inputs_and_embeds_attention_views():
    import torch

    figs = {f"figure {i}": go.Figure(go.Bar(x=[1, 2], y=[i, i + 1])) for i in range(3)}
    attention = torch.softmax(torch.randn(2, 2, 4, 4), dim=-1)
    view = to_standalone_html(attention, ["[CLS]", "a", "b", "[SEP]"], title="Attention: a b")
    sections = [RecordSection("Mask", [("Text", "<script>alert(1)</script> the [MASK]")], figs),
                RecordSection("Attention", [], {}, {"attention view": view}),
                RecordSection("Empty tab")]
    page = lab_record_html(RecordHeader("tiny", [("What it is", "2 layers")], {"Next sentence": 7}, "Ada"), sections)
    assert len(PLOTLY_BANNER.findall(page)) == 1  # plotly.js inlined once for all figures
    assert remote_resources(page) == [] and "cdn" not in page.lower().split("<body>")[1][:20000]
    for i in range(3):
        assert f'id="bertlab-figure-{i + 1}"' in page
    assert "<script>alert(1)</script>" not in page and html.escape("<script>alert(1)</script>") in page
    assert f'srcdoc="{html.escape(view)}"' in page  # the attention view page, whole, in an iframe
    assert "Empty tab" not in page  # a tab that shows nothing is left out
    assert ">Ada<" in page and "Next sentence = 7" in page and ">tiny<" in page
    empty = lab_record_html(RecordHeader("tiny"), [])
    assert "No tab had drawn anything yet" in empty


def test_the_export_tab_records_the_opened_tabs_inputs_figures_attention_and_seeds(default_model, tmp_path,
                                                                                    monkeypatch):
    state = ModelState(*default_model)
    tabs = (("Mask", "bertlab.panels.mask:MaskPanel"), ("Next sentence", "bertlab.panels.nsp:NSPPanel"),
            ("Attention", "bertlab.panels.attention:AttentionPanel"), ("Export", "bertlab.panels.export:ExportPanel"))
    app = App(state, tabs=tabs, first=0)
    for i in (1, 2):
        app.open(i)
    nsp = app.panels["Next sentence"]
    nsp.text_b.value = "It rained all day."
    export = app.open(3)
    monkeypatch.chdir(tmp_path)
    export.folder.value = "."  # the working folder itself
    export.student.value = "Ada Lovelace"
    export.record_button.click()
    saved = list(tmp_path.glob("*.html"))
    assert [p.name for p in saved] == ["lab-record-ada-lovelace.html"]
    page = saved[0].read_text(encoding="utf-8")
    assert "The record holds 3 tab(s)." in " ".join(text for _, text in export.messages)
    link = re.search(r'href="data:text/html;base64,([^"]+)"', export.link.value)
    assert base64.b64decode(link.group(1)).decode("utf-8") == page  # the download is the same page
    assert remote_resources(page) == [] and len(PLOTLY_BANNER.findall(page)) == 1
    heads = [m for m in re.findall(r"<h2>(.*?)</h2>", page)]
    assert heads == ["Mask", "Next sentence", "Attention"]  # tab order, Export itself left out
    assert html.escape("It rained all day.") in page and html.escape(nsp.text_a.value) in page
    assert "P(B follows A)" in page and "guesses for the hidden words" in page
    assert page.count('class="attention"') == 1 and "Next sentence = 0" in page  # the NSP tab's seed
    assert f">{html.escape(state.name)}<" in page


def test_without_the_app_the_record_holds_the_figures_and_an_attention_view(default_model, tmp_path):
    fig = go.Figure(go.Bar(x=[1], y=[2]))
    panel = ExportPanel(*default_model, figures=lambda: {"Mask: guesses": fig}, folder=tmp_path)
    page, tabs = panel.lab_record()
    assert tabs == 2 and "Figures" in page and "Attention view" in page and 'class="attention"' in page


def test_in_class_mode_the_record_is_a_download_only(default_model, tmp_path):
    panel = ExportPanel(*default_model, workspace=Workspace(tmp_path / "ws"))
    assert panel.folder not in panel.widget.children  # no server path typed or shown
    panel.record_button.click()
    assert 'download="lab-record.html"' in panel.link.value
    text = " ".join(t for _, t in panel.messages)
    assert "downloads it to your computer" in text and str(tmp_path) not in text
