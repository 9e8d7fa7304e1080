"""Memory per student: the proportional set size (PSS) of kernels that each run the dashboard.

Starts K kernels at once, as a class server does for K students, runs `build_app()` in each (the offline
default loaded, the picker and the first tab built: what a student's page holds before any click), lets
them idle, and reads `/proc/PID/smaps_rollup` of every kernel. PSS charges each page shared between
processes (the torch libraries, memory-mapped weights) in equal parts to the processes that map it, so
the PSS of K kernels adds up to what they cost the machine together. The cost of one more student is the
marginal PSS: (total(K) - total(1)) / (K - 1), for the largest K. Aim: <= 250 MB. Each kernel's private
memory (USS) is reported too: what the marginal cost tends to as more kernels share the rest. PSS of a
shared page is also split with any other process on the machine that maps it (another bertlab, torch).

  --mode kernel   Jupyter kernels (ipykernel, started by jupyter_client as Voila starts them); default
  --mode process  plain Python processes (no Jupyter), for a machine without ipykernel
  --mode fork     plain processes forked from one warm parent that has imported the dashboard's code,
                  loaded the model and run `gc.freeze()` (as pre-fork servers do): what kernels forked
                  from such a parent would cost. The parent counts in every total (the server keeps it).
  --mode serve-fork  the real class server, `bertlab serve --class N --fork-kernels`, for each N of
                  --seats: seconds from the command to N pre-heated seats (/bertlab/api/status), then the
                  PSS and USS of every idle student kernel and of the zygote they were forked from.
                  Writes bench/results/memory_fork_kernels.json, with the machine's load average.

Each kernel gets BERTLAB_THREADS=--threads (and OMP_NUM_THREADS), as `bertlab serve --class` sets.
Prints a markdown table and writes bench/results/memory.json.

    python bench/bench_memory.py [--quick] [--kernels 1 4] [--mode kernel|process|fork] [--threads 1]
    python bench/bench_memory.py --mode serve-fork --seats 20 [100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

AIM_MB = 250.0
BUILD = "from bertlab.panels.app import build_app\napp = build_app()\napp.widget"
DEFAULT_OUT = str(Path(__file__).parent / "results" / "memory.json")
FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty")


def smaps_rollup(pid: int) -> dict[str, float]:
    """The memory totals of process `pid` in MB, from /proc/PID/smaps_rollup (Linux 4.14+)."""
    return parse_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())


def parse_rollup(text: str) -> dict[str, float]:
    """`Name:   1234 kB` lines -> {name: MB}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":") and parts[2] == "kB":
            out[parts[0][:-1]] = int(parts[1]) / 1024
    return out


def marginal(totals: dict[int, float]) -> float | None:
    """MB one more kernel costs: (total at the most kernels - total at the fewest) / the difference in count."""
    ks = sorted(totals)
    if len(ks) < 2:
        return None
    return (totals[ks[-1]] - totals[ks[0]]) / (ks[-1] - ks[0])


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "BERTLAB_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


# -- kernels -----------------------------------------------------------------------------------
class _Kernels:
    """K ipykernels that have each built the app; `.pids`; `close()` shuts them down."""

    def __init__(self, k: int, threads: int, timeout: float) -> None:
        from jupyter_client import KernelManager

        self.managers = []
        for _ in range(k):
            km = KernelManager(kernel_name="python3")
            km.start_kernel(env=_env(threads))
            self.managers.append(km)
        self.clients = [km.client() for km in self.managers]
        for kc in self.clients:
            kc.start_channels()
            kc.wait_for_ready(timeout=timeout)
        msg_ids = [kc.execute(BUILD) for kc in self.clients]  # all at once, as students arriving together
        for kc, msg_id in zip(self.clients, msg_ids):
            _wait_reply(kc, msg_id, timeout)

    @property
    def pids(self) -> list[int]:
        return [int(getattr(km.provisioner, "pid", None) or km.provisioner.process.pid) for km in self.managers]

    def close(self) -> None:
        for kc in self.clients:
            kc.stop_channels()
        for km in self.managers:
            km.shutdown_kernel(now=True)


def _wait_reply(kc, msg_id: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(1.0, end - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["content"]["status"] != "ok":
            raise SystemExit(f"building the app failed in a kernel: {msg['content'].get('ename')}: "
                             f"{msg['content'].get('evalue')}")
        return


# -- plain processes ---------------------------------------------------------------------------
class _Processes:
    """K Python processes that have each built the app and wait on stdin."""

    CODE = BUILD.replace("\napp.widget", "") + "\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()\n"

    def __init__(self, k: int, threads: int, timeout: float) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=_env(threads)) for _ in range(k)]
        for p in self.procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(f"building the app failed in a process (exit {p.wait(timeout)}).")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
            p.wait(timeout=60)


# -- processes forked from a warm parent -------------------------------------------------------
class _Forked:
    """One warm parent (the model loaded, the dashboard's modules imported, `gc.freeze()`), and K
    children forked from it that have each built the app on the parent's model; all wait on stdin."""

    CODE = """
import gc, os, sys
from bertlab.runtime import cap_threads
cap_threads()
from bertlab.loading import load
from bertlab.panels.app import App
from bertlab.panels.state import DEFAULT_NAME, ModelState
import bertlab.panels.mask, bertlab.panels.classroom  # the first tab's code
model, tok = load(None)
gc.collect()
gc.freeze()  # the parent's objects leave the collector's lists: children's collections do not touch their pages
children = []
for _ in range(int(sys.argv[1])):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        app = App(ModelState(model, tok, name=DEFAULT_NAME))
        app.widget
        os.write(w, b"ready")
        sys.stdin.read()
        os._exit(0)
    os.close(w)
    children.append((pid, r))
for pid, r in children:
    if os.read(r, 5) != b"ready":
        sys.exit(1)
print(" ".join(str(pid) for pid, _ in children), flush=True)
sys.stdin.read()
for pid, _ in children:
    os.waitpid(pid, 0)
"""

    def __init__(self, k: int, threads: int, timeout: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, str(k)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=_env(threads))
        line = self.proc.stdout.readline().split()
        if len(line) != k:
            raise SystemExit(f"forking the app failed (exit {self.proc.wait(timeout)}).")
        self.children = [int(pid) for pid in line]

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid, *self.children]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(k: int, mode: str, threads: int, settle: float, timeout: float) -> dict:
    """Start `k` kernels, build the app in each, idle `settle` s, read their memory (MB)."""
    t = time.perf_counter()
    group = {"kernel": _Kernels, "process": _Processes, "fork": _Forked}[mode](k, threads, timeout)
    try:
        ready_s = time.perf_counter() - t
        time.sleep(settle)
        per = [smaps_rollup(pid) for pid in group.pids]
    finally:
        group.close()
    row = {"kernels": k, "ready_s": round(ready_s, 1)}
    for f in FIELDS:
        row[f"{f.lower()}_mb"] = [round(p.get(f, 0.0), 1) for p in per]
    row["uss_mb"] = [round(p.get("Private_Clean", 0.0) + p.get("Private_Dirty", 0.0), 1) for p in per]
    row["pss_total_mb"] = round(sum(p["Pss"] for p in per), 1)  # with --mode fork: the parent's too
    row["pss_mean_mb"] = round(row["pss_total_mb"] / k, 1)
    return row


# -- the class server with forked kernels -----------------------------------------------------------
def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid`."""
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def serve_fork(seats: int, settle: float, timeout: float) -> dict:
    """`bertlab serve --class seats --fork-kernels` on a free loopback port: time to `seats` pre-heated
    kernels, then the memory of each idle kernel and of the zygote."""
    import shutil
    import socket
    import tempfile
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="bench_fork_")
    token = "bench-fork-token"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"], env["BERTLAB_TOKEN"] = "1", token
    load_before = os.getloadavg()
    t = time.perf_counter()
    log = Path(folder) / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--class", str(seats), "--fork-kernels",
                                 "--no-browser", "--port", str(port), "--class-dir",
                                 folder + "/class"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    failed = True
    try:
        ready, status = None, {}
        while time.perf_counter() - t < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the class server exited ({proc.returncode}).")
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/bertlab/api/status",
                                             headers={"Authorization": f"token {token}"})
                status = json.loads(urllib.request.urlopen(req, timeout=30).read())
            except OSError:
                status = {}
            if status.get("pool", {}).get("ready") == seats:
                ready = time.perf_counter() - t
                break
            time.sleep(1.0)
        if ready is None:
            raise SystemExit(f"{seats} seats were not pre-heated within {timeout} s (last status: {status}).")
        load_ready = os.getloadavg()
        time.sleep(settle)
        zygotes = [p for p in _descendants(proc.pid) if "bertlab.serving.forking" in _cmdline(p)
                   and "bertlab.serving.forking" not in _cmdline(int(Path(f"/proc/{p}/stat").read_text()
                                                                      .rsplit(")", 1)[1].split()[1]))]
        if len(zygotes) != 1:
            raise SystemExit(f"expected one zygote, found {zygotes}")
        kernels = _children(zygotes[0])
        per = [smaps_rollup(p) for p in kernels]
        zygote = smaps_rollup(zygotes[0])
        failed = False
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=120)
        if failed:
            print(f"the server's log: {log}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    pss = [p["Pss"] for p in per]
    uss = [p.get("Private_Clean", 0.0) + p.get("Private_Dirty", 0.0) for p in per]
    return {"seats": seats, "kernels_found": len(kernels), "preheat_s": round(ready, 1),
            "pss_per_kernel_mb": round(sum(pss) / len(pss), 1), "pss_max_mb": round(max(pss), 1),
            "uss_per_kernel_mb": round(sum(uss) / len(uss), 1), "zygote_pss_mb": round(zygote["Pss"], 1),
            "pss_total_mb": round(sum(pss) + zygote["Pss"], 1),
            "pss_total_per_seat_mb": round((sum(pss) + zygote["Pss"]) / len(pss), 1),
            "load_avg_at_start": [round(x, 2) for x in load_before],
            "load_avg_when_ready": [round(x, 2) for x in load_ready]}


def main_serve_fork(a: argparse.Namespace) -> None:
    rows = []
    print("| seats | pre-heat s | PSS per kernel MB | USS per kernel MB | zygote PSS MB | PSS total per seat MB "
          "| load avg (1 min) start / ready |\n|---|---|---|---|---|---|---|")
    for n in a.seats:
        r = serve_fork(n, a.settle, a.timeout)
        rows.append(r)
        print(f"| {n} | {r['preheat_s']} | {r['pss_per_kernel_mb']} | {r['uss_per_kernel_mb']} | "
              f"{r['zygote_pss_mb']} | {r['pss_total_per_seat_mb']} | {r['load_avg_at_start'][0]} / "
              f"{r['load_avg_when_ready'][0]} |", flush=True)
    import torch

    meta = {"mode": "serve-fork", "command": "bertlab serve --class N --fork-kernels", "settle_s": a.settle,
            "torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "model": "offline default (MiniLM-L6 + bertlab heads)",
            "shared_machine": "other engineers' jobs ran on the same cores meanwhile: see the load averages"}
    out = Path(a.out if a.out != DEFAULT_OUT else Path(__file__).parent / "results" / "memory_fork_kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"written to {out}")


HEADER = ("| kernels | PSS each MB | PSS total MB | PSS anon each MB | PSS file each MB | USS each MB | RSS each MB "
          "| ready s |\n|---|---|---|---|---|---|---|---|")


def _fmt(r: dict) -> str:
    def mean(key: str) -> float:
        return round(sum(r[key]) / len(r[key]), 1)

    return (f"| {r['kernels']} | {r['pss_mean_mb']} | {r['pss_total_mb']} | {mean('pss_anon_mb')} | "
            f"{mean('pss_file_mb')} | {mean('uss_mb')} | {mean('rss_mb')} | {r['ready_s']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, nargs="+", default=[1, 4], help="group sizes to measure")
    p.add_argument("--mode", choices=["kernel", "process", "fork", "serve-fork"], default="kernel")
    p.add_argument("--seats", type=int, nargs="+", default=[20], help="with --mode serve-fork: class sizes")
    p.add_argument("--threads", type=int, default=1, help="BERTLAB_THREADS for each kernel")
    p.add_argument("--settle", type=float, default=3.0, help="seconds of idling before reading memory")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--quick", action="store_true", help="1 and 2 kernels")
    p.add_argument("--out", default=DEFAULT_OUT)
    a = p.parse_args()
    if not Path("/proc/self/smaps_rollup").is_file():
        raise SystemExit("this benchmark reads /proc/PID/smaps_rollup: it needs Linux 4.14 or later.")
    if a.mode == "serve-fork":
        main_serve_fork(a)
        return
    if a.quick:
        a.kernels = [1, 2]
    print(HEADER)
    rows = []
    for k in sorted(set(a.kernels)):
        rows.append(measure(k, a.mode, a.threads, a.settle, a.timeout))
        print(_fmt(rows[-1]), flush=True)
    m = marginal({r["kernels"]: r["pss_total_mb"] for r in rows})
    uss = rows[-1]["uss_mb"]
    summary = {"marginal_pss_mb": None if m is None else round(m, 1), "aim_mb": AIM_MB,
               "within_aim": None if m is None else m <= AIM_MB,
               # what each kernel holds alone: the marginal cost once shared pages are split many ways
               "uss_per_kernel_mb": round(sum(uss) / len(uss), 1)}
    if m is not None:
        print(f"\nmarginal PSS per kernel: {summary['marginal_pss_mb']} MB (aim <= {AIM_MB:.0f} MB); "
              f"private (USS) per kernel: {summary['uss_per_kernel_mb']} MB")
    import torch  # only for the version in the record

    meta = {"mode": a.mode, "threads": a.threads, "settle_s": a.settle, "torch": torch.__version__,
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "model": "offline default (MiniLM-L6 + bertlab heads)"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
