"""The class store under a class: N student processes (one per kernel, as `bertlab serve --class N`
runs them) poll the store as the Mask tab does, the teacher pushes a question, every student answers
at once, the teacher reveals. Measures what one poll costs, how long a push and a reveal take to reach
every student, and how long an answer waits for SQLite's write lock when all answer together.

    python bench/bench_class_store.py --students 30 --out bench/results/class_store.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bertlab.classroom.store import ClassStore, Question  # noqa: E402

# As bertlab.panels.classroom.POLL_IDLE_S / POLL_LIVE_S (not imported: each student process re-imports
# this file, and the panels bring torch; tests/test_classroom_store.py checks they agree).
POLL_IDLE_S, POLL_LIVE_S = 3.0, 1.0

QUESTION = Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.5), ("floor", 0.2)])


def student(path: str, i: int, idle_s: float, live_s: float, ready, out) -> None:
    """Poll as ClassQuestionBox does; answer the question once seen; report when it saw the push and the
    reveal (wall clock), and how long its answer took."""
    store = ClassStore(path)
    store.changed()
    ready.wait()
    seen_push = answer_s = None
    q = None
    while True:
        time.sleep(live_s if q is not None else idle_s)
        if not store.changed():
            continue
        q = store.current()
        if q is None:
            continue
        if seen_push is None:
            seen_push = time.time()
            start = time.perf_counter()
            store.answer(q.id, f"s{i}", "mat" if i % 3 else "rug")
            answer_s = time.perf_counter() - start
        if q.revealed:
            out.put((seen_push, time.time(), answer_s))
            return


def poll_cost(path: Path, n: int = 2000) -> dict[str, float]:
    """Microseconds per `changed()` (every poll) and per `current()` (only when something changed)."""
    store = ClassStore(path)
    start = time.perf_counter()
    for _ in range(n):
        store.changed()
    changed_us = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for _ in range(n // 10):
        store.current()
    current_us = (time.perf_counter() - start) / (n // 10) * 1e6
    return {"changed_us": round(changed_us, 1), "current_us": round(current_us, 1)}


def run(students: int, idle_s: float, live_s: float) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bertlab-class-bench-"))
    path = folder / "class.sqlite"
    teacher = ClassStore(path)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(students + 1), ctx.Queue()
    procs = [ctx.Process(target=student, args=(str(path), i, idle_s, live_s, ready, out)) for i in range(students)]
    for p in procs:
        p.start()
    ready.wait()
    time.sleep(1.5 * idle_s)  # the push lands mid-way between two idle polls
    pushed = time.time()
    q = teacher.push(QUESTION)
    deadline = time.monotonic() + 120
    while len(teacher.answers(q.id)) < students and time.monotonic() < deadline:
        time.sleep(0.05)
    answered = len(teacher.answers(q.id))
    revealed = time.time()
    teacher.reveal(q.id)
    rows = [out.get(timeout=120) for _ in range(students)]
    for p in procs:
        p.join(timeout=30)
    push_s = sorted(seen - pushed for seen, _, _ in rows)
    reveal_s = sorted(seen - revealed for _, seen, _ in rows)
    answer_ms = sorted(a * 1000 for _, _, a in rows)
    return {
        "students": students, "answers_counted": answered,
        "poll_s": {"idle": idle_s, "live": live_s},
        "push_to_every_student_s": {"median": round(statistics.median(push_s), 2), "max": round(push_s[-1], 2)},
        "reveal_to_every_student_s": {"median": round(statistics.median(reveal_s), 2), "max": round(reveal_s[-1], 2)},
        "answer_ms": {"median": round(statistics.median(answer_ms), 1),
                      "p95": round(answer_ms[int(0.95 * (len(answer_ms) - 1))], 1), "max": round(answer_ms[-1], 1)},
        "one_poll": poll_cost(path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--idle-s", type=float, default=POLL_IDLE_S, help="poll interval with no live question")
    parser.add_argument("--live-s", type=float, default=POLL_LIVE_S, help="poll interval while a question is live")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "class_store.json")
    args = parser.parse_args(argv)
    result = run(args.students, args.idle_s, args.live_s)
    result["meta"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                      "sqlite": __import__("sqlite3").sqlite_version}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    r = result
    print("| students | push reaches all (max) | reveal reaches all (max) | answer p95 | one poll |")
    print(f"| {r['students']} | {r['push_to_every_student_s']['max']} s | {r['reveal_to_every_student_s']['max']} s "
          f"| {r['answer_ms']['p95']} ms | {r['one_poll']['changed_us']} µs |")
    return 0 if r["answers_counted"] == r["students"] else 1


if __name__ == "__main__":
    sys.exit(main())
