"""The Family tab's "Both ways vs left to right" section: an encoder beside a causal model on the tab's sentence
(their attention patterns, what each position may read, their guesses for the hidden word). The Family panel
owns the sentence, the models and the busy sign; this section owns its layer and head choosers and its figure."""

from __future__ import annotations

import html
from typing import Callable, Sequence

import ipywidgets as widgets

from bertlab.analysis.both_ways import ADD_CAUSAL, ADD_ENCODER, BothWays, both_ways, pick_pair, shared_range
from bertlab.analysis.family import Loaded, WordChoice
from bertlab.inputs import InputError
from bertlab.viz.both_ways import plot_both_ways
from bertlab.viz.figure_widget import show_or_clear
from bertlab.viz.theme import help_html, note_html

TITLE = "Both ways vs left to right"
HELP = ("An encoder (BERT) reads every word at once, both sides of it: its attention pattern is full, and to guess "
        "a word it must hide it. A left-to-right model (GPT-2) reads each token with only the tokens before it: "
        "its pattern is a triangle (nothing right of the diagonal), and it guesses a word from its left alone. The "
        "grids in the middle are the masks the models apply; the dotted line marks the hidden word's row.")


class BothWaysSection:
    """The section's widgets and its last result; `on_change` runs when the layer or head changes."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.result: BothWays | None = None
        self.pair: tuple[Loaded, Loaded] | None = None
        self._filling = False
        self.layer = widgets.Dropdown(description="Layer", options=[0], value=0,
                                      layout=widgets.Layout(width="min(100%, 180px)"))
        self.head = widgets.Dropdown(description="Head", options=[0], value=0,
                                     layout=widgets.Layout(width="min(100%, 180px)"))
        self.note = widgets.HTML()
        self.box = widgets.VBox([])
        for w in (self.layer, self.head):
            w.observe(lambda _: None if self._filling else on_change(), names="value")
        self.choosers = widgets.HBox([self.layer, self.head], layout=widgets.Layout(flex_flow="row wrap"))
        self.widget = widgets.VBox([
            widgets.HTML(f'<div style="font-weight:600;margin-top:8px">{TITLE}</div>'),
            widgets.HTML(help_html(html.escape(HELP))), self.choosers, self.note, self.box])

    def _say(self, text: str, level: str = "info") -> None:
        self.note.value = note_html(level, text) if text else ""

    def _fill_choosers(self, layers: int, heads: int) -> None:
        self._filling = True
        try:
            for w, n in ((self.layer, layers), (self.head, heads)):
                old = w.value
                w.options = list(range(n))
                w.value = old if old in range(n) else 0
        finally:
            self._filling = False

    def compute(self, loaded: Sequence[Loaded], text: str, word: WordChoice | None, k: int) -> None:
        """Pick the pair among `loaded` and compare them (a missing model or a bad word: a note, no figure)."""
        self.result = None
        encoder, causal = pick_pair(loaded)
        self.pair = (encoder, causal) if encoder is not None and causal is not None else None
        self.choosers.layout.display = None if self.pair else "none"
        if causal is None:
            self._say(ADD_CAUSAL)
            return
        if encoder is None:
            self._say(ADD_ENCODER)
            return
        self._fill_choosers(*shared_range(encoder.model, causal.model))
        self.redo(text, word, k)

    def redo(self, text: str, word: WordChoice | None, k: int) -> None:
        """Compare the pair again at the chosen layer and head."""
        self.result = None
        if self.pair is None:
            return
        encoder, causal = self.pair
        try:
            self.result = both_ways(encoder, causal, text, word, self.layer.value, self.head.value, k)
        except InputError as e:
            self._say(str(e), "warning")
            return
        notes = [f"{s.name} ({s.reads}): {s.note}" for s in (self.result.encoder, self.result.causal) if s.note]
        self._say(" ".join(notes))

    def draw(self) -> None:
        show_or_clear(self.box, None if self.result is None else plot_both_ways(self.result))

    def clear(self) -> None:
        """No result and no note (the tab failed as a whole: its message says why)."""
        self.result, self.pair = None, None
        self.box.children = ()
        self.note.value = ""
        self.choosers.layout.display = "none"
