"""The app shell without a browser: the model picker, the shared ModelState, lazy tabs, and the
wiring that makes every built tab follow the picker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.panels.app import TABS, App, panel_class
from bertlab.panels.picker import ModelPicker
from bertlab.panels.state import DEFAULT_NAME, ModelState
from bertlab.viz.picker import model_card

ATTENTION = ("Attention", "bertlab.panels.attention:AttentionPanel")
BROKEN = ("Broken", "bertlab.panels.no_such_module:Nothing")


@pytest.fixture
def state(default_model):
    return ModelState(*default_model)


def test_every_tab_names_an_importable_panel():
    for title, spec in TABS:
        cls = panel_class(spec)
        assert cls.title == title and cls.teaches, spec


def test_tabs_are_built_when_first_opened(state):
    app = App(state, tabs=(ATTENTION, ("Export", "bertlab.panels.export:ExportPanel")), first=0)
    assert list(app.panels) == ["Attention"]
    app.tabs.selected_index = 1
    assert list(app.panels) == ["Attention", "Export"]
    assert app.tabs.children[1].children == (app.panels["Export"].widget,)
    assert "Attention: heatmap" in app.figures()  # what Export offers


def test_a_broken_tab_shows_a_note_and_the_rest_works(state):
    app = App(state, tabs=(ATTENTION, BROKEN), first=0)
    app.tabs.selected_index = 1
    assert "could not open" in app.tabs.children[1].children[0].value
    assert list(app.panels) == ["Attention"]


def test_switching_model_updates_every_built_tab(state, tiny_checkpoints, tmp_path, monkeypatch):
    from bertlab.loading import load

    monkeypatch.chdir(tmp_path)  # no finished runs in the working folder: the picker lists the models alone

    app = App(state, tabs=(ATTENTION, ("Input", "bertlab.panels.representation:RepresentationPanel")), first=1)
    app.tabs.selected_index = 0
    tiny, tok = load(tiny_checkpoints["BertForPreTraining"])
    state.add("tiny", tiny, tok)
    assert app.picker.choice.options == (DEFAULT_NAME, "tiny") and state.name == DEFAULT_NAME
    app.picker.choice.value = "tiny"  # the student picks it
    assert state.name == "tiny" and state.model is tiny
    attention = app.panels["Attention"]
    assert attention.model is tiny and attention.layer.max == tiny.config.num_hidden_layers - 1
    assert "tiny" in app.picker.card.value and "2 layers" in app.picker.card.value
    app.picker.choice.value = DEFAULT_NAME
    assert attention.model is state.model and attention.layer.max == 5
    # the Input tab was built but hidden: it catches up when opened, not before
    app.picker.choice.value = "tiny"
    assert app.panels["Input"].model is not tiny
    app.tabs.selected_index = 1
    assert app.panels["Input"].model is tiny


def test_a_model_made_in_a_tab_joins_the_picker(state, tiny_checkpoints):
    from bertlab.loading import load

    app = App(state, tabs=(ATTENTION,), first=0)
    tiny, tok = load(tiny_checkpoints["BertForMaskedLM"])
    app.panels["Attention"].model_made("mini BERT (tiny, 8 steps)", tiny, tok)
    assert "mini BERT (tiny, 8 steps)" in app.picker.choice.options
    assert state.name == DEFAULT_NAME  # listed, not switched to
    assert "joined the model list" in app.picker.message.value
    again = state.add("mini BERT (tiny, 8 steps)", *load(tiny_checkpoints["BertForMaskedLM"]))
    assert again == "mini BERT (tiny, 8 steps) (2)"


def test_loading_from_a_folder_and_a_bad_folder(state, tiny_checkpoints, tmp_path):
    picker = ModelPicker(state)
    picker.source.value = str(tmp_path / "nothing-here")
    picker.load_button.click()
    assert picker.messages[0][0] == "error" and state.name == DEFAULT_NAME
    picker.source.value = ""
    picker.load_button.click()
    assert "Type a Hugging Face model name" in picker.messages[0][1]
    picker.source.value = str(tiny_checkpoints["BertModel"])
    picker.load_button.click()
    assert state.name == str(tiny_checkpoints["BertModel"]) and not state.model.has_mlm
    assert any("no MLM head / NSP or SOP head" in text for _, text in picker.messages)
    assert "✗ MLM head" in picker.card.value


def test_model_card_lists_heads(default_model, tiny_checkpoints):
    from bertlab.loading import load

    model, _ = default_model
    card = model_card(model, DEFAULT_NAME)
    assert "6 layers" in card and "384 wide" in card and "✓ MLM head" in card and "✓ NSP head" in card
    clf, _ = load(tiny_checkpoints["BertForSequenceClassification"])
    assert "✓ task head: sequence classification" in model_card(clf, "clf")
    clf.config.id2label = {0: "<b>bad</b>", 1: "good"}  # a checkpoint's labels are drawn as text, never as HTML
    card = model_card(clf, "<i>run</i>")
    assert "&lt;b&gt;bad&lt;/b&gt;, good" in card and "&lt;i&gt;run&lt;/i&gt;" in card and "<b>bad" not in card


def test_a_tab_not_built_yet_shows_a_busy_sign(state):
    """The first opening of a tab takes seconds; the browser shows the slot meanwhile."""
    app = App(state, tabs=(ATTENTION, ("Export", "bertlab.panels.export:ExportPanel")), first=0)
    waiting = app.tabs.children[1].children[0].value
    assert "bertlab-busy" in waiting and "Opening Export…" in waiting and "@keyframes" in waiting


TRAIN_IN_A_THREAD = '''
import threading, time, torch
from bertlab.loading import load
from bertlab.panels.state import ModelState
torch.set_num_threads(1)

def anon_mb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss_Anon:"):
            return int(line.split()[1]) / 1024

model, tok = load()
state = ModelState(model, tok)
made = []

def fine_tune():  # a few AdamW steps in a thread, as the training tabs run them
    clf = model.with_heads([], task="sequence_classification", id2label={0: "neg", 1: "pos"}).train()
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(1000, 30000, (16, 64), generator=g)
        clf(ids).logits.logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    made.append(clf.eval())

t = threading.Thread(target=fine_tune)
t.start()
t.join()
time.sleep(1.0)  # the thread's own exit frees what it can: not counted
before = anon_mb()
state.add("sst2 · full", made[0], tok)
print(before, anon_mb())
'''


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").is_file(), reason="reads smaps_rollup (Linux)")
def test_a_finished_runs_freed_memory_goes_back_when_its_model_joins(tmp_path):
    """glibc kept what a training thread freed (optimizer state, activations) in that thread's arena:
    the kernel stayed that much bigger after each fine-tune, although nothing used the memory."""
    out = subprocess.run([sys.executable, "-c", TRAIN_IN_A_THREAD], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = (float(x) for x in out.stdout.split()[-2:])
    assert before - after > 50, (before, after)


def test_follow_page_switches_on_the_address_and_redraws_on_a_resize_in_projector_mode():
    from bertlab.panels.page import follow_page
    from bertlab.viz import theme

    asked, redraws = [], []
    follow = lambda name, new: follow_page({"name": name, "new": new}, asked.append, lambda: redraws.append(1))  # noqa: E731
    try:
        theme.use(False)
        follow("query", "?projector=1")
        follow("query", "?other=1")  # says nothing about projector mode
        follow("width", 1200)  # the normal page does not redraw on a resize
        assert asked == [True] and redraws == []
        theme.use(True, page_width=900)
        follow("query", "?projector=1")  # already on
        follow("width", 920)  # less than 40 px: no redraw
        follow("width", 1200)
        assert asked == [True] and redraws == [1] and theme.current().page_width == 1200
    finally:
        theme.use(False)
