"""A real browser in a class whose kernels are forked from a warm parent (`bertlab serve --class 2
--fork-kernels`). The page's widget manager asks its kernel for every widget's state at once (the
`jupyter.widget.control` comm): a forked kernel must answer it (before it did not, and in the rush bench
no Chromium page showed the Mask tab). And a page whose code is slow to load (as on a
busy server) keeps its kernel: its first script says it runs, so only a plain request loses its seat
within seconds."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port as _free_port
from servers import stop as _stop

from bertlab.serving import STATUS_PATH
from bertlab.serving.kernels import ClassKernels

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
START_S = 240  # the server, its warm parent and two forked kernels, on 2 busy cores
READY_MS = 120_000
TEXT_BOX = ".widget-textarea textarea"
CHART = ".js-plotly-plot .main-svg"
CLASS_DIRS: dict[str, Path] = {}  # the class folder of each served URL


@pytest.fixture(scope="module")
def forked_class() -> Iterator[str]:
    """The students' URL of `bertlab serve --class 2 --fork-kernels`, once its two kernels are pre-heated."""
    port, folder = _free_port(), Path(tempfile.mkdtemp(prefix="forked-class-"))
    log = folder / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTLAB_") or k == "BERTLAB_DATA"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--class", "2", "--fork-kernels", "--no-browser",
             "--port", str(port), "--teacher-port", str(_free_port()), "--class-dir", str(folder / "class")],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    CLASS_DIRS[url] = folder / "class"
    try:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"bertlab serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            status = _status(url)
            if status and status["pool"]["ready"] >= 2:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the class did not pre-heat within {START_S} s:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        _stop(proc)






def _status(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + STATUS_PATH, timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def _frames(page) -> list[str | bytes]:
    """Every frame the page receives on its websockets (filled in as they come)."""
    frames: list[str | bytes] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    return frames


def test_a_forked_kernels_page_loads_every_widget_state_at_once(forked_class, chromium_browser):
    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(READY_MS)
        frames = _frames(page)
        page.goto(forked_class, wait_until="domcontentloaded")
        page.locator(TEXT_BOX).first.wait_for(state="visible")
        page.wait_for_selector(CHART)
        answered = [f for f in frames if (b"update_states" if isinstance(f, bytes) else "update_states") in f]
        assert answered, "the forked kernel did not answer the page's jupyter.widget.control comm"
    finally:
        context.close()


def test_a_page_slow_to_load_its_code_keeps_its_kernel(forked_class, chromium_browser):
    """Voila's code (voila.js) reaches the page only after a plain request would have lost its seat: the
    page's first script already said it runs, so the kernel waits, and the page draws."""
    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1000})
    delayed = []

    def slow(route) -> None:
        delayed.append(route.request.url)
        time.sleep(ClassKernels.UNSEEN_GRACE_S + 5)
        route.continue_()

    try:
        page = context.new_page()
        page.set_default_timeout(READY_MS)
        page.route("**/voila/static/voila.js*", slow)
        page.goto(forked_class, wait_until="domcontentloaded")
        page.locator(TEXT_BOX).first.wait_for(state="visible")
        page.wait_for_selector(CHART)
        assert delayed, "the test did not delay the page's code"
        assert page.locator(".bertlab-kernel-gone").count() == 0  # no "this page has lost its kernel"
    finally:
        context.close()


def test_a_reload_keeps_the_models_the_student_trained(forked_class, chromium_browser, tmp_path):
    """A student's run, finished in this browser's workspace, is in the model picker again after a reload
    (the reload's kernel adopts the workspace of the browser's key; before, it got an empty one)."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import family_folder

    from bertlab.serving.handlers import WORKSPACE_COOKIE

    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(READY_MS)
        page.goto(forked_class, wait_until="domcontentloaded")
        page.locator(TEXT_BOX).first.wait_for(state="visible")
        key = next(c["value"] for c in context.cookies() if c["name"] == WORKSPACE_COOKIE)
        suffix = hashlib.sha256(key.encode()).hexdigest()[:32]
        workspaces = CLASS_DIRS[forked_class] / "workspaces"
        deadline = time.monotonic() + 60
        while not (found := [p for p in workspaces.glob(f"*-{suffix}") if (p / "runs").is_dir()]):
            assert time.monotonic() < deadline, "the page's kernel never took its browser's workspace"
            time.sleep(0.5)
        # what a finished fine-tune leaves in runs/ (a model folder transformers wrote, as the run's save does)
        run = found[0] / "runs" / "20261202-101500-sst2-full-reload"
        family_folder(tmp_path, "bert").rename(run)
        assert page.locator("select option", has_text="runs/").count() == 0  # this page listed none
        page.reload(wait_until="domcontentloaded")
        page.locator(TEXT_BOX).first.wait_for(state="visible")
        option = page.locator("select option", has_text=run.name)
        option.first.wait_for(state="attached", timeout=60_000)
        assert option.first.text_content().strip() == f"runs/{run.name}"
    finally:
        context.close()
