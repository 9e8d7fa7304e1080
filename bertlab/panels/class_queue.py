"""The class training queue on the teacher's page: every run in order with its state and (on a hub)
whose it is, and two buttons — let a waiting run go first, or cancel a run (its student is told
why). Works on the SQLite queue of one server and on the hub's class service (which refuses both
buttons to anyone but the teacher)."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import ipywidgets as widgets

from bertlab.panels.base import note_html
from bertlab.panels.runs import BackgroundRun
from bertlab.service_client import ClassServiceError
from bertlab.training.queue import QUEUE_ERRORS
from bertlab.viz.classroom import queue_html

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often the list is read again


class TeacherQueue(Protocol):
    """What the view asks of a queue: `ClassQueue` (one server) or `RemoteQueue` (the class service)."""

    def entries(self) -> list[tuple[int, str, str]]: ...
    def owners(self) -> dict[int, str]: ...
    def cancel(self, rid: int) -> bool: ...
    def first(self, rid: int) -> bool: ...


class ClassQueueView:
    """The queue's runs and the teacher's two buttons. `poll_s=None` starts no thread: call `refresh()`."""

    def __init__(self, queue: TeacherQueue, poll_s: float | None = POLL_S) -> None:
        self.queue = queue
        self.rows: list[tuple[int, str, str, str]] = []  # (id, label, state, owner), in queue order
        self._lock = threading.RLock()
        self.table = widgets.HTML()
        self.pick = widgets.Dropdown(description="Run", options=[], layout=widgets.Layout(width="min(100%, 420px)"))
        self.first_button = widgets.Button(description="Let it go first", tooltip="Move this waiting run to the "
                                           "front of the queue")
        self.cancel_button = widgets.Button(description="Cancel run", button_style="warning",
                                            tooltip="Take this run out of the queue (a running one stops); "
                                            "its student is told the teacher did")
        self.status = widgets.HTML()
        self.first_button.on_click(lambda _: self._act("first"))
        self.cancel_button.on_click(lambda _: self._act("cancel"))
        self.widget = widgets.VBox([
            widgets.HTML("<b>Class training queue</b>"), self.table,
            widgets.HBox([self.pick, self.first_button, self.cancel_button],
                         layout=widgets.Layout(flex_flow="row wrap")),
            self.status,
        ], layout=widgets.Layout(margin="12px 0 0 0"))
        self.widget.add_class("bertlab-class-queue")
        self.refresh()
        self.watch = BackgroundRun("bertlab-class-queue")
        if poll_s:
            self.watch.poll(self.refresh, poll_s)

    def refresh(self) -> None:
        """Read the queue again and redraw it."""
        with self._lock:
            try:
                owners = self.queue.owners()
                rows = [(rid, label, state, owners.get(rid, "")) for rid, label, state in self.queue.entries()]
            except QUEUE_ERRORS as e:
                self.status.value = note_html("warning", f"Could not read the class queue: {e}")
                return
            if rows != self.rows:
                self.rows = rows
                self._draw()

    def _draw(self) -> None:
        self.table.value = queue_html(self.rows)
        keep = self.pick.value
        self.pick.options = [(f"{n}. {label}" + (f" ({owner})" if owner else ""), rid)
                             for n, (rid, label, _, owner) in enumerate(self.rows, 1)]
        self.pick.value = keep if keep in {rid for rid, *_ in self.rows} else None
        self.first_button.disabled = self.cancel_button.disabled = not self.rows

    def _act(self, action: str) -> None:
        rid = self.pick.value
        if rid is None:
            self.status.value = note_html("info", "Pick a run first.")
            return
        try:
            done = (self.queue.first if action == "first" else self.queue.cancel)(rid)
        except (ClassServiceError, *QUEUE_ERRORS) as e:
            self.status.value = note_html("warning", str(e))
            return
        if action == "first":
            text = "Moved to the front." if done else "Only a waiting run can move: this one is running or gone."
        else:
            text = ("Cancelled: its student is told you took it out of the queue." if done
                    else "That run has already left the queue.")
        self.status.value = note_html("info", text)
        self.refresh()

    def stop(self) -> None:
        self.watch.cancel()
