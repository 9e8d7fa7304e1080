"""Each student in a sandbox, through the panels as a student uses them, without a
browser: every field that takes a path refuses what lies outside the student's workspace and
the class data with one message that quotes no file and does not say whether the path exists;
the Export tab writes nothing outside the workspace; two runs started in the same second keep
their own folders. One-person mode keeps free paths."""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from pathlib import Path

import plotly.graph_objects as go
import pytest
from tiny_models import tiny_bert

from bertlab.loading import save_pretrained
from bertlab.panels.export import ExportPanel
from bertlab.panels.finetune import FinetunePanel
from bertlab.panels.picker import ModelPicker
from bertlab.panels.pretrain import FALLBACK_DOCUMENTS, PretrainPanel
from bertlab.panels.state import ModelState
from bertlab.workspace import REFUSED, Workspace

pytestmark = pytest.mark.usefixtures("one_thread")

PASSWD_LINE = "root:x:0:0"  # the first line of /etc/passwd
SST2 = "sentence\tlabel\n" + "".join(f"{w} film number {i}\t{i % 2}\n" for i, w in enumerate(["dull", "great"] * 10))


@pytest.fixture
def classroom(monkeypatch, tmp_path) -> dict[str, Path]:
    """Class mode: workspaces, class data (a small SST-2), a teacher's model folder, an outside
    folder with a secret, and a working folder (where one-person mode would write)."""
    dirs = {name: tmp_path / name for name in ("workspaces", "data", "teacher", "outside", "cwd")}
    for d in dirs.values():
        d.mkdir()
    (dirs["data"] / "sst2").mkdir()
    for split in ("train", "dev"):
        text = SST2 if split == "train" else SST2.replace("film", "play")  # dev: sentences of its own
        (dirs["data"] / "sst2" / f"{split}.tsv").write_text(text, encoding="utf-8")
    (dirs["outside"] / "secret.tsv").write_text(f"{PASSWD_LINE}:secret\t1\n", encoding="utf-8")
    monkeypatch.setenv("BERTLAB_CLASS", "1")
    monkeypatch.setenv("BERTLAB_WORKSPACES", str(dirs["workspaces"]))
    monkeypatch.setenv("BERTLAB_DATA", str(dirs["data"]))
    monkeypatch.setenv("BERTLAB_ALLOW_MODELS", str(dirs["teacher"]))
    monkeypatch.chdir(dirs["cwd"])
    return dirs


@pytest.fixture
def escapes(classroom) -> list[str]:
    """What a curious student types: server files and folders, `..`, and links out of the workspace."""
    ws = Workspace.for_session()
    (ws.uploads / "link.tsv").symlink_to("/etc/passwd")
    (ws.uploads / "linked-folder").symlink_to(classroom["outside"], target_is_directory=True)
    return ["/etc/passwd", "/", "../../etc", "../../etc/passwd", "/etc", "/no/such/folder",
            str(classroom["outside"] / "secret.tsv"), "uploads/link.tsv", "uploads/linked-folder",
            "uploads/linked-folder/secret.tsv", "sst2/../../outside/secret.tsv"]


def errors(messages) -> str:
    return " ".join(text for level, text in messages if level == "error")


def all_text(panel) -> str:
    """Everything the panel shows in its message lines (HTML included)."""
    parts = [panel.message.value] + [getattr(panel, name).value for name in ("run_message", "data_note",
                                                                              "progress_text") if hasattr(panel, name)]
    return " ".join(parts)


def upload(panel, name: str, content: bytes) -> None:
    panel.upload.value = ({"name": name, "type": "text/plain", "size": len(content),
                           "content": memoryview(content), "last_modified": datetime.datetime.now()},)


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------------
# Fine-tuning: the data path field, uploads
# ---------------------------------------------------------------------------------------------
def test_finetune_path_field_refuses_server_files_with_one_message(classroom, escapes, tok):
    panel = FinetunePanel(tiny_bert(tok), tok, device="cpu")
    panel.task.value = "nli"  # the task whose error quoted /etc/passwd's first line
    for text in escapes:
        panel.path.value = text
        panel.start_button.click()
        assert panel.job.wait(30)
        assert errors(panel.messages) == REFUSED["data"], text
        assert PASSWD_LINE not in all_text(panel) and "secret" not in all_text(panel)
    assert not panel.runs  # refused before any run (or run folder) was made


def test_a_start_past_the_students_share_says_so_and_makes_nothing(classroom, tok, monkeypatch):
    monkeypatch.setenv("BERTLAB_WORKSPACE_MB", "100")  # less than a run needs while it trains
    panel = FinetunePanel(tiny_bert(tok), tok, device="cpu")
    panel.start_button.click()
    assert panel.job.wait(30) and not panel.runs
    assert errors(panel.messages).startswith("Your workspace holds ") and "ask your teacher" in errors(panel.messages)
    assert not list(Workspace.for_session().runs.iterdir())


def test_finetune_reads_the_class_data_and_the_students_own_files(classroom, tok):
    panel = FinetunePanel(tiny_bert(tok), tok, device="cpu")
    panel.path.value = "sst2"  # relative: the class data folder
    assert len(panel.dev_examples("sst2")) == 20
    ws = Workspace.for_session()
    (ws.uploads / "mine.tsv").write_text(SST2, encoding="utf-8")
    panel.path.value = "uploads/mine.tsv"
    assert len(panel.dev_examples("sst2")) == 2  # a single file: 10 % held out as dev


def test_uploads_go_to_the_workspace_and_are_size_limited(classroom, tok, monkeypatch):
    monkeypatch.setenv("BERTLAB_UPLOAD_MAX_MB", "0.001")  # 1 048 bytes
    panel = FinetunePanel(tiny_bert(tok), tok, device="cpu")
    ws = Workspace.for_session()
    upload(panel, "../../big.tsv", b"x" * 2000)
    assert "That file is 1.95 kB; uploads are limited to 1.02 kB here" in errors(panel.messages)
    assert panel.data.value == "default" and not files_under(classroom["workspaces"])
    upload(panel, "../../reviews.tsv", SST2.encode())
    assert not errors(panel.messages) and panel.data.value == "upload"
    assert files_under(classroom["workspaces"]) == {ws.uploads / "reviews.tsv"}
    assert not files_under(classroom["cwd"])


def test_two_runs_started_in_the_same_second_keep_their_own_folders(tmp_path, tok, monkeypatch):
    """One-person mode (two tabs of one server share the runs folder): each run gets a new folder."""
    monkeypatch.delenv("BERTLAB_CLASS", raising=False)
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-120000")
    go_on = threading.Event()
    seen = []

    def fake_finetune(cfg, **kwargs):
        go_on.wait(30)  # both runs have started before either writes anything
        Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)  # as finetune does when it saves
        (Path(cfg.out_dir) / "model.safetensors").write_text(str(cfg.lr))
        seen.append(cfg.out_dir)
        raise ValueError("stopped by the test")

    monkeypatch.setattr("bertlab.panels.finetune.finetune", fake_finetune)
    runs = tmp_path / "runs"
    panels = [FinetunePanel(tiny_bert(tok), tok, runs_dir=runs, device="cpu") for _ in range(2)]
    (tmp_path / "data.tsv").write_text(SST2, encoding="utf-8")
    for panel, lr in zip(panels, (1e-3, 2e-3)):  # the same task and mode: only the learning rate differs
        panel.path.value, panel.lr.value = str(tmp_path / "data.tsv"), lr  # one-person mode: a free path
        panel.start_button.click()
    go_on.set()
    assert all(p.job.wait(30) for p in panels)
    first, second = (Path(d) for d in sorted(seen))
    assert first != second and first.parent == second.parent == runs
    assert {(first / "model.safetensors").read_text(), (second / "model.safetensors").read_text()} == {"0.001",
                                                                                                      "0.002"}


def test_class_runs_go_to_the_students_own_workspace(classroom, tok, monkeypatch):
    seen = []

    def fake_finetune(cfg, **kwargs):
        seen.append(Path(cfg.out_dir))
        (Path(cfg.out_dir) / "train.log").write_text("started")  # a run that wrote something keeps its folder
        raise ValueError("stopped by the test")

    monkeypatch.setattr("bertlab.panels.finetune.finetune", fake_finetune)
    panel = FinetunePanel(tiny_bert(tok), tok, device="cpu")
    panel.start_button.click()  # the class data (BERTLAB_DATA)
    assert panel.job.wait(30) and "stopped by the test" in errors(panel.messages)
    out = seen[0]
    assert out.parent == Workspace.for_session().runs and out.is_dir()
    assert not files_under(classroom["cwd"]) and not (classroom["cwd"] / "bertlab-runs").exists()


# ---------------------------------------------------------------------------------------------
# Pre-training: the "or a file" field
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def corpus_calls(monkeypatch) -> list[str]:
    """Stands in for load_corpus: records what the run would read (nothing is walked)."""
    calls: list[str] = []

    def fake(name, split="train", **kwargs):
        calls.append(str(name))
        raise ValueError("stopped by the test")

    monkeypatch.setattr("bertlab.training.corpora.load_corpus", fake)  # what read_corpus reads with
    return calls


def pretrain_panel(tok) -> PretrainPanel:
    panel = PretrainPanel(tiny_bert(tok), tok, pair_documents=FALLBACK_DOCUMENTS)
    panel.steps.value = 1
    return panel


def test_pretrain_file_field_refuses_server_files(classroom, escapes, tok, corpus_calls):
    panel = pretrain_panel(tok)
    for text in escapes:
        panel.corpus_path.value = text
        panel.start.click()
        assert panel.job.wait(30)
        assert errors(panel.run_messages) == REFUSED["data"], text
        assert PASSWD_LINE not in panel.run_message.value
    assert corpus_calls == []  # "/" never walked


def test_pretrain_reads_a_text_file_of_the_students_workspace(classroom, tok, corpus_calls):
    panel = pretrain_panel(tok)
    mine = Workspace.for_session().uploads / "my text.txt"
    mine.write_text("One sentence here. Another one there.\n", encoding="utf-8")
    panel.corpus_path.value = "uploads/my text.txt"
    panel.start.click()
    assert panel.job.wait(30) and corpus_calls == [str(mine)]


def test_one_person_mode_keeps_free_paths(monkeypatch, tmp_path, tok, corpus_calls):
    monkeypatch.delenv("BERTLAB_CLASS", raising=False)
    anywhere = tmp_path / "anywhere"
    anywhere.mkdir()
    (anywhere / "reviews.tsv").write_text(SST2, encoding="utf-8")
    finetune = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path / "runs", device="cpu")
    finetune.path.value = str(anywhere / "reviews.tsv")
    assert len(finetune.dev_examples("sst2")) == 2
    pretrain = pretrain_panel(tok)
    pretrain.corpus_path.value = str(anywhere)
    pretrain.start.click()
    assert pretrain.job.wait(30) and corpus_calls == [str(anywhere)]
    export = ExportPanel(tiny_bert(tok), tok, figures=lambda: {"Mask: top": go.Figure(go.Bar(y=[1]))})
    assert export.folder in export.widget.children
    monkeypatch.chdir(anywhere)  # exports go to a folder inside the working one, as typed
    export.folder.value = "exports"
    export.format.value = "html"
    export.export_button.click()
    assert (anywhere / "exports" / "mask-top.html").is_file()


# ---------------------------------------------------------------------------------------------
# The model picker
# ---------------------------------------------------------------------------------------------
def test_picker_refuses_server_folders_without_telling_which_exist(classroom, escapes, tok):
    picker = ModelPicker(ModelState(tiny_bert(tok), tok))
    seen = set()
    for text in [*escapes, "bert-base-uncased", "org/not-in-the-cache"]:
        picker.source.value = text
        picker.load_button.click()
        seen.add(errors(picker.messages))
    assert seen == {REFUSED["model"]}  # /etc (exists) and /no/such/folder (does not) read the same
    assert list(picker.state.entries) == ["offline default (MiniLM-L6)"]


def test_picker_loads_the_students_runs_and_the_teachers_folders(classroom, tok):
    ws = Workspace.for_session()
    run = ws.new_run_dir("sst2-full")
    save_pretrained(tiny_bert(tok, seed=1), tok, run)
    save_pretrained(tiny_bert(tok, seed=2), tok, classroom["teacher"] / "class-bert")
    picker = ModelPicker(ModelState(tiny_bert(tok), tok))
    for text in (ws.shown(run), str(classroom["teacher"] / "class-bert")):
        picker.source.value = text
        picker.load_button.click()
        assert not errors(picker.messages), errors(picker.messages)
        assert picker.state.name == text
    other = Workspace.new()  # another student's session cannot load this student's run
    picker = ModelPicker(ModelState(tiny_bert(tok), tok), workspace=other)
    for text in (str(run), f"../{ws.root.name}/{ws.shown(run)}"):
        picker.source.value = text
        picker.load_button.click()
        assert errors(picker.messages) == REFUSED["model"]


# ---------------------------------------------------------------------------------------------
# Export: downloads only, nothing written outside the workspace
# ---------------------------------------------------------------------------------------------
def test_export_in_class_mode_has_no_folder_and_writes_only_in_the_workspace(classroom, tok):
    figure = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    panel = ExportPanel(tiny_bert(tok), tok, figures=lambda: {"Mask: top": figure})
    assert panel.folder not in panel.widget.children  # no folder field in class mode
    panel.folder.value = str(classroom["outside"] / "made-here")  # even if set, it is not used
    panel.format.value = "html"
    panel.export_button.click()
    panel.text_a.value = "The cat sat on the mat."
    panel.view_button.click()
    assert not errors(panel.messages)
    assert re.match(r'<a download="[a-z0-9-]+\.html" href="data:text/html;base64,', panel.link.value)
    assert not (classroom["outside"] / "made-here").exists()
    assert not files_under(classroom["cwd"]) and not files_under(classroom["outside"]) - {
        classroom["outside"] / "secret.tsv"}
    ws = Workspace.for_session()
    assert {p.parent for p in files_under(classroom["workspaces"])} == {ws.exports}
    shown = " ".join(text for _, text in panel.messages)
    assert str(ws.root) not in shown and os.sep + "exports" not in shown  # no server path to guess


def test_every_tab_of_a_page_shares_one_workspace(classroom, tok):
    model = tiny_bert(tok)
    panels = [FinetunePanel(model, tok, device="cpu"), pretrain_panel(tok), ExportPanel(model, tok),
              ModelPicker(ModelState(model, tok))]
    assert len({id(p.workspace) for p in panels}) == 1 and panels[0].workspace.confined
