"""The one background-run controller (panels/runs.py): states, buttons, cancel, the class queue, the
redraw throttle and the error-to-message policy, without a panel."""

from __future__ import annotations

import threading

import ipywidgets as widgets
import pytest
import torch
from aio import run_in_thread

from bertlab.inputs import InputError
from bertlab.panels.runs import BackgroundRun, Throttle, error_text, in_background
from bertlab.runtime import out_of_memory_text


def buttons() -> tuple[widgets.Button, widgets.Button]:
    return widgets.Button(), widgets.Button(disabled=True)


def test_a_run_goes_pending_running_finished_and_the_buttons_follow():
    start, cancel = buttons()
    job = BackgroundRun("test-run", start, cancel)
    assert job.state == "pending" and not job.running
    go, seen = threading.Event(), []
    job.start(lambda: (go.wait(10), seen.append((start.disabled, cancel.disabled))),
              on_done=lambda: seen.append("done"))
    assert job.running and job.state == "running"
    with pytest.raises(InputError, match="in progress"):  # one job at a time
        job.start(lambda: None)
    go.set()
    assert job.wait(10)
    assert job.state == "finished" and seen == [(True, False), "done"]
    assert not start.disabled and cancel.disabled


def test_cancel_sets_the_event_the_work_reads_and_ends_cancelled():
    start, cancel = buttons()
    job = BackgroundRun("test-cancel", start, cancel)
    job.start(lambda: job.cancel_event.wait(10))
    job.cancel()
    assert cancel.disabled  # pressed once is enough
    assert job.wait(10) and job.state == "cancelled"


def test_an_error_goes_to_on_error_once_and_the_job_ends_in_error(caplog):
    errors: list[BaseException] = []
    job = BackgroundRun("test-error")
    job.start(lambda: 1 / 0, on_error=errors.append)
    assert job.wait(10)
    assert job.state == "error" and isinstance(job.error, ZeroDivisionError) and errors == [job.error]
    assert "test-error failed" in caplog.text  # a bug keeps its traceback in the log


def test_a_failing_callback_never_escapes_the_thread(caplog):
    job = BackgroundRun("test-callback")
    job.start(lambda: None, on_done=lambda: 1 / 0)
    assert job.wait(10) and job.state == "finished"
    assert "showing how the run went failed" in caplog.text


def test_poll_checks_until_cancelled():
    calls: list[int] = []
    job = BackgroundRun("test-poll")
    job.poll(lambda: calls.append(1), 0.01)
    while len(calls) < 3:
        threading.Event().wait(0.01)
    job.cancel()
    assert job.wait(10) and job.state == "cancelled"


def test_in_background_runs_a_one_off_job():
    done = threading.Event()
    job = in_background(done.set, "test-one-off")
    assert job.wait(10) and done.is_set() and job.state == "finished"


def test_leaving_the_queue_before_the_start_runs_nothing(monkeypatch):
    class Place:
        left = False

        def wait(self, cancel, on_place):
            on_place(2)
            cancel.wait(10)
            return False

        def leave(self):
            Place.left = True

    monkeypatch.setattr("bertlab.panels.runs.join_queue", lambda label: Place())
    ran, places, left = [], [], []
    job = BackgroundRun("test-queue")
    job.start(lambda: ran.append(1), queue="a run", on_place=places.append, on_left_queue=lambda: left.append(1))
    job.cancel()
    assert job.wait(10)
    assert job.state == "cancelled" and not ran and places == [2] and left == [1] and Place.left


def test_the_error_policy():
    assert error_text(KeyError("no such label 'x'")) == "no such label 'x'"
    assert error_text(ValueError("in /srv/class/ann/data.tsv"), hide=lambda t: t.replace("/srv/class/ann", "~")) \
        == "in ~/data.tsv"
    assert error_text(RuntimeError("boom")) == "the run stopped (RuntimeError: boom)."
    oom = error_text(torch.OutOfMemoryError("CUDA out of memory"), batch_size=32, max_length=128)
    assert oom == out_of_memory_text(32, 128)
    assert "batches of 32 × up to 128 tokens" in oom and "(e.g. 16" in oom and "max length 64" in oom


def test_the_throttle_lets_one_redraw_through_per_interval():
    throttle = Throttle(every_s=3600)
    assert throttle.due() and not throttle.due() and throttle.due(force=True)
    throttle.reset()
    assert throttle.due()


# ---------------------------------------------------------------------------------------------
# Every background start of the dashboard's code goes through this module
# ---------------------------------------------------------------------------------------------
BACKGROUND_CALLS = {"Thread", "Timer", "run_in_executor", "ThreadPoolExecutor", "ProcessPoolExecutor",
                    "start_new_thread", "Process", "Pool", "create_task", "ensure_future", "call_later"}
BACKGROUND_MODULES = ("threading", "concurrent.futures", "_thread", "multiprocessing", "asyncio")
STARTS_HERE = "panels/runs.py"  # the one module allowed to start background work


def background_starts(path) -> list[str]:
    """`line: what` for each call in `path` that starts work in the background (a thread, a timer, an
    executor, a process, an asyncio task), by the called name, and each such name imported by itself
    (`from threading import Thread`). Locks and events are not starts."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in BACKGROUND_CALLS:
                found.append(f"{node.lineno}: {name}(...)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(BACKGROUND_MODULES):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in BACKGROUND_CALLS or node.module.startswith(("concurrent", "multiprocessing"))]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith(("concurrent", "multiprocessing", "_thread"))]
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_panels_start_background_work_only_through_the_run_controller():
    """No panel (nor the class store the panels read) holds a thread of its own: each background start in
    the kernel is a BackgroundRun (or `in_background`), so that every run has one cancel, one set of button
    states and one error policy. (bertlab/serving is the page server's process, with its own event loop:
    its timers are not a panel's work.)"""
    from pathlib import Path

    import bertlab

    root = Path(bertlab.__file__).resolve().parent
    files = [p for d in ("panels", "classroom") for p in sorted((root / d).rglob("*.py"))]
    assert (root / STARTS_HERE) in files and background_starts(root / STARTS_HERE)  # the scanner sees its thread
    found = [f"{p.relative_to(root).as_posix()}:{hit}" for p in files if p != root / STARTS_HERE
             for hit in background_starts(p)]
    assert not found, "background work started outside bertlab/panels/runs.py:\n" + "\n".join(found)


def test_the_background_start_scanner_sees_threads_timers_and_executors(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
                 "lock = threading.Lock()\nevent = threading.Event()\n"
                 "def go(loop, work):\n    threading.Thread(target=work).start()\n    threading.Timer(1, work)\n"
                 "    loop.run_in_executor(None, work)\n")
    assert [hit.split(": ")[1] for hit in background_starts(f)] == [
        "from concurrent.futures import ThreadPoolExecutor", "Thread(...)", "Timer(...)", "run_in_executor(...)"]


def test_check_idle_refuses_while_a_job_runs():
    job = BackgroundRun("t")
    job.check_idle()
    gate = threading.Event()
    job.start(gate.wait)
    try:
        with pytest.raises(InputError, match="in progress"):
            job.check_idle()
    finally:
        gate.set()
        assert job.wait(5)
    job.check_idle()


def test_callbacks_and_redraws_run_on_the_thread_that_started_the_job():
    """The work never draws: `redraw` (while it runs and once at the end) and `on_done` run on the starting
    thread; without an event loop `wait()` runs them."""
    import time

    job = BackgroundRun("test-home")
    where: list[tuple[str, threading.Thread]] = []
    job.start(lambda: time.sleep(1.5), redraw=lambda: where.append(("redraw", threading.current_thread())),
              on_done=lambda: where.append(("done", threading.current_thread())))
    assert job.running and job.wait(10) and not job.running
    assert {t for _, t in where} == {threading.current_thread()}
    assert [w for w, _ in where].count("redraw") >= 3 and where[-1][0] == "done"  # ticks, the last redraw, done


def test_in_an_event_loop_the_loop_runs_them_without_wait():
    """In a kernel (an asyncio loop on the kernel's thread) nobody calls wait(): the loop redraws and ends it."""
    import asyncio
    import time

    async def main() -> tuple[list[threading.Thread], BackgroundRun, threading.Thread]:
        job, seen, done = BackgroundRun("test-loop"), [], asyncio.Event()
        job.start(lambda: time.sleep(1.5), redraw=lambda: seen.append(threading.current_thread()), on_done=done.set)
        await asyncio.wait_for(done.wait(), 10)
        return seen, job, threading.current_thread()

    seen, job, loop_thread = run_in_thread(main())  # the suite's main thread may hold Playwright's loop
    assert len(seen) >= 2 and all(t is loop_thread for t in seen) and not job.running
