"""At 1024x768 in headless Chromium: the header leaves the first tab's result in the window, the neuron view
follows every new text (never the one before), and the head view has one set of controls (the tab's).

Screenshots: /tmp/bertlab-screenshots/header-1024.png, neuron-view-*.png, attention-head-view.png."""

from __future__ import annotations

import pytest
from dashboard_page import CURRENT, PLOT, TAB, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SECTION = f"{CURRENT} .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)"  # the section on show in a tab
HEADER_PX = 240  # the tab bar starts above this (it started at ~370 px under a title, two paragraphs and the picker)


@pytest.fixture
def page_1024(chromium_browser):
    context = chromium_browser.new_context(viewport={"width": 1024, "height": 768})
    page = context.new_page()
    page.set_default_timeout(180_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page, errors
    context.close()


def test_the_header_is_compact_and_the_first_result_shows(dashboard_url, page_1024, screenshot_dirs):
    page, _ = page_1024
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg")
    page.wait_for_timeout(500)
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "header-1024.png"))
    tabs_top = page.eval_on_selector(TAB, "e => e.getBoundingClientRect().top")
    assert tabs_top < HEADER_PX, f"the tab bar starts at {tabs_top:.0f} px of 768"
    bars = page.eval_on_selector(f"{CURRENT} {PLOT} .cartesianlayer", "e => e.getBoundingClientRect().bottom")
    assert bars <= 768, f"the Mask tab's guesses end at {bars:.0f} px: below the window"


def test_the_neuron_view_follows_every_text(dashboard_url, page_1024, screenshot_dirs):
    page, errors = page_1024
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg")
    open_tab(page, "What it knows")
    page.locator(f"{CURRENT} .lm-TabBar-tab", has_text="Neuron view").click()

    shown_js = """([sel, want]) => Array.from(document.querySelectorAll(sel + ' .js-plotly-plot .ytick text, '
                                                + sel + ' .js-plotly-plot .annotation-text'))
                                  .some(e => e.textContent.includes(want))"""

    def show(text: str, want: str, shot: str) -> list[str]:
        """Type `text`, press Show, wait until a tick label or a note holds `want`; the tick labels then."""
        page.locator(f"{SECTION} .widget-text input").first.fill(text)
        page.locator(SECTION).get_by_role("button", name="Show").click()
        page.wait_for_function(shown_js, arg=[SECTION, want], timeout=60_000)
        for d in screenshot_dirs:
            page.locator(SECTION).screenshot(path=str(d / f"neuron-view-{shot}.png"))
        return page.eval_on_selector_all(f"{SECTION} {PLOT} .ytick text", "els => els.map(e => e.textContent)")

    show("The dog ran home.", "dog", "short")
    longer = show("A much longer sentence about a cat that sat on a mat in the sun.", "cat", "longer")
    assert not any("dog" in t for t in longer), longer  # the earlier text is gone
    assert show(" ".join(["word"] * 600), "up to 48 tokens", "too-long") == []
    assert page.eval_on_selector(f"{SECTION} {PLOT} .annotation-text",  # the whole message, inside the figure
                                 "e => e.getBoundingClientRect().width") < 600
    again = show("A bird sang.", "bird", "after-long")
    assert not any("cat" in t for t in again), again
    assert show("", "empty", "empty") == []
    assert not [e for e in errors if "Error setting state" in e], errors


def test_the_head_view_has_one_set_of_controls(dashboard_url, page_1024, screenshot_dirs):
    page, _ = page_1024
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg")
    open_tab(page, "Attention")
    page.locator(f"{CURRENT} .widget-toggle-buttons button", has_text="Head view").click()
    page.wait_for_selector(f"{CURRENT} .bl-attn path.bl-line", state="attached")
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "attention-head-view.png"))
    visible = "el => !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length)"
    assert not page.locator(f"{CURRENT} .bl-attn .bl-tabs").evaluate(visible)  # no second view toggle
    assert not page.locator(f"{CURRENT} .bl-attn select.bl-layer").evaluate(visible)  # no second layer control
    sliders = page.locator(f"{CURRENT} .widget-slider").filter(has_text="Layer")
    assert sliders.count() == 1 and sliders.first.is_visible()  # the tab's Layer slider drives the head view
