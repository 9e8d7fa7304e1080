"""The whole dashboard: the model picker above one tab per panel.

Tabs are built the first time they are opened (the app is ready in about a second; each
tab computes only when a student looks at it), and every built tab follows the picker.

Projector mode (a toggle beside the picker, `?projector=1` in the page's address, or
`bertlab serve --projector`) draws everything larger for a lecture hall: see bertlab.viz.theme.
"""

from __future__ import annotations

import importlib
import logging

import ipywidgets as widgets

from bertlab.panels.base import Panel, busy_html, note_html
from bertlab.panels.page import (  # noqa: F401 (PROJECTOR_PARAM, projector_requested: imported from here too)
    PROJECTOR_PARAM,
    ProjectorSwitch,
    projector_in_query,
    projector_requested,
)
from bertlab.panels.picker import ModelPicker
from bertlab.panels.state import ModelState
from bertlab.runtime import cap_threads  # noqa: F401 (moved down: the teacher view uses it too)
from bertlab.viz import theme
from bertlab.viz.theme import MUTED

log = logging.getLogger(__name__)

# The page's header: one line, so that at 1024x768 a tab's results show without scrolling.
HEADER = (f'<div><b style="font-size:1.3em">bertlab</b> <span style="{MUTED}">· look inside a BERT model, one tab '
          'at a time; the model picker below is shared by every tab.</span></div>')

# (tab title, "module:Class"). Each class is `Class(model, tok)` with `.widget`,
# `.set_model(model, tok)` and `.figures()`; see bertlab.panels.base.Panel.
TABS: tuple[tuple[str, str], ...] = (
    ("Input", "bertlab.panels.representation:RepresentationPanel"),
    ("Mask", "bertlab.panels.mask:MaskPanel"),
    ("Next sentence", "bertlab.panels.nsp:NSPPanel"),
    ("Attention", "bertlab.panels.attention:AttentionPanel"),
    ("Embeddings", "bertlab.panels.similarity:SimilarityPanel"),
    ("What it knows", "bertlab.panels.knows:KnowsPanel"),
    ("Ablation", "bertlab.panels.ablation:AblationPanel"),
    ("Family", "bertlab.panels.family:FamilyPanel"),
    ("Pre-training", "bertlab.panels.pretrain:PretrainPanel"),
    ("Fine-tuning", "bertlab.panels.finetune:FinetunePanel"),
    ("Compression", "bertlab.panels.compress:CompressPanel"),
    ("Export", "bertlab.panels.export:ExportPanel"),
)


def panel_class(spec: str) -> type[Panel]:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


class App:
    """The picker, the tabs, and the wiring between them."""

    def __init__(self, state: ModelState, tabs: tuple[tuple[str, str], ...] = TABS, first: int = 1,
                 projector: bool = False) -> None:
        theme.use(projector)  # before the first tab draws
        self.state = state
        self.tabs_spec = tabs
        self.panels: dict[str, Panel] = {}
        self.picker = ModelPicker(state)
        self._slots = [  # a tab is built when first opened (up to seconds): a busy sign meanwhile
            widgets.VBox([widgets.HTML(f'<div style="padding:1em">{busy_html(f"Opening {title}…")}</div>')])
            for title, _ in tabs
        ]
        self.tabs = widgets.Tab(children=self._slots, titles=[title for title, _ in tabs])
        self.tabs.add_class("bertlab-tabs")  # for the browser tests: nested tabs inside a panel differ
        self.tabs.selected_index = first
        self.open(first)
        self.tabs.observe(self._on_tab, names="selected_index")
        self._shown = state.model  # the model the picker shows
        self._stale: set[str] = set()  # built tabs still showing an earlier model
        state.observe(self._on_model)
        self.switch = ProjectorSwitch(projector, self._redraw, flex="0 0 auto", margin="0 0 0 8px")
        self.projector, self.page = self.switch.toggle, self.switch.page
        style = widgets.HTML(theme.css([title for title, _ in tabs]), layout=widgets.Layout(display="none"))
        self.header = widgets.HTML(HEADER, layout=widgets.Layout(flex="1 1 0%", width="auto", min_width="0"))
        top = widgets.HBox([self.header, self.projector], layout=widgets.Layout(width="100%", align_items="center"))
        self.widget = widgets.VBox([style, self.page, top, self.picker.widget, self.tabs],
                                   layout=widgets.Layout(width="100%"))
        self.switch.attach(self.widget)

    # -- projector mode ---------------------------------------------------------------------
    def set_projector(self, on: bool) -> None:
        """Switch projector mode: widget text at once (CSS), the tab on show redrawn now and the
        other built tabs when next opened (training curves at their next update)."""
        self.switch.set(on)

    def _redraw(self) -> None:
        """The theme or the model changed: the tab on show redraws now, the other built tabs when next opened
        (a plotly figure that a hidden tab creates may fail to start in the browser, and there is no need to
        pay for redrawing tabs nobody looks at)."""
        self._stale = set(self.panels)
        self._catch_up(self.tabs_spec[self.tabs.selected_index][0])

    # -- tabs -------------------------------------------------------------------------------
    def open(self, index: int) -> Panel | None:
        """Build tab `index` if it is not built yet; returns its panel (None if it failed)."""
        title, spec = self.tabs_spec[index]
        if title in self.panels:
            return self.panels[title]
        try:
            panel = self._build(spec)
        except Exception as e:  # one broken tab must not take the app down
            log.exception("building the %s tab failed", title)
            self._slots[index].children = [widgets.HTML(
                note_html("error", f"The {title} tab could not open ({type(e).__name__}: {e}).")
            )]
            return None
        self.panels[title] = panel
        self._slots[index].children = [panel.widget]
        return panel

    def _build(self, spec: str) -> Panel:
        cls = panel_class(spec)
        if spec.endswith(":ExportPanel"):
            panel = cls(self.state.model, self.state.tok, figures=self.figures, session=self.session)
        elif getattr(cls, "uses_state", False):  # tabs that list the picker's models (Family)
            panel = cls(self.state.model, self.state.tok, state=self.state)
        else:
            panel = cls(self.state.model, self.state.tok)
        panel.model_made = self._model_made
        panel.model_name = self.state.name
        return panel

    def _on_tab(self, change) -> None:
        if change["new"] is None:
            return
        panel = self.open(change["new"])
        self._catch_up(self.tabs_spec[change["new"]][0])
        if panel is not None and hasattr(panel, "refresh"):  # e.g. Export: list what the other tabs show now
            with panel.reporting():
                panel.refresh()

    # -- wiring -----------------------------------------------------------------------------
    def _on_model(self, state: ModelState) -> None:
        if state.model is self._shown:  # a model was only added to the list
            return
        self._shown = state.model
        self._redraw()

    def _catch_up(self, title: str) -> None:
        panel = self.panels.get(title)
        if panel is None or title not in self._stale:
            return
        self._stale.discard(title)
        panel.model_name = self.state.name
        try:
            panel.set_model(self.state.model, self.state.tok)
        except Exception as e:
            log.exception("%s tab could not switch model", title)
            panel.show_message(f"Could not show this model here ({type(e).__name__}: {e}).", "error")

    def _model_made(self, name: str, model, tok) -> None:
        self.state.add(name, model, tok)
        self.picker.show_message(f"{name} joined the model list: pick it to explore it in every tab.")

    def figures(self) -> dict[str, object]:
        """Every figure on show in the built tabs, as "Tab: name" -> plotly figure."""
        out: dict[str, object] = {}
        for title, panel in self.panels.items():
            if title == "Export":
                continue
            for name, fig in panel.figures().items():
                out[f"{title}: {name}"] = fig
        return out

    def session(self) -> tuple[str, dict[str, Panel]]:
        """The picked model's name and the built tabs, in tab order (the Export tab's lab record reads them)."""
        order = [title for title, _ in self.tabs_spec]
        return self.state.name, dict(sorted(self.panels.items(), key=lambda kv: order.index(kv[0])))




def build_app(source: str | None = None, tabs: tuple[tuple[str, str], ...] = TABS,
              first: int = 1, projector: bool | None = None) -> App:
    """Load `source` (None = offline default) and build the dashboard (torch capped to
    `BERTLAB_THREADS` first); `projector` None: as the page or `bertlab serve` asks
    (see `projector_requested`)."""
    from bertlab.loading import load
    from bertlab.panels.state import DEFAULT_NAME

    cap_threads()
    model, tok = load(source)
    state = ModelState(model, tok, name=source or DEFAULT_NAME, source=source)
    return App(state, tabs=tabs, first=first,
               projector=projector_requested() if projector is None else projector)
