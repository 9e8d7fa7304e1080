"""Attention tab: type a sentence (or a pair), pick a layer and a head, see who attends to whom.

Five views of the same patterns, one on show at a time: the heatmap of one head, bertlab's own
head view (lines between tokens) and model view (layers x heads thumbnails), raw attention beside
rollout, and bertviz's own views fed offline; a sixth, Masks, draws six attention masks on the same
text (bertlab.panels.masks). The model runs once per text; a view is drawn when it is on show and
only if it is out of date.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attention import AttentionResult, attention_patterns
from bertlab.analysis.rollout import RolloutResult, rollout_from_attention
from bertlab.panels.base import Level, Panel, run_button, sentence_pair
from bertlab.panels.masks import MasksPanel
from bertlab.panels.views import CountSliders, Hold, on_input
from bertlab.tokenizer import Tokenizer
from bertlab.viz.attention import (
    attention_notes,
    empty_heatmap,
    heatmap_marks,
    heatmap_title,
    heatmap_z,
    plot_attention_heatmap,
    view_help,
)
from bertlab.viz.attention_view import AttentionView
from bertlab.viz.figure_widget import SyncedFigureWidget, redraw
from bertlab.viz.rollout import plot_rollout, rollout_titles, rollout_z
from bertlab.viz.theme import FAINT

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired."
MAX_TOKENS = 128  # beyond this a heatmap cell is smaller than a pixel pair; cut with a note
VIEWS = ("Heatmap", "Head view", "Model view", "Rollout", "bertviz", "Masks")
BERTVIZ_KINDS = ("head view", "model view")
BERTVIZ_MODEL_VIEW_TOKENS = 48  # above this bertviz's model view draws so many lines the browser crawls
# The panel's sliders each view uses: one set of controls on the page. The head view takes the Layer slider
# (its own view buttons and layer drop-down are off; its head chips pick the heads), the model view shows every
# layer and head, bertviz has its own controls inside its page, and rollout mixes every head.
SLIDERS = {"Heatmap": ("layer", "head"), "Head view": ("layer",), "Model view": (), "Rollout": ("layer",),
           "bertviz": (), "Masks": ()}  # the Masks view has its own layer and head


class AttentionPanel(Panel):
    """Who attends to whom: one head's heatmap, head and model views, rollout, bertviz."""

    title = "Attention"
    teaches = (
        "Each head of each layer spreads every token's attention over the others; "
        "rollout follows that flow down to the input words."
    )

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Tokenizer,
        text: str = DEFAULT_TEXT,
        text_b: str = "",
        max_length: int = MAX_TOKENS,
    ) -> None:
        super().__init__()
        self.model, self.tok, self.max_length = model, tok, max_length
        self.text_a, self.text_b = sentence_pair(text, text_b)
        self.show_button = run_button()
        self.sliders = CountSliders(model)
        self.layer, self.head = self.sliders("layer", "Layer"), self.sliders("head", "Head")
        self.view = widgets.ToggleButtons(
            options=VIEWS, value="Heatmap", description="View",
            tooltips=["One head as a grid", "Lines between tokens", "All layers × heads",
                      "Raw attention beside rollout", "bertviz's own views (offline)",
                      "Six attention masks (BERT, GPT, UniLM, Longformer, Reformer, Transformer-XL)"],
            style=widgets.ToggleButtonsStyle(button_width="auto"),
        )
        self.bertviz_kind = widgets.ToggleButtons(
            options=BERTVIZ_KINDS, value="head view", style=widgets.ToggleButtonsStyle(button_width="auto")
        )

        # What each view shows now: view name -> (result version, layer, head, ...); see `_key`.
        self._version = 0
        self._drawn: dict[str, tuple] = {}
        self.hold = Hold()  # set while the panel itself moves the sliders
        self._rollout: tuple[int, RolloutResult] | None = None  # (version, rollout) cache

        # The widget is built from a full figure: what plotly changes before the browser
        # shows it is not sent, so a widget filled after creation would show up empty.
        self.result = self._compute()
        self.figure = SyncedFigureWidget(
            plot_attention_heatmap(self.result, 0, 0) if self.result else empty_heatmap()
        )
        if self.result is not None:
            self._drawn["Heatmap"] = self._key("Heatmap")
        # The heavier views are made the first time they are chosen, then reused.
        self.attention_view: AttentionView | None = None
        self.rollout_figure: go.FigureWidget | None = None
        self.masks: MasksPanel | None = None
        self.bertviz_frame = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.bertviz_box = widgets.VBox([self.bertviz_kind, self.bertviz_frame], layout=widgets.Layout(width="100%"))
        self.placeholder = widgets.HTML(f'<div style="{FAINT};padding:1em">Type a sentence and press Show.</div>')
        self.stage = widgets.VBox([self.figure], layout=widgets.Layout(width="100%", overflow="auto"))
        self.help = widgets.HTML(view_help("Heatmap"))

        on_input(self._on_text, self.text_a, self.text_b, self.show_button)
        on_input(self._on_head, self.layer, self.head)
        on_input(self._on_view, self.view, self.bertviz_kind)
        self._widget = widgets.VBox(
            [
                self.text_a,
                widgets.HBox([self.text_b, self.show_button]),
                widgets.HBox([self.layer, self.head]),
                self.view,
                self.message,
                self.stage,
                self.help,
            ],
            layout=widgets.Layout(width="100%"),
        )

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_text(self, _=None) -> None:
        with self.busy(self.show_button):
            self.update()

    def _on_head(self, _=None) -> None:
        if self.hold:
            return
        with self.reporting():
            self._sync(self.view.value)

    def _on_view(self, _=None) -> None:
        view = self.view.value
        text = "Drawing bertviz's view…" if view == "bertviz" else f"Drawing the {view.lower()}…"
        with self.busy(self.show_button, self.view, self.bertviz_kind, text=text), self.reporting():
            self._show_view()

    def _on_view_widget(self, change: dict) -> None:
        """The student used the controls inside the head/model view: the sliders follow."""
        if self.hold:
            return
        with self.reporting():
            if change["name"] == "layer":
                self.layer.value = change["new"]
            elif change["name"] == "heads" and len(change["new"]) == 1:
                self.head.value = change["new"][0]
            elif change["name"] == "view":
                self.view.value = "Model view" if change["new"] == "model" else "Head view"

    def update(self) -> None:
        """Run the model on the current text (only if it changed) and redraw; on bad input the old
        picture goes too (the message says why), so it never sits under a new message."""
        if self.result is not None and (self.result.text_a, self.result.text_b) == self._inputs():
            return
        self._set_result(self._compute())

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Show the same text through another model; the sliders take its layer and head counts."""
        self.model, self.tok = model, tok
        with self.hold():
            self.sliders.fit(model)
        if self.masks is not None:
            self.masks.set_model(model, tok, redraw=False)  # redrawn with the new result (`_key` changes)
        self._set_result(self._compute())

    def figures(self) -> dict[str, go.Figure]:
        """The heatmap of the chosen head and the rollout of the chosen layer (none before a result)."""
        if self.result is None:
            return {}
        with self.reporting():
            self._sync("Heatmap")
            rollout = plot_rollout(self._rollout_result(), self.layer.value)
            masks = self.masks.figures() if self.masks is not None and self._drawn.get("Masks") == self._key(
                "Masks") else {}
            return {"heatmap": go.Figure(self.figure), "rollout": rollout, **masks}
        return {}

    def _notes(self, result: AttentionResult) -> list[tuple[Level, str]]:
        """What the student should know about this input, beyond the picture."""
        notes = attention_notes(result)
        if self.model.family.causal:  # the triangle is the mask, not something the heads learned
            notes.append(("info", f"This {self.model.family.title} model reads left to right: each token (a row) "
                                  "attends only to itself and the tokens before it, so everything right of the "
                                  "diagonal is 0 (the causal mask). In a two-way encoder every row reads the whole "
                                  "text."))
        return notes + self.unknown_notes(result.tokens, "the model sees them all as the same token")

    # -- state ----------------------------------------------------------------------------
    def _compute(self) -> AttentionResult | None:
        """The patterns for the current text, or None (and a message saying why)."""
        with self.reporting():
            result = attention_patterns(self.model, self.tok, *self._inputs(), max_length=self.max_length)
            self.show_messages(self._notes(result))
            return result
        return None

    def _inputs(self) -> tuple[str, str | None]:
        return self.text_a.value, self.text_b.value.strip() or None

    def _set_result(self, result: AttentionResult | None) -> None:
        """Keep a new result (None: nothing to show) and redraw the view on show."""
        self.result = result
        self._version += 1
        if result is None:
            redraw(self.figure, empty_heatmap())
            self._drawn.clear()
        with self.reporting():
            self._show_view()

    def _key(self, view: str) -> tuple:
        """What `view` depends on: when this changes, the view is out of date."""
        v, layer, head = self._version, self.layer.value, self.head.value
        if view == "Heatmap":
            return (v, layer, head)
        if view in ("Head view", "Model view"):
            return (v, layer, head, view)
        if view == "Rollout":
            return (v, layer)
        if view == "Masks":
            return (v,)  # its own settings redraw it from inside
        return (v, self.bertviz_kind.value)  # bertviz has its own layer and head controls

    # -- drawing --------------------------------------------------------------------------
    def _show_view(self) -> None:
        """Bring the chosen view up to date and put it on the stage (alone)."""
        name = self.view.value
        for slider, key in ((self.layer, "layer"), (self.head, "head")):
            slider.layout.display = None if key in SLIDERS[name] else "none"
        self._sync(name)
        shown = self._view_widget(name)
        if tuple(self.stage.children) != (shown,):
            self.stage.children = [shown]
        self.help.value = view_help(name)

    def _view_widget(self, name: str) -> widgets.Widget:
        if name == "Heatmap":
            return self.figure
        if self.result is None:
            return self.placeholder
        if name in ("Head view", "Model view"):
            return self.attention_view
        if name == "Rollout":
            return self.rollout_figure
        if name == "Masks":
            return self.masks.widget
        return self.bertviz_box

    def _sync(self, view: str) -> None:
        """Redraw `view` if what it shows is out of date."""
        if self.result is None:
            return
        slot = "Attention view" if view in ("Head view", "Model view") else view
        key, old = self._key(view), self._drawn.get(slot)
        if key == old:
            return
        draw = {
            "Heatmap": self._draw_heatmap, "Attention view": self._draw_attention_view,
            "Rollout": self._draw_rollout, "bertviz": self._draw_bertviz, "Masks": self._draw_masks,
        }[slot]
        draw(old)
        self._drawn[slot] = key

    def _draw_heatmap(self, old: tuple | None) -> None:
        if old is None or old[0] != self._version:
            self._draw_all()
        else:
            self._draw_head()

    def _draw_all(self) -> None:
        """New tokens: replace the heatmap's data and axes."""
        redraw(self.figure, plot_attention_heatmap(self.result, self.layer.value, self.head.value))

    def _draw_head(self) -> None:
        """Same tokens, another layer or head: only the weights, the title and the layer's marks (a local
        layer's band) change."""
        layer, head = self.layer.value, self.head.value
        with self.figure.batch_update():
            self.figure.data[0].z = heatmap_z(self.result, layer, head)
            self.figure.layout.title.text = heatmap_title(layer, head)
            marks = heatmap_marks(self.result, layer)
            self.figure.layout.shapes, self.figure.layout.annotations = marks["shapes"], marks["annotations"]

    def _draw_attention_view(self, old: tuple | None) -> None:
        """The one AttentionView widget, updated in place (new data only for a new text)."""
        r, layer, head = self.result, self.layer.value, self.head.value
        mode = "model" if self.view.value == "Model view" else "head"
        with self.hold():
            if self.attention_view is None:
                self.attention_view = AttentionView(
                    r.patterns, r.labels, r.sentence_b_start, layer=layer, view=mode, controls=False,
                    layout=widgets.Layout(width="100%"),
                )
                self.attention_view.observe(self._on_view_widget, names=["layer", "heads", "view"])
                return
            view = self.attention_view
            with view.hold_sync():
                if old is None or old[0] != self._version:
                    view.set_attention(r.patterns, r.labels, r.sentence_b_start)
                view.layer = layer
                if old is not None and old[2] != head:  # the student picked a head: show it alone
                    view.heads = [head]
                view.view = mode

    def _rollout_result(self) -> RolloutResult:
        """Rollout of the current result, computed once per result (no forward pass)."""
        if self._rollout is None or self._rollout[0] != self._version:
            self._rollout = (self._version, rollout_from_attention(self.result))
        return self._rollout[1]

    def _draw_rollout(self, old: tuple | None) -> None:
        rollout, layer = self._rollout_result(), self.layer.value
        if self.rollout_figure is None:
            self.rollout_figure = SyncedFigureWidget(plot_rollout(rollout, layer))
        elif old is None or old[0] != self._version:
            redraw(self.rollout_figure, plot_rollout(rollout, layer))
        else:  # another layer: two grids of weights and the two titles
            fig = self.rollout_figure
            with fig.batch_update():
                fig.data[0].z = rollout_z(rollout.raw[layer])
                fig.data[1].z = rollout_z(rollout.rollout[layer])
                for note, text in zip(fig.layout.annotations, rollout_titles(rollout, layer)):
                    note.text = text

    def _draw_masks(self, old: tuple | None) -> None:
        """The Masks view (built the first time it is chosen) on this result's text."""
        if self.masks is None:
            self.masks = MasksPanel(self.model, self.tok)
        self.masks.show(self.result.text_a, self.result.text_b)

    def _draw_bertviz(self, old: tuple | None) -> None:
        """bertviz's page for this text, built only when this view is chosen."""
        from bertlab.viz.bertviz_offline import bertviz_page

        r = self.result
        try:
            self.bertviz_frame.value = bertviz_page(r.patterns, r.labels, r.sentence_b_start, self.bertviz_kind.value,
                                                    layer=self.layer.value)
        except ValueError:  # bertviz cannot be shown here: no old page under the message
            self.bertviz_frame.value = ""
            raise
        if self.bertviz_kind.value == "model view" and len(r.tokens) > BERTVIZ_MODEL_VIEW_TOKENS:
            self.show_messages(self._notes(r) + [(
                "warning",
                (f"bertviz's model view draws every line of every head ({len(r.tokens)} tokens): it may take a "
                 "while to appear. bertlab's own Model view is much lighter."),
            )])
