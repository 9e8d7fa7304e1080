"""Export tab without a browser: pick a figure, export it, read back the link and the saved file;
export attention views as offline pages and check the data they carry."""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime

import plotly.graph_objects as go
import pytest
import torch

import bertlab.panels.export as export_panel
from bertlab.analysis.attention import attention_patterns
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.panels.export import ExportPanel
from bertlab.viz import export
from bertlab.viz.attention_view import expand_attention
from bertlab.viz.export import remote_resources, static_export_problem

PARIS = "Paris is the capital of France."


class Tabs:
    """Stands in for the app: the figures on show, changeable by the test."""

    def __init__(self) -> None:
        self.shown: dict[str, go.Figure] = {
            "Mask: top-k": go.Figure(go.Bar(x=["paris", "lyon"], y=[0.75, 0.125])),
            "Attention: heatmap": go.FigureWidget(go.Heatmap(z=[[0.5, 0.5], [0.25, 0.75]])),
        }
        self.calls = 0

    def __call__(self) -> dict[str, go.Figure]:
        self.calls += 1
        return dict(self.shown)


@pytest.fixture
def tabs() -> Tabs:
    return Tabs()


@pytest.fixture
def panel(default_model, tabs, tmp_path) -> ExportPanel:
    model, tok = default_model
    return ExportPanel(model, tok, figures=tabs, folder=tmp_path / "exports")


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


def link_file(panel) -> tuple[str, str, bytes]:
    """(download name, mime, bytes) of the panel's download link."""
    m = re.search(r'<a download="([^"]+)" href="data:([^;]+);base64,([^"]+)"', panel.link.value)
    assert m, panel.link.value
    return m.group(1), m.group(2), base64.b64decode(m.group(3))


def page_state(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="bertlab-attention-state">(.*?)</script>', page, re.DOTALL)
    assert m
    return json.loads(m.group(1))


# -- figures ------------------------------------------------------------------------------------
def test_opens_with_the_figures_on_show_and_html_export_saves_and_links(panel, tabs, tmp_path):
    assert panel.title == "Export" and panel.figures() == {}
    assert panel.message in panel.widget.children and panel.link in panel.widget.children
    assert list(panel.choice.options) == ["Attention: heatmap", "Mask: top-k"]
    assert "2 figure(s)" in notes(panel, "info")
    panel.choice.value, panel.format.value = "Mask: top-k", "html"
    panel.export_button.click()
    name, mime, data = link_file(panel)
    assert (name, mime) == ("mask-top-k.html", "text/html")
    saved = tmp_path / "exports" / "mask-top-k.html"
    assert saved.read_bytes() == data
    assert str(saved) in notes(panel, "info")
    page = data.decode("utf-8")
    assert remote_resources(page) == [] and '"paris","lyon"' in page and "0.75" in page
    assert not panel.export_button.disabled


def test_export_reads_the_figure_as_it_is_now_and_keeps_earlier_files(panel, tabs, tmp_path):
    panel.clock = lambda: datetime(2026, 11, 24, 9, 12, 5)
    panel.choice.value, panel.format.value = "Attention: heatmap", "html"
    panel.export_button.click()
    tabs.shown["Attention: heatmap"].data[0].z = [[0.875, 0.125], [1.0, 0.0]]  # the tab redrew its widget
    panel.export_button.click()
    first = tmp_path / "exports" / "attention-heatmap.html"
    second = tmp_path / "exports" / "attention-heatmap_2026-11-24_091205.html"
    assert "0.875" not in first.read_text() and "0.875" in second.read_text()
    assert link_file(panel)[2] == second.read_bytes()


def test_a_repeated_export_downloads_under_the_name_it_is_announced_and_saved_with(panel, tmp_path):
    """A file renamed "-2" in the folder was announced under the new name but downloaded
    under the old one (and the browser then renamed it again). Each download now has its own
    meaningful name, the saved copy's, the one the note gives."""
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "mask-top-k.html").write_text("from an earlier session")
    times = iter([datetime(2026, 11, 24, 9, 12, 5), datetime(2026, 11, 24, 9, 12, 5), datetime(2026, 11, 24, 9, 13)])
    panel.clock = lambda: next(times)
    panel.choice.value, panel.format.value = "Mask: top-k", "html"
    names = []
    for _ in range(3):
        panel.export_button.click()
        name, _, data = link_file(panel)
        assert (tmp_path / "exports" / name).read_bytes() == data  # the download is the saved copy ...
        assert f"exports/{name};" in notes(panel, "info")  # ... under the name the note gives
        names.append(name)
    assert names == ["mask-top-k_2026-11-24_091205.html", "mask-top-k_2026-11-24_091205-2.html",
                     "mask-top-k_2026-11-24_091300.html"]  # "-2" only for two in the same second
    assert (tmp_path / "exports" / "mask-top-k.html").read_text() == "from an earlier session"


def test_a_name_already_downloaded_gets_the_time_even_when_the_folder_cannot_keep_copies(panel, tmp_path,
                                                                                         monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    panel.folder.value = "a-file"
    panel.clock = lambda: datetime(2026, 11, 24, 9, 12, 5)
    panel.choice.value, panel.format.value = "Mask: top-k", "html"
    panel.export_button.click()
    panel.export_button.click()
    assert link_file(panel)[0] == "mask-top-k_2026-11-24_091205.html"
    warning = notes(panel, "warning")
    assert "Made mask-top-k_2026-11-24_091205.html. Could not save it in the folder" in warning
    assert "in the way" in warning and "Errno" not in warning


def test_refresh_lists_new_figures_and_keeps_the_pick(panel, tabs):
    panel.choice.value = "Mask: top-k"
    tabs.shown["Next sentence: probabilities"] = go.Figure(go.Bar(y=[0.5]))
    panel.refresh_button.click()
    assert list(panel.choice.options) == ["Attention: heatmap", "Mask: top-k", "Next sentence: probabilities"]
    assert panel.choice.value == "Mask: top-k" and "3 figure(s)" in notes(panel, "info")


def test_a_figure_gone_from_its_tab_asks_for_refresh(panel, tabs):
    panel.choice.value = "Mask: top-k"
    del tabs.shown["Mask: top-k"]
    panel.export_button.click()
    assert "no longer on show: press Refresh" in notes(panel, "error")
    assert panel.link.value == ""


def test_no_figures_yet_says_where_they_come_from(default_model, tmp_path):
    model, tok = default_model
    panel = ExportPanel(model, tok, figures=dict, folder=tmp_path)
    assert panel.choice.options == () and "open a tab that draws one" in notes(panel, "info")
    panel.export_button.click()
    assert "no figure to export yet" in notes(panel, "error")


def test_standalone_panel_still_exports_attention_views(default_model, tmp_path):
    model, tok = default_model
    panel = ExportPanel(model, tok, folder=tmp_path)
    assert panel.choice.disabled and "attention view export works" in notes(panel, "info")
    panel.view_button.click()
    assert link_file(panel)[0].startswith("attention-the-animal") and not notes(panel, "error")


@pytest.mark.skipif(static_export_problem() is not None, reason=str(static_export_problem()))
def test_svg_export_through_the_panel_is_a_real_svg(panel, tmp_path):
    panel.choice.value, panel.format.value = "Mask: top-k", "svg"
    panel.export_button.click()
    name, mime, data = link_file(panel)
    assert (name, mime) == ("mask-top-k.svg", "image/svg+xml")
    assert re.match(rb"\s*(<\?xml[^>]*>\s*)?<svg\b", data)
    assert (tmp_path / "exports" / name).read_bytes() == data
    assert not notes(panel, "warning") and not notes(panel, "error")


def test_png_without_kaleido_explains_and_gives_html_instead(panel, monkeypatch, tmp_path):
    why = "PNG and SVG need the kaleido package (pip install 'kaleido>=1'), which is not installed."
    monkeypatch.setattr(export, "static_export_problem", lambda: why)
    monkeypatch.setattr(export_panel, "static_export_problem", lambda: why)
    panel.refresh_button.click()
    assert why in notes(panel, "warning") and "HTML export works" in notes(panel, "warning")
    panel.choice.value, panel.format.value = "Mask: top-k", "png"
    panel.export_button.click()
    assert why in notes(panel, "warning") and "Here is the HTML" in notes(panel, "warning")
    name, mime, data = link_file(panel)
    assert (name, mime) == ("mask-top-k.html", "text/html") and b"0.75" in data
    assert (tmp_path / "exports" / "mask-top-k.html").is_file()


def test_a_folder_that_cannot_be_written_still_gives_the_link(panel, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    panel.folder.value = "a-file"
    panel.choice.value, panel.format.value = "Mask: top-k", "html"
    panel.export_button.click()
    assert "Could not save it in the folder" in notes(panel, "warning") and "Errno" not in notes(panel, "warning")
    assert link_file(panel)[0] == "mask-top-k.html"


# -- attention views ---------------------------------------------------------------------------
def test_attention_view_page_is_offline_and_carries_the_models_attention(panel, tmp_path):
    panel.text_a.value, panel.text_b.value = PARIS, "It is big."
    panel.view_button.click()
    name, mime, data = link_file(panel)
    assert (name, mime) == ("attention-paris-is-the-capital-of-france.html", "text/html")
    page = data.decode("utf-8")
    assert remote_resources(page) == []
    assert not re.search(r"""<(script|link)\b[^>]*(src|href)=["']?(https?:)?//""", page, re.IGNORECASE)
    assert "<title>Attention: Paris is the capital of France. / It is big.</title>" in page
    state = page_state(page)
    expected = attention_patterns(panel.model, panel.tok, PARIS, "It is big.", max_length=panel.max_length)
    assert state["tokens"] == expected.tokens and state["sentence_b_start"] == expected.sentence_b_start == 9
    assert state["shape"] == [6, 12, len(expected.tokens), len(expected.tokens)]
    weights = expand_attention(base64.b64decode(state["data"]), state["shape"], state["scale"])
    torch.testing.assert_close(weights, expected.patterns, atol=1 / 500, rtol=0)
    assert (tmp_path / "exports" / name).read_bytes() == data
    assert f"{len(expected.tokens)} tokens (sentence B from token 9); 6 layers × 12 heads" in notes(panel, "info")


@pytest.mark.parametrize(("a", "b", "level", "says"), [
    ("", "", "error", "The text is empty"),
    ("   ", "It is big.", "error", "The text is empty"),
    ("word " * 600, "", "warning", "only 128 fit"),
    ("東京は日本の首都です。", "", "info", "tokens"),
    ("I love pizza 🍕🍕", "", "warning", "[UNK]"),
    ("[MASK]", "", "info", "3 tokens"),
    (PARIS, "   ", "info", "9 tokens;"),
])
def test_attention_view_odd_inputs_give_messages_not_tracebacks(panel, a, b, level, says):
    panel.text_a.value, panel.text_b.value = a, b
    panel.view_button.click()
    assert says in notes(panel, level), panel.messages
    if level == "error":
        assert panel.link.value == ""
    else:
        state = page_state(link_file(panel)[2].decode("utf-8"))
        assert len(state["tokens"]) <= 128 and state["sentence_b_start"] is None
    assert not panel.view_button.disabled


def test_set_model_makes_attention_views_with_the_new_model(panel):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=panel.tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    panel.set_model(Bert(cfg).eval(), panel.tok)
    panel.text_a.value = PARIS
    panel.view_button.click()
    state = page_state(link_file(panel)[2].decode("utf-8"))
    assert state["shape"][:2] == [2, 4]  # the tiny model's layers x heads
    assert list(panel.choice.options) == ["Attention: heatmap", "Mask: top-k"]


# -- where files go in one-person mode ------------------------------------------------------------
@pytest.mark.parametrize("typed", ["{outside}", "../../", "../../up", "<b>x</b>", "~/x", "exports/<i>"])
def test_the_lab_record_and_exports_stay_inside_the_working_folder(default_model, tabs, tmp_path, monkeypatch, typed):
    """One-person mode wrote the record to /etc (the server ran as root), `../../` reached two folders
    above, and `<b>x</b>` made folders `<b>x<` and `b>`: a typed folder is now a plain one inside."""
    work = tmp_path / "home" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    outside = tmp_path / "outside"
    outside.mkdir()
    panel = ExportPanel(*default_model, figures=tabs)
    panel.folder.value = typed.format(outside=outside)
    before = sorted(tmp_path.rglob("*"))
    panel.record_button.click()
    panel.choice.value, panel.format.value = "Mask: top-k", "html"
    panel.export_button.click()
    assert sorted(tmp_path.rglob("*")) == before  # nothing written anywhere
    error = notes(panel, "error")
    assert "not a plain folder name inside the working folder" in error and panel.link.value == ""


def test_a_plain_folder_inside_the_working_folder_gets_the_record(default_model, tabs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    panel = ExportPanel(*default_model, figures=tabs)
    panel.folder.value = "exports/week-1"
    panel.student.value = "<b>Ada</b>"
    panel.record_button.click()
    assert [p.name for p in (tmp_path / "exports" / "week-1").iterdir()] == ["lab-record-b-ada-b.html"]


def test_a_link_out_of_the_working_folder_is_refused(default_model, tabs, tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "work" / "out").symlink_to(tmp_path / "outside")
    monkeypatch.chdir(tmp_path / "work")
    panel = ExportPanel(*default_model, figures=tabs)
    panel.folder.value = "out"
    panel.record_button.click()
    assert "leads outside the working folder" in notes(panel, "error") and not list((tmp_path / "outside").iterdir())
