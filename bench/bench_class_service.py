"""The hub's class service under a class: N students' kernels (threads in a few processes) poll it as
the Mask tab's question box does, over HTTP with their own tokens; the teacher pushes a question, every
student answers once they see it, the teacher reveals. The service runs as the hub starts it
(`python -m bertlab.hubservice`, its own process) and checks every token with JupyterHub's HubAuth,
against a stand-in for the hub's API (tests/hub_stub.py) in this process.

Measures how long a push and a reveal take to reach every student (the poll interval bounds them from
below, as with the SQLite store), one poll's round trip, one answer's round trip, and the service's CPU
time and memory, over several runs.

    python bench/bench_class_service.py --students 100 --runs 3 --out bench/results/class_service.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hub_stub import SERVICE_NAME, SERVICE_TOKEN, serving, user  # noqa: E402

from bertlab.classroom.remote import RemoteClassStore  # noqa: E402
from bertlab.classroom.store import Question  # noqa: E402
from bertlab.service_client import ServiceClient  # noqa: E402

# As bertlab.panels.classroom.POLL_IDLE_S / POLL_LIVE_S (not imported: the panels bring torch).
POLL_IDLE_S, POLL_LIVE_S = 3.0, 1.0
QUESTION = Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.5), ("floor", 0.2)])
PREFIX = f"/services/{SERVICE_NAME}/"


def _student(url: str, name: str, phase: float, ready: threading.Barrier, out: list) -> None:
    """Poll as ClassQuestionBox does, answer the question once seen, report when the push and the
    reveal were seen, the answer's round trip and every poll's."""
    store = RemoteClassStore(ServiceClient(url, f"t-{name}", name, timeout_s=60))
    store.changed()
    ready.wait()
    time.sleep(phase)  # pages opened at different moments poll out of step
    seen_push = answer_s = q = None
    polls = []
    while True:
        time.sleep(POLL_LIVE_S if q is not None else POLL_IDLE_S)
        start = time.perf_counter()
        changed = store.changed()
        polls.append(time.perf_counter() - start)
        if not changed:
            continue
        q = store.current()
        if q is None:
            continue
        if seen_push is None:
            seen_push = time.time()
            start = time.perf_counter()
            store.answer(q.id, name, "mat")
            answer_s = time.perf_counter() - start
        if q.revealed:
            out.append((seen_push, time.time(), answer_s, polls))
            return


def _students(url: str, names: list[str], ready, results) -> None:
    """One process of students: a thread each."""
    out: list = []
    barrier = threading.Barrier(len(names) + 1)
    phases = {n: random.Random(n).uniform(0, POLL_IDLE_S) for n in names}  # seeded by the student's name
    threads = [threading.Thread(target=_student, args=(url, n, phases[n], barrier, out), daemon=True) for n in names]
    for t in threads:
        t.start()
    barrier.wait()
    ready.put(len(names))
    for t in threads:
        t.join()
    results.put(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_mb(pid: int) -> dict[str, float]:
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        kb[key] = int(value.split()[0])
    return {"rss_mb": round(kb["Rss"] / 1024, 1), "pss_mb": round(kb["Pss"] / 1024, 1)}


def one_run(api_url: str, n: int, processes: int, folder: Path) -> dict:
    port = _free_port()
    env = {**os.environ, "JUPYTERHUB_API_URL": api_url, "JUPYTERHUB_API_TOKEN": SERVICE_TOKEN,
           "JUPYTERHUB_SERVICE_NAME": SERVICE_NAME, "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
           "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}", "PYTHONPATH": str(ROOT),
           "BERTLAB_CLASS_SERVICE_DB": str(folder / f"class-{port}.sqlite")}
    service = subprocess.Popen([sys.executable, "-m", "bertlab.hubservice"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}{PREFIX}"
    try:
        teacher = RemoteClassStore(ServiceClient(url, "t-tess", "tess", timeout_s=60))
        deadline = time.monotonic() + 60
        while True:
            try:
                teacher.current()
                break
            except OSError:
                assert time.monotonic() < deadline, "the class service did not start"
                time.sleep(0.2)
        names = [f"s{i}" for i in range(n)]
        ctx = mp.get_context("fork")
        ready, results = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=_students, args=(url, names[i::processes], ready, results))
                 for i in range(processes)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        time.sleep(2 * POLL_IDLE_S)  # every student polling, the class idle
        cpu0, t0 = _cpu_s(service.pid), time.time()
        q = teacher.push(QUESTION)
        while len(teacher.answers(q.id)) < n:
            time.sleep(0.2)
        answered_s = time.time() - t0
        t_reveal = time.time()
        teacher.reveal(q.id)
        out = [row for _ in procs for row in results.get(timeout=120)]
        cpu, wall = _cpu_s(service.pid) - cpu0, time.time() - t0
        memory = _memory_mb(service.pid)
        for p in procs:
            p.join(30)
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(30)
    push = [seen - t0 for seen, _, _, _ in out]
    reveal = [seen - t_reveal for _, seen, _, _ in out]
    answers = sorted(a for _, _, a, _ in out)
    polls = sorted(p for *_, ps in out for p in ps)
    return {"push_reach_s": {"median": round(statistics.median(push), 2), "max": round(max(push), 2)},
            "reveal_reach_s": {"median": round(statistics.median(reveal), 2), "max": round(max(reveal), 2)},
            "all_answered_s": round(answered_s, 2),
            "answer_ms": {"median": round(1000 * statistics.median(answers), 1),
                          "p95": round(1000 * answers[int(0.95 * (len(answers) - 1))], 1)},
            "poll_ms": {"median": round(1000 * statistics.median(polls), 2),
                        "p95": round(1000 * polls[int(0.95 * (len(polls) - 1))], 2)},
            "service_cpu_share": round(cpu / wall, 3), "service_memory": memory, "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=100)
    ap.add_argument("--processes", type=int, default=4, help="student processes (threads share them)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "class_service.json")
    ap.add_argument("--quick", action="store_true", help="20 students, one run, results not written")
    a = ap.parse_args()
    if a.quick:
        a.students, a.runs, a.out = 20, 1, None
    users = {f"t-s{i}": user(f"s{i}") for i in range(a.students)}
    users["t-tess"] = user("tess", groups=("teachers",))
    runs, load_before = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, serving(None, users) as api_url:
        for i in range(a.runs):
            runs.append(one_run(api_url, a.students, a.processes, Path(tmp)))
            print(f"run {i + 1}: {json.dumps(runs[-1])}", flush=True)
    result = {
        "what": ("the hub's class service (python -m bertlab.hubservice, HubAuth against a stand-in hub API) "
                 f"under {a.students} students polling as the question box does (every {POLL_IDLE_S:g} s idle, "
                 f"{POLL_LIVE_S:g} s live): a push and a reveal reaching every student, each one's answer, "
                 "one poll's round trip, the service's share of one core and its memory"),
        "command": f"python bench/bench_class_service.py --students {a.students} --runs {a.runs}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_before": load_before},
        "students": a.students, "runs": runs,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
