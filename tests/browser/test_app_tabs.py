"""Every tab of the dashboard in headless Chromium, served by `bertlab serve` (Voila) on loopback,
with every request that leaves 127.0.0.1 refused: each tab opens and draws, a mask prediction
appears after typing, the head view draws lines, switching layer redraws the heatmap.

Screenshots go to $TMPDIR/bertlab-screenshots (and docs/img with BERTLAB_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import re

import pytest
from dashboard_page import CURRENT, PLOT, open_dashboard_offline, open_tab

from bertlab.panels.app import TABS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Tabs that draw a figure as soon as they open (the training tabs draw theirs once a run starts).
DRAWS_AT_OPEN = {"Input", "Mask", "Next sentence", "Attention", "Embeddings", "Ablation", "Pre-training"}


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


@pytest.fixture
def app(dashboard_url, dashboard_page):
    """The dashboard loaded with the network cut off; yields (page, refused URLs, page errors)."""
    page = dashboard_page
    seen = open_dashboard_offline(page, dashboard_url)
    page.loaded = seen.loaded  # loopback URLs the page asked for
    yield page, seen.refused, seen.errors


def _errors_on_show(page) -> list[str]:
    return page.eval_on_selector_all(f"{CURRENT} .bertlab-error", "els => els.map(e => e.textContent)")


def test_every_tab_opens_and_draws_offline(app, screenshot_dirs):
    page, refused, errors = app
    for title, _ in TABS:
        open_tab(page, title)
        if title in DRAWS_AT_OPEN:
            page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg")
        page.wait_for_timeout(300)  # let plotly finish laying out before the picture
        assert not _errors_on_show(page), title
        assert "Traceback" not in page.inner_text(CURRENT), title
        for d in screenshot_dirs:
            page.screenshot(path=str(d / f"tab-{_slug(title)}.png"), full_page=True)
    assert not errors, errors
    assert not refused, f"the page asked the network for: {refused}"  # e.g. Font Awesome from a CDN
    # plotly.js is parsed once per page, from the server's bundle: not again from plotly's lab extension
    assert sum("plotly-widgetbundle.js" in u for u in page.loaded) == 1, page.loaded
    assert not [u for u in page.loaded if "labextensions/jupyterlab-plotly" in u]


def test_a_mask_prediction_appears_after_typing(app, screenshot_dirs):
    page, _, _ = app
    open_tab(page, "Mask")
    box = page.locator(f"{CURRENT} .widget-textarea textarea").first
    box.fill("Paris is the [MASK] of France.")
    page.locator(CURRENT).get_by_role("button", name="Predict").click()
    # [CLS] paris is the [MASK]: the chart for token 4 replaces the default sentence's token 6
    page.wait_for_function(
        """sel => Array.from(document.querySelectorAll(sel + ' .js-plotly-plot'))
               .some(p => p.textContent.includes('[MASK] at token 4'))""",
        arg=CURRENT,
    )
    bars = page.evaluate(f"() => document.querySelector('{CURRENT} {PLOT}').data[0]")
    assert len(bars["x"]) == 5 and all(0 < p <= 1 for p in bars["x"])  # top 5 probabilities
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "tab-mask-typed.png"), full_page=True)


def test_head_view_draws_lines_and_layer_switch_redraws_the_heatmap(app, screenshot_dirs):
    page, _, _ = app
    open_tab(page, "Attention")
    heatmap = f"{CURRENT} {PLOT}"
    page.wait_for_selector(f"{heatmap} .main-svg")
    before = page.evaluate("sel => JSON.stringify(document.querySelector(sel).data[0].z)", heatmap)
    handle = page.locator(f"{CURRENT} .widget-slider .noUi-handle").first  # the Layer slider
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function("([sel, old]) => JSON.stringify(document.querySelector(sel).data[0].z) !== old",
                           arg=[heatmap, before])
    assert page.text_content(f"{heatmap} .gtitle").startswith("Layer 1")

    page.locator(CURRENT).get_by_role("button", name="Head view").click()
    page.wait_for_selector(f"{CURRENT} .bl-line")
    assert page.locator(f"{CURRENT} .bl-line").count() > 20
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "tab-attention-head-view.png"), full_page=True)
