"""Nothing clips on a small screen, at 150 % zoom, or in projector mode; every tab draws.

One `bertlab serve` (Voila) on loopback, three pages in headless Chromium, each opening every tab:

- 1024x768 CSS px, the normal page;
- 150 % browser zoom of a 1024x768 window: `device_scale_factor=1.5` on a 683x512 CSS-px viewport,
  which is what Chromium's zoom does to a page's layout (CSS px shrink, pixels per CSS px grow);
- projector mode at 1024x768, asked for with `?projector=1` in the address.

In each tab, no element whose overflow is hidden cuts its content (scrollWidth > clientWidth, or
the same in height), every tab title shows whole, and the tabs that draw at opening have drawn a
plotly figure. A figure wider than the tab scrolls in a box instead (a long token list). In
projector mode the text and figure fonts are x1.5, figures are as wide as the tab, and the intro
is folded away.

Screenshots of each tab in projector mode: $TMPDIR/bertlab-screenshots/projector-<tab>.png (and
docs/img with BERTLAB_UPDATE_SCREENSHOTS=1).
"""

from __future__ import annotations

import re

import pytest
from dashboard_page import CURRENT, PLOT, TAB, open_tab

from bertlab.panels.app import TABS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DRAWS_AT_OPEN = {"Input", "Mask", "Next sentence", "Attention", "Embeddings", "Ablation", "Pre-training"}
LONG_TEXT = " ".join(["The unbelievably clueless gamers played it again and again"] * 9)  # ~110 pieces

# Elements that hide overflow and whose content is cut: [description, scrollW, clientW, scrollH, clientH].
# Plotly's own inner layers clip by design (the plot area); the figure's element itself is checked.
CLIPPED_JS = """(sel) => {
  const root = document.querySelector(sel);
  const out = [];
  for (const el of [root, ...root.querySelectorAll('*')]) {
    if (el.closest('.js-plotly-plot') && !el.classList.contains('js-plotly-plot')) continue;
    if (el.closest('svg') || el.offsetParent === null) continue;
    const cs = getComputedStyle(el);
    const hides = (v) => v === 'hidden' || v === 'clip';
    const wide = hides(cs.overflowX) && el.scrollWidth > el.clientWidth + 1;
    const tall = hides(cs.overflowY) && el.scrollHeight > el.clientHeight + 1;
    if (wide || tall) {
      out.push([el.tagName + '.' + String(el.className).split(' ').slice(-2).join('.') + ' "' +
                (el.textContent || '').trim().slice(0, 30) + '"',
                el.scrollWidth, el.clientWidth, el.scrollHeight, el.clientHeight]);
    }
  }
  return out;
}"""

# Tab titles cut (by ellipsis or by the bar's edge): [title, label scrollWidth, clientWidth].
CUT_TITLES_JS = """(sel) => {
  const bar = document.querySelector('.bertlab-tabs > .lm-TabBar').getBoundingClientRect();
  return Array.from(document.querySelectorAll(sel)).flatMap(tab => {
    const label = tab.querySelector('.lm-TabBar-tabLabel');
    const r = tab.getBoundingClientRect();
    const cut = label.scrollWidth > label.clientWidth + 1 || r.right > bar.right + 1 || r.left < bar.left - 1;
    return cut ? [[tab.textContent.trim(), label.scrollWidth, label.clientWidth]] : [];
  });
}"""

LABEL_PX_JS = "() => parseFloat(getComputedStyle(document.querySelector('.widget-label')).fontSize)"
FIGURES_JS = """(sel) => Array.from(document.querySelectorAll(sel + ' .js-plotly-plot')).filter(d => d._fullLayout)
  .map(d => ({width: d._fullLayout.width, font: d._fullLayout.font.size, box: d.parentElement.clientWidth,
              drawn: d.querySelector('.main-svg') !== null}))"""


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _page(browser, url: str, width: int, height: int, scale: float = 1.0):
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale)
    page = context.new_page()
    page.set_default_timeout(120_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(TAB)
    page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", state="attached")
    return context, page, errors


def _open(page, title: str) -> None:
    open_tab(page, title)
    if title in DRAWS_AT_OPEN:
        page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", state="attached")
    page.wait_for_timeout(400)  # plotly lays out, the busy sign goes


def _settled(page) -> None:
    """Wait until the tab on show has no busy sign (a redraw after a switch or new text)."""
    page.wait_for_function("sel => !document.querySelector(sel + ' .bertlab-busy')", arg=CURRENT)
    page.wait_for_timeout(400)


def _check_every_tab(page, where: str, shots: list | None = None) -> dict[str, list[dict]]:
    """Open each tab; assert nothing clips and the drawing tabs drew. Returns the figures per tab."""
    figures: dict[str, list[dict]] = {}
    assert not page.evaluate(CUT_TITLES_JS, TAB), f"{where}: tab titles cut"
    for title, _ in TABS:
        _open(page, title)
        _settled(page)
        clipped = page.evaluate(CLIPPED_JS, CURRENT)
        assert not clipped, f"{where}, {title} tab: content cut by {clipped}"
        figures[title] = page.evaluate(FIGURES_JS, CURRENT)
        if title in DRAWS_AT_OPEN:
            assert figures[title] and all(f["drawn"] for f in figures[title]), f"{where}, {title}: no figure"
        shown = page.eval_on_selector_all(f"{CURRENT} .bertlab-error", "els => els.map(e => e.textContent)")
        assert not shown, f"{where}, {title}: {shown}"
        if shots is not None:
            height = page.evaluate("() => document.querySelector('.bertlab-app').scrollHeight")
            page.set_viewport_size({"width": 1024, "height": min(max(768, height + 60), 3000)})
            page.wait_for_timeout(300)
            for d in shots:
                page.locator(".bertlab-app").screenshot(path=str(d / f"projector-{_slug(title)}.png"))
            page.set_viewport_size({"width": 1024, "height": 768})
    assert not page.evaluate(CUT_TITLES_JS, TAB), f"{where}: tab titles cut"
    return figures


def test_nothing_clips_at_1024x768(dashboard_url, chromium_browser):
    context, page, errors = _page(chromium_browser, dashboard_url, 1024, 768)
    try:
        _check_every_tab(page, "1024x768")
        # bertviz's model view (~970 px wide) fits its frame: no head cut off
        _open(page, "Attention")
        page.locator(CURRENT).get_by_role("button", name="bertviz", exact=True).click()
        page.locator(CURRENT).get_by_role("button", name="model view", exact=True).click()
        frame = page.frame_locator(f"{CURRENT} iframe.bertlab-bertviz").last
        frame.locator("svg *").first.wait_for(state="attached")
        page.wait_for_timeout(500)
        fits = frame.locator("html").evaluate("r => [r.scrollWidth, r.clientWidth]")
        assert fits[0] <= fits[1] + 1, f"bertviz's model view is {fits[0]} px wide in a {fits[1]} px frame"
        assert not errors, errors
    finally:
        context.close()


def test_nothing_clips_at_150_percent_zoom_and_long_token_lists_scroll(dashboard_url, chromium_browser):
    context, page, errors = _page(chromium_browser, dashboard_url, 683, 512, scale=1.5)
    try:
        _check_every_tab(page, "150 % zoom")
        _open(page, "Input")
        box = page.locator(f"{CURRENT} .widget-textarea textarea").first
        box.fill(LONG_TEXT)
        page.locator(CURRENT).get_by_role("button", name="Show").click()
        page.wait_for_function(
            """sel => Array.from(document.querySelectorAll(sel + ' .js-plotly-plot'))
                   .some(d => d._fullLayout && d._fullLayout.width > 1200)""", arg=CURRENT)
        _settled(page)
        assert not page.evaluate(CLIPPED_JS, CURRENT), "the long input clips"
        # the piece table is wider than the tab: its box scrolls (headless Chromium hides scroll bars,
        # so scroll it and see it move)
        moved = page.evaluate("""sel => Array.from(document.querySelectorAll(sel + ' .js-plotly-plot'))
            .map(d => d.parentElement).filter(b => b.scrollWidth > b.clientWidth + 1)
            .map(b => { b.scrollLeft = 200; return [getComputedStyle(b).overflowX, b.scrollLeft]; })""", CURRENT)
        assert moved and all(o in ("auto", "scroll") and left > 0 for o, left in moved), moved
        assert not errors, errors
    finally:
        context.close()


def test_projector_mode_scales_everything_and_nothing_clips(dashboard_url, chromium_browser, screenshot_dirs):
    normal_context, normal, _ = _page(chromium_browser, dashboard_url, 1024, 768)
    normal_text = normal.evaluate(LABEL_PX_JS)
    normal_font = normal.evaluate(FIGURES_JS, CURRENT)[0]["font"]
    normal_context.close()

    context, page, errors = _page(chromium_browser, dashboard_url + "?projector=1", 1024, 768)
    try:
        page.wait_for_selector(".bertlab-app.bertlab-projector")
        _settled(page)
        assert page.locator(".jp-MarkdownCell").first.is_hidden(), "the intro is not folded away"
        assert page.get_by_role("button", name="Projector mode").get_attribute("class").count("mod-active")
        text = page.evaluate(LABEL_PX_JS)
        assert text >= 1.5 * normal_text - 0.5, (text, normal_text)
        figures = _check_every_tab(page, "projector", shots=screenshot_dirs)
        for title, figs in figures.items():
            for f in figs:
                assert f["font"] >= 1.5 * normal_font - 0.5, (title, f)
                assert f["width"] >= 0.9 * f["box"], (title, f)  # as wide as the tab (or wider, scrolling)
        assert not errors, errors
    finally:
        context.close()
