"""bertlab's own attention view and the offline bertviz views in a real browser, with no network.

A tiny notebook that shows both views for a fixed random attention tensor is served by Voila on
a free loopback port; headless Chromium (fixtures in conftest.py) loads it while every request
that leaves 127.0.0.1 is aborted and recorded. The HTML exports are opened from file:// the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import nbformat
import pytest
import torch

from bertlab.viz.attention_view import to_standalone_html
from bertlab.viz.bertviz_offline import bertviz_html

pytestmark = pytest.mark.browser

TOKENS = "[CLS] the cat sat on the mat . [SEP] it was very happy [SEP]".split()
B_START = 9
VOILA_START_S = 180  # Voila + a kernel importing torch, on 2 busy cores
SETUP = f"""\
import torch
from bertlab.viz.attention_view import AttentionView
from bertlab.viz.bertviz_offline import bertviz_head_view, bertviz_model_view

tokens = {TOKENS!r}
generator = torch.Generator().manual_seed(0)
attention = (torch.randn(2, 4, len(tokens), len(tokens), generator=generator) * 2.5).softmax(-1)
"""


def _attention() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, len(TOKENS), len(TOKENS), generator=generator) * 2.5).softmax(-1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def views_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Voila serving a notebook with both views, on a free loopback port; stopped at the end."""
    folder = tmp_path_factory.mktemp("attention_views")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(f"AttentionView(attention, tokens, sentence_b_start={B_START})"),
        nbformat.v4.new_code_cell(f"bertviz_head_view(attention, tokens, sentence_b_start={B_START})"),
        nbformat.v4.new_code_cell("bertviz_model_view(attention, tokens)"),
    ]
    nbformat.write(nb, folder / "views.ipynb")
    port = _free_port()
    log = folder / "voila.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voila", "views.ipynb", f"--port={port}", "--Voila.ip=127.0.0.1", "--no-browser"],
            cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + VOILA_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"voila exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"voila did not listen within {VOILA_START_S} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def offline_page(chromium_browser) -> Iterator[tuple[object, list[str], list[str]]]:
    """A page whose requests may only reach 127.0.0.1 or local schemes: (page, blocked URLs, errors)."""
    blocked: list[str] = []
    errors: list[str] = []
    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1500})

    def route(r) -> None:
        url = r.request.url
        if url.startswith(("http://127.0.0.1", "file:", "data:", "blob:", "about:")):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page, blocked, errors
    context.close()


def _view_requests(blocked: list[str]) -> list[str]:
    """Blocked requests made for the attention views (Voila's own template asks a CDN for fonts)."""
    return [u for u in blocked if any(k in u for k in ("d3", "jquery", "require", "bertviz", "cdnjs"))]


def _bertviz_lines(frame_locator) -> int:
    return frame_locator.locator("svg line").count()


@pytest.mark.slow
def test_voila_shows_own_view_and_bertviz_offline(views_url, offline_page, screenshot_dirs):
    page, blocked, errors = offline_page
    page.goto(views_url, wait_until="domcontentloaded")

    page.wait_for_selector(".bl-attn svg.bl-head path.bl-line", state="attached")
    assert page.locator(".bl-attn .bl-token[data-side=q]").count() == len(TOKENS)
    all_heads = page.locator(".bl-attn path.bl-line").count()
    assert all_heads > 0
    page.click(".bl-attn button[data-act=none]")
    page.wait_for_function("() => document.querySelectorAll('.bl-attn path.bl-line').length === 0")
    page.click(".bl-attn .bl-chip[data-head='2']")
    page.wait_for_selector(".bl-attn path.bl-line[data-head='2']", state="attached")
    heads = page.eval_on_selector_all(".bl-attn path.bl-line", "ps => [...new Set(ps.map(p => p.dataset.head))]")
    assert heads == ["2"]
    page.hover(".bl-attn .bl-token[data-side=q][data-index='2']")  # "cat": only its lines stay
    page.wait_for_function("() => document.querySelectorAll('.bl-attn .bl-token.bl-hovered').length === 1")
    hover_d = page.eval_on_selector_all(".bl-attn path.bl-line", "ps => ps.map(p => p.getAttribute('d'))")
    assert hover_d and all(d.count("M") == d.count("L") for d in hover_d)
    assert len({seg.split("L")[0] for d in hover_d for seg in d.split("M")[1:]}) == 1  # one start point

    frames = page.frame_locator("iframe.bertlab-bertviz")
    head_frame, model_frame = frames.nth(0), frames.nth(1)
    head_frame.locator("svg line").first.wait_for(state="attached")
    model_frame.locator("svg line").first.wait_for(state="attached")
    assert _bertviz_lines(head_frame) == 4 * len(TOKENS) ** 2  # one line per head, query and key
    assert _bertviz_lines(model_frame) > 0
    page.wait_for_timeout(500)  # let the iframes fit their height before the screenshot
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "attention-views-voila.png"), full_page=True)

    page.click(".bl-attn .bl-tab[data-view=model]")
    page.wait_for_selector(".bl-attn canvas.bl-thumb")
    assert page.locator(".bl-attn canvas.bl-thumb").count() == 2 * 4
    page.click(".bl-attn canvas.bl-thumb[data-layer='1'][data-head='3']")
    page.wait_for_selector(".bl-attn path.bl-line[data-head='3']", state="attached")
    assert page.locator(".bl-attn select.bl-layer").input_value() == "1"

    assert _view_requests(blocked) == []
    assert not [e for e in errors if "require is not defined" in e or "d3" in e]


def test_html_exports_open_offline(tmp_path, offline_page, screenshot_dirs):
    page, blocked, errors = offline_page
    attention = _attention()
    own = tmp_path / "own.html"
    own.write_text(to_standalone_html(attention, TOKENS, B_START, title="Export"), encoding="utf-8")
    page.goto(own.as_uri())
    page.wait_for_selector(".bl-attn path.bl-line", state="attached")
    assert page.locator(".bl-attn .bl-token[data-side=k]").count() == len(TOKENS)
    page.select_option(".bl-attn select.bl-filter", "a->b")
    page.wait_for_function(
        f"() => document.querySelectorAll('.bl-attn .bl-token[data-side=k]').length === {len(TOKENS) - B_START}"
    )
    assert page.locator(".bl-attn path.bl-line").count() > 0
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "attention-view-export.png"), full_page=True)

    for view in ("head", "model"):
        exported = tmp_path / f"bertviz-{view}.html"
        exported.write_text(bertviz_html(attention, TOKENS, B_START, view=view), encoding="utf-8")
        page.goto(exported.as_uri())
        page.locator("svg line").first.wait_for(state="attached")
        assert page.locator("svg line").count() > 0
        for d in screenshot_dirs:
            page.screenshot(path=str(d / f"bertviz-{view}-export.png"), full_page=True)

    assert blocked == []
    assert errors == []
