"""Rush hour: N students arriving within a minute at `bertlab serve --class N --fork-kernels`.

A load generator that fits on the server's own machine: a few real students in one headless
Chromium (one browser context each, the flow of bench/bench_class.py) and the rest as light
clients in this one asyncio process. A light client does what the page's code does on the wire:
GET the page as Voila serves it (kernel id in its `jupyter-config-data`, cookies kept), open the
kernel's websocket (`/api/kernels/<id>/channels`, Origin and cookies as the page sends them, and the
binary `v1.kernel.websocket.jupyter.org` subprotocol that the page's code offers), read every widget's
state in one message on ipywidgets 8's control comm (`jupyter.widget.control`, `request_states`, as
the page's widget manager does; `--protocol json --states per-widget` is the legacy JSON text with a
`request_state` per widget, the manager's fallback when the control comm does not answer within its
few seconds), find the Mask tab's text box by its placeholder, and edit it: a `comm_msg` with the
ipywidgets "update" of its `value`, then wait for the Mask chart's figure widget to send the new
guesses (their top token, computed here with the model the server loads). Reports per run:

  page_ready_s     page requested -> the chart's state received (light client) / drawn (browser)
  edit_ms          value sent -> the figure widget's update carrying the guesses (light clients);
                   browsers: sentence typed -> chart drawn with its guesses
  failures         students with no page, no websocket, no text box or an edit never redrawn
  cpu              CPU seconds of this load generator (its own process), its Chromium, the server
                   and the kernels during the rush, and each as a share of (wall x cores); counted
                   process by process and sampled through the rush (bench_class.CpuMeter), so that
                   kernels pre-heated or ended during it are counted too

and, over `--runs`, the spread (min / median / max across runs) of each figure. The load average
is recorded next to every run: this is one shared 2-core machine.

    python bench/bench_rush.py --runs 3          # 100 students, 3 browsers, within 60 s
    python bench/bench_rush.py --quick           # 10 students, 1 browser, 1 run
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "rush.json"
MASK_PLACEHOLDER = "where a word should go"  # the Mask tab's text box (bertlab/panels/mask.py)
FIGURE_KEYS = ("_widget_data", "_py2js_")  # plotly FigureWidget state and edit messages


def _bench_class():
    """bench/bench_class.py as a module (server start, kernels, CPU, the browser student)."""
    spec = importlib.util.spec_from_file_location("bench_class", REPO / "bench" / "bench_class.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_class"] = mod
    spec.loader.exec_module(mod)
    return mod


bc = _bench_class()
@dataclass
class Light:
    index: int
    ready_s: float | None = None
    edit_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# -- the kernel's websocket, as the page's code speaks it -------------------------------------------
V1 = "v1.kernel.websocket.jupyter.org"  # the subprotocol the page's code offers (jupyter_server's binary form)
CONTROL_TARGET = "jupyter.widget.control"  # ipywidgets 8: every widget's state in one message
PROTOCOLS = ("v1", "json")  # what a light client speaks: as the page (v1), or the legacy JSON text
STATE_PATHS = ("control", "per-widget")  # how it reads the widget states: as the page, or one by one


WIDGET_PROTOCOL = "2.1.0"  # ipywidgets' comm protocol, in each message's metadata
CONTROL_PROTOCOL = "1.0.0"  # its control comm's: the kernel closes a control comm opened with another


def message(msg_type: str, content: dict, session: str, channel: str = "shell",
            version: str = WIDGET_PROTOCOL) -> str:
    """A Jupyter message in the websocket's JSON form (jupyter_client's message spec)."""
    return json.dumps({**_parts(msg_type, content, session, version), "channel": channel, "buffers": []})


def _parts(msg_type: str, content: dict, session: str, version: str = WIDGET_PROTOCOL) -> dict:
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "", "session": session,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "5.3"},
        "parent_header": {}, "metadata": {"version": version}, "content": content}


def message_v1(msg_type: str, content: dict, session: str, channel: str = "shell",
               version: str = WIDGET_PROTOCOL) -> bytes:
    """The same message in the v1 binary form: 8-byte little-endian offset count and offsets, the channel
    name, then header, parent header, metadata and content as JSON (jupyter_server's
    `serialize_msg_to_ws_v1`)."""
    m = _parts(msg_type, content, session, version)
    return _frame_v1(channel, [json.dumps(m[k]).encode() for k in ("header", "parent_header", "metadata", "content")])


def _frame_v1(channel: str, parts: list[bytes]) -> bytes:
    name = channel.encode()
    offsets = [8 * (1 + 1 + len(parts) + 1)]
    offsets.append(offsets[-1] + len(name))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    return head + name + b"".join(parts)


def decode_v1(frame: bytes) -> dict:
    """A v1 binary message from the websocket as a dict (msg_type, header, content, channel)."""
    count = int.from_bytes(frame[:8], "little")
    offsets = [int.from_bytes(frame[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
    parts = [frame[offsets[i]:offsets[i + 1]] for i in range(1, count - 1)]
    header = json.loads(parts[0])
    return {"header": header, "msg_type": header.get("msg_type"), "content": json.loads(parts[3]),
            "channel": frame[offsets[0]:offsets[1]].decode()}


def decode(frame: str | bytes) -> dict:
    """A message from the websocket: JSON text, or the binary form (buffer count, offsets, JSON, buffers)."""
    if isinstance(frame, bytes):
        n = struct.unpack("!I", frame[:4])[0]
        offsets = struct.unpack(f"!{n}I", frame[4:4 + 4 * n])
        end = offsets[1] if n > 1 else len(frame)
        return json.loads(frame[offsets[0]:end])
    return json.loads(frame)


def page_view(html: str) -> str | None:
    """The model id of the widget view that the page shows (its dashboard: the output of the notebook's
    `app.widget` cell, which Voila writes into the page as the cell's output JSON), None when the page has
    none."""
    found = re.search(r'"application/vnd\.jupyter\.widget-view\+json"\s*:\s*\{[^{}]*?"model_id"\s*:\s*"([0-9a-f]+)"',
                      html)
    return found.group(1) if found else None


def find_text_box(states: dict[str, dict]) -> str | None:
    """The Mask tab's text box among the widget states (model id -> state)."""
    for model_id, state in states.items():
        if state.get("_model_name") == "TextareaModel" and MASK_PLACEHOLDER in (state.get("placeholder") or ""):
            return model_id
    return None


def is_chart_update(msg: dict, top_token: str) -> bool:
    """Whether `msg` is a figure widget's open or update carrying `top_token` among its data."""
    if msg.get("msg_type") not in ("comm_open", "comm_msg"):
        return False
    data = json.dumps(msg.get("content", {}).get("data", {}))
    return any(k in data for k in FIGURE_KEYS) and json.dumps(top_token) in data


class Socket:
    """One kernel websocket: send, and read until a predicate holds (with a deadline). `v1`: the binary
    subprotocol was agreed on (as with the page's code), else JSON text."""

    def __init__(self, ws, session: str, v1: bool = False) -> None:
        self.ws, self.session, self.v1 = ws, session, v1
        self.received = 0  # bytes read from the server

    async def send(self, msg_type: str, content: dict, version: str = WIDGET_PROTOCOL) -> None:
        if self.v1:
            await self.ws.write_message(message_v1(msg_type, content, self.session, version=version), binary=True)
        else:
            await self.ws.write_message(message(msg_type, content, self.session, version=version))

    async def read_until(self, done, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer in time")
            frame = await asyncio.wait_for(self.ws.read_message(), left)
            if frame is None:
                raise ConnectionError("the kernel's websocket closed")
            self.received += len(frame)
            msg = decode_v1(frame) if self.v1 else decode(frame)
            if done(msg):
                return msg


async def widget_states(sock: Socket, timeout: float, path: str = "control") -> dict[str, dict]:
    """Every widget's state (model id -> state), as ipywidgets' manager reads them at page load: in one
    message on the control comm (`path` "control", what ipywidgets 8 does), or with `comm_info_request`
    and a `request_state` per widget ("per-widget", its fallback when the kernel has no control comm)."""
    if path == "control":
        comm = uuid.uuid4().hex
        await sock.send("comm_open", {"comm_id": comm, "target_name": CONTROL_TARGET, "data": {}},
                        version=CONTROL_PROTOCOL)
        await sock.send("comm_msg", {"comm_id": comm, "data": {"method": "request_states"}}, version=CONTROL_PROTOCOL)

        def answer(m: dict) -> bool:
            c = m.get("content", {})
            if m.get("msg_type") == "comm_close" and c.get("comm_id") == comm:
                raise ConnectionError("the kernel closed the widgets' control comm")
            return (m.get("msg_type") == "comm_msg" and c.get("comm_id") == comm
                    and c.get("data", {}).get("method") == "update_states")

        reply = await sock.read_until(answer, timeout)
        await sock.send("comm_close", {"comm_id": comm, "data": {}}, version=CONTROL_PROTOCOL)  # as the page does
        return {k: v.get("state", {}) for k, v in reply["content"]["data"]["states"].items()}
    await sock.send("comm_info_request", {"target_name": "jupyter.widget"})
    reply = await sock.read_until(lambda m: m.get("msg_type") == "comm_info_reply", timeout)
    ids = list(reply["content"].get("comms", {}))
    for model_id in ids:
        await sock.send("comm_msg", {"comm_id": model_id, "data": {"method": "request_state"}})
    states: dict[str, dict] = {}

    def collect(m: dict) -> bool:
        c = m.get("content", {})
        if m.get("msg_type") == "comm_msg" and c.get("comm_id") in ids and c.get("data", {}).get("method") == "update":
            states.setdefault(c["comm_id"], {}).update(c["data"].get("state", {}))
        return len(states) >= len(ids)

    await sock.read_until(collect, timeout)
    return states


async def light_student(s: Light, url: str, delay: float, plan: list[str], want: dict, wait: float,
                        open_sockets: list, protocol: str = "v1", path: str = "control", mark=None) -> None:
    """Arrive after `delay` s: the page, its kernel's websocket, the widget states, then one edit of
    the Mask text box per sentence of `plan`, each timed until the chart widget brings its guesses.
    The websocket stays open (in `open_sockets`) as a student's page does, so its kernel is not culled
    before the run's CPU is counted. `protocol` and `path`: how it speaks (PROTOCOLS, STATE_PATHS; the
    page's way by default); `mark(phase, bytes)`, if given, is called as each phase ends ("page", "states",
    "edit") with the bytes read so far in it (the page; then the websocket's, counted from its start)."""
    mark = mark or (lambda _phase, _bytes: None)
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest
    from tornado.websocket import websocket_connect

    await asyncio.sleep(delay)
    ws = None
    try:
        t = time.monotonic()
        page = await AsyncHTTPClient().fetch(url, connect_timeout=wait, request_timeout=wait, raise_error=False)
        if page.code != 200:
            raise RuntimeError(f"page answered {page.code}")
        found = re.search(r'"kernelId": "([0-9a-f-]+)"', page.body.decode())
        if not found:
            raise RuntimeError("no kernel id in the page")
        view = page_view(page.body.decode())
        if view is None:  # a browser would show no dashboard at all
            raise RuntimeError("the page has no dashboard (its widget output is missing)")
        cookies = "; ".join(c.split(";")[0] for c in page.headers.get_list("Set-Cookie"))
        origin = url.rstrip("/")
        ws_url = f"ws{url[4:]}api/kernels/{found.group(1)}/channels?session_id={uuid.uuid4().hex}"
        mark("page", len(page.body))
        ws = await websocket_connect(HTTPRequest(ws_url, headers={"Cookie": cookies, "Origin": origin},
                                                 request_timeout=wait), max_message_size=256 * 2**20,
                                     subprotocols=[V1] if protocol == "v1" else None)
        if protocol == "v1" and ws.selected_subprotocol != V1:
            raise RuntimeError(f"the server did not agree to {V1}")
        sock = Socket(ws, uuid.uuid4().hex, v1=protocol == "v1")
        await sock.read_until(lambda m: True, wait)  # the server's first word: its channels are open
        states = await widget_states(sock, wait, path)
        box = find_text_box(states)
        if box is None or not any(any(k in st for k in FIGURE_KEYS) for st in states.values()):
            raise RuntimeError("no Mask text box or chart among the widgets")
        if view not in states:
            raise RuntimeError("the page's dashboard is not among its kernel's widgets")
        s.ready_s = time.monotonic() - t
        mark("states", sock.received)
        for sentence in plan:
            t = time.monotonic()
            await sock.send("comm_msg", {"comm_id": box, "data": {"method": "update", "state": {"value": sentence},
                                                                  "buffer_paths": []}})
            top = want[sentence][1][0]
            await sock.read_until(lambda m, top=top: is_chart_update(m, top), wait)
            s.edit_ms.append((time.monotonic() - t) * 1000)
            mark("edit", sock.received)
    except Exception as e:  # a student who got stuck is a result too
        s.errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    finally:
        if ws is not None:
            open_sockets.append(ws)
            asyncio.ensure_future(_drain(ws))


async def _drain(ws) -> None:
    """Keep reading a student's websocket after its edits, as an open page does: tornado's client answers
    the server's pings only while its messages are read, and the server closes a socket whose pings go
    unanswered (its kernel then counts as idle and is culled)."""
    while await ws.read_message() is not None:
        pass


# -- one run -----------------------------------------------------------------------------------------
def _spread(values: list[float | None]) -> dict[str, float | None]:
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"min": None, "median": None, "max": None}
    return {"min": round(v[0], 1), "median": round(statistics.median(v), 1), "max": round(v[-1], 1)}


async def rush(n: int, browsers: int, args: argparse.Namespace, want: dict, chromium: str | None) -> dict:
    from tornado.httpclient import AsyncHTTPClient

    AsyncHTTPClient.configure(None, max_clients=n)  # every student's page request at once, none queued here
    server_log = Path(tempfile.mkdtemp(prefix="bench-rush-")) / "server.log"
    proc, url, label = bc.start_server(n, server_log)
    bc.log(f"N={n}: {label} at {url}; log {server_log}")
    try:
        preheat_s = bc.wait_for_pool(url, proc, args.preheat_timeout)
        bc.log(f"N={n}: pool ready after {preheat_s:.0f} s: {bc.status(url)}")
        load_before = os.getloadavg()
        delays = [args.arrive_within * i / max(n - 1, 1) for i in range(n)]
        every = max(n // max(browsers, 1), 1)
        in_browser = set(range(0, n, every)[:browsers])  # spread over the arrivals
        plans = [[bc.SENTENCES[(i * (args.rounds + 1) + r) % len(bc.SENTENCES)] for r in range(args.rounds + 1)]
                 for i in range(n)]
        lights = {i: Light(i) for i in range(n) if i not in in_browser}
        pages = {i: bc.Student(i) for i in in_browser}
        t0, own0, meter = time.monotonic(), time.process_time(), bc.CpuMeter(proc.pid)
        sampling = asyncio.ensure_future(meter.run_sampling())
        sockets: list = []
        flows = [light_student(s, url, delays[i], plans[i][1:], want, args.wait, sockets,
                               protocol=args.protocol, path=args.states) for i, s in lights.items()]
        contexts = []
        if pages:
            from playwright.async_api import async_playwright

            pw = await async_playwright().start()
            browser = await pw.chromium.launch(executable_path=chromium, args=bc.CHROMIUM_ARGS, headless=True)
            flows += [_browser_student(s, browser, url, delays[i], plans[i], want, args, contexts)
                      for i, s in pages.items()]
        attention, bc._attention_edit = bc._attention_edit, _no_attention  # Mask edits only
        try:
            await asyncio.gather(*flows)
        finally:
            bc._attention_edit = attention
        wall = time.monotonic() - t0
        sampling.cancel()
        own, by_part = time.process_time() - own0, meter.totals()
        load_after = os.getloadavg()
        kernels = len(bc.kernel_pids(proc.pid))
        for ws in sockets:
            ws.close()
        if pages:
            for c in contexts:
                await c.close()
            await browser.close()
            await pw.stop()
    finally:
        bc.stop_server(proc)
    cores = os.cpu_count() or 1
    cpu = {"load_generator": own, **by_part}
    ready = [s.ready_s for s in lights.values()] + [s.ready_s for s in pages.values()]
    failed = [f"light {s.index}: {e}" for s in lights.values() for e in s.errors] + [
        f"browser {s.index}: {e}" for s in pages.values() for e in s.errors + s.stale]
    edits = [m for s in lights.values() for m in s.edit_ms]
    return {
        "n": n, "server": label, "browsers": len(pages), "light_clients": len(lights),
        "light_client_speaks": f"{args.protocol}/{args.states}",
        "arrive_within_s": args.arrive_within, "edits_per_student": args.rounds, "preheat_s": round(preheat_s, 1),
        "page_ready_s": bc._stats([r for r in ready if r is not None]),
        "page_ready_browser_s": bc._stats([s.ready_s for s in pages.values() if s.ready_s is not None]),
        "edit_ms": bc._stats(edits),
        "edit_browser_ms": bc._stats([m for s in pages.values() for m in s.mask_ms]),
        "edits_sent": len(lights) * args.rounds, "edits_redrawn": len(edits),
        "failures": len({line.split(":")[0] for line in failed}),
        "failure_details": failed[:20],
        "wall_s": round(wall, 1), "cores": cores,
        "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_share": {k: round(v / (wall * cores), 3) for k, v in cpu.items()},
        "kernels_at_end": kernels,
        "load_avg": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }


async def _browser_student(s, browser, url: str, delay: float, plan: list[str], want: dict,
                           args: argparse.Namespace, contexts: list) -> None:
    """bench_class's student (chart drawn, Mask edits timed in the page); `rush` leaves out its
    Attention part for the whole run."""
    bargs = argparse.Namespace(wait=args.wait, stale_after=args.wait)
    contexts.append(await bc.student(s, browser, url, delay, plan, want, bargs))


async def _no_attention(*_args, **_kwargs) -> None:
    return None


def summary(runs: list[dict]) -> dict:
    """min / median / max across runs of each headline figure."""
    get = {
        "page_ready_p50_s": lambda r: r["page_ready_s"]["p50"], "page_ready_p95_s": lambda r: r["page_ready_s"]["p95"],
        "page_ready_max_s": lambda r: r["page_ready_s"]["max"], "edit_p50_ms": lambda r: r["edit_ms"]["p50"],
        "edit_p95_ms": lambda r: r["edit_ms"]["p95"], "failures": lambda r: r["failures"],
        "load_generator_cpu_share": lambda r: r["cpu_share"]["load_generator"] + r["cpu_share"].get("browsers", 0),
        "kernels_cpu_share": lambda r: r["cpu_share"]["kernels"],
        "server_cpu_share": lambda r: r["cpu_share"]["server"],
        "load_1min_after": lambda r: r["load_avg"]["after"][0],
    }
    return {name: _spread([f(r) for r in runs]) for name, f in get.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100, help="students (default 100)")
    p.add_argument("--browsers", type=int, default=3, help="of them, real Chromium pages (default 3)")
    p.add_argument("--runs", type=int, default=1, help="runs, each with a fresh server (default 1)")
    p.add_argument("--rounds", type=int, default=2, help="timed Mask edits per student (default 2)")
    p.add_argument("--arrive-within", type=float, default=60.0, help="arrivals spread over this many s (default 60)")
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for a page or a chart (default 300)")
    p.add_argument("--preheat-timeout", type=float, default=900.0)
    p.add_argument("--protocol", choices=PROTOCOLS, default="v1",
                   help="what light clients speak: the page's binary v1 subprotocol (default) or legacy JSON")
    p.add_argument("--states", choices=STATE_PATHS, default="control",
                   help="how light clients read the widget states: the control comm as the page (default), "
                        "or one request_state per widget (the page's fallback)")
    p.add_argument("--quick", action="store_true", help="10 students, 1 browser, 1 run")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--append", action="store_true",
                   help="add these runs to those already in --out (a long series in short jobs on a shared machine)")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.browsers, args.runs = min(args.n, 10), min(args.browsers, 1), 1
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if args.browsers and chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium), or pass --browsers 0.")
    _fork_flag()
    want = bc.expected_guesses(list(bc.SENTENCES))
    runs: list[dict] = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    earlier = len(runs)
    for i in range(args.runs):
        command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
        runs.append({**asyncio.run(rush(args.n, args.browsers, args, want, chromium)), "command": command,
                     "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
        r = runs[-1]
        bc.log(f"run {earlier + i + 1}: ready {r['page_ready_s']}, edit {r['edit_ms']}, failures {r['failures']} "
               f"{r['failure_details'][:5]}, cpu share {r['cpu_share']}, load {r['load_avg']['after']}")
        result = {
            "meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                     "command": command,
                     "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
            "runs": runs, "spread": summary(runs),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # each run kept as soon as it ends
    print(json.dumps(result["spread"], indent=1))
    return 0


def _fork_flag() -> None:
    """bench_class starts `bertlab serve --class N`: add --fork-kernels to it."""
    plain = bc.serve_command

    def forked(n: int, port: int, class_dir: Path) -> tuple[list[str], str]:
        cmd, label = plain(n, port, class_dir)
        return cmd + ["--fork-kernels"], label + " --fork-kernels"

    bc.serve_command = forked


if __name__ == "__main__":
    raise SystemExit(main())
