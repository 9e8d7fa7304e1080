"""The lab record names the model each tab's figures were made with, not only the model picked when the
record was made (a tab not opened since a switch still shows the model before it)."""

from __future__ import annotations

import html
import re

import plotly.graph_objects as go
import pytest
from tiny_models import tiny_bert

from bertlab.panels.app import App
from bertlab.panels.state import DEFAULT_NAME, ModelState
from bertlab.tasks import SST2_LABELS
from bertlab.viz.record import RecordHeader, RecordSection, lab_record_html

pytestmark = pytest.mark.usefixtures("one_thread")


def _sections(page: str) -> dict[str, str]:
    """Each section's HTML by its heading."""
    parts = re.split(r"<h2>(.*?)</h2>", page)
    return {html.unescape(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_each_section_and_each_figure_from_another_model_says_which():
    fig = go.Figure(go.Bar(x=[1], y=[1]))
    sections = [RecordSection("Mask", [("Text", "a [MASK]")], {"guesses": fig}, model="default"),
                RecordSection("Fine-tuning", [], {"curves": fig, "class probabilities": fig}, model="sst2 model",
                              made_with={"class probabilities": "sst2 · full"})]
    page = lab_record_html(RecordHeader("sst2 model"), sections)
    parts = _sections(page)
    assert "Made with <b>default</b> (this tab last drew before another model was picked" in parts["Mask"]
    assert 'class="note other-model"' in parts["Mask"]
    tuned = parts["Fine-tuning"]
    assert "Made with <b>sst2 model</b>.</p>" in tuned  # the model picked: said plainly
    assert tuned.index("class probabilities") < tuned.index("Made with <b>sst2 · full</b> (not the tab")


def test_the_record_of_tabs_drawn_before_a_switch_names_the_model_they_drew(default_model, tok, tmp_path):
    state = ModelState(*default_model)
    tabs = (("Input", "bertlab.panels.representation:RepresentationPanel"), ("Mask", "bertlab.panels.mask:MaskPanel"),
            ("Export", "bertlab.panels.export:ExportPanel"))
    app = App(state, tabs=tabs, first=0)
    app.open(1)
    export = app.open(2)
    app.tabs.selected_index = 2  # the student is on Export when the fine-tuned model is picked
    tuned = tiny_bert(tok, seed=1).with_heads(task="sequence_classification", id2label=SST2_LABELS)
    state.add("sst2 · full (accuracy=0.9)", tuned, tok, switch=True)
    export.folder.value = str(tmp_path)
    page, _ = export.lab_record()
    assert ">Model picked<" in page and f">{html.escape(state.name)}<" in page
    parts = _sections(page)
    for tab in ("Input", "Mask"):  # their figures are the offline default's: the record says so
        assert f"Made with <b>{html.escape(DEFAULT_NAME)}</b> (this tab last drew before" in parts[tab], tab
    app.tabs.selected_index = 1  # the Mask tab opened again: it draws the picked model now
    page, _ = export.lab_record()
    assert f"Made with <b>{html.escape(state.name)}</b>.</p>" in _sections(page)["Mask"]


def test_use_it_names_the_model_just_fine_tuned_for_its_figures(tok, tmp_path):
    from bertlab.panels.finetune import FinetunePanel

    base = tiny_bert(tok, seed=1)
    tuned = base.with_heads(task="sequence_classification", id2label=SST2_LABELS)
    panel = FinetunePanel(base, tok, runs_dir=tmp_path, device="cpu")
    assert panel.made_with() == {}
    panel.use.show_model(tuned, tok, "sst2 · full (accuracy=0.9)", before=base, task="sst2")
    assert panel.made_with() == {"class probabilities": "sst2 · full (accuracy=0.9)"}
    panel.set_model(tuned, tok)  # the same model picked above: the tab's own model, nothing to add
    assert panel.made_with() == {}
