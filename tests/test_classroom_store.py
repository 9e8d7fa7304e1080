"""The class store: one SQLite file in WAL mode shared by separate processes (one per
kernel). Answers from two processes all count, a reveal is seen by every process, a killed process
leaves nothing locked, and guesses are counted as normalised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertlab.classroom.store import (
    MAX_GUESS_CHARS,
    ClassStore,
    GuessError,
    Question,
    QuestionClosedError,
    normalise_guess,
)

MASK_Q = Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.5), ("floor", 0.2)])

# A student kernel in its own process: answer `n` times (students s<tag>-0..n-1), print "done".
ANSWERING = """
import sys
from bertlab.classroom.store import ClassStore
store = ClassStore(sys.argv[1])
qid, tag, n = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
for i in range(n):
    store.answer(qid, f"s{tag}-{i}", "Mat" if i % 2 else " floor ")
print("done", flush=True)
"""

# Another kernel that only looks: prints whether the live question is revealed, as it sees it.
LOOKING = """
import sys
from bertlab.classroom.store import ClassStore
q = ClassStore(sys.argv[1]).current()
print(q.id, q.revealed, flush=True)
"""


def _python(code: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "class" / "class.sqlite"


def test_wal_mode_is_on_and_stays_on_for_every_opener(path):
    first = ClassStore(path)
    assert first.journal_mode == "wal"
    first.push(MASK_Q)
    assert Path(f"{path}-wal").exists()  # the write-ahead log, not a rollback journal
    assert ClassStore(path).journal_mode == "wal"


def test_two_processes_answering_at_once_all_count(path):
    teacher = ClassStore(path)
    q = teacher.push(MASK_Q)
    n = 40
    procs = [_python(ANSWERING, path, q.id, tag, n) for tag in "ab"]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "done", err[-2000:]
    answers = teacher.answers(q.id)
    assert len(answers) == 2 * n
    assert sorted(set(answers.values())) == ["floor", "mat"]  # "Mat" and " floor " counted as normalised


def test_reveal_is_seen_by_every_process_and_closes_answers(path):
    teacher, student = ClassStore(path), ClassStore(path)
    q = teacher.push(MASK_Q)
    student.answer(q.id, "s1", "mat")
    for p in [_python(LOOKING, path) for _ in range(2)]:
        assert p.communicate(timeout=60)[0].split() == [str(q.id), "False"]
    teacher.reveal(q.id)
    for p in [_python(LOOKING, path) for _ in range(2)]:
        assert p.communicate(timeout=60)[0].split() == [str(q.id), "True"]
    assert student.current().revealed
    with pytest.raises(QuestionClosedError, match="already revealed"):
        student.answer(q.id, "s2", "floor")
    assert student.answers(q.id) == {"s1": "mat"}


def test_a_student_may_change_a_guess_until_the_reveal(path):
    store = ClassStore(path)
    q = store.push(MASK_Q)
    store.answer(q.id, "s1", "mat")
    store.answer(q.id, "s1", "rug")
    assert store.answers(q.id) == {"s1": "rug"}


def test_a_push_ends_the_question_before_and_its_late_answers(path):
    store = ClassStore(path)
    old = store.push(MASK_Q)
    new = store.push(Question("nsp", "A.", "B.", model=[("B follows A", 0.9), ("B is random", 0.1)]))
    current = store.current()
    assert (current.id, current.kind, current.text_b, current.revealed) == (new.id, "nsp", "B.", False)
    assert current.model == [("B follows A", 0.9), ("B is random", 0.1)]
    with pytest.raises(QuestionClosedError):
        store.answer(old.id, "s1", "mat")
    store.end(new.id)
    assert store.current() is None


def test_changed_is_one_cheap_check_for_other_processes_commits(path):
    student, teacher = ClassStore(path), ClassStore(path)
    assert student.changed()  # first look
    assert not student.changed()
    q = teacher.push(MASK_Q)
    assert student.changed() and not student.changed()
    teacher.reveal(q.id)
    assert student.changed()


def test_a_killed_kernel_mid_write_blocks_nobody(path):
    """A kernel killed inside a write transaction (holding SQLite's write lock): the others still write."""
    ClassStore(path).push(MASK_Q)
    holder = _python(
        "import sys, time\nfrom bertlab.classroom.store import ClassStore\n"
        "s = ClassStore(sys.argv[1]); s._db.execute('BEGIN IMMEDIATE')\n"
        "s._db.execute(\"UPDATE questions SET text = 'half-written'\")\nprint('locked', flush=True); time.sleep(600)\n",
        path)
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    store = ClassStore(path)
    start = time.monotonic()
    q = store.current()
    store.answer(q.id, "s1", "mat")
    assert time.monotonic() - start < 2  # no waiting for a dead process's lock
    assert q.text == MASK_Q.text  # its half-done write was rolled back
    assert store.answers(q.id) == {"s1": "mat"}


def test_guesses_are_normalised_and_bad_ones_say_what_to_do():
    assert normalise_guess("  The   Store ") == "the store"
    with pytest.raises(GuessError, match="Type a guess first"):
        normalise_guess("   ")
    with pytest.raises(GuessError, match="too long") as e:
        normalise_guess("word " * 2000)
    assert len(str(e.value)) < 120  # the long input is not echoed whole
    assert len(normalise_guess("x" * MAX_GUESS_CHARS)) == MAX_GUESS_CHARS


def test_an_unknown_question_kind_is_refused(path):
    with pytest.raises(ValueError, match="mask, nsp"):
        ClassStore(path).push(Question("poll", "?"))  # type: ignore[arg-type]
