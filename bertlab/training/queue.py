"""The class training queue: at most `slots` training runs at once across every student's kernel.

Each kernel is its own process, so the queue lives in a SQLite file (WAL mode) that all of them
open: `BERTLAB_QUEUE` (set by `bertlab serve --class`), with `BERTLAB_QUEUE_SLOTS` runs at a time.
A run joins the queue, waits its turn in first-come order (telling the student how many runs are
ahead), trains, and leaves. A run whose process died (killed kernel, culled page) is dropped:
every entry stores its process id and start time, and a heartbeat that a live run refreshes;
entries of dead processes or with a heartbeat older than `ttl_s` are removed by whoever looks next.

Without `BERTLAB_QUEUE` there is no queue: `join_queue()` gives the go at once. Where the student
servers share no disk (JupyterHub on Kubernetes), the hub sets `BERTLAB_CLASS_SERVICE_URL` and the
queue is the class service's (bertlab.hubservice), reached by `RemoteQueue`: the same five operations
(`enter`, `try_start`, `beat`, `leave`, `entries`) over HTTP, so `QueuePlace` works with either. Each
entry has an `owner` (the hub user there; "" on one server); the teacher may cancel anyone's run
(`cancel`), which the run's own place sees at its next look, or let a waiting run go first (`first`).

    place = join_queue("SST-2 · full")          # a place in the queue (one that starts at once without a queue)
    try:
        if not place.wait(cancel, on_place):    # False: cancelled while waiting
            return
        ...train...
    finally:
        place.leave()
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from bertlab import settings
from bertlab.service_client import ClassServiceError, ServiceClient

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting run looks at the queue
TTL_S = 60.0  # an entry whose heartbeat is older than this is dropped (its process is gone or hung)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- join order
    label TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started TEXT NOT NULL,                 -- the process's start time: a reused pid is not the same run
    state TEXT NOT NULL DEFAULT 'waiting', -- waiting | running | cancelled (by the teacher; its place leaves)
    heartbeat REAL NOT NULL,
    owner TEXT NOT NULL DEFAULT '',        -- the hub user who queued it ('' on one server)
    seq REAL                               -- place in the order when the teacher moved it (NULL: its id)
)
"""
_ORDER = "COALESCE(seq, id)"
CANCELLED = -2  # try_start's answer for an entry the teacher cancelled
TEACHER_CANCELLED = ("The teacher took this run out of the class queue (to free a slot for the class). "
                     "Start it again when the teacher says so.")


QUEUE_ERRORS = (sqlite3.Error, ClassServiceError)  # a look at the queue that failed: try again later


class CancelledByTeacher(Exception):
    """A run the teacher cancelled in the class queue (`TEACHER_CANCELLED` says so to the student)."""


def waiting_text(ahead: int, leave: str = "Cancel") -> str:
    """What a waiting student reads (`leave`: how to leave the queue)."""
    runs = "1 run" if ahead == 1 else f"{ahead} runs"
    return (f"Waiting for a free training slot: {runs} ahead of you in the class queue. "
            f"It starts by itself; {leave} leaves the queue.")


def _process_start(pid: int) -> str:
    """The start time of process `pid` ("" where /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime (clock ticks after boot)


def process_alive(pid: int, started: str = "") -> bool:
    """Whether process `pid` is still running (a zombie is not); `started` (its `_process_start`) also
    tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] not in ("Z", "X") and (not started or fields[19] == started)


class QueueBackend(Protocol):
    """What a `QueuePlace` asks of a queue: the SQLite `ClassQueue` on one machine, `RemoteQueue` on a hub."""

    poll_s: float
    ttl_s: float

    def enter(self, label: str) -> int: ...
    def try_start(self, rid: int) -> int: ...
    def beat(self, rid: int) -> bool: ...
    def leave(self, rid: int) -> None: ...
    def entries(self) -> list[tuple[int, str, str]]: ...


class ClassQueue:
    """A first-come queue with `slots` runs at a time, shared by every process that opens `path`."""

    def __init__(self, path: str | Path, slots: int, poll_s: float = POLL_S, ttl_s: float = TTL_S) -> None:
        if slots < 1:
            raise ValueError(f"The class queue needs at least 1 slot, not {slots}.")
        self.path, self.slots, self.poll_s, self.ttl_s = Path(path), slots, poll_s, ttl_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._connect()
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never block the one writer
            db.execute(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
            for name, kind in (("owner", "TEXT NOT NULL DEFAULT ''"), ("seq", "REAL")):  # a file made before them
                if name not in columns:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
        finally:
            db.close()

    @classmethod
    def from_env(cls) -> QueueBackend | None:
        """The class service's queue when the hub set one up (BERTLAB_CLASS_SERVICE_URL), else the queue
        `bertlab serve --class` set up (BERTLAB_QUEUE), or None when there is none."""
        service = settings.class_service()
        if service is not None:
            return RemoteQueue(ServiceClient(*service))
        path = settings.queue_path()
        return None if path is None else cls(path, settings.queue_slots())

    def _connect(self) -> sqlite3.Connection:
        # A connection per call: runs wait in their own threads, and sqlite3 connections stay in one.
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _transaction(self, fn: Callable[[sqlite3.Connection], object]) -> object:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time: places and starts never race
            try:
                out = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out
        finally:
            db.close()

    def _expire(self, db: sqlite3.Connection) -> None:
        """Drop the entries of processes that are gone, or whose heartbeat stopped."""
        host, now = socket.gethostname(), time.time()
        rows = db.execute("SELECT id, host, pid, started, heartbeat FROM runs").fetchall()
        for rid, rhost, pid, started, beat in rows:
            if now - beat > self.ttl_s or (rhost == host and not process_alive(pid, started)):
                log.info("class queue: dropping entry %d of process %d (gone)", rid, pid)
                db.execute("DELETE FROM runs WHERE id = ?", (rid,))

    def entries(self) -> list[tuple[int, str, str]]:
        """(id, label, state) of every live entry, in queue order (join order unless the teacher moved one)."""
        def read(db: sqlite3.Connection) -> list[tuple[int, str, str]]:
            self._expire(db)
            return db.execute(f"SELECT id, label, state FROM runs ORDER BY {_ORDER}, id").fetchall()
        return self._transaction(read)  # type: ignore[return-value]

    def join(self, label: str) -> QueuePlace:
        """Join the queue now (at the back); `QueuePlace.wait` blocks until this run may start."""
        return QueuePlace(self, self.enter(label), label)

    def enter(self, label: str, owner: str = "", host: str | None = None, pid: int | None = None,
              started: str | None = None) -> int:
        """Add an entry at the back for `owner`'s run; its process (`host`, `pid`, `started`) is this
        one unless given (the class service queues other machines' runs). Returns its id."""
        pid = os.getpid() if pid is None else pid
        host = socket.gethostname() if host is None else host
        started = _process_start(pid) if started is None else started

        def join(db: sqlite3.Connection) -> int:
            cur = db.execute("INSERT INTO runs (label, host, pid, started, heartbeat, owner) VALUES (?, ?, ?, ?, ?, ?)",
                             (label[:200], host[:200], pid, started[:40], time.time(), owner[:200]))
            return int(cur.lastrowid)

        return self._transaction(join)  # type: ignore[return-value]

    def owner(self, rid: int) -> str | None:
        """Who queued entry `rid` ("" on one server), or None when there is no such entry."""
        def read(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT owner FROM runs WHERE id = ?", (rid,)).fetchone()
            return None if row is None else row[0]
        return self._transaction(read)  # type: ignore[return-value]

    def owners(self) -> dict[int, str]:
        """{entry id: owner} of every entry."""
        return dict(self._transaction(lambda db: db.execute("SELECT id, owner FROM runs").fetchall()))  # type: ignore[arg-type]

    def try_start(self, rid: int) -> int:
        """Start entry `rid` if a slot is free for it: 0 when it started, else the runs ahead of it
        (running, or waiting since before it). -1 when the entry is gone, CANCELLED when the teacher
        cancelled it (the entry goes with this answer)."""
        def step(db: sqlite3.Connection) -> int:
            self._expire(db)
            db.execute("UPDATE runs SET heartbeat = ? WHERE id = ?", (time.time(), rid))
            row = db.execute("SELECT state FROM runs WHERE id = ?", (rid,)).fetchone()
            if row is None:
                return -1
            if row[0] == "cancelled":
                db.execute("DELETE FROM runs WHERE id = ?", (rid,))
                return CANCELLED
            if row[0] == "running":
                return 0
            running = db.execute("SELECT COUNT(*) FROM runs WHERE state = 'running'").fetchone()[0]
            earlier = db.execute(f"SELECT COUNT(*) FROM runs WHERE state = 'waiting' AND ({_ORDER}, id) < "
                                 f"(SELECT {_ORDER}, id FROM runs WHERE id = ?)", (rid,)).fetchone()[0]
            if running + earlier < self.slots:
                db.execute("UPDATE runs SET state = 'running' WHERE id = ?", (rid,))
                return 0
            return running + earlier
        return self._transaction(step)  # type: ignore[return-value]

    def beat(self, rid: int) -> bool:
        """A running entry says it is alive; False when the teacher cancelled it (or it is gone)."""
        def step(db: sqlite3.Connection) -> bool:
            db.execute("UPDATE runs SET heartbeat = ? WHERE id = ?", (time.time(), rid))
            row = db.execute("SELECT state FROM runs WHERE id = ?", (rid,)).fetchone()
            return row is not None and row[0] != "cancelled"
        return self._transaction(step)  # type: ignore[return-value]

    def leave(self, rid: int) -> None:
        """Remove entry `rid` (its run ended, or its student left the queue)."""
        self._transaction(lambda db: db.execute("DELETE FROM runs WHERE id = ?", (rid,)))

    def first(self, rid: int) -> bool:
        """The teacher lets waiting entry `rid` go next: it moves ahead of every other waiting run. False
        when there is no such waiting entry."""
        def step(db: sqlite3.Connection) -> bool:
            front = db.execute(f"SELECT MIN({_ORDER}) FROM runs WHERE state = 'waiting'").fetchone()[0]
            return db.execute("UPDATE runs SET seq = ? WHERE id = ? AND state = 'waiting'",
                              (0 if front is None else front - 1, rid)).rowcount > 0
        return self._transaction(step)  # type: ignore[return-value]

    def cancel(self, rid: int) -> bool:
        """The teacher cancels entry `rid`: its slot is free at once, and its own place hears of it at
        its next look (a waiting run leaves the queue, a running one is asked to stop). False when
        there is no such entry."""
        def step(db: sqlite3.Connection) -> bool:
            return db.execute("UPDATE runs SET state = 'cancelled' WHERE id = ?", (rid,)).rowcount > 0
        return self._transaction(step)  # type: ignore[return-value]


class RemoteQueue:
    """The class service's queue (bertlab.hubservice), over HTTP as the hub user of `client`. The queue's
    logic is the service's `ClassQueue`; this only carries the calls."""

    def __init__(self, client: ServiceClient, poll_s: float = POLL_S * 2, ttl_s: float = TTL_S) -> None:
        self.client, self.poll_s, self.ttl_s = client, poll_s, ttl_s

    def join(self, label: str) -> QueuePlace:
        return QueuePlace(self, self.enter(label), label)

    def enter(self, label: str) -> int:
        pid = os.getpid()
        body = {"label": label[:200], "host": socket.gethostname(), "pid": pid, "started": _process_start(pid)}
        return int(self.client.call("POST", "api/queue", body)["id"])

    def try_start(self, rid: int) -> int:
        return int(self.client.call("POST", f"api/queue/{rid}/start")["ahead"])

    def beat(self, rid: int) -> bool:
        return bool(self.client.call("POST", f"api/queue/{rid}/beat")["alive"])

    def leave(self, rid: int) -> None:
        self.client.call("DELETE", f"api/queue/{rid}")

    def cancel(self, rid: int) -> bool:
        """The teacher cancels another's run (the service refuses a student)."""
        return bool(self.client.call("POST", f"api/queue/{rid}/cancel")["done"])

    def first(self, rid: int) -> bool:
        """The teacher lets a waiting run go next (the service refuses a student); False when it is not waiting."""
        return bool(self.client.call("POST", f"api/queue/{rid}/first")["done"])

    def owners(self) -> dict[int, str]:
        """{entry id: hub user}: the teacher's view (a student's has no names, so it is empty)."""
        return {e["id"]: e["owner"] for e in self.client.call("GET", "api/queue")["entries"] if "owner" in e}

    def entries(self) -> list[tuple[int, str, str]]:
        return [(e["id"], e["label"], e["state"]) for e in self.client.call("GET", "api/queue")["entries"]]


class QueuePlace:
    """One run's place in the queue: `wait()` for the go, `leave()` when done (always)."""

    def __init__(self, queue: QueueBackend | None, rid: int | None, label: str = "") -> None:
        self.queue, self.id, self.label = queue, rid, label
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None
        self._cancel: threading.Event | None = None
        self.cancelled_by_teacher = False

    def wait(self, cancel: threading.Event | None = None,
             on_place: Callable[[int], None] | None = None) -> bool:
        """Block until this run may start (True), or until `cancel` is set while it waits (False:
        the entry is gone from the queue). `on_place(ahead)` is called whenever the number of runs
        ahead changes (and first when the run has to wait at all)."""
        if self.queue is None:
            return not (cancel is not None and cancel.is_set())
        self._cancel = cancel
        shown = None
        while True:
            if cancel is not None and cancel.is_set():
                self.leave()
                return False
            ahead = self.queue.try_start(self.id)
            if ahead == 0:
                break
            if ahead == CANCELLED:  # the teacher took it out of the queue
                self.cancelled_by_teacher, self.id = True, None
                self.leave()
                return False
            if ahead < 0:  # dropped (e.g. this process was too slow to beat): join again at the back
                self.id = self.queue.enter(self.label)
                continue
            if ahead != shown and on_place is not None:
                on_place(ahead)
            shown = ahead
            (cancel or self._stop).wait(self.queue.poll_s)
        self._heart = threading.Thread(target=self._beating, name="bertlab-queue-heartbeat", daemon=True)
        self._heart.start()
        return True

    def _beating(self) -> None:
        while not self._stop.wait(self.queue.ttl_s / 4):
            try:
                rid = self.id
                if rid is not None and not self.queue.beat(rid) and self._cancel is not None:
                    self.cancelled_by_teacher = True
                    self._cancel.set()  # the run reads its cancel event: the teacher stopped it
            except QUEUE_ERRORS:
                log.warning("class queue: heartbeat failed", exc_info=True)

    def leave(self) -> None:
        """Give the slot (or the place) back; safe to call twice."""
        self._stop.set()
        if self.queue is not None and self.id is not None:
            rid, self.id = self.id, None
            try:
                self.queue.leave(rid)
            except QUEUE_ERRORS:  # the entry will expire with its heartbeat
                log.warning("class queue: could not leave", exc_info=True)


def join_queue(label: str) -> QueuePlace:
    """Join the class queue (BERTLAB_QUEUE) for a training run; without one, a place that starts at once."""
    queue = ClassQueue.from_env()
    return QueuePlace(None, None, label) if queue is None else queue.join(label)


@contextlib.contextmanager
def queued(label: str) -> Iterator[None]:
    """A command-line run in the class queue: wait for a slot (places go to the log), run, give it
    back, also on Ctrl-C. Without BERTLAB_QUEUE it runs at once."""
    t = join_queue(label)
    try:
        t.wait(on_place=lambda ahead: log.warning(waiting_text(ahead, leave="Ctrl-C")))
        yield
    finally:
        t.leave()
