"""The Attention tab's Masks view: six attention masks on the student's sentence (BERT, GPT, UniLM, Longformer,
Reformer, Transformer-XL), drawn from the grids `bertlab.masks` returns, and one head of the model run under a
chosen mask beside it. The Attention tab gives it its text (`show`); it keeps its own settings."""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attention_masks import MASK_NAMES, MasksResult, build_masks, masked_patterns
from bertlab.analysis.window_cost import LENGTHS, time_window
from bertlab.panels.base import Level, Panel, labelled
from bertlab.panels.views import CountSliders, Hold, help_note, on_input
from bertlab.tokenizer import Tokenizer
from bertlab.viz.figure_widget import SyncedFigureWidget, redraw
from bertlab.viz.masks import plot_masked_head, plot_masks, plot_window_timing
from bertlab.viz.theme import FAINT

MAX_TOKENS = 64  # beyond this a cell of a small grid is thinner than a pixel pair; cut with a note
HELP = ("Each grid is a mask: rows are the tokens that look (queries), columns the tokens they may look at "
        "(keys); blue = may read. Each title counts the pairs read out of n² (full attention's work). These are "
        "the grids the code applies: below, the model itself runs with the chosen one added to every head's "
        "scores.")
TIMING_WINDOW = 64  # tokens on each side: a ModernBERT local layer's band (local_attention 128 / 2)
TIMING_HELP = (f"<b>What a window saves.</b> Time one attention call on this machine at {LENGTHS[0]:,} to "
               f"{LENGTHS[-1]:,} tokens: full attention (every pair) against a sliding window of ±{TIMING_WINDOW} "
               "tokens with one global token, computed block by block so that it scores only the band. ModernBERT's "
               "local layers read such a band. It takes a few seconds, on one thread.")


class MasksPanel(Panel):
    """Who may read whom, six ways, on one sentence; and the model's attention under one of the masks."""

    title = "Attention masks"
    teaches = ("BERT lets every token read both sides; GPT, UniLM, Longformer, Reformer and Transformer-XL each "
               "hide part of the grid, to predict left to right or to do less work.")

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, max_length: int = MAX_TOKENS) -> None:
        super().__init__()
        self.model, self.tok, self.max_length = model, tok, max_length
        self.inputs: tuple[str, str | None] = ("", None)
        self.window = labelled(widgets.BoundedIntText, "Window ±", "130px", value=2, min=0, max=32)
        self.segment = labelled(widgets.BoundedIntText, "Segment", "130px", value=4, min=1, max=64)
        self.buckets = labelled(widgets.Dropdown, "Buckets", "130px", options=[2, 4, 8, 16], value=4)
        self.seed = labelled(widgets.BoundedIntText, "Hash seed", "140px", value=0, min=0, max=2**31 - 1)
        self.chosen = labelled(widgets.Dropdown, "Run the model under", "330px", options=list(MASK_NAMES),
                               value="left-to-right")
        self.sliders = CountSliders(model)
        self.layer, self.head = self.sliders("layer", "Layer"), self.sliders("head", "Head")
        self.hold = Hold()
        self.result: MasksResult | None = None
        self._patterns: tuple[str, torch.Tensor] | None = None  # (mask name, [layers, heads, q, k]) for result
        self.descriptions = widgets.HTML()
        self.placeholder = widgets.HTML(f'<div style="{FAINT};padding:1em">Type a sentence and press Show.</div>')
        self.grid_figure: go.FigureWidget | None = None
        self.head_figure: go.FigureWidget | None = None
        self.stage = widgets.VBox([self.placeholder], layout=widgets.Layout(width="100%", overflow="auto"))
        self.timing_lengths = LENGTHS
        self.time_button = widgets.Button(description="Time it here", tooltip="Time full and windowed attention")
        self.timing_message = widgets.HTML()
        self.timing_box = widgets.VBox([], layout=widgets.Layout(width="100%"))
        self.timing_figure: go.FigureWidget | None = None
        on_input(self._on_settings, self.window, self.segment, self.buckets, self.seed)
        on_input(self._on_head, self.chosen, self.layer, self.head)
        self.time_button.on_click(self._on_time)
        self._widget = widgets.VBox([
            help_note(HELP, "760px"),
            widgets.HBox([self.window, self.segment, self.buckets, self.seed]),
            self.message,
            self.stage,
            help_note(TIMING_HELP, "760px"),
            widgets.HBox([self.time_button, self.timing_message]),
            self.timing_box,
        ], layout=widgets.Layout(width="100%"))

    # -- callbacks ------------------------------------------------------------------------
    def _on_settings(self, _=None) -> None:
        if self.hold:
            return
        with self.busy(text="Drawing the masks…"):
            self._redraw()

    def _on_head(self, _=None) -> None:
        if self.hold or self.result is None:
            return
        with self.busy(text="Running the model under the mask…"), self.reporting():
            self._draw_head()

    def _on_time(self, _=None) -> None:
        """Time full attention against the window at each length and draw the two curves."""
        self.timing_message.value = ""
        with self.busy(self.time_button, text="Timing attention…"), self.reporting(self.timing_box):
            rows = time_window(self.timing_lengths, TIMING_WINDOW)
            fig = plot_window_timing(rows, TIMING_WINDOW)
            if self.timing_figure is None:
                self.timing_figure = SyncedFigureWidget(fig)
            else:
                redraw(self.timing_figure, fig)
            self.timing_box.children = [self.timing_figure]
            longest = rows[-1]
            self.timing_message.value = html.escape(
                f"At {longest.seq:,} tokens the window took {longest.banded_ms:,.1f} ms, full attention "
                f"{longest.full_ms:,.1f} ms ({longest.speedup:.1f}×), timed just now on one thread.")
            return
        self.timing_figure = None  # `reporting` emptied the box and closes the figure

    def show(self, text_a: str, text_b: str | None = None) -> None:
        """Draw the masks of this text (and pair), as the model's tokenizer splits it."""
        self.inputs = (text_a, text_b)
        self._redraw()

    def set_model(self, model: torch.nn.Module, tok: Tokenizer, redraw: bool = True) -> None:
        """Another model: its tokenizer and layer-0 queries; the sliders take its layer and head counts. `redraw`
        False: the caller shows a new text next (the Attention tab does, with the new model's result)."""
        self.model, self.tok = model, tok
        with self.hold():
            self.sliders.fit(model)
        if redraw and self.result is not None:
            self._redraw()

    def figures(self) -> dict[str, go.Figure]:
        shown = {} if self.result is None else {"masks": go.Figure(self.grid_figure),
                                                "masked head": go.Figure(self.head_figure)}
        if self.timing_figure is not None and self.timing_box.children:
            shown["window timing"] = go.Figure(self.timing_figure)
        return shown

    # -- state and drawing ----------------------------------------------------------------
    def _redraw(self) -> None:
        """Build the masks for the current text and settings; on bad input the old grids go (the message says why)."""
        self.result, self._patterns, drawn = None, None, False
        with self.reporting(self.stage):
            result = build_masks(self.model, self.tok, *self.inputs, window=self.window.value,
                                 segment=self.segment.value, n_buckets=self.buckets.value, seed=self.seed.value,
                                 max_length=self.max_length)
            self.result = result
            self.show_messages(self._notes(result))
            self._draw()
            drawn = True
        if not drawn:  # `reporting` emptied the stage and closes the figures it held
            self.result, self.grid_figure, self.head_figure = None, None, None

    def _notes(self, r: MasksResult) -> list[tuple[Level, str]]:
        pair = " (two sentences: the prefix's source is sentence A)" if r.sentence_b_start is not None else ""
        notes: list[tuple[Level, str]] = [("info", f"{r.n} tokens{pair}, so full attention reads {r.n ** 2} pairs.")]
        if r.warning:
            notes.append(("warning", r.warning))
        return notes + self.unknown_notes(r.tokens, "each reads as the same token, and hashes alike")

    def _draw(self) -> None:
        r = self.result
        rows = "".join(f"<li><b>{html.escape(m.title)}</b>: {html.escape(m.description)} "
                       f"({m.allowed_pairs} of {r.n ** 2} pairs)</li>" for m in r.masks)
        self.descriptions.value = f'<ul style="margin:0.3em 0;line-height:1.4">{rows}</ul>'
        grid = plot_masks(r)
        if self.grid_figure is None:
            self.grid_figure = SyncedFigureWidget(grid)
        else:
            redraw(self.grid_figure, grid)
        head = self._head_plot()
        if self.head_figure is None:
            self.head_figure = SyncedFigureWidget(head)
        else:
            redraw(self.head_figure, head)
        self.stage.children = [self.descriptions, self.grid_figure,
                               widgets.HBox([self.chosen, self.layer, self.head]), self.head_figure]

    def _head_plot(self) -> go.Figure:
        name = self.chosen.value
        if self._patterns is None or self._patterns[0] != name:
            self._patterns = (name, masked_patterns(self.model, self.result, name))
        layer, head = self.layer.value, self.head.value
        return plot_masked_head(self.result, name, self._patterns[1][layer, head].numpy(), layer, head)

    def _draw_head(self) -> None:
        redraw(self.head_figure, self._head_plot())
