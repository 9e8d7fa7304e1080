"""The Family tab in headless Chromium: the offline default and a tiny RoBERTa
(written here by transformers, loaded through the picker as a student would) side by side: both
tokenizers' rows, both models' guesses, the parameter chart, the objective cards; nothing leaves
127.0.0.1. Screenshot: $TMPDIR/bertlab-screenshots/tab-family-two-models.png."""

from __future__ import annotations

import pytest
from dashboard_page import CURRENT, PLOT, open_dashboard_offline, open_tab
from tiny_models import family_folder

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_family_tab_shows_two_models_side_by_side(dashboard_url, dashboard_page, tmp_path, screenshot_dirs):
    folder = family_folder(tmp_path, "roberta")
    page = dashboard_page
    seen = open_dashboard_offline(page, dashboard_url)
    refused, errors = seen.refused, seen.errors
    # The student loads a second model in the picker (every tab switches to it; the default stays listed).
    page.get_by_placeholder("hub name or local folder").fill(str(folder))
    page.get_by_role("button", name="Load", exact=True).click()
    page.wait_for_function("t => document.body.innerText.includes(t)", arg=f"Loaded {folder}")
    open_tab(page, "Family")
    page.wait_for_function(
        """sel => !document.querySelector(sel + ' .bertlab-busy')
                 && document.querySelectorAll(sel + ' .js-plotly-plot .main-svg').length >= 3""",
        arg=CURRENT,
    )
    page.wait_for_timeout(500)
    rows = page.evaluate(f"() => document.querySelector('{CURRENT} {PLOT}').data.map(t => t.y[0])")
    assert len(rows) == 2 and "byte-level BPE" in rows[0] and "WordPiece" in rows[1], rows
    guesses = page.evaluate(f"() => document.querySelectorAll('{CURRENT} {PLOT}')[1].data.map(t => t.x.length)")
    assert guesses == [5, 5]  # both models guess the same hidden word
    text = page.inner_text(CURRENT)
    assert "MLM, dynamic masking, no NSP" in text and "MLM + NSP" in text and "epoch 3" in text
    assert not page.eval_on_selector_all(f"{CURRENT} .bertlab-error", "els => els.map(e => e.textContent)")
    height = page.evaluate("() => document.querySelector('.bertlab-app').scrollHeight")
    page.set_viewport_size({"width": 1200, "height": min(max(1100, height + 400), 4000)})
    page.wait_for_timeout(300)
    for d in screenshot_dirs:
        page.screenshot(path=str(d / "tab-family-two-models.png"), full_page=True)
    assert not errors, errors
    assert not refused, refused
