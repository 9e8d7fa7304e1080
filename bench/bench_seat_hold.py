"""How long a page that never runs holds a seat: `bertlab serve --class 2` with its defaults, one plain
`GET /` (no browser, as `curl` does: the page is fetched, its code never runs, its kernel's websocket never
opens), then the seconds until the kernel it was handed is gone (`GET /api/kernels/<id>` answers 404).

    python bench/bench_seat_hold.py                          # this checkout
    python bench/bench_seat_hold.py --repo OTHER --label before --append
                                                             # another checkout's code (e.g. an older commit)

Writes bench/results/seat_hold.json (one row per checkout measured, with the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "seat_hold.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def measure(repo: Path, timeout: float) -> dict:
    port = _free_port()
    folder = Path(tempfile.mkdtemp(prefix="bench-seat-"))
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--class", "2", "--no-browser",
                             "--port", str(port), "--class-dir", str(folder / "class")],
                            cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}: see {log.name}")
            try:
                status = json.loads(_get(base + "/bertlab/api/status", 5)[1])
                if status["pool"]["ready"] >= status["pool"]["target"]:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(1)
        time.sleep(5)  # the pooled kernels settle
        load = os.getloadavg()
        code, page = _get(base + "/", 120)
        sent = time.monotonic()
        kernel = re.search(r'"kernelId": "([0-9a-f-]{36})"', page).group(1)
        assert code == 200, code
        while time.monotonic() - sent < timeout:
            if _get(f"{base}/api/kernels/{kernel}", 10)[0] == 404:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"the kernel of a plain GET was still there after {timeout} s")
        held = time.monotonic() - sent
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    return {"held_s": round(held, 1), "load_avg_before": [round(x, 2) for x in load], "commit": commit}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose `bertlab serve` runs (default: this)")
    p.add_argument("--label", default="this checkout")
    p.add_argument("--append", action="store_true", help="add a row to --out instead of starting it afresh")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--quick", action="store_true", help="the same run (it is short already)")
    args = p.parse_args(argv)
    row = {"label": args.label, **measure(args.repo.resolve(), args.timeout)}
    print(json.dumps(row), flush=True)
    rows = json.loads(args.out.read_text())["rows"] if args.append and args.out.exists() else []
    result = {"meta": {"what": "seconds a plain GET / (page fetched, never run) holds a seat of "
                               "`bertlab serve --class 2` with its defaults",
                       "command": "python bench/bench_seat_hold.py", "cpus": os.cpu_count(),
                       "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
              "rows": [*rows, row]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
