"""The cost of ONE student's page on a warm, pre-heated `bertlab serve --class N --fork-kernels`.

One light client of bench/bench_rush.py at a time, on an otherwise idle server: the CPU seconds
that the server (with its helpers) and the kernels spend on each phase of a page, and the bytes
the client reads in it:

  page     GET of the page (Voila hands out a pre-heated kernel and its pre-rendered page)
  states   the kernel's websocket opened and every widget's state read
  edit     one Mask edit, until the chart's new guesses arrive

for each way a client can speak (`--variants`): `v1/control` is what the page's code does
(jupyter_server's binary v1 subprotocol, ipywidgets 8's control comm: all states in one message);
`json/per-widget` is the legacy JSON text with one `request_state` per widget. Between pages the
script waits until the server and its kernels are idle again (a pool refill included), so each
page's figures are its own. The load average is recorded: this is a shared machine.

    python bench/bench_page.py                   # 2 pages of each variant
    python bench/bench_page.py --repeat 1 --variants v1/control
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "page_cost.json"
VARIANTS = ("v1/control", "json/control", "json/per-widget")


def _bench_rush():
    spec = importlib.util.spec_from_file_location("bench_rush", REPO / "bench" / "bench_rush.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_rush"] = mod
    spec.loader.exec_module(mod)
    return mod


br = _bench_rush()
bc = br.bc


def quiet(server: int, timeout: float = 120.0, still_s: float = 3.0) -> None:
    """Wait until the server and its kernels together use under 0.1 CPU s per `still_s` (or `timeout`)."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        now = sum(bc.cpu_by_part(server).values())
        if last is not None and now - last < 0.1:
            return
        last = now
        time.sleep(still_s)


async def one_page(url: str, server: int, variant: str, sentence: str, want: dict, wait: float) -> dict:
    """One page of `variant`: CPU seconds of the server and the kernels, and bytes read, per phase."""
    protocol, path = variant.split("/")
    marks: list[tuple[str, float, dict, int]] = [("start", time.monotonic(), bc.cpu_by_part(server), 0)]

    def mark(phase: str, received: int) -> None:
        marks.append((phase, time.monotonic(), bc.cpu_by_part(server), received))

    s, sockets = br.Light(0), []
    await br.light_student(s, url, 0.0, [sentence], want, wait, sockets, protocol=protocol, path=path, mark=mark)
    for ws in sockets:
        ws.close()
    phases = {}
    for (_, t0, c0, b0), (name, t1, c1, b1) in zip(marks, marks[1:]):
        phases[name] = {"wall_s": round(t1 - t0, 2),
                        "server_cpu_s": round(c1["server"] - c0["server"], 2),
                        "kernels_cpu_s": round(c1["kernels"] - c0["kernels"], 2),
                        "bytes": b1 - (b0 if name == "edit" else 0)}
    return {"variant": variant, "errors": s.errors, "phases": phases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--repeat", type=int, default=2, help="pages of each variant (default 2)")
    p.add_argument("--wait", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    order = [v for _ in range(args.repeat) for v in args.variants]  # interleaved: drift hits every variant
    n = len(order)
    br._fork_flag()
    want = bc.expected_guesses(list(bc.SENTENCES))
    log = Path(tempfile.mkdtemp(prefix="bench-page-")) / "server.log"
    proc, url, label = bc.start_server(n, log)
    pages = []
    try:
        preheat_s = bc.wait_for_pool(url, proc, 900)
        bc.log(f"{label}: pool of {n} ready after {preheat_s:.0f} s")
        for i, variant in enumerate(order):
            quiet(proc.pid)
            load = os.getloadavg()[0]
            page = asyncio.run(one_page(url, proc.pid, variant, bc.SENTENCES[i % len(bc.SENTENCES)], want, args.wait))
            page["load_1min_before"] = round(load, 2)
            pages.append(page)
            bc.log(f"{variant}: {page['phases']} {page['errors']}")
    finally:
        bc.stop_server(proc)
    summary = {}
    for variant in args.variants:
        mine = [pg for pg in pages if pg["variant"] == variant and not pg["errors"]]
        summary[variant] = {
            phase: {key: round(statistics.median(pg["phases"][phase][key] for pg in mine), 2)
                    for key in ("wall_s", "server_cpu_s", "kernels_cpu_s", "bytes")}
            for phase in ("page", "states", "edit") if mine and all(phase in pg["phases"] for pg in mine)}
    result = {"meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "server": label, "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                       "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
              "pages": pages, "median": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
