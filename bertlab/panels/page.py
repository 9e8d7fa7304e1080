"""What a dashboard page tells its kernel: its address (`?projector=1`) and the width a figure has,
for the dashboard (bertlab.panels.app) and the teacher's page (bertlab.panels.teacher) alike."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anywidget
import ipywidgets as widgets
import traitlets

from bertlab.viz import theme

PROJECTOR_PARAM = "projector"  # ?projector=1 in the page's address starts in projector mode
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def projector_in_query(query: str) -> bool | None:
    """What `?projector=...` in a query string asks for (None: it does not say)."""
    values = parse_qs(query.lstrip("?"), keep_blank_values=True).get(PROJECTOR_PARAM)
    if not values:
        return None
    value = values[-1].strip().lower()
    return value in _YES or (value not in _NO)  # a bare ?projector means on


def follow_page(change: Mapping[str, Any], set_projector: Callable[[bool], None], redraw: Callable[[], None]) -> None:
    """Act on a PageAddress change (observed for "query" and "width"): an address that asks for projector
    mode on or off switches it (`set_projector`); in projector mode, a page resized by 40 px or more
    redraws (`redraw`) at its new width."""
    if change["name"] == "query":
        asked = projector_in_query(change["new"])
        if asked is not None and asked != theme.is_projector():
            set_projector(asked)
    elif change["name"] == "width" and change["new"] and theme.is_projector() \
            and abs(theme.current().page_width - change["new"]) >= 40:
        theme.use(True, page_width=change["new"])
        redraw()


def projector_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the page starts in projector mode: the page's `?projector=` (Voila gives a kernel
    that was not pre-heated the query string as QUERY_STRING) wins over `bertlab serve --projector`
    (BERTLAB_PROJECTOR). A pre-heated kernel hears the address from the page (see PageAddress)."""
    from bertlab.settings import projector

    env = os.environ if env is None else env
    asked = projector_in_query(env.get("QUERY_STRING", ""))
    return projector(env) if asked is None else asked


class PageAddress(anywidget.AnyWidget):
    """Tells the kernel about the page that shows it: its query string (`?projector=1`: a
    pre-heated Voila kernel ran the notebook before anyone asked for the page, so its environment
    cannot say) and the width a figure has in a tab (projector mode draws figures that wide)."""

    _esm = Path(theme.__file__).parent / "static" / "page_address.js"  # package data, beside the other views' code
    query = traitlets.Unicode("").tag(sync=True)
    width = traitlets.Int(0).tag(sync=True)  # px a figure may take in a tab (0: not told yet)


class ProjectorSwitch:
    """Projector mode for one page (the dashboard, the teacher's page): the toggle, the page's
    address and width (`PageAddress`), and the page's root widget whose CSS class follows the mode.
    `redraw` is called after every switch and when a projected page is resized."""

    def __init__(self, on: bool, redraw: Callable[[], None], **toggle_layout: str) -> None:
        self.redraw = redraw
        self.root: widgets.Widget | None = None  # the page's root (`attach`), whose class follows the mode
        self.toggle = widgets.ToggleButton(
            value=on, description="Projector mode", tooltip="Larger text and figures for a lecture hall "
            "(also: ?projector=1 in the address, or bertlab serve --projector)",
            layout=widgets.Layout(width="auto", **toggle_layout),
        )
        self.page = PageAddress()
        self.toggle.observe(lambda change: self.set(change["new"]), names="value")
        self.page.observe(lambda change: follow_page(change, self.set, self.redraw), names=["query", "width"])

    def attach(self, root: widgets.Widget) -> None:
        """Make `root` the page's root widget: the app's class, and projector mode's when the toggle is on
        (the page draws in the theme `theme.use` set before it was built: nothing is redrawn)."""
        self.root = root
        root.add_class(theme.ROOT_CLASS)
        if self.toggle.value:
            root.add_class(theme.PROJECTOR_CLASS)

    def set(self, on: bool) -> None:
        """Switch projector mode: widget text at once (CSS), then `redraw`."""
        on = bool(on)
        if self.toggle.value != on:
            self.toggle.value = on  # its observer comes back here
            return
        if theme.is_projector() == on:
            return
        theme.use(on, page_width=self.page.width or None)
        if self.root is not None:
            (self.root.add_class if on else self.root.remove_class)(theme.PROJECTOR_CLASS)
        self.redraw()
