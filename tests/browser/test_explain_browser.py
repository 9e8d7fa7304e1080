"""In a real browser: "Does attention explain it?" opened in the Mask and Next
sentence tabs draws its figure; the Export tab's lab record downloads and, opened offline as a file,
draws its figures and attention view. Screenshots: $TMPDIR/bertlab-screenshots/explain-*.png,
lab-record.png."""

from __future__ import annotations

import base64
import re

import pytest
from dashboard_page import CURRENT, PLOT, TAB, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXPLAIN = ".bertlab-explain"


def _open_explain(page, tab: str, screenshot_dirs) -> str:
    """Open the section in `tab`, wait for its figure; the figure's title."""
    open_tab(page, tab)
    section = page.locator(f"{CURRENT} {EXPLAIN}")
    section.get_by_role("button", name="Does attention explain it?").click()
    page.wait_for_function(
        """sel => Array.from(document.querySelectorAll(sel + ' .gtitle'))
               .some(t => t.textContent.startsWith('Does attention explain'))""",
        arg=f"{CURRENT} {EXPLAIN} {PLOT}", timeout=120_000)
    page.wait_for_timeout(300)
    for d in screenshot_dirs:
        section.screenshot(path=str(d / f"explain-{tab.lower().replace(' ', '-')}.png"))
    assert not page.eval_on_selector_all(f"{CURRENT} {EXPLAIN} .bertlab-error", "els => els.map(e => e.textContent)")
    assert section.locator(".bertlab-note", has_text="completeness gap").count() == 1
    return page.locator(f"{CURRENT} {EXPLAIN} {PLOT} .gtitle").first.text_content()


def test_attention_beside_attribution_and_the_lab_record(dashboard_url, dashboard_page, chromium_browser,
                                                         screenshot_dirs, tmp_path):
    page = dashboard_page
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(dashboard_url, wait_until="domcontentloaded")
    page.wait_for_selector(TAB)
    title = _open_explain(page, "Mask", screenshot_dirs)
    assert "[MASK]" in title
    title = _open_explain(page, "Next sentence", screenshot_dirs)
    assert "IsNext" in title
    # the lab record: a download link (a data: URL), opened as a file with the network cut off
    open_tab(page, "Export")
    page.locator(CURRENT).get_by_role("button", name="Make lab record").click()
    link = page.locator(f'{CURRENT} a[download$=".html"]', has_text=re.compile("lab-record"))
    link.wait_for(timeout=120_000)
    href = link.get_attribute("href")
    record = tmp_path / "record.html"
    record.write_bytes(base64.b64decode(href.split(",", 1)[1]))
    assert not errors, errors

    context = chromium_browser.new_context(viewport={"width": 1200, "height": 1400})
    asked: list[str] = []

    def offline(route):
        asked.append(route.request.url)
        route.abort()

    context.route(re.compile(r"^https?://"), offline)
    viewer = context.new_page()
    viewer_errors: list[str] = []
    viewer.on("pageerror", lambda e: viewer_errors.append(str(e)))
    viewer.goto(record.as_uri())
    viewer.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3")
    text = viewer.locator("body").text_content()
    assert "Mask" in text and "Next sentence" in text and "Does attention explain" in text
    assert viewer.locator("iframe.attention").count() == 1  # the Export tab's sentence: no Attention tab opened
    frame = viewer.frame_locator("iframe.attention").first
    frame.locator("#bertlab-attention svg, #bertlab-attention canvas").first.wait_for()
    viewer.locator("iframe.attention").scroll_into_view_if_needed()
    viewer.wait_for_timeout(300)
    for d in screenshot_dirs:
        viewer.screenshot(path=str(d / "lab-record.png"), full_page=True)
    context.close()
    assert not asked and not viewer_errors, (asked, viewer_errors)
