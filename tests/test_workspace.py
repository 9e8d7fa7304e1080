"""The per-student workspace of class mode (bertlab.workspace) and its settings, without panels:
a private folder per session, one gate for typed paths (realpath, so neither `..` nor a symlink
leads out, and one message whether the path exists or not), unique run folders, upload limits."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tiny_models import tiny_bert

from bertlab import settings
from bertlab.training.checkpoint import save_model_atomically
from bertlab.workspace import REFUSED, NoRoomForRun, PathNotAllowed, UploadTooLarge, Workspace

SECRET = "root:x:0:0"  # the first line of /etc/passwd: must never reach a message


@pytest.fixture
def classroom(monkeypatch, tmp_path) -> dict[str, Path]:
    """Class mode with its own workspaces root, data folder, teacher's model folder and hub cache."""
    dirs = {name: tmp_path / name for name in ("workspaces", "data", "teacher", "hub", "elsewhere")}
    for d in dirs.values():
        d.mkdir()
    (dirs["data"] / "sst2").mkdir()
    (dirs["data"] / "sst2" / "train.tsv").write_text("sentence\tlabel\ngood\t1\n", encoding="utf-8")
    (dirs["elsewhere"] / "secret.txt").write_text(f"{SECRET}:/root\n", encoding="utf-8")
    (dirs["hub"] / "models--org--cached" / "snapshots" / "abc").mkdir(parents=True)
    monkeypatch.setenv("BERTLAB_CLASS", "1")
    monkeypatch.setenv("BERTLAB_WORKSPACES", str(dirs["workspaces"]))
    monkeypatch.setenv("BERTLAB_DATA", str(dirs["data"]))
    monkeypatch.setenv("BERTLAB_ALLOW_MODELS", os.pathsep.join([str(dirs["teacher"]), str(tmp_path / "also")]))
    monkeypatch.setattr("bertlab.settings.hub_cache_dir", lambda: dirs["hub"])
    return dirs


def refused(ws: Workspace, text: str, kind: str = "data") -> str:
    with pytest.raises(PathNotAllowed) as info:
        ws.resolve(text, kind)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------
def test_class_settings_read_their_variables(monkeypatch, tmp_path):
    for off in ("", "0", "no"):
        monkeypatch.setenv("BERTLAB_CLASS", off)
        assert not settings.class_mode()
    monkeypatch.setenv("BERTLAB_CLASS", "1")
    assert settings.class_mode()
    monkeypatch.setenv("BERTLAB_WORKSPACES", str(tmp_path / "ws"))
    assert settings.workspaces_dir() == tmp_path / "ws"
    monkeypatch.setenv("BERTLAB_ALLOW_MODELS", f"{tmp_path / 'a'}{os.pathsep}{os.pathsep}{tmp_path / 'b'}")
    assert settings.allowed_model_dirs() == [tmp_path / "a", tmp_path / "b"]
    monkeypatch.delenv("BERTLAB_UPLOAD_MAX_MB", raising=False)
    assert settings.upload_max_bytes() == 20 * 2**20
    monkeypatch.setenv("BERTLAB_UPLOAD_MAX_MB", "0.5")
    assert settings.upload_max_bytes() == 2**19
    monkeypatch.setenv("BERTLAB_UPLOAD_MAX_MB", "lots")
    with pytest.raises(ValueError, match="BERTLAB_UPLOAD_MAX_MB must be a number"):
        settings.upload_max_bytes()


# ---------------------------------------------------------------------------------------------
# the private folder
# ---------------------------------------------------------------------------------------------
def test_each_session_gets_a_private_unguessable_folder(classroom):
    ws = Workspace.for_session()
    assert ws.confined and Workspace.for_session() is ws  # every tab of the page shares it
    runs = ws.runs  # made on first use
    assert ws.root.parent == classroom["workspaces"].resolve() and runs == ws.root / "runs"
    for folder in (ws.root, ws.runs, ws.uploads, ws.exports):
        assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    token = ws.root.name.split("-", 1)[1]
    assert len(token) >= 24  # secrets.token_urlsafe(18): 144 random bits
    other = Workspace.new()
    other.make()
    assert other.root != ws.root and other.root.parent == ws.root.parent


def test_one_person_mode_keeps_free_paths_and_the_old_folders(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTLAB_CLASS", raising=False)
    ws = Workspace.for_session()
    assert not ws.confined and ws.root is None
    assert ws.runs == Path("bertlab-runs") and ws.exports == Path("bertlab-exports")
    assert ws.resolve("/etc/passwd") == Path("/etc/passwd")
    assert ws.resolve("~/x") == Path.home() / "x"
    assert ws.model_source("/any/folder") == "/any/folder"
    ws.check_upload(10**12)  # no size limit for one person


# ---------------------------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------------------------
def test_paths_inside_the_workspace_and_the_class_data_are_accepted(classroom):
    ws = Workspace.for_session()
    mine = ws.uploads / "mine.tsv"
    mine.write_text("x\t1\n", encoding="utf-8")
    data = classroom["data"].resolve()
    assert ws.resolve(str(mine)) == mine
    assert ws.resolve("uploads/mine.tsv") == mine  # relative: the workspace first
    assert ws.resolve("sst2") == data / "sst2"  # then the class data
    assert ws.resolve(str(classroom["data"] / "sst2" / "train.tsv")) == data / "sst2" / "train.tsv"
    assert ws.resolve("uploads/../uploads/mine.tsv") == mine
    assert ws.resolve("uploads/not-yet.tsv") == ws.uploads / "not-yet.tsv"  # inside: it may say "missing"


def test_everything_else_gets_one_message_that_does_not_say_whether_it_exists(classroom):
    ws = Workspace.for_session()
    (ws.uploads / "out.tsv").symlink_to("/etc/passwd")
    (ws.uploads / "etc").symlink_to("/etc", target_is_directory=True)
    (ws.uploads / "secret.txt").symlink_to(classroom["elsewhere"] / "secret.txt")
    other = Workspace.new()
    (other.uploads / "theirs.tsv").write_text("x\t1\n", encoding="utf-8")
    typed = ["/etc/passwd", "/", "../../etc", "../../etc/passwd", "/no/such/file", "~", "~/.ssh",
             "uploads/out.tsv", "uploads/etc/passwd", "uploads/secret.txt", str(classroom["elsewhere"]),
             str(other.uploads / "theirs.tsv"), f"../{other.root.name}/uploads/theirs.tsv",
             "sst2/../../elsewhere/secret.txt", "uploads/\x00x", str(classroom["teacher"])]
    messages = {refused(ws, text) for text in typed}
    assert messages == {REFUSED["data"]}  # one message for all: existing or not, file or folder
    assert SECRET not in REFUSED["data"] and "/" not in REFUSED["data"]


def test_models_may_also_come_from_the_teachers_folders_and_the_hub_cache(classroom):
    ws = Workspace.for_session()
    teacher = classroom["teacher"].resolve()
    (teacher / "bert-class").mkdir()
    assert ws.resolve(str(teacher / "bert-class"), "model") == teacher / "bert-class"
    assert ws.model_source(str(teacher / "bert-class")) == str(teacher / "bert-class")
    assert ws.model_source("org/cached") == "org/cached"  # in the hub cache: load() finds it there
    run = ws.new_run_dir("sst2-full")
    assert ws.model_source(ws.shown(run)) == str(run)  # "runs/..." as the Fine-tuning tab names it
    from bertlab import loading, settings

    assert set(settings.BUILT_IN_MODELS) == {"default", loading.DEFAULT_MODEL, loading.DEFAULT_ENCODER}
    for built_in in settings.BUILT_IN_MODELS:  # shipped with bertlab: loadable by name in class mode
        assert ws.model_source(f" {built_in} ") == built_in
    for text in ("default-encoder/../../etc", "org/not-cached", "bert-base-uncased", "/etc", "/", "../../etc"):
        with pytest.raises(PathNotAllowed) as info:
            ws.model_source(text)
        assert str(info.value) == REFUSED["model"], text


def test_two_runs_in_the_same_second_get_their_own_new_folders(classroom, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-120000")
    ws = Workspace.for_session()
    made: list[Path] = []
    lock = threading.Lock()

    def start() -> None:
        path = ws.new_run_dir("sst2-full")
        (path / "mine").write_text(path.name)
        with lock:
            made.append(path)

    threads = [threading.Thread(target=start) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 20 and all(p.parent == ws.runs for p in made)
    assert all(p.name.startswith("20260101-120000-sst2-full-") for p in made)
    assert all((p / "mine").read_text() == p.name for p in made)  # nothing overwritten
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in made)


def test_uploads_over_the_class_limit_are_refused_with_the_numbers(classroom, monkeypatch):
    monkeypatch.setenv("BERTLAB_UPLOAD_MAX_MB", "1")
    ws = Workspace.for_session()
    ws.check_upload(2**20)
    with pytest.raises(UploadTooLarge, match=r"That file is 3 MB; uploads are limited to 1 MB here"):
        ws.check_upload(3 * 2**20)


def test_messages_show_paths_relative_to_the_workspace(classroom):
    ws = Workspace.for_session()
    run = ws.new_run_dir("nli-adapter")
    assert ws.shown(run) == f"runs/{run.name}" and ws.shown("/somewhere/else") == "/somewhere/else"
    assert ws.hide_root(f"{run} has no config.json") == f"runs/{run.name} has no config.json"
    assert str(ws.root) not in ws.hide_root(f"cannot read {ws.root}")


def test_a_finished_run_folder_stays_private(classroom, tok):
    """A model saved into a run folder (through a staged folder renamed into place) keeps the folder's 0700."""
    ws = Workspace.for_session()
    folder = ws.new_run_dir("sst2-full")
    model = tiny_bert(tok)
    save_model_atomically(model, tok, folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and (folder / "config.json").is_file()
    fresh = classroom["elsewhere"] / "mine"  # a new folder outside any workspace: the umask's mode
    save_model_atomically(model, tok, fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o777 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# Room for a run
# ---------------------------------------------------------------------------------------------
def test_a_run_past_the_students_share_is_refused_before_anything_is_made(classroom, monkeypatch):
    """In class mode 30 students could fill the disk in a lesson: each workspace has a share, and a Start
    that would go past it says so (what is used, the share, what to do) before the disk fills."""
    monkeypatch.setenv("BERTLAB_WORKSPACE_MB", "700")
    ws = Workspace.for_session()
    first = ws.new_run_dir("sst2-full")
    (first / "model.safetensors").write_bytes(os.urandom(150 * 2**20))  # a finished run
    with pytest.raises(NoRoomForRun) as info:
        ws.new_run_dir("sst2-full")
    assert str(info.value).startswith("Your workspace holds 150 MB of the 700 MB each student has here, and a run "
                                      "needs about 600 MB while it trains")
    assert "ask your teacher" in str(info.value) and str(ws.root) not in str(info.value)
    assert [p.name for p in ws.runs.iterdir()] == [first.name]  # nothing made
    monkeypatch.setenv("BERTLAB_WORKSPACE_MB", "1000")
    assert ws.new_run_dir("sst2-full").is_dir()


def test_a_run_that_would_fill_the_disk_is_refused(tmp_path, monkeypatch):
    """On a real 8 MB filesystem a run (which needs hundreds of MB while it trains) is refused at Start."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True,
                          check=False)
    if done.returncode:
        pytest.skip("cannot mount a small filesystem here")
    try:
        monkeypatch.chdir(where)
        with pytest.raises(NoRoomForRun, match=r"^The disk has 8 MB free, and a run needs about 600 MB"):
            Workspace(None).new_run_dir("sst2-full")
        assert not list(Path("bertlab-runs").iterdir())
    finally:
        monkeypatch.chdir(tmp_path)
        subprocess.run(["umount", "-l", str(where)], check=False)  # lazily: a loaded model may still map a file


def test_a_failed_start_leaves_no_run_folder(classroom):
    ws = Workspace.for_session()
    run = ws.new_run_dir("sst2-full")
    assert ws.discard_run_dir(run) and not run.exists() and list(ws.runs.iterdir()) == []
    kept = ws.new_run_dir("sst2-full")
    (kept / "finetune_results.json").write_text("{}")
    assert not ws.discard_run_dir(kept) and kept.is_dir()  # a run that wrote something stays


def test_two_students_starting_in_the_same_second_never_touch_each_others_files(classroom, monkeypatch, tok):
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-120000")
    ann, bob = Workspace.new(), Workspace.new()
    runs = {ws: ws.new_run_dir("sst2-full") for ws in (ann, bob)}
    for ws, run in runs.items():
        save_model_atomically(tiny_bert(tok, seed=len(str(ws.root))), tok, run)
    assert ann.finished_runs() == [runs[ann]] and bob.finished_runs() == [runs[bob]]
    for me, other in ((ann, bob), (bob, ann)):
        for text in (str(runs[other]), f"../{other.root.name}/runs/{runs[other].name}", ws_relative(me, runs[other])):
            with pytest.raises(PathNotAllowed):
                me.model_source(text)
            with pytest.raises(PathNotAllowed):
                me.resolve(f"{text}/model.safetensors", "data")
        assert me.export_folder("../../etc") == me.exports  # class mode: the typed folder is not asked


def ws_relative(ws: Workspace, path: Path) -> str:
    return os.path.relpath(path, ws.root)


# ---------------------------------------------------------------------------------------------
# A reload keeps the workspace (the browser's key, from the class server)
# ---------------------------------------------------------------------------------------------
def test_a_reloaded_page_adopts_the_workspace_its_browser_used_before(classroom, tok):
    key, other = "ab" * 32, "cd" * 32
    first = Workspace.new(classroom["workspaces"])
    first.make()  # a pre-heated page made its own folder before anyone asked for it
    made_before = first.root
    assert first.adopt(key) and not made_before.exists(), "the empty folder the page made is left behind"
    run = first.new_run_dir("sst2-full")
    save_model_atomically(tiny_bert(tok), tok, run)

    reloaded = Workspace.new(classroom["workspaces"])
    listed = []
    reloaded.on_adopt(lambda ws: listed.extend(ws.finished_runs()))
    assert reloaded.adopt(key)
    assert reloaded.root == first.root and listed == [run]
    assert stat.S_IMODE(reloaded.root.stat().st_mode) == 0o700

    stranger = Workspace.new(classroom["workspaces"])  # another browser's key: another folder
    assert stranger.adopt(other) and stranger.root != first.root and stranger.finished_runs() == []


def test_a_key_the_server_did_not_make_or_a_page_that_already_wrote_keeps_its_own_folder(classroom, tok):
    ws = Workspace.new(classroom["workspaces"])
    own = ws.root
    for bad in ("", "../../etc", "AB" * 32, "ab" * 31, "ab" * 32 + "/x"):
        assert not ws.adopt(bad) and ws.root == own
    run = ws.new_run_dir("sst2-full")  # this page trained already: it stays where its run is
    assert not ws.adopt("ab" * 32) and ws.root == own and run.is_dir()
    assert not Workspace(None).adopt("ab" * 32)  # one-person mode: nothing to adopt
