"""The dashboard end to end: the app notebook in a headless kernel, then `bertlab serve` ->
Voila -> headless Chromium, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dashboard_page import CURRENT

APP = Path(__file__).resolve().parents[2] / "apps" / "bertlab.ipynb"

PLOT = f"{CURRENT} .js-plotly-plot"
TICKS = f"{PLOT} .xtick text"
SENTENCE = "Paris is the capital of France."


def _ticks(page) -> list[str]:
    return page.eval_on_selector_all(TICKS, "els => els.map(e => e.textContent)")


def _z(page) -> str:
    """The heatmap's weights as the browser holds them (JSON, for comparing)."""
    return page.evaluate(
        "sel => JSON.stringify(Array.from(document.querySelector(sel).data[0].z, r => Array.from(r)))", PLOT
    )


def _wait_for_ticks(page, *tokens: str) -> None:
    page.wait_for_function(
        """([sel, want]) => {
            const got = Array.from(document.querySelectorAll(sel), e => e.textContent);
            return want.every(t => got.includes(t));
        }""",
        arg=[TICKS, list(tokens)],
    )


@pytest.mark.slow
def test_app_notebook_runs_in_a_headless_kernel():
    """No browser needed: the notebook runs cell by cell and ends by showing the widgets."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(APP, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(APP.parent)}}).execute()
    shown = nb.cells[-1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown)
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_shows_typed_sentence_and_switches_layer(dashboard_url, dashboard_page, screenshot_dirs):
    page = dashboard_page
    response = page.goto(dashboard_url, wait_until="domcontentloaded")  # a real GET of the served page
    assert response is not None and response.status == 200
    html = response.text()
    assert "application/vnd.jupyter.widget-view+json" in html  # the app's last cell showed widgets
    assert "There was an error when executing cell" not in html and "Traceback" not in html
    page.locator(".bertlab-tabs > .lm-TabBar .lm-TabBar-tab", has_text="Attention").click()
    page.wait_for_selector(f"{CURRENT} .widget-textarea textarea")
    _wait_for_ticks(page, "[CLS]", "animal", "[SEP]")  # the default sentence, drawn when the tab opens

    page.fill(f"{CURRENT} .widget-textarea textarea", SENTENCE)
    page.locator(CURRENT).get_by_role("button", name="Show").click()
    _wait_for_ticks(page, "paris", "capital", "france")
    assert _ticks(page) == ["[CLS]", "paris", "is", "the", "capital", "of", "france", ".", "[SEP]"]
    assert "9 tokens" in page.inner_text(f"{CURRENT} .bertlab-note")
    before = _z(page)
    assert len(json.loads(before)) == 9
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "dashboard.png"), full_page=True)

    handle = page.locator(f"{CURRENT} .widget-slider .noUi-handle").first  # the Layer slider
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function("sel => document.querySelector(sel).textContent.startsWith('Layer 1')",
                           arg=f"{PLOT} .gtitle")
    page.wait_for_function("([sel, old]) => JSON.stringify(Array.from(document.querySelector(sel).data[0].z, "
                           "r => Array.from(r))) !== old", arg=[PLOT, before])
    assert _ticks(page) == ["[CLS]", "paris", "is", "the", "capital", "of", "france", ".", "[SEP]"]
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "dashboard-layer1.png"), full_page=True)
