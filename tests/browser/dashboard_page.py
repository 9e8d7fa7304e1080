"""Where things are on the dashboard page, and how a test opens a tab, for the browser tests."""

from __future__ import annotations

import re

TAB = ".bertlab-tabs > .lm-TabBar .lm-TabBar-tab"
CURRENT = ".bertlab-tabs > .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)"  # the tab on show
PLOT = ".js-plotly-plot"


def open_tab(page, title: str) -> None:
    """Click the tab `title` and wait until it is on show and built (no "Opening <title>…" left)."""
    page.locator(TAB, has_text=re.compile(f"^{re.escape(title)}$")).first.click()
    page.wait_for_function(
        """([tabs, current, title]) => {
            const tab = document.querySelector(tabs + '.lm-mod-current');
            const panel = document.querySelector(current);
            return tab && tab.textContent.trim() === title && panel && !panel.textContent.includes('Opening ' + title);
        }""",
        arg=[TAB, CURRENT, title],
    )
