"""Work that runs in the background, as solara's tasks do: one object per job with a state
(pending, running, finished, error, cancelled), start, cancel, the class queue's place, the buttons that
start and cancel it, one redraw throttle for its progress, and one policy that turns an error into a
message for the student. Every panel that trains, evaluates, downloads or watches the class store
starts its work here; no panel holds a thread.

    job = BackgroundRun("bertlab-finetune", start_button, cancel_button)
    job.start(work, queue="sst2 · full", on_place=..., on_error=..., on_done=...)
    job.cancel_event  # handed to the training loop, which stops after its current step
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import ipywidgets as widgets

from bertlab.inputs import InputError
from bertlab.runtime import is_out_of_memory, out_of_memory_text, release_free_memory
from bertlab.tasks import DataSourceError
from bertlab.training.queue import TEACHER_CANCELLED, CancelledByTeacher, join_queue
from bertlab.viz.theme import FAINT

log = logging.getLogger(__name__)

State = Literal["pending", "running", "finished", "error", "cancelled"]

# errors whose message says what to change (bad settings, a missing or malformed file): shown as they are.
# Anything else is a bug: its type is named and its traceback goes to the log.
STUDENT_ERRORS = (ValueError, KeyError, OSError, DataSourceError, CancelledByTeacher)
REDRAW_EVERY_S = 0.5  # live figures redraw at most this often while a run reports progress
CPU_MAX_TRAIN, CPU_MAX_DEV = 2000, 500  # training and dev examples a CPU run keeps by default (0 = all)


def is_student_error(error: BaseException) -> bool:
    """Whether the error's own message tells the student what to change (no traceback needed)."""
    return isinstance(error, STUDENT_ERRORS) or is_out_of_memory(error)


def error_text(error: BaseException, hide: Callable[[str], str] = str, batch_size: int | None = None,
               max_length: int | None = None) -> str:
    """The one message a failed background run shows: out-of-memory advice (for `batch_size` ×
    `max_length` when known), a student error's own words, or a bug named by its type. `hide` rewrites
    paths the student should not see (the workspace's root)."""
    if is_out_of_memory(error) and batch_size is not None:
        return out_of_memory_text(batch_size, max_length)
    if isinstance(error, KeyError) and error.args:
        return hide(str(error.args[0]))
    if is_student_error(error):
        return hide(str(error))
    return f"the run stopped ({type(error).__name__}: {hide(str(error))})."


class Throttle:
    """At most one redraw every `every_s` seconds; the end of a run (`force`) always redraws."""

    def __init__(self, every_s: float = REDRAW_EVERY_S) -> None:
        self.every_s = every_s
        self.last = float("-inf")

    def due(self, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.last = now
            return True
        return False

    def reset(self) -> None:
        self.last = float("-inf")


class BackgroundRun:
    """One job at a time in a daemon thread named `name`. While it runs, `start_button` is disabled and
    `cancel_button` enabled; `cancel()` sets `cancel_event` (which the work reads, e.g. the training
    loop) and disables the cancel button. `state` tells how the last job ended.

    The work never touches a widget: every callback (`on_place`, `on_left_queue`, `on_error`, `on_done`)
    and `redraw` run on the thread that started the job (the kernel's), as ipywidgets needs. In a kernel
    they are scheduled on its event loop, `redraw` every REDRAW_EVERY_S while the job runs and once at its
    end; without an event loop (a script, a widget test) `wait()` runs them."""

    def __init__(self, name: str, start_button: widgets.Button | None = None,
                 cancel_button: widgets.Button | None = None) -> None:
        self.name = name
        self.start_button, self.cancel_button = start_button, cancel_button
        self.state: State = "pending"
        self.error: BaseException | None = None
        self.cancel_event = threading.Event()
        self.redraw = Throttle()
        self._thread: threading.Thread | None = None
        self._home: threading.Thread | None = None  # the thread that started the job: callbacks run there
        self._loop: asyncio.AbstractEventLoop | None = None  # its event loop (None: `wait()` runs them)
        self._posted: collections.deque[Callable[[], Any]] = collections.deque()
        self._delivered = threading.Event()  # the job's end was handled on the home thread
        self._delivered.set()
        self._on_redraw: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        """From Start until the job's end was handled on the kernel's thread (buttons back, `on_done` ran)."""
        return self._thread is not None and not self._delivered.is_set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def start(self, work: Callable[[], Any], *, queue: str | None = None,
              on_place: Callable[[int], None] | None = None, on_left_queue: Callable[[], None] | None = None,
              on_error: Callable[[BaseException], None] | None = None,
              on_done: Callable[[], None] | None = None, redraw: Callable[[], None] | None = None) -> None:
        """Run `work()` in the background. With `queue` (a label) the job first waits for its place in
        the class queue (`on_place(runs ahead)` while it waits; `on_left_queue()` if cancelled there). An
        exception from `work` goes to `on_error` (a bug is logged with its traceback first); `redraw()`
        runs now and then while the job runs, and `on_done()` last in every case, after the buttons are
        back: all of them on the caller's thread (see the class)."""
        self.check_idle()
        self.cancel_event = threading.Event()
        self.state, self.error = "running", None
        self.redraw.reset()
        self._home, self._loop = threading.current_thread(), _running_loop()
        self._posted.clear()
        self._delivered.clear()
        self._on_redraw = redraw
        self._buttons(running=True)
        post = self._post
        self._thread = threading.Thread(target=self._body, name=self.name, daemon=True, args=(
            work, queue, on_place and (lambda ahead: post(functools.partial(on_place, ahead))),
            on_left_queue and (lambda: post(on_left_queue)), on_error, on_done))
        self._thread.start()
        if self._loop is not None and redraw is not None:
            self._loop.call_later(REDRAW_EVERY_S, self._tick)

    def check_idle(self) -> None:
        """Raise InputError (the message a student sees) while a job runs: before a panel resets its view
        for a new run."""
        if self.running:
            raise InputError("A run is in progress: cancel it or wait for it to end.")

    def poll(self, check: Callable[[], None], every_s: float | Callable[[], float]) -> None:
        """Call `check()` every `every_s` seconds (or as often as `every_s()` says each time) until
        `cancel()`; an error in one check is logged and the next check comes all the same."""
        def loop() -> None:
            while not self.cancel_event.wait(every_s() if callable(every_s) else every_s):
                try:
                    check()
                except Exception:  # a locked store must not end the loop: try again next time
                    log.exception("%s: a check failed", self.name)

        self.start(loop)

    def cancel(self) -> None:
        """Ask the job to stop (the work reads `cancel_event`); safe from any thread."""
        self.cancel_event.set()
        if self.cancel_button is not None:
            self._on_home(functools.partial(setattr, self.cancel_button, "disabled", True))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job ends and its end was handled (True), or `timeout` seconds pass (False): for
        tests and scripts. On the thread that started the job, it runs the callbacks and redraws meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            home = threading.current_thread() is self._home
            if home:
                self.pump()
            if self._delivered.is_set():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            step = REDRAW_EVERY_S if left is None else min(left, REDRAW_EVERY_S)
            if home and self._thread is not None and self._thread.is_alive():
                self._thread.join(step / 5)
                if self._on_redraw is not None and self.redraw.due():
                    _safely(self._on_redraw, self.name)
            elif not home:
                self._delivered.wait(step)

    def pump(self) -> None:
        """Run what the job handed to the home thread (callbacks, the end), in order: on the home thread."""
        while self._posted:
            _safely(self._posted.popleft(), self.name)

    def _post(self, fn: Callable[[], Any]) -> None:
        """Hand `fn` to the home thread (from the job's thread)."""
        self._posted.append(fn)
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.pump)
            except RuntimeError:  # the kernel's loop is closed: nothing will draw any more
                log.debug("%s: the event loop is closed", self.name)

    def _on_home(self, fn: Callable[[], Any]) -> None:
        """Run `fn` now on the home thread, else hand it there."""
        if self._home is None or threading.current_thread() is self._home:
            fn()
        else:
            self._post(fn)

    def _tick(self) -> None:
        """The periodic redraw on the kernel's event loop, while the job runs."""
        if self._delivered.is_set():
            return
        if self._on_redraw is not None:
            _safely(self._on_redraw, self.name)
        self.redraw.last = time.monotonic()
        if self._loop is not None:
            self._loop.call_later(REDRAW_EVERY_S, self._tick)

    def _body(self, work: Callable[[], Any], queue: str | None, on_place: Callable[[int], None] | None,
              on_left_queue: Callable[[], None] | None, on_error: Callable[[BaseException], None] | None,
              on_done: Callable[[], None] | None) -> None:
        place, error = None, None
        try:
            if queue is not None:
                place = join_queue(queue)
                if not place.wait(self.cancel_event, on_place):
                    if getattr(place, "cancelled_by_teacher", False):
                        raise CancelledByTeacher(TEACHER_CANCELLED)
                    self.state = "cancelled"
                    if on_left_queue is not None:
                        on_left_queue()
                    return
            work()
            if place is not None and getattr(place, "cancelled_by_teacher", False):  # the teacher stopped it
                raise CancelledByTeacher(TEACHER_CANCELLED)
            self.state = "cancelled" if self.cancelled else "finished"
        except Exception as e:
            self.state, self.error, error = "error", e, e
            if not is_student_error(e) and not self.cancelled:
                log.exception("%s failed", self.name)
        finally:
            if place is not None:
                place.leave()  # the next student's run may start
            if self.error is not None:
                release_free_memory()  # outside the except block: the traceback no longer holds the tensors
            end = functools.partial(self._end, error, on_error, on_done)
            if any((on_error, on_done, self._on_redraw, self.start_button, self.cancel_button)):
                self._post(end)
            else:  # nothing to show: a one-off job ends here
                end()

    def _end(self, error: BaseException | None, on_error: Callable[[BaseException], None] | None,
             on_done: Callable[[], None] | None) -> None:
        """The job's end, on the home thread: the error's callback, the last redraw, the buttons, `on_done`."""
        try:
            if error is not None and on_error is not None:
                _safely(functools.partial(on_error, error), self.name)
            if self._on_redraw is not None:
                _safely(self._on_redraw, self.name)
            self._buttons(running=False)
            _safely(on_done, self.name)
        finally:
            self._delivered.set()

    def _buttons(self, running: bool) -> None:
        if self.start_button is not None:
            self.start_button.disabled = running
        if self.cancel_button is not None:
            self.cancel_button.disabled = not running


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread (the kernel's, in a notebook or Voila), None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_controls(name: str, start: str, tooltip: str | None, stop_tooltip: str, icon: str = "play",
                 stop: str = "Cancel", idle: str = "No run yet.", width: str = "260px",
                 ) -> tuple[widgets.Button, widgets.Button, BackgroundRun, widgets.IntProgress, widgets.HTML]:
    """The controls of a tab's background run: its start and stop buttons (stop disabled until the run
    starts), the job (`BackgroundRun` named `name`) they drive, a progress bar `width` wide and a status
    line (`idle` until the first run)."""
    start_button = widgets.Button(description=start, button_style="primary", icon=icon, tooltip=tooltip)
    stop_button = widgets.Button(description=stop, button_style="warning", icon="stop", disabled=True,
                                 tooltip=stop_tooltip)
    status = widgets.HTML(f'<span style="{FAINT}">{idle}</span>' if idle else "")
    progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width=width))
    return start_button, stop_button, BackgroundRun(name, start_button, stop_button), progress, status


def in_background(work: Callable[[], Any], name: str) -> BackgroundRun:
    """Start a one-off background job (a size lookup, figures built ahead) and return it."""
    job = BackgroundRun(name)
    job.start(work)
    return job


def _safely(callback: Callable[[], Any] | None, name: str) -> None:
    """Run a callback of the job; a failing one is logged, never raised into the thread."""
    if callback is None:
        return
    try:
        callback()
    except Exception:
        log.exception("%s: showing how the run went failed", name)
