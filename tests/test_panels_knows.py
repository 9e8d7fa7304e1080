"""What it knows tab without a browser: set widget values, click, wait for the background run, read the figures."""

from __future__ import annotations

import pytest

from bertlab.panels.app import TABS
from bertlab.panels.knows import KnowsPanel

CORPUS = [
    "I went to the bank to deposit money.",
    "We sat on the bank of the river.",
    "The bank raised its interest rates.",
    "She plays the violin in an orchestra.",
]


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


@pytest.fixture
def panel(default_model, tmp_path, monkeypatch):
    from bertlab.settings import data_dir

    if not (data_dir() / "ud_ewt").is_dir():
        pytest.skip("the shared data (BERTLAB_DATA) is not present")
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path))
    model, tok = default_model
    return KnowsPanel(model, tok, corpus=lambda: list(CORPUS))


def test_the_tab_is_in_the_app():
    assert ("What it knows", "bertlab.panels.knows:KnowsPanel") in TABS


def test_probes_and_the_tree(panel):
    for box in panel.properties:
        box.value = box.description.startswith(("part of speech", "tree"))
    panel.train_sentences.value, panel.eval_sentences.value = 20, 10
    panel.train_button.click()
    assert panel.job.running or panel.results
    assert panel.job.wait(600) and not notes(panel, "error"), panel.messages
    fig = panel.layers_box.children[0]
    names = [t.name for t in fig.data]
    assert "part of speech" in names and "part of speech: control task" in names and "tree (UUAS)" in names
    layers = panel.model.config.num_hidden_layers
    assert len(fig.data[0].y) == layers + 1 and all(0 <= v <= 1 for v in fig.data[0].y)
    assert len(panel.mix_box.children[0].data[0].y) == layers + 1
    assert set(panel.figures()) >= {"probes", "scalar mix"}
    assert panel.tree_sentence.options
    panel.tree_button.click()
    tree = panel.tree_box.children[0]
    assert tree.data and "gold" in tree.layout.title.text, panel.messages
    panel.tree_text.value = "the <b>cat</b> sat on the mat"
    panel.tree_button.click()
    words = panel.tree_box.children[0].data[-1].text
    assert "&lt;b&gt;cat&lt;/b&gt;" in words and not any("<b>" in w for w in words)


def test_cancel_stops_a_run(panel):
    for box in panel.properties:
        box.value = box.description.startswith("part of speech")
    panel.train_sentences.value = 3000
    panel.train_button.click()
    assert panel.cancel_button.disabled is False
    panel.cancel_button.click()
    assert panel.job.wait(300)
    assert "Cancelled" in notes(panel, "warning") and panel.train_button.disabled is False


def test_patching_grid_and_a_clear_message(panel):
    panel.patch_button.click()
    heat = panel.patch_box.children[0].data[0]
    assert heat.type == "heatmap" and len(heat.y) == panel.model.config.num_hidden_layers + 1
    word = panel.grid.inp.differing[0]  # the one word the two sentences differ in
    assert heat.z[0][word] == pytest.approx(1.0, abs=1e-3)
    panel.kind.value = "heads"
    panel.patch_button.click()
    assert len(panel.patch_box.children[0].data[0].y) == panel.model.config.num_attention_heads
    panel.corrupt.value = panel.corrupt.value.replace("Berlin is", "Frankfurt am Main is")
    panel.patch_button.click()
    assert "same number of pieces" in notes(panel, "error")
    assert panel.patch_box.children == () and "patching" not in panel.figures()  # the old grid is gone


def test_the_default_patching_pair_has_a_clean_answer_to_restore(panel):
    """On the offline default the clean run prefers the answer and the corrupted one the wrong word; else
    every recovery figure would be a ratio of meaningless numbers."""
    panel.patch_button.click()
    assert panel.grid.clean_diff > 0 > panel.grid.corrupt_diff, (panel.grid.clean_diff, panel.grid.corrupt_diff)
    assert panel.grid.warning is None and not notes(panel, "warning"), panel.messages


def test_patching_warns_when_the_clean_run_prefers_the_wrong_word(panel):
    mask = panel.tok.mask_token
    panel.clean.value = f"When John and Mary went to the store, Mary gave a drink to {mask}."
    panel.corrupt.value = f"When John and Mary went to the store, John gave a drink to {mask}."
    panel.answer.value, panel.wrong.value = "john", "mary"
    panel.patch_button.click()
    assert panel.grid.clean_diff < 0  # the offline default prefers "mary" here
    assert "does not prefer" in notes(panel, "warning") and "mean nothing" in notes(panel, "warning")
    panel.clean.value, panel.corrupt.value = panel.corrupt.value, panel.clean.value  # the corrupted one now helps
    panel.answer.value, panel.wrong.value = "mary", "john"
    panel.patch_button.click()
    assert panel.grid.clean_diff > 0 and "does not lower" in notes(panel, "warning"), panel.messages


def test_the_neuron_view_never_keeps_an_earlier_text(panel):
    """Long, then short, then empty: each time the view shows the new text, or says in its place why not."""
    panel.neuron_text.value = "The dog ran home."
    panel.neuron_button.click()
    first = panel.neuron_box.children[0]
    assert len(first.data[1].y) == len(panel.tok.encode("The dog ran home."))
    panel.neuron_text.value = "A much longer sentence about a cat that sat on a mat."
    panel.neuron_button.click()
    assert panel.neuron_box.children[0] is not first  # a new widget: plotly's front end cannot restyle it in place
    panel.neuron_text.value = " ".join(["word"] * 600)
    panel.neuron_button.click()
    shown = panel.neuron_box.children[0]
    assert "tokens" in notes(panel, "error") and not shown.data  # a message, not the old figure nor 512 rows
    assert "up to" in shown.layout.annotations[0].text
    panel.neuron_text.value = "A cat."
    panel.neuron_button.click()
    labels = list(panel.neuron_box.children[0].data[1].y)
    assert len(labels) == len(panel.tok.encode("A cat.")) and any("cat" in y for y in labels), labels
    assert not notes(panel, "error")
    panel.neuron_text.value = "   "
    panel.neuron_button.click()
    shown = panel.neuron_box.children[0]
    assert not shown.data and "empty" in shown.layout.annotations[0].text and "empty" in notes(panel, "error")


def test_most_of_the_input_unknown_is_said(panel):
    panel.neuron_text.value = "\U0001F600 \U0001F603 \U0001F604 cat"  # emoji: outside the vocabulary
    panel.neuron_button.click()
    assert panel.neuron_box.children[0].data and "Most of this input" in notes(panel, "warning"), panel.messages


def test_neuron_view_escapes_tokens(panel):
    panel.neuron_text.value = "a <b>bold</b> cat"
    panel.neuron_button.click()
    fig = panel.neuron_box.children[0]
    assert len(fig.data) == 4 and not notes(panel, "error")
    labels = list(fig.data[1].y)
    assert any("&lt;" in y for y in labels) and not any("<" in y for y in labels)


def test_neighbours(panel):
    panel.find_button.click()
    assert "Build the index" in notes(panel, "error")
    panel.build_button.click()
    assert panel.job.wait(120) and panel.index is not None, panel.messages
    panel.nb_text.value = CORPUS[1]
    panel.find_button.click()
    table = panel.nb_box.children[0].data[0]
    assert table.type == "table" and table.cells.values[0][0] == "bank"
    assert "<b>bank</b>" in table.cells.values[2][0] and "river" in table.cells.values[2][0]


def test_neighbour_cells_escape_the_sentence_but_bold_the_piece(default_model, tmp_path):
    from bertlab.analysis.neighbours import build_index, corpus_neighbours
    from bertlab.viz.knows import plot_neighbours

    model, tok = default_model
    corpus = ['He typed <a href="http://evil.example/">bank</a> & left.']
    index = build_index(model, tok, corpus, 3, folder=tmp_path)
    found = corpus_neighbours(model, tok, index, corpus[0], "bank", k=2)
    cells = plot_neighbours(found, "<b>bank</b>", "layer 2").data[0].cells.values[2]
    assert all("<a" not in c and "&lt;" in c for c in cells) and any("<b>bank</b>" in c for c in cells)
