"""Where things are on the dashboard page, and how a test opens a tab, for the browser tests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlparse

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


@dataclass
class Offline:
    """What a page loaded with the network cut off asked for: loopback URLs it loaded, other URLs refused,
    and its uncaught errors."""

    loaded: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def open_dashboard_offline(page, url: str) -> Offline:
    """Open the dashboard at `url` with every request beyond 127.0.0.1 refused (and recorded); returns once
    the tab bar shows and the first tab has drawn."""
    seen = Offline()

    def route(r):
        if urlparse(r.request.url).hostname in ("127.0.0.1", "localhost"):
            seen.loaded.append(r.request.url)
            r.continue_()
        else:
            seen.refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: seen.errors.append(str(e)))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(TAB)
    page.wait_for_selector(f"{CURRENT} {PLOT}")  # the first tab drew
    return seen
