"""A real browser: a short pre-training run in the Pre-training tab, then its Replay
section: the step slider moved with the keyboard redraws the view at the first snapshot, and each view
(Mask, Attention, Embeddings, Logit lens) draws. Screenshot: $TMPDIR/bertlab-screenshots/replay-*.png."""

from __future__ import annotations

import pytest
from dashboard_page import CURRENT, PLOT, TAB, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPLAY = ".bertlab-replay"


def _field(page, label: str):
    return page.locator(f"{CURRENT} .widget-inline-hbox", has_text=label).locator("input").first


def _wait_for_title(page, start: str, has: str = "") -> None:
    """Wait until a figure of the Replay section has a title that starts with `start` and holds `has`."""
    page.wait_for_function(
        """([sel, start, has]) => Array.from(document.querySelectorAll(sel + ' .gtitle'))
               .some(t => t.textContent.startsWith(start) && t.textContent.includes(has))""",
        arg=[f"{CURRENT} {REPLAY} {PLOT}", start, has])


def _open(page, url: str, tab: str) -> list[str]:
    """The dashboard at `tab`; the list fills with the page's uncaught errors."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(TAB)
    open_tab(page, tab)
    return errors


def test_a_pretraining_run_replays_in_the_browser(dashboard_url, dashboard_page, screenshot_dirs):
    page = dashboard_page
    errors = _open(page, dashboard_url, "Pre-training")
    _field(page, "Steps").fill("16")
    _field(page, "Steps").press("Enter")
    _field(page, "Batch").fill("4")
    _field(page, "Batch").press("Enter")
    page.locator(CURRENT).get_by_role("button", name="Start").click()
    # the run ends, then the probe is read with every snapshot: the trajectory and the Mask view draw
    page.wait_for_function(
        """sel => document.querySelectorAll(sel + ' .js-plotly-plot .main-svg').length >= 2""",
        arg=f"{CURRENT} {REPLAY}", timeout=240_000)
    _wait_for_title(page, "step 16")  # the last snapshot is on show first
    handle = page.locator(f"{CURRENT} {REPLAY} .noUi-handle").first
    handle.focus()
    handle.press("Home")  # the step slider to its first snapshot
    _wait_for_title(page, "step 0")
    for view in ("Attention", "Embeddings", "Logit lens", "Mask"):
        page.locator(f"{CURRENT} {REPLAY}").get_by_role("button", name=view, exact=True).click()
        want = {"Attention": "Layer", "Embeddings": "Cosine", "Logit lens": "Logit lens", "Mask": "step 0"}[view]
        _wait_for_title(page, "step 0", want)
        page.wait_for_timeout(300)
        for d in screenshot_dirs if view == "Attention" else screenshot_dirs[:1]:  # the docs show one
            page.locator(f"{CURRENT} {REPLAY}").screenshot(path=str(d / f"replay-{view.lower().replace(' ', '-')}.png"))
    assert not page.eval_on_selector_all(f"{CURRENT} {REPLAY} .bertlab-error", "els => els.map(e => e.textContent)")
    assert not errors, errors


def test_what_a_fine_tuning_run_changed_shows_in_the_browser(dashboard_url, dashboard_page, screenshot_dirs):
    """A 2-step fine-tuning run of the offline default: its replay and its "What changed" figures draw."""
    import os
    from pathlib import Path

    if not (Path(os.environ.get("BERTLAB_DATA", "/nonexistent")) / "sst2").is_dir():
        pytest.skip("BERTLAB_DATA with sst2/ is not set for the server")
    page = dashboard_page
    errors = _open(page, dashboard_url, "Fine-tuning")
    for label, value in (("Epochs", "1"), ("Batch", "16"), ("Max train examples", "32"), ("Max dev examples", "16")):
        _field(page, label).fill(value)
        _field(page, label).press("Enter")
    page.locator(CURRENT).get_by_role("button", name="Start").click()
    changed = f"{CURRENT} .bertlab-changed"
    page.wait_for_function(
        """sel => document.querySelectorAll(sel + ' .js-plotly-plot .main-svg').length >= 3""",
        arg=changed, timeout=300_000)
    page.wait_for_function(
        """sel => document.querySelectorAll(sel + ' .js-plotly-plot .main-svg').length >= 2""",
        arg=f"{CURRENT} {REPLAY}", timeout=120_000)
    text = page.inner_text(changed)
    assert "Jensen" in text and "linear CKA" in text and "sst2 · full" in text
    import torch

    from bertlab.training.loop import native_bf16

    if native_bf16(torch.device("cpu")):  # the server's kernel runs here too: its run said it computed in bf16
        assert "bf16" in page.locator(CURRENT).get_by_text("sst2 · full · step").first.inner_text()
        page.locator(CURRENT).screenshot(path=str(screenshot_dirs[0] / "fine-tuning-tab-bf16.png"))
    assert not page.eval_on_selector_all(f"{changed} .bertlab-error", "els => els.map(e => e.textContent)")
    page.set_viewport_size({"width": 1200, "height": 1600})  # the section is taller than the default page
    page.locator(f"{changed} {PLOT}").last.scroll_into_view_if_needed()
    page.wait_for_function(  # the loss slice drew its axes' titles
        """sel => Array.from(document.querySelectorAll(sel + ' .xtitle')).some(t => t.textContent.includes('alpha'))""",
        arg=changed)
    page.wait_for_timeout(300)
    for d in screenshot_dirs:
        page.locator(changed).screenshot(path=str(d / "what-changed.png"))
    page.locator(f"{CURRENT} {REPLAY}").screenshot(path=str(screenshot_dirs[0] / "replay-fine-tuning.png"))
    assert not errors, errors
