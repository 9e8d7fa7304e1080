"""The class training queue (bertlab.training.queue) across real processes, as the kernels of a
class use it: first-come order and the places each waiting run is told, Cancel while waiting,
a killed kernel's slot given back, stale heartbeats dropped; and in the training panels, a
waiting student reads "1 run ahead of you" and can leave with Cancel/Stop."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from bertlab import settings
from bertlab.training.queue import ClassQueue, join_queue, waiting_text

FORK = mp.get_context("fork")  # the children only use sqlite and time


def _until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


# -- a student's kernel, as a child process --------------------------------------------------------
def _student(path: str, name: str, events, hold_s: float) -> None:
    """Join, report every place and the start, hold the slot `hold_s` seconds, leave."""
    q = ClassQueue(path, slots=1, poll_s=0.05)
    t = q.join(name)
    events.put((name, "joined", None))
    try:
        assert t.wait(on_place=lambda ahead: events.put((name, "place", ahead)))
        events.put((name, "start", time.monotonic()))
        time.sleep(hold_s)
        events.put((name, "end", time.monotonic()))
    finally:
        t.leave()


def _holder(path: str, ready) -> None:
    """Take the slot and keep it until killed."""
    t = ClassQueue(path, slots=1, poll_s=0.05).join("holder")
    assert t.wait()
    ready.set()
    time.sleep(600)


def _drain(events, names: set[str], kind: str, timeout: float = 30.0) -> list[tuple]:
    out, deadline = [], time.monotonic() + timeout
    while {n for n, k, _ in out if k == kind} != names:
        out.append(events.get(timeout=max(0.1, deadline - time.monotonic())))
    return out


def test_three_processes_run_one_at_a_time_in_the_order_they_joined(tmp_path):
    path = str(tmp_path / "queue.sqlite")
    q = ClassQueue(path, slots=1, poll_s=0.05)
    mine = q.join("teacher")  # holds the slot while the students line up
    assert mine.wait()
    events, procs, seen = FORK.Queue(), [], []
    for name in ("a", "b", "c"):  # join one after another: the join order is a, b, c
        p = FORK.Process(target=_student, args=(path, name, events, 0.3))
        p.start()
        procs.append(p)
        while (name, "joined", None) not in seen:
            seen.append(events.get(timeout=30))
    _until(lambda: len(q.entries()) == 4)
    # everyone told their place: the holder and the earlier students are ahead
    seen += _drain(events, {"a", "b", "c"} - {n for n, k, _ in seen if k == "place"}, "place")
    first_place = {}
    for name, kind, ahead in seen:
        if kind == "place":
            first_place.setdefault(name, ahead)
    assert first_place == {"a": 1, "b": 2, "c": 3}
    assert [label for _, label, _ in q.entries()] == ["teacher", "a", "b", "c"]
    mine.leave()
    seen += _drain(events, {"a", "b", "c"} - {n for n, k, _ in seen if k == "end"}, "end")
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    starts = sorted((t, n) for n, k, t in seen if k == "start")
    ends = {n: t for n, k, t in seen if k == "end"}
    assert [n for _, n in starts] == ["a", "b", "c"]  # first come, first served
    for (_, prev), (start, _) in zip(starts, starts[1:]):
        assert start >= ends[prev]  # one slot: never two at once
    places = {n: [a for m, k, a in seen if m == n and k == "place"] for n in "abc"}
    assert places["c"] == sorted(places["c"], reverse=True) and places["c"][-1] == 1  # counts down to 1
    assert q.entries() == []


def test_cancel_while_waiting_removes_the_entry(tmp_path):
    q = ClassQueue(tmp_path / "queue.sqlite", slots=1, poll_s=0.05)
    holder = q.join("holder")
    assert holder.wait()
    waiting, cancel, result, places = q.join("student"), threading.Event(), [], []
    thread = threading.Thread(target=lambda: result.append(waiting.wait(cancel, places.append)))
    thread.start()
    _until(lambda: places == [1])
    cancel.set()
    thread.join(10)
    assert result == [False]
    assert [label for _, label, _ in q.entries()] == ["holder"]
    holder.leave()
    assert q.entries() == []


def test_a_killed_kernels_slot_is_given_back(tmp_path):
    path = str(tmp_path / "queue.sqlite")
    ready = FORK.Event()
    proc = FORK.Process(target=_holder, args=(path, ready))
    proc.start()
    try:
        assert ready.wait(30)
        q = ClassQueue(path, slots=1, poll_s=0.05)
        mine, places, got = q.join("next"), [], []
        thread = threading.Thread(target=lambda: got.append(mine.wait(on_place=places.append)))
        thread.start()
        _until(lambda: places == [1])
        time.sleep(0.3)
        assert not got  # still held
        os.kill(proc.pid, signal.SIGKILL)  # not joined yet: a zombie, which counts as gone too
        thread.join(10)
        assert got == [True]
        assert [(label, state) for _, label, state in q.entries()] == [("next", "running")]
        mine.leave()
    finally:
        proc.kill()
        proc.join(10)


def test_an_entry_whose_heartbeat_stopped_expires(tmp_path):
    path = tmp_path / "queue.sqlite"
    q = ClassQueue(path, slots=1, poll_s=0.05, ttl_s=5)
    stuck = q.join("stuck")
    assert stuck.wait()
    db = sqlite3.connect(path)
    with db:  # as if its process had hung (or lived on another machine) for a minute
        db.execute("UPDATE runs SET heartbeat = heartbeat - 60")
    db.close()
    assert q.entries() == []
    assert q.join("next").wait()


def test_a_running_turn_keeps_its_heartbeat(tmp_path):
    q = ClassQueue(tmp_path / "queue.sqlite", slots=1, poll_s=0.05, ttl_s=0.4)
    running = q.join("long run")
    assert running.wait()
    time.sleep(1.0)  # more than the ttl: the heartbeat thread keeps it alive
    assert [label for _, label, _ in q.entries()] == ["long run"]
    running.leave()


def test_two_slots_let_two_run(tmp_path):
    q = ClassQueue(tmp_path / "queue.sqlite", slots=2, poll_s=0.05)
    a, b, c = q.join("a"), q.join("b"), q.join("c")
    assert a.wait() and b.wait()
    places, done = [], []
    thread = threading.Thread(target=lambda: done.append(c.wait(on_place=places.append)))
    thread.start()
    _until(lambda: places == [2])
    a.leave()
    thread.join(10)
    assert done == [True]
    b.leave(), c.leave()


def test_without_bertlab_queue_a_run_starts_at_once(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTLAB_QUEUE", raising=False)
    t = join_queue("run")
    assert t.queue is None and t.wait()
    cancel = threading.Event()
    cancel.set()
    assert not join_queue("run").wait(cancel)  # cancelled before it started
    assert list(tmp_path.iterdir()) == []


def test_queue_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTLAB_QUEUE", raising=False)
    monkeypatch.delenv("BERTLAB_QUEUE_SLOTS", raising=False)
    assert settings.queue_path() is None
    assert settings.queue_slots() >= 1
    monkeypatch.setenv("BERTLAB_QUEUE", str(tmp_path / "q.sqlite"))
    monkeypatch.setenv("BERTLAB_QUEUE_SLOTS", "3")
    assert settings.queue_path() == tmp_path / "q.sqlite" and settings.queue_slots() == 3
    q = ClassQueue.from_env()
    assert q is not None and q.slots == 3 and Path(q.path).exists()
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv("BERTLAB_QUEUE_SLOTS", bad)
        with pytest.raises(ValueError, match="BERTLAB_QUEUE_SLOTS"):
            settings.queue_slots()


def test_waiting_text():
    assert "1 run ahead of you" in waiting_text(1)
    assert "2 runs ahead of you" in waiting_text(2)


# -- in the training panels ------------------------------------------------------------------------
@pytest.fixture
def class_queue(monkeypatch, tmp_path):
    """BERTLAB_QUEUE with one slot, held by another student's run."""
    path = tmp_path / "queue.sqlite"
    monkeypatch.setenv("BERTLAB_QUEUE", str(path))
    monkeypatch.setenv("BERTLAB_QUEUE_SLOTS", "1")
    other = ClassQueue(path, slots=1).join("another student's run")
    assert other.wait()
    yield ClassQueue(path, slots=1), other
    other.leave()


def _pretrain_panel(tmp_path):
    from bertlab.panels.pretrain import FALLBACK_DOCUMENTS, PretrainPanel
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.pretrain import new_model

    words = ["cat", "dog", "bird", "tree", "house", "river", "car", "book"]
    (tmp_path / "vocab").mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "a", "saw", "near", *words]
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = Tokenizer.from_folder(tmp_path / "vocab")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(
        " ".join(f"The {words[(d + s) % 8]} saw a {words[(d * 3 + s) % 8]} near the {words[(s * 5) % 8]}."
                 for s in range(8)) for d in range(20)), encoding="utf-8")
    p = PretrainPanel(new_model("tiny", tok), tok, text="the cat saw a dog .", probe="the cat saw a [MASK] .",
                      pair_documents=FALLBACK_DOCUMENTS)
    p.corpus_path.value = str(corpus)
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value = "tiny", 4, 4, 32
    p.made = []
    p.model_made = lambda name, model, tok: p.made.append(name)
    return p


def _run_texts(p) -> str:
    return " ".join(text for _, text in p.run_messages)


def _drawn(panel):
    """The panel after its job's callbacks ran and it redrew: on this thread, as a kernel's loop would."""
    panel.job.pump()
    panel.draw()
    return panel


@pytest.mark.usefixtures("one_thread")
def test_pretraining_waits_its_turn_and_stop_leaves_the_queue(class_queue, tmp_path):
    q, _ = class_queue
    p = _pretrain_panel(tmp_path)
    p.start.click()
    _until(lambda: "1 run ahead of you" in _run_texts(_drawn(p)))
    assert p.job.running and not p.stop.disabled and p.progress.value == 0  # waiting, not training
    assert "Stop leaves the queue" in _run_texts(p)
    assert len(q.entries()) == 2
    p.stop.click()
    assert p.job.wait(20)
    assert "left the class queue" in _run_texts(p) and not p.made
    assert [label for _, label, _ in q.entries()] == ["another student's run"]
    assert not p.start.disabled and p.stop.disabled


@pytest.mark.usefixtures("one_thread")
def test_pretraining_starts_when_the_slot_frees(class_queue, tmp_path):
    q, other = class_queue
    p = _pretrain_panel(tmp_path)
    p.start.click()
    _until(lambda: "1 run ahead of you" in _run_texts(_drawn(p)))
    other.leave()
    assert p.job.wait(120)
    assert p.result is not None and p.result.status == "completed", p.run_messages
    assert p.made and q.entries() == []  # the slot was given back at the end


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.skipif(not (SHARED_DATA / "sst2").is_dir(), reason="shared data folder not present")
def test_finetuning_waits_its_turn_and_cancel_leaves_the_queue(class_queue, tok, tmp_path):
    from tiny_models import tiny_bert

    from bertlab.panels.finetune import FinetunePanel

    q, _ = class_queue
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path / "runs", device="cpu")
    panel.path.value = str(SHARED_DATA / "sst2")
    panel.max_train.value, panel.max_dev.value, panel.epochs.value, panel.batch.value = 16, 8, 1, 8
    panel.start_button.click()
    texts = lambda _=None: " ".join(text for _, text in panel.messages)  # noqa: E731
    _until(lambda: "1 run ahead of you" in texts(_drawn(panel)))
    assert panel.job.running and not panel.cancel_button.disabled
    panel.cancel_button.click()
    assert panel.job.wait(20)
    assert "left the class queue" in texts()
    assert panel.runs[-1].status == "cancelled"
    assert [label for _, label, _ in q.entries()] == ["another student's run"]
    assert not panel.start_button.disabled and panel.cancel_button.disabled


def test_a_command_line_run_waits_for_its_slot(monkeypatch, tmp_path, caplog):
    from bertlab.training.queue import queued

    path = tmp_path / "queue.sqlite"
    monkeypatch.setenv("BERTLAB_QUEUE", str(path))
    monkeypatch.setenv("BERTLAB_QUEUE_SLOTS", "1")
    holder = ClassQueue(path, slots=1).join("a student's run")
    assert holder.wait()
    ran = []

    def cli_run():
        with queued("bertlab finetune sst2"):
            ran.append(len(ClassQueue(path, slots=1).entries()))

    thread = threading.Thread(target=cli_run)
    with caplog.at_level("WARNING", logger="bertlab.training.queue"):
        thread.start()
        _until(lambda: "1 run ahead of you" in caplog.text)
        assert not ran
        holder.leave()
        thread.join(20)
    assert ran == [1] and "Ctrl-C leaves the queue" in caplog.text
    assert ClassQueue(path, slots=1).entries() == []  # given back after the run
