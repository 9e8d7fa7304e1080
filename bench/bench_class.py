"""A class on one server: N simulated students in headless Chromium, all at once.

Starts `bertlab serve --class N` (plain Voila with culling when this bertlab has no `--class`),
waits until its pre-heated kernels are idle, then opens one Chromium with N browser contexts (one
student each, arriving evenly over `--arrive-within` seconds). Every student does the Mask flow
(types a sentence with a [MASK] as soon as the text box shows, then `--rounds` more, each time
pressing Predict and waiting for the chart's new guesses) and then the Attention flow (moves the
Layer slider, waits for the heatmap of layer 1). Reports:

  page_ready_s        page requested -> the Mask chart drawn (p50 / p95 / max)
  mask_edit_ms        sentence typed -> the chart shows its guesses, in the browser (p50 / p95);
                      the first sentence (typed while the page loads) is checked but not timed
  attention_edit_ms   slider moved -> the heatmap redrawn, in the browser (p50 / p95)
  stale_charts        charts that never showed what the kernel computed: the bars' labels and the
                      subplot title as drawn, against the guesses this script computes with the same
                      model, while the panel's "The model reads" line already shows the sentence
  pss_mb              proportional memory of each kernel (/proc/PID/smaps_rollup) and the total,
                      with the pages open after the flows
  kernels_left        kernel processes alive `--linger` s after every page closed (and the pool)

No network beyond loopback: a request to any other host is refused and counted. The machine's
load average is recorded next to the figures (this benchmark is about a shared machine).

    python bench/bench_class.py --n 10 [--n 30] [--rounds 2] [--arrive-within 60]
    python bench/bench_class.py --quick          # N = 2, one round, short linger
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "class.json"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PLOT = ".js-plotly-plot"
TAB = ".bertlab-tabs > .lm-TabBar .lm-TabBar-tab"
CURRENT = ".bertlab-tabs > .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)"
K = 5  # guesses the Mask tab shows by default
# One [MASK] each, at different places, so every edit changes the chart's bars and title.
SENTENCES = (
    "Paris is the [MASK] of France.",
    "She poured the [MASK] into a tall glass.",
    "The children played in the [MASK] after school.",
    "He opened the [MASK] and walked into the kitchen.",
    "We took the [MASK] to the airport this morning.",
    "The doctor told him to stay in [MASK] for a week.",
    "My sister plays the [MASK] in a small band.",
    "The [MASK] barked at the postman all morning.",
    "They watched a [MASK] at the cinema last night.",
    "I read the [MASK] before going to bed.",
    "The river flows into the [MASK] near the town.",
    "She wrote a [MASK] to her grandmother.",
)

# The chart on show: its subplot title and its bars' labels as drawn (SVG text), and whether the
# panel's "The model reads" line (set by the same callback, just before the chart) has the text.
CHART_JS = """(sel) => {
    const tab = document.querySelector(sel);
    if (!tab) return null;
    const plot = tab.querySelector('.js-plotly-plot');
    const reads = Array.from(tab.querySelectorAll('.widget-html')).map(e => e.textContent)
        .find(t => t.includes('The model reads')) || '';
    if (!plot) return {title: '', ticks: [], reads};
    const title = Array.from(plot.querySelectorAll('.annotation-text')).map(e => e.textContent).join(' | ');
    const ticks = Array.from(plot.querySelectorAll('.yaxislayer-above .ytick text')).map(e => e.textContent);
    return {title, ticks, reads};
}"""


@dataclass
class Student:
    index: int
    textbox_s: float | None = None
    ready_s: float | None = None
    mask_ms: list[float] = field(default_factory=list)
    attention_ms: list[float] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # what stayed stale, one line each
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


# -- what the kernel computes ---------------------------------------------------------------------
def expected_guesses(sentences: list[str]) -> dict[str, tuple[str, list[str]]]:
    """sentence -> (chart title, top-K tokens), computed here with the model the server loads."""
    from bertlab.analysis.mask import fill_mask
    from bertlab.loading import load
    from bertlab.viz.mask import fill_mask_title

    model, tok = load(None)
    out = {}
    for s in sentences:
        pred = fill_mask(model, tok, s, K)[0]
        out[s] = (fill_mask_title(pred), [c.token for c in pred.candidates])
    return out


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def shows(chart: dict | None, want: tuple[str, list[str]]) -> bool:
    """Whether the drawn chart is the one for these guesses (title and the K bar labels); the same
    test as the wait in `_shows` runs in the page."""
    if not chart:
        return False
    title, tokens = want
    return _normal(title) in _normal(chart["title"]) and sorted(chart["ticks"]) == sorted(tokens)


# -- the server ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(n: int, port: int, class_dir: Path) -> tuple[list[str], str]:
    """`bertlab serve --class N` when this bertlab has it, else plain Voila with culling on."""
    help_text = subprocess.run([sys.executable, "-m", "bertlab.cli", "serve", "--help"],
                               capture_output=True, text=True, cwd=REPO).stdout
    if "--class" in help_text:
        return ([sys.executable, "-m", "bertlab.cli", "serve", "--class", str(n), "--no-browser",
                 "--port", str(port), "--class-dir", str(class_dir)]
                + (["--per-client", "0"] if "--per-client" in help_text else []),  # every student is on loopback
                f"bertlab serve --class {n}")
    cmd = [sys.executable, "-m", "voila", str(REPO / "apps" / "bertlab.ipynb"), f"--port={port}",
           "--no-browser", "--Voila.ip=127.0.0.1", "--preheat_kernel=True", "--pool_size=1",
           "--MappingKernelManager.cull_idle_timeout=30", "--MappingKernelManager.cull_interval=10"]
    return cmd, "voila (plain, culling 30 s, pool 1)"


def status(url: str) -> dict | None:
    """The class server's /bertlab/api/status (None where there is none)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.split("?")[0] + "bertlab/api/status", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def wait_for_pool(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until the pre-heated pool is full (as a teacher starts the server before class)."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} while pre-heating")
        st = status(url)
        if st is None or st["pool"]["ready"] >= st["pool"]["target"]:
            break
        time.sleep(2)
    # "ready" kernels may still be running the notebook: wait until the kernels are idle
    last = None
    while time.monotonic() - t < timeout:
        cpu = sum(_cpu_s(pid) for pid in kernel_pids(proc.pid))
        if last is not None and cpu - last < 0.2:
            break
        last = cpu
        time.sleep(3)
    return time.monotonic() - t


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(n: int, log: Path) -> tuple[subprocess.Popen, str, str]:
    port = _free_port()
    cmd, label = serve_command(n, port, log.parent / "class")
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        stop_server(proc)
        raise SystemExit(f"the server did not listen within 300 s:\n{log.read_text()[-3000:]}")
    return proc, f"http://127.0.0.1:{port}/", label  # on loopback the class server asks no token


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)


# -- kernels and their memory -----------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


ZYGOTE = b"bertlab.serving.forking"  # the warm parent's command line (bertlab/serving/forking.py)


def kernel_pids(root: int) -> list[int]:
    """The kernels under `root` (the server): ipykernel processes, and the children of the kernel zygote
    (`bertlab serve --class N` forks its kernels from it; they keep its command line, so they are told
    from the server's helpers by their parent, not by their name). The zygote itself is the server's."""
    kids, out, todo = _children(), [], [(root, False)]
    while todo:
        pid, under_zygote = todo.pop()
        for c in kids.get(pid, []):
            try:
                cmd = Path(f"/proc/{c}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ipykernel" in cmd or under_zygote:
                out.append(c)
            todo.append((c, ZYGOTE in cmd and not under_zygote))
    return sorted(out)


def pss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else None


# -- one student ------------------------------------------------------------------------------------
async def _open_tab(page, title: str) -> None:
    await page.locator(TAB, has_text=re.compile(f"^{re.escape(title)}$")).first.click()
    await page.wait_for_function(
        """([tabs, current, title]) => {
            const tab = document.querySelector(tabs + '.lm-mod-current');
            const panel = document.querySelector(current);
            return tab && tab.textContent.trim() === title && panel && !panel.textContent.includes('Opening ' + title);
        }""",
        arg=[TAB, CURRENT, title],
    )


async def student(s: Student, browser, url: str, delay: float, plan: list[str],
                  want: dict[str, tuple[str, list[str]]], args: argparse.Namespace):
    """Arrive after `delay` s; type plan[0] as soon as the text box shows (a student does not wait
    for the chart), then the other sentences one by one once the page is ready (timed), then move
    the Attention tab's layer slider (timed). Returns the browser context (closed later)."""
    await asyncio.sleep(delay)
    context = await browser.new_context(viewport={"width": 1200, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(args.wait * 1000)

    async def route(r):
        if urlparse(r.request.url).hostname in ("127.0.0.1", "localhost"):
            await r.continue_()
        else:
            s.refused.append(r.request.url)
            await r.abort()

    await page.route("**/*", route)
    page.on("pageerror", lambda e: s.errors.append(str(e)[:200]))
    try:
        t = time.monotonic()
        await page.goto(url, wait_until="domcontentloaded")
        await page.locator(f"{CURRENT} .widget-textarea textarea").first.wait_for(state="visible")
        s.textbox_s = time.monotonic() - t
        await _type(page, plan[0])
        await page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg")
        s.ready_s = time.monotonic() - t
        await _shows(s, page, plan[0], want[plan[0]], args, since=None)
        for sentence in plan[1:]:
            t = time.monotonic()
            await _type(page, sentence)
            await _shows(s, page, sentence, want[sentence], args, since=t)
        await _attention_edit(s, page, args.wait)
    except Exception as e:  # a student who got stuck is a result too
        s.errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    log(f"student {s.index}: ready {s.ready_s and round(s.ready_s, 1)} s, mask {[round(m) for m in s.mask_ms]} ms, "
        f"attention {[round(m) for m in s.attention_ms]} ms, stale {len(s.stale)}, errors {len(s.errors)}")
    return context


def log(line: str) -> None:
    print(time.strftime("%H:%M:%S"), line, file=sys.stderr, flush=True)


async def _type(page, sentence: str) -> None:
    await page.locator(f"{CURRENT} .widget-textarea textarea").first.fill(sentence)
    await page.locator(CURRENT).get_by_role("button", name="Predict").click()


async def _shows(s: Student, page, sentence: str, want: tuple[str, list[str]], args: argparse.Namespace,
                 since: float | None) -> None:
    """Wait until the chart shows `sentence`'s guesses (timed from `since`). A chart that does not
    within --stale-after s while the panel already reads the new sentence is stale; one whose
    kernel has not read it yet gets up to --wait s."""
    start = time.monotonic()
    while True:
        try:
            await page.wait_for_function(
                f"""([sel, title, tokens]) => {{
                    const c = ({CHART_JS})(sel);
                    if (!c) return false;
                    const norm = x => x.replace(/\\s+/g, ' ').trim().toLowerCase();
                    return norm(c.title).includes(norm(title)) &&
                           JSON.stringify([...c.ticks].sort()) === JSON.stringify([...tokens].sort());
                }}""",
                arg=[CURRENT, want[0], want[1]], timeout=args.stale_after * 1000,
            )
        except Exception:
            chart = await page.evaluate(CHART_JS, CURRENT)
            if shows(chart, want):  # drawn just as the wait ran out
                break
            words = [w for w in re.findall(r"[a-z]+", sentence.lower()) if w != "mask"]
            read = bool(chart) and all(w in chart["reads"].lower() for w in words)
            if read or time.monotonic() - start > args.wait:
                s.stale.append(f"mask {sentence!r}: the kernel {'had read it' if read else 'had not read it'}; "
                               f"the chart shows {chart['title'][:60] if chart else None!r} "
                               f"{chart['ticks'] if chart else []}")
                return
            continue
        break
    if since is not None:
        s.mask_ms.append((time.monotonic() - since) * 1000)


async def _attention_edit(s: Student, page, wait_s: float) -> None:
    await _open_tab(page, "Attention")
    heatmap = f"{CURRENT} {PLOT}"
    await page.wait_for_selector(f"{heatmap} .main-svg")
    before = await page.evaluate("sel => JSON.stringify(document.querySelector(sel).data[0].z)", heatmap)
    handle = page.locator(f"{CURRENT} .widget-slider .noUi-handle").first  # the Layer slider
    t = time.monotonic()
    await handle.focus()
    await handle.press("ArrowRight")
    try:
        await page.wait_for_function(
            """([sel, old]) => {
                const p = document.querySelector(sel);
                const title = p && p.querySelector('.gtitle');
                return p && JSON.stringify(p.data[0].z) !== old && title && title.textContent.startsWith('Layer 1');
            }""",
            arg=[heatmap, before], timeout=wait_s * 1000,
        )
        s.attention_ms.append((time.monotonic() - t) * 1000)
    except Exception:
        title = await page.evaluate(
            "sel => { const t = document.querySelector(sel + ' .gtitle'); return t ? t.textContent : null; }", heatmap)
        s.stale.append(f"attention layer 1: heatmap title {title!r}")


# -- one class --------------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    v = sorted(values)
    return {"n": len(v), "p50": round(statistics.median(v), 1),
            "p95": round(v[min(len(v) - 1, round(0.95 * (len(v) - 1)))], 1), "max": round(v[-1], 1)}


async def _watch(proc: subprocess.Popen) -> None:
    """Returns when the server process has exited."""
    while proc.poll() is None:
        await asyncio.sleep(2)


def server_pids(root: int) -> list[int]:
    """The server and its helpers (every process under it that is not a kernel)."""
    kids, out, todo = _children(), [root], [root]
    kernels = set(kernel_pids(root))
    while todo:
        for c in kids.get(todo.pop(), []):
            todo.append(c)
            if c not in kernels:
                out.append(c)
    return out


def _parts(server: int) -> dict[int, str]:
    """Each process this run cares about, by pid: "kernels", "server" (with its helpers, the kernel zygote
    included) or "browsers" (every chromium process under this script)."""
    kernels = set(kernel_pids(server))
    kids, browsers, todo = _children(), [], [os.getpid()]
    while todo:
        for c in kids.get(todo.pop(), []):
            todo.append(c)
            try:
                if b"chrom" in Path(f"/proc/{c}/cmdline").read_bytes():
                    browsers.append(c)
            except OSError:
                continue
    parts = {p: "server" for p in server_pids(server) if p not in kernels}
    parts.update({p: "kernels" for p in kernels})
    parts.update({p: "browsers" for p in browsers})
    return parts


def cpu_by_part(server: int) -> dict[str, float]:
    """CPU seconds used so far by the kernels, the server (with its helpers) and the browsers this
    script started, summed over the processes alive now. For a stretch of time use `CpuMeter`: a
    difference of two of these loses what processes that ended in between used, and takes off their
    CPU from before the stretch."""
    out = {"kernels": 0.0, "server": 0.0, "browsers": 0.0}
    for pid, part in _parts(server).items():
        out[part] += _cpu_s(pid)
    return out


class CpuMeter:
    """CPU seconds by part (`_parts`) over a stretch, process by process: a process born in the stretch
    counts whole, one that ends in it keeps what it had used at its last `sample()`. Sample every few
    seconds (`run_sampling`) while processes come and go (pool refills, culled kernels)."""

    def __init__(self, server: int) -> None:
        self.server = server
        self.start = self._read()
        self.last = dict(self.start)

    def _read(self) -> dict[int, tuple[str, float]]:
        return {pid: (part, _cpu_s(pid)) for pid, part in _parts(self.server).items()}

    def sample(self) -> None:
        for pid, (part, cpu) in self._read().items():
            if cpu > 0 or pid not in self.last:  # 0.0: it ended between listing and reading
                self.last[pid] = (part, cpu)

    def totals(self) -> dict[str, float]:
        """CPU seconds by part since the meter was made (a last sample taken now)."""
        self.sample()
        out = {"kernels": 0.0, "server": 0.0, "browsers": 0.0}
        for pid, (part, cpu) in self.last.items():
            out[part] += max(cpu - self.start.get(pid, (part, 0.0))[1], 0.0)
        return out

    async def run_sampling(self, every_s: float = 2.0) -> None:
        """Sample until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            self.sample()


async def run_class(n: int, args: argparse.Namespace, want: dict, chromium: str) -> dict:
    from playwright.async_api import async_playwright

    server_log = Path(tempfile.mkdtemp(prefix="bench-class-")) / "server.log"
    proc, url, label = start_server(n, server_log)
    log(f"N={n}: {label} at {url}; log {server_log}")
    preheat_s = wait_for_pool(url, proc, args.preheat_timeout)
    log(f"N={n}: pool ready after {preheat_s:.0f} s: {status(url)}")
    load_before = os.getloadavg()
    students = [Student(i) for i in range(n)]
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            plans = [[SENTENCES[(i * (args.rounds + 1) + r) % len(SENTENCES)] for r in range(args.rounds + 1)]
                     for i in range(n)]
            delays = [args.arrive_within * i / max(n - 1, 1) for i in range(n)]
            t0 = time.monotonic()
            meter = CpuMeter(proc.pid)
            sampling = asyncio.ensure_future(meter.run_sampling())
            flows = asyncio.gather(*(student(s, browser, url, d, p, want, args)
                                     for s, d, p in zip(students, delays, plans)))
            watch = asyncio.ensure_future(_watch(proc))
            await asyncio.wait([flows, watch], return_when=asyncio.FIRST_COMPLETED)
            if not flows.done():
                flows.cancel()
                raise SystemExit(f"the server died (exit {proc.returncode}) during the flows: see {server_log}")
            watch.cancel()
            contexts = flows.result()
            flows_s = time.monotonic() - t0
            sampling.cancel()
            cpu = meter.totals()
            load_during = os.getloadavg()
            open_status = status(url)
            kernels = kernel_pids(proc.pid)
            pss = {pid: pss_mb(pid) for pid in kernels}
            server_pss = sum(pss_mb(pid) or 0 for pid in server_pids(proc.pid))
            for c in contexts:
                await c.close()
            await browser.close()
        closed = time.monotonic()
        while time.monotonic() - closed < args.linger:
            time.sleep(2)
        left, left_status = kernel_pids(proc.pid), status(url)
    finally:
        stop_server(proc)
    known = [v for v in pss.values() if v is not None]
    stale = [f"student {s.index}: {line}" for s in students for line in s.stale]
    pool_after = (left_status or {}).get("pool", {})
    return {
        "n": n,
        "server": label,
        "preheat_s": round(preheat_s, 1),
        "rounds_timed": args.rounds,
        "arrive_within_s": args.arrive_within,
        "text_box_s": _stats([s.textbox_s for s in students if s.textbox_s is not None]),
        "page_ready_s": _stats([s.ready_s for s in students if s.ready_s is not None]),
        "pages_never_ready": sum(s.ready_s is None for s in students),
        "mask_edit_ms": _stats([m for s in students for m in s.mask_ms]),
        "attention_edit_ms": _stats([m for s in students for m in s.attention_ms]),
        "charts_checked": n * (args.rounds + 2),
        "stale_charts": len(stale),
        "stale_while_the_kernel_had_the_result": sum("had read it" in line for line in stale),
        "stale_details": stale,
        "flows_s": round(flows_s, 1),
        "cpu_s_during_flows": {part: round(v, 1) for part, v in cpu.items()},
        "status_with_pages_open": open_status,
        "kernels_with_pages_open": len(kernels),
        "pss_mb": {"per_kernel": [round(v, 1) for v in known],
                   "per_kernel_median": round(statistics.median(known), 1) if known else None,
                   "kernels_total": round(sum(known), 1), "server": round(server_pss, 1)},
        "kernels_left": {"after_s": args.linger, "count": len(left),
                         "pool_ready": pool_after.get("ready"), "pool_starting": pool_after.get("starting"),
                         "of_closed_pages": (len(left) - pool_after.get("ready", 0) - pool_after.get("starting", 0))
                         if left_status else None},
        "refused_requests": sorted({u for s in students for u in s.refused})[:20],
        "page_errors": sorted({e for s in students for e in s.errors})[:20],
        "load_avg": {"before": [round(x, 2) for x in load_before], "after_flows": [round(x, 2) for x in load_during]},
    }


def table(rows: list[dict]) -> str:
    lines = ["| N | page ready p50 / p95 / max s | mask edit p50 / p95 ms | attention edit p50 / p95 ms | "
             "stale | PSS per kernel (median) / total MB | kernels left | load (1 min) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pr, me, ae, pss = r["page_ready_s"], r["mask_edit_ms"], r["attention_edit_ms"], r["pss_mb"]
        lines.append(
            f"| {r['n']} | {pr['p50']} / {pr['p95']} / {pr['max']} | {me['p50']} / {me['p95']} | "
            f"{ae['p50']} / {ae['p95']} | {r['stale_charts']} of {r['charts_checked']} | "
            f"{pss['per_kernel_median']} / {pss['kernels_total']} | {r['kernels_left']['count']} after "
            f"{r['kernels_left']['after_s']} s | {r['load_avg']['after_flows'][0]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, action="append", help="students (repeat for several classes; default 10)")
    p.add_argument("--rounds", type=int, default=2, help="timed Mask edits per student after the first (default 2)")
    p.add_argument("--arrive-within", type=float, default=60.0,
                   help="students arrive evenly over this many seconds (default 60)")
    p.add_argument("--wait", type=float, default=240.0, help="seconds to wait for a page or a chart (default 240)")
    p.add_argument("--linger", type=float, default=60.0,
                   help="seconds after the pages close before counting kernels (default 60)")
    p.add_argument("--stale-after", type=float, default=60.0,
                   help="a chart not redrawn this many seconds after its kernel read the text is stale (default 60)")
    p.add_argument("--preheat-timeout", type=float, default=900.0,
                   help="seconds to wait for the pre-heated pool before the students arrive (default 900)")
    p.add_argument("--quick", action="store_true", help="N = 2, one round, arriving together, 45 s linger")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.rounds, args.arrive_within, args.linger = [2], 1, 0.0, 45.0
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium).")
    want = expected_guesses(list(SENTENCES))
    rows = []
    for n in args.n or [10]:
        rows.append(asyncio.run(run_class(n, args, want, chromium)))
        print(table(rows[-1:]), flush=True)
    result = {
        "meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
