"""The README's screenshot, made from today's app: `bertlab serve` on a free loopback port (offline, the
offline default), Debian's Chromium driven by Playwright until the Mask tab's chart is drawn, then the
first screen of the page written to docs/img/tab-mask.png.

    python docs/screenshot.py [--out docs/img/tab-mask.png] [--width 1200 --height 900]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img" / "tab-mask.png"
CHART = ".bertlab-mask-guesses .js-plotly-plot .main-svg .ytick"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(proc: subprocess.Popen, port: int, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bertlab serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"bertlab serve did not listen within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--width", type=int, default=1200)
    p.add_argument("--height", type=int, default=900)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium).")
    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="bertlab-screenshot-")) / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--no-browser", "--port", str(port)],
                                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(proc, port, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.set_default_timeout(240_000)
            page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
            page.wait_for_selector(CHART)
            page.wait_for_selector(".bertlab-classics")  # the model card's line on the lectures' examples
            time.sleep(1.0)  # plotly's last transition
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=False)
            browser.close()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
