"""Browser fixtures: the dashboard served by `bertlab serve` (Voila) on a free loopback port,
and a headless Debian Chromium driven by Playwright. Offline: nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port as _free_port
from servers import stop as _stop

SERVER_START_S = 180  # Voila + a kernel that loads MiniLM, on 2 busy cores
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REPO = Path(__file__).resolve().parents[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(what: str) -> None:
    """Skip on a developer machine, fail in CI: CI must run the browser tests."""
    if _in_ci():
        pytest.fail(f"{what} (CI=true, so this is an error: .ci/run installs chromium).")
    pytest.skip(what)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="session")
def chromium_browser(chromium_path: str) -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()




def _wait_for_port(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"bertlab serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"bertlab serve did not listen on port {port} within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`bertlab serve --no-browser` on a free port; stopped (whole process group) at the end."""
    port = _free_port()
    log = tmp_path_factory.mktemp("voila") / "voila.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}  # the offline default model
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--no-browser", "--port", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_for_port(proc, port, log)
        yield f"http://127.0.0.1:{port}/"
    finally:
        _stop(proc)




@pytest.fixture
def dashboard_page(chromium_browser) -> Iterator[object]:
    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1100})
    p = context.new_page()
    p.set_default_timeout(120_000)
    yield p
    context.close()


@pytest.fixture(scope="session")
def screenshot_dirs() -> list[Path]:
    """Always a temp folder; also docs/img when BERTLAB_UPDATE_SCREENSHOTS=1 (for the docs)."""
    dirs = [Path(tempfile.gettempdir()) / "bertlab-screenshots"]
    if os.environ.get("BERTLAB_UPDATE_SCREENSHOTS") == "1":
        dirs.append(REPO / "docs" / "img")
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs
