"""The class store: the teacher's live question and the students' guesses, shared by every kernel.

Each student's page runs in its own kernel (its own process), and the teacher's view in another,
so the state lives in one SQLite file in WAL mode that all of them open (`BERTLAB_CLASS_STORE`,
set by `bertlab serve --class`). WAL lets the many readers (students polling once a second) go on
while one writer commits; every write is one short transaction, so a kernel that dies mid-way
leaves nothing locked (SQLite rolls its transaction back, the OS drops its locks).

    store = ClassStore(path)
    q = store.push(Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.4), ...]))  # teacher
    store.answer(q.id, student, "mat")      # each student, once (a later answer replaces it)
    store.answers(q.id)                      # {student: guess}
    store.reveal(q.id)                       # everyone's current() now says revealed

Only one question is live at a time: a push ends the one before it. Guesses are anonymous
(a random id per page), normalised by `normalise_guess` so that "Mat " and "mat" count together.

`QuestionStore` is the interface the panels use; where the student servers share no disk (JupyterHub
on Kubernetes) the class service (bertlab.hubservice) holds a `ClassStore` and the kernels reach it
through `bertlab.classroom.remote.RemoteClassStore`, which has the same methods.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

Kind = Literal["mask", "nsp"]
KINDS: tuple[Kind, ...] = ("mask", "nsp")
MAX_GUESS_CHARS = 40
MAX_QUESTION_CHARS = 5000  # a sentence pair of the longest input a model takes, with room to spare
MAX_MODEL_ANSWERS, MAX_ANSWER_CHARS = 100, 100  # the top-k words shown beside a question
BUSY_TIMEOUT_MS = 10_000  # a writer waits this long for another's commit (commits take milliseconds)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS questions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,                  -- mask | nsp
    text TEXT NOT NULL,                  -- the sentence with its mask token, or sentence A
    text_b TEXT,                         -- sentence B of an NSP pair
    model TEXT NOT NULL,                 -- JSON [[answer, probability], ...], most probable first
    pushed REAL NOT NULL,
    revealed REAL,                       -- when the teacher revealed it (NULL: not yet)
    ended REAL                           -- when it stopped being live (NULL: live)
);
CREATE TABLE IF NOT EXISTS answers (
    question_id INTEGER NOT NULL REFERENCES questions(id),
    student TEXT NOT NULL,
    guess TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (question_id, student)
);
"""


class GuessError(ValueError):
    """A guess that cannot be counted; the message says what to type instead."""


class QuestionClosedError(GuessError):
    """An answer to a question that is no longer open (revealed, ended, or replaced by a newer one)."""


@dataclass(frozen=True)
class Question:
    """One question the teacher pushes. `model` is the model's answer, hidden from students until
    they reveal: (answer, probability) pairs, most probable first (the top-k words for a [MASK]; the
    two verdicts for an NSP pair)."""

    kind: Kind
    text: str
    text_b: str | None = None
    model: list[tuple[str, float]] = field(default_factory=list)
    id: int | None = None  # set by the store on push
    revealed: bool = False
    live: bool = True


def question_json(q: Question) -> dict[str, Any]:
    """`q` as JSON (the class service's answers)."""
    return {"kind": q.kind, "text": q.text, "text_b": q.text_b, "model": [[a, float(p)] for a, p in q.model],
            "id": q.id, "revealed": q.revealed, "live": q.live}


def question_from_json(d: dict[str, Any]) -> Question:
    """The `Question` that `question_json` wrote. Raises ValueError for a malformed one."""
    try:
        kind, text = d["kind"], d["text"]
        model = [(str(a), float(p)) for a, p in d.get("model") or []]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a class question needs kind, text and model ([[answer, probability], ...]): {e}") from None
    if not isinstance(text, str) or not isinstance(d.get("text_b") or "", str):
        raise ValueError("a class question's text and text_b are strings.")
    qid = d.get("id")
    return Question(kind=kind, text=text, text_b=d.get("text_b"), model=model,
                    id=None if qid is None else int(qid), revealed=bool(d.get("revealed")),
                    live=bool(d.get("live", True)))


class QuestionStore(Protocol):
    """The class store as the panels use it: `ClassStore` (SQLite, one machine) or
    `bertlab.classroom.remote.RemoteClassStore` (the class service on a hub)."""

    def push(self, question: Question) -> Question: ...
    def reveal(self, question_id: int) -> None: ...
    def end(self, question_id: int) -> None: ...
    def answers(self, question_id: int) -> dict[str, str]: ...
    def current(self) -> Question | None: ...
    def changed(self) -> bool: ...
    def answer(self, question_id: int, student: str, guess: str) -> str: ...
    def close(self) -> None: ...
    def another(self) -> QuestionStore: ...


def normalise_guess(guess: str) -> str:
    """A guess as it is counted: spaces trimmed and collapsed, case folded. Raises GuessError (with
    what to do) for an empty guess or one over MAX_GUESS_CHARS characters."""
    text = " ".join(str(guess).split()).casefold()
    if not text:
        raise GuessError("Type a guess first (one word), then press Send.")
    if len(text) > MAX_GUESS_CHARS:
        raise GuessError(f"'{text[:29]}…' is too long for a guess: type one word "
                         f"(at most {MAX_GUESS_CHARS} characters).")
    return text


class ClassStore:
    """The class's shared question and answers in the SQLite file `path` (created when missing).
    One connection per store; safe to use from several threads of one kernel."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL's safe setting: a power cut may lose the last commit only
        self._db.executescript(_SCHEMA)
        self._seen_version: int | None = None

    @property
    def journal_mode(self) -> str:
        with self._lock:
            return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def another(self) -> ClassStore:
        """A second connection to the same file, whose `changed()` is its own."""
        return ClassStore(self.path)

    # -- the teacher ---------------------------------------------------------------------------
    def push(self, question: Question) -> Question:
        """Make `question` the live one (ending any other); returns it with its id."""
        if question.kind not in KINDS:
            raise ValueError(f"question kind {str(question.kind)[:20]!r}: use one of {', '.join(KINDS)}.")
        size = len(question.text) + len(question.text_b or "")
        if size > MAX_QUESTION_CHARS:
            raise ValueError(f"a class question is at most {MAX_QUESTION_CHARS:,} characters of text; this one has "
                             f"{size:,}: push a shorter sentence.")
        if len(question.model) > MAX_MODEL_ANSWERS or any(len(a) > MAX_ANSWER_CHARS for a, _ in question.model):
            raise ValueError(f"a class question carries at most {MAX_MODEL_ANSWERS} of the model's answers, each at "
                             f"most {MAX_ANSWER_CHARS} characters.")
        now = time.time()
        with self._write() as db:
            db.execute("UPDATE questions SET ended = ? WHERE ended IS NULL", (now,))
            cur = db.execute(
                "INSERT INTO questions (kind, text, text_b, model, pushed) VALUES (?, ?, ?, ?, ?)",
                (question.kind, question.text, question.text_b,
                 json.dumps([[a, float(p)] for a, p in question.model]), now),
            )
        return replace(question, id=cur.lastrowid, revealed=False, live=True)

    def reveal(self, question_id: int) -> None:
        """Show the model's answer (and the class's guesses) to every student; answers close."""
        with self._write() as db:
            db.execute("UPDATE questions SET revealed = ? WHERE id = ? AND revealed IS NULL",
                       (time.time(), question_id))

    def end(self, question_id: int) -> None:
        """Take the question off every student's screen."""
        with self._write() as db:
            db.execute("UPDATE questions SET ended = ? WHERE id = ? AND ended IS NULL", (time.time(), question_id))

    def answers(self, question_id: int) -> dict[str, str]:
        """{student: guess} for a question (normalised guesses; the latest one per student)."""
        with self._lock:
            rows = self._db.execute("SELECT student, guess FROM answers WHERE question_id = ? ORDER BY at",
                                    (question_id,)).fetchall()
        return dict(rows)

    # -- everyone ------------------------------------------------------------------------------
    def current(self) -> Question | None:
        """The live question (revealed or not), or None when there is none."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, kind, text, text_b, model, revealed FROM questions WHERE ended IS NULL "
                "ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        qid, kind, text, text_b, model, revealed = row
        return Question(kind=kind, text=text, text_b=text_b, model=[(a, p) for a, p in json.loads(model)],
                        id=qid, revealed=revealed is not None, live=True)

    def changed(self) -> bool:
        """Whether another connection committed since the last call (True on the first call): one
        cheap PRAGMA, for polling."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
        changed, self._seen_version = version != self._seen_version, version
        return changed

    # -- a student -----------------------------------------------------------------------------
    def answer(self, question_id: int, student: str, guess: str) -> str:
        """Record (or replace) `student`'s guess while the question is open; returns the guess as
        counted. Raises QuestionClosedError once it is revealed, ended or replaced."""
        guess = normalise_guess(guess)
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO answers (question_id, student, guess, at) "
                "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM questions WHERE id = ? "
                "AND ended IS NULL AND revealed IS NULL) "
                "ON CONFLICT (question_id, student) DO UPDATE SET guess = excluded.guess, at = excluded.at",
                (question_id, student, guess, time.time(), question_id),
            )
        if cur.rowcount == 0:
            raise QuestionClosedError("The teacher has already revealed or closed this question: "
                                      "your guess was not counted. Wait for the next one.")
        return guess

    # -- plumbing --------------------------------------------------------------------------------
    def _write(self) -> _Transaction:
        return _Transaction(self)


class _Transaction:
    """`with store._write() as db:` one IMMEDIATE transaction (the write lock taken at once, so
    two writers never deadlock upgrading a read), committed on success, rolled back on error."""

    def __init__(self, store: ClassStore) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store._lock.release()
            raise
        return self.store._db

    def __exit__(self, kind, value, tb) -> None:
        try:
            self.store._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.store._lock.release()
