"""Everything fits at 1024x768, at 150 % zoom and in projector mode: measured in headless Chromium.

One `bertlab serve` (Voila) on loopback and four pages, each opening every tab (and every section of
a tab that has its own: Embeddings, What it knows; and the Mask tab's "Does attention explain it?"):

- 1024x768 and 1280x800 CSS px, the normal page;
- a 1280x800 window at 150 % zoom: `device_scale_factor=1.5` on a 853x533 CSS-px viewport (what
  Chromium's zoom does to a page's layout);
- projector mode (`?projector=1`) at 1024x768.

In each tab, measured facts (every problem of a page is collected, then reported together):

- the page is no wider than the window (document.scrollWidth <= innerWidth), and no element reaches
  past the window's right edge unless a box that scrolls holds it;
- the tab bar is one row (every tab shares one offsetTop), and the picker's Load button sits on its
  text field's row;
- no text is cut: a label, help line or note is as wide as its content (scrollWidth <= clientWidth)
  and starts inside its tab (no first letters cut at the left edge);
- a row of toggle buttons keeps its description beside it (not on a line of its own above);
- a drop-down is wide enough for its longest option (measured in its own font, with room for the arrow);
- a figure's legend and its point labels stay inside the figure (a legend also inside the box that
  scrolls a wide figure), no legend entry on the figure's title, point labels of a 2-D map do not
  sit on each other, and no axis shows the same tick label twice in a row or a "μ" unit;
- table headers have room between them (padding on both sides).

Screenshots of every tab of every page: /tmp/layout-shots/<page>-<tab>.png (the problems found:
/tmp/layout-shots/problems.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dashboard_page import CURRENT, PLOT, TAB, open_tab

from bertlab.panels.app import TABS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path("/tmp/layout-shots")
DRAWS_AT_OPEN = {"Input", "Mask", "Next sentence", "Attention", "Embeddings", "Ablation", "Pre-training"}
PAGES = {  # name -> (CSS width, CSS height, device scale, address suffix)
    "1024x768": (1024, 768, 1.0, ""),
    "1280x800": (1280, 800, 1.0, ""),
    "zoom150": (853, 533, 1.5, ""),
    "projector": (1024, 768, 1.0, "?projector=1"),
}

# Problems of the page as a whole: the page wider than the window, the tab bar on two rows, Load off its row.
PAGE_JS = """() => {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth + 1)
    out.push(`page ${doc.scrollWidth} px wide in a ${window.innerWidth} px window`);
  const tabs = Array.from(document.querySelectorAll('.bertlab-tabs > .lm-TabBar .lm-TabBar-tab'))
    .map(t => t.getBoundingClientRect());
  const first = Math.min(...tabs.map(r => r.top));
  const below = tabs.filter(r => r.top > first + r.height / 2).length;  // the current tab stands a pixel higher
  if (below) out.push(`tab bar on two rows: ${below} of ${tabs.length} tabs below the first row`);
  const load = Array.from(document.querySelectorAll('.bertlab-app button')).find(b => b.textContent.trim() === 'Load');
  const field = document.querySelector('.bertlab-app input[placeholder]');
  if (load && field) {
    const a = load.getBoundingClientRect(), b = field.getBoundingClientRect();
    if (a.top >= b.bottom - 1) out.push('the Load button sits on its own line below its text field');
  }
  return out;
}"""

# Problems inside the tab on show.
TAB_JS = """(sel) => {
  const root = document.querySelector(sel);
  const out = [];
  const name = (el) => (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 40);
  const shown = (el) => el.offsetParent !== null || (el.getClientRects && el.getClientRects().length > 0);
  const scrolls = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const cs = getComputedStyle(p);
      if (['auto', 'scroll'].includes(cs.overflowX)) return true;
    }
    return false;
  };
  const left = root.getBoundingClientRect().left;
  const canvas = document.createElement('canvas').getContext('2d');
  // elements past the window's right edge, outside any scrolling box
  for (const el of root.querySelectorAll('*')) {
    if (el.closest('svg') || !shown(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > window.innerWidth + 1 && !scrolls(el)) {
      out.push(`${el.tagName.toLowerCase()} "${name(el)}" reaches ${Math.round(r.right)} px ` +
               `in a ${window.innerWidth} px window`);
      break;  // its children would repeat it
    }
  }
  // text cut: labels, help lines and notes
  for (const el of root.querySelectorAll('.widget-html-content, .widget-label, label, .widget-html-content > *')) {
    if (!shown(el) || el.closest('.js-plotly-plot')) continue;
    const text = name(el);
    if (!text) continue;
    const r = el.getBoundingClientRect();
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'auto')
      out.push(`text cut (${el.scrollWidth} px in ${el.clientWidth} px): "${text}"`);
    if (r.width > 0 && r.left < left - 1 && !scrolls(el))
      out.push(`text starts ${Math.round(left - r.left)} px left of the tab: "${text}"`);
  }
  // drop-downs as wide as their longest option
  for (const s of root.querySelectorAll('select')) {
    if (!shown(s) || s.multiple || s.size > 1) continue;
    const cs = getComputedStyle(s);
    canvas.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const longest = Math.max(0, ...Array.from(s.options).map(o => canvas.measureText(o.text).width));
    const room = s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    if (longest > room + 1) {
      const wide = (o) => canvas.measureText(o.text).width;
      const opt = Array.from(s.options).reduce((a, o) => wide(o) > wide(a) ? o : a);
      out.push(`drop-down ${s.clientWidth} px wide cuts its option "${opt.text.slice(0, 40)}" ` +
               `(${Math.ceil(longest)} px of text, ${Math.floor(room)} px of room)`);
    }
  }
  // a row of toggle buttons with its description on a line of its own above them
  for (const group of root.querySelectorAll('.widget-toggle-buttons')) {
    const label = group.querySelector(':scope > .widget-label');
    const button = group.querySelector('.widget-toggle-button');
    if (!shown(group) || !label || !name(label) || !shown(label) || !button) continue;
    if (label.getBoundingClientRect().bottom <= button.getBoundingClientRect().top + 1)
      out.push(`"${name(label)}" sits on a line of its own above its buttons`);
  }
  // table headers with no room between them
  for (const th of root.querySelectorAll('th')) {
    if (!shown(th)) continue;
    const cs = getComputedStyle(th);
    if (parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) < 6)
      out.push(`table header "${name(th)}" has no room beside it (padding ${cs.paddingLeft} + ${cs.paddingRight})`);
  }
  // figures: legend and point labels inside; point labels apart; axis ticks readable
  for (const plot of root.querySelectorAll('.js-plotly-plot')) {
    if (!shown(plot) || !plot._fullLayout) continue;
    const title = (plot._fullLayout.title && plot._fullLayout.title.text || '').slice(0, 40);
    const box = plot.querySelector('.main-svg').getBoundingClientRect();
    const view = plot.parentElement.getBoundingClientRect();  // a figure wider than its tab scrolls in this box
    const heading = plot.querySelector('.gtitle');
    const top = heading && heading.textContent.trim() ? heading.getBoundingClientRect() : null;
    for (const entry of plot.querySelectorAll('.legend .traces')) {
      const r = entry.getBoundingClientRect();
      const right = Math.min(box.right, view.right);
      if (r.width > 0 && (r.right > right + 1 || r.bottom > box.bottom + 1 || r.left < box.left - 1))
        out.push(`figure "${title}": legend entry "${name(entry)}" cut by the edge of the figure or its box`);
      if (top && r.width > 0 && Math.min(r.right, top.right) - Math.max(r.left, top.left) > 2
          && Math.min(r.bottom, top.bottom) - Math.max(r.top, top.top) > 2)
        out.push(`figure "${title}": legend entry "${name(entry)}" drawn on the figure's title`);
    }
    const points = Array.from(plot.querySelectorAll('.scatterlayer .textpoint text')).filter(t => t.textContent.trim())
      .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
    for (const [t, r] of points)
      if (r.right > box.right + 1 || r.left < box.left - 1)
        out.push(`figure "${title}": point label "${t}" cut by the figure's edge`);
    let overlaps = [];
    for (let i = 0; i < points.length; i++) for (let j = i + 1; j < points.length; j++) {
      const [a, ra] = points[i], [b, rb] = points[j];
      const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
      const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
      if (w > 2 && h > 2) overlaps.push(`${a}/${b}`);
    }
    if (overlaps.length)
      out.push(`figure "${title}": point labels on top of each other: ${overlaps.slice(0, 6).join(', ')}`);
    for (const axis of plot.querySelectorAll('.xaxislayer-above, .yaxislayer-above')) {
      const ticks = Array.from(axis.querySelectorAll('.xtick text, .ytick text')).map(t => t.textContent);
      if (ticks.some(t => t.includes('μ'))) out.push(`figure "${title}": an axis in μ units: ${ticks.join(' ')}`);
      const numeric = ticks.filter(t => /^[-−]?[0-9][0-9.,]*\\s?%?$/.test(t));
      if (numeric.length > 1 && new Set(numeric).size < numeric.length)
        out.push(`figure "${title}": the same tick twice: ${ticks.join(' ')}`);
    }
  }
  return out;
}"""


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _open(page, title: str) -> None:
    open_tab(page, title)
    if title in DRAWS_AT_OPEN:
        page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", state="attached")
    page.wait_for_function("sel => !document.querySelector(sel + ' .bertlab-busy')", arg=CURRENT)
    page.wait_for_timeout(500)  # plotly lays out


def _open_explain(page) -> None:
    """Open "Does attention explain it?" in the tab on show and wait for its figure."""
    page.locator(f"{CURRENT} .bertlab-explain").get_by_role("button", name="Does attention explain it?").click()
    page.wait_for_function(
        """sel => Array.from(document.querySelectorAll(sel + ' .gtitle'))
               .some(t => t.textContent.startsWith('Does attention explain'))""",
        arg=f"{CURRENT} .bertlab-explain {PLOT}")
    page.wait_for_timeout(500)


def _screenshot(page, path: Path, width: int, height: int) -> None:
    """The whole app (the window made as tall as it, then back)."""
    tall = page.evaluate("() => document.querySelector('.bertlab-app').scrollHeight")
    page.set_viewport_size({"width": width, "height": min(max(height, tall + 60), 4000)})
    page.wait_for_timeout(300)
    page.locator(".bertlab-app").screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_timeout(200)


def _measure(browser, url: str, name: str) -> list[str]:
    """Open every tab of the page `name` (see PAGES); the problems found, each "<tab>: <problem>"."""
    width, height, scale, suffix = PAGES[name]
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale)
    page = context.new_page()
    page.set_default_timeout(120_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    problems: list[str] = []
    try:
        page.goto(url + suffix, wait_until="domcontentloaded")
        page.wait_for_selector(TAB)
        page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", state="attached")
        if suffix:
            page.wait_for_selector(".bertlab-app.bertlab-projector")
        problems += [f"page: {p}" for p in page.evaluate(PAGE_JS)]
        for title, _ in TABS:
            _open(page, title)
            problems += [f"{title}: {p}" for p in page.evaluate(TAB_JS, CURRENT)]
            _screenshot(page, SHOTS / f"{name}-{_slug(title)}.png", width, height)
            if title == "Mask":  # its "Does attention explain it?" (drop-downs of layers and heads)
                _open_explain(page)
                problems += [f"{title} › explain: {p}" for p in page.evaluate(TAB_JS, CURRENT)]
                _screenshot(page, SHOTS / f"{name}-mask-explain.png", width, height)
            sections = page.locator(f"{CURRENT} .lm-TabBar .lm-TabBar-tab")  # a tab's own sections
            for i in range(1, sections.count()):
                section = sections.nth(i).inner_text().strip()
                sections.nth(i).click()
                page.wait_for_timeout(1000)
                page.wait_for_function("sel => !document.querySelector(sel + ' .bertlab-busy')", arg=CURRENT)
                page.wait_for_timeout(800)  # plotly lays out
                problems += [f"{title} › {section}: {p}" for p in page.evaluate(TAB_JS, CURRENT)]
                _screenshot(page, SHOTS / f"{name}-{_slug(title)}-{_slug(section)}.png", width, height)
        problems += [f"page error: {e}" for e in errors]
    finally:
        context.close()
    return problems


@pytest.fixture(scope="module")
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@pytest.mark.parametrize("name", list(PAGES))
def test_every_tab_fits(name, dashboard_url, chromium_browser, shots):
    problems = _measure(chromium_browser, dashboard_url, name)
    record = shots / "problems.json"
    found = json.loads(record.read_text()) if record.exists() else {}
    found[name] = problems
    record.write_text(json.dumps(found, indent=1, ensure_ascii=False))
    assert not problems, f"{name}: {len(problems)} layout problems:\n" + "\n".join(problems)


MODERNBERT_TEXT = "The quick brown fox jumps over the lazy dog near the river bank today."
BAND_JS = """sel => {
  const plot = document.querySelector(sel + ' .js-plotly-plot');
  return {title: plot._fullLayout.title.text, ticks: plot._fullLayout.xaxis.ticktext,
          band: plot.querySelectorAll('.shapelayer path').length,
          note: Array.from(plot.querySelectorAll('.annotation-text')).map(a => a.textContent).join(' ')};
}"""


def test_the_attention_tab_draws_a_modernbert_band_and_readable_pieces(dashboard_url, chromium_browser, shots,
                                                                       tmp_path):
    """A tiny random ModernBERT (written by transformers; local_attention 4) loaded in the picker: the
    Attention heatmap's ticks read "␣the", not "Ġthe"; a local layer outlines its ±2 band and says so, a
    global layer says it sees every token. Screenshot: /tmp/layout-shots/attention-modernbert-band.png."""
    from test_family_modernbert import modernbert_tokenizer, write_checkpoint

    folder = write_checkpoint(tmp_path / "modernbert", "ModernBertForMaskedLM", modernbert_tokenizer())
    context = chromium_browser.new_context(viewport={"width": 1024, "height": 768})
    page = context.new_page()
    page.set_default_timeout(120_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(dashboard_url, wait_until="domcontentloaded")
        page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", state="attached")
        page.get_by_placeholder("hub name or local folder").fill(str(folder))
        page.get_by_role("button", name="Load", exact=True).click()
        page.wait_for_function("t => document.body.innerText.includes(t)", arg=f"Loaded {folder}")
        _open(page, "Attention")
        ticks = "sel => JSON.stringify(document.querySelector(sel + ' .js-plotly-plot')._fullLayout.xaxis.ticktext)"
        before = page.evaluate(ticks, CURRENT)
        page.locator(f"{CURRENT} .widget-textarea textarea").first.fill(MODERNBERT_TEXT)
        page.locator(CURRENT).get_by_role("button", name="Show").click()
        page.wait_for_function(f"([sel, old]) => ({ticks})(sel) !== old", arg=[CURRENT, before])
        idle = "sel => !document.querySelector(sel + ' .bertlab-busy')"
        page.wait_for_function(idle, arg=CURRENT)
        page.wait_for_timeout(500)
        first = page.evaluate(BAND_JS, CURRENT)
        assert first["title"].startswith("Layer 0") and first["band"] == 0, first
        assert "global layer: every token sees every token" in first["note"], first
        assert any(t.startswith("␣") for t in first["ticks"]) and not any("Ġ" in t for t in first["ticks"]), first
        handle = page.locator(f"{CURRENT} .widget-slider .noUi-handle").first  # the Layer slider
        handle.focus()
        handle.press("ArrowRight")
        page.wait_for_function("sel => document.querySelector(sel + ' .js-plotly-plot')._fullLayout.title.text"
                               ".startsWith('Layer 1')", arg=CURRENT)
        page.wait_for_timeout(500)
        local = page.evaluate(BAND_JS, CURRENT)
        assert local["band"] == 1 and "local layer: each token sees ±2 tokens" in local["note"], local
        problems = page.evaluate(TAB_JS, CURRENT)
        assert not problems, problems
        _screenshot(page, shots / "attention-modernbert-band.png", 1024, 768)
        assert not errors, errors
    finally:
        context.close()
