"""The whole dashboard: the model picker above one tab per panel.

Tabs are built the first time they are opened (the app is ready in about a second; each
tab computes only when a student looks at it), and every built tab follows the picker.
"""

from __future__ import annotations

import importlib
import logging

import ipywidgets as widgets

from bertlab.panels.base import Panel
from bertlab.panels.picker import ModelPicker
from bertlab.panels.state import ModelState

log = logging.getLogger(__name__)

# (tab title, "module:Class"). Each class is `Class(model, tok)` with `.widget`,
# `.set_model(model, tok)` and `.figures()`; see bertlab.panels.base.Panel.
TABS: tuple[tuple[str, str], ...] = (
    ("Input", "bertlab.panels.representation:RepresentationPanel"),
    ("Mask", "bertlab.panels.mask:MaskPanel"),
    ("Next sentence", "bertlab.panels.nsp:NSPPanel"),
    ("Attention", "bertlab.panels.attention:AttentionPanel"),
    ("Embeddings", "bertlab.panels.similarity:SimilarityPanel"),
    ("Ablation", "bertlab.panels.ablation:AblationPanel"),
    ("Pre-training", "bertlab.panels.pretrain:PretrainPanel"),
    ("Fine-tuning", "bertlab.panels.finetune:FinetunePanel"),
    ("Export", "bertlab.panels.export:ExportPanel"),
)


def panel_class(spec: str) -> type[Panel]:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


class App:
    """The picker, the tabs, and the wiring between them."""

    def __init__(self, state: ModelState, tabs: tuple[tuple[str, str], ...] = TABS, first: int = 1) -> None:
        self.state = state
        self.tabs_spec = tabs
        self.panels: dict[str, Panel] = {}
        self.picker = ModelPicker(state)
        self._slots = [
            widgets.VBox([widgets.HTML(f'<div style="color:#777;padding:1em">Opening {title}…</div>')])
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
        self.widget = widgets.VBox([self.picker.widget, self.tabs], layout=widgets.Layout(width="100%"))

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
                f'<div class="bertlab-note bertlab-error" style="color:#6b0b0b;background:#fdecec;'
                f'padding:6px 10px">The {title} tab could not open ({type(e).__name__}: {e}).</div>'
            )]
            return None
        self.panels[title] = panel
        self._slots[index].children = [panel.widget]
        return panel

    def _build(self, spec: str) -> Panel:
        cls = panel_class(spec)
        if spec.endswith(":ExportPanel"):
            panel = cls(self.state.model, self.state.tok, figures=self.figures)
        else:
            panel = cls(self.state.model, self.state.tok)
        panel.model_made = self._model_made
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
        # Only the tab on show redraws now; the others when next opened. A plotly figure that a
        # hidden tab creates may fail to start in the browser, and there is no need to pay for
        # redrawing tabs nobody looks at.
        self._stale = set(self.panels)
        self._catch_up(self.tabs_spec[self.tabs.selected_index][0])

    def _catch_up(self, title: str) -> None:
        panel = self.panels.get(title)
        if panel is None or title not in self._stale:
            return
        self._stale.discard(title)
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


def build_app(source: str | None = None, tabs: tuple[tuple[str, str], ...] = TABS,
              first: int = 1) -> App:
    """Load `source` (None = offline default) and build the dashboard."""
    from bertlab.loading import load
    from bertlab.panels.state import DEFAULT_NAME

    model, tok = load(source)
    state = ModelState(model, tok, name=source or DEFAULT_NAME, source=source)
    return App(state, tabs=tabs, first=first)
