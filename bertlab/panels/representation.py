"""Input tab: what a BERT-family model reads before its first layer. Its tokenizer's pieces (WordPiece,
byte-level BPE or SentencePiece Unigram, named by the family, drawn readably), segment and position ids,
and the token + segment + position embeddings that add up to each token's input vector."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.representation import Representation, first_tokens, input_representation
from bertlab.panels.base import Panel, lacks, run_button, sentence_pair
from bertlab.panels.views import on_input
from bertlab.tokenizer import Tokenizer
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.mask import empty_figure
from bertlab.viz.representation import (
    help_text,
    input_notes,
    plot_input_table,
    plot_part_norms,
    plot_part_projection,
)
from bertlab.viz.theme import help_html

DEFAULT_TEXT = "The unbelievably clueless gamer played it."
DEFAULT_TEXT_B = "It was fine."
MAX_SHOWN = 64  # tokens drawn; beyond this the table and the bars are unreadable. Cut with a note.
HIDDEN_PARTS = ("normalised",)  # ~8x longer than the others: in the legend, off until clicked


class RepresentationPanel(Panel):
    """The pieces, ids and embedding parts of a sentence (or a pair) the student types."""

    title = "Input"
    teaches = (
        "A BERT-family model reads its tokenizer's pieces (WordPiece, byte-level BPE or SentencePiece), and "
        "each piece's input vector is the sum of a token, a segment and a position embedding."
    )

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Tokenizer,
        text: str = DEFAULT_TEXT,
        text_b: str = DEFAULT_TEXT_B,
        max_shown: int = MAX_SHOWN,
    ) -> None:
        super().__init__()
        self.model, self.tok, self.max_shown = model, tok, max_shown
        self.text_a, self.text_b = sentence_pair(text, text_b)
        self.show_button = run_button(tooltip="Read the input")
        self.rep = self._compute()
        # Each FigureWidget starts from a complete figure (one filled after creation shows blank in Voilà).
        self.table, self.norms, self.projection = (SyncedFigureWidget(f) for f in self._figures())
        self.boxes = [widgets.Box([f], layout=widgets.Layout(overflow="auto")) for f in self._widgets()]
        self.help = widgets.HTML(self._help_html())
        on_input(self._on_text, self.text_a, self.text_b, self.show_button)
        self._widget = widgets.VBox(
            [self.text_a, widgets.HBox([self.text_b, self.show_button]), self.message, *self.boxes, self.help],
            layout=widgets.Layout(width="100%"),
        )

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        self.model, self.tok = model, tok
        self.help.value = self._help_html()
        self.update(force=True)

    def _help_html(self) -> str:
        kind = self.model.family.tokenizer_title
        return help_html(help_text(self.tok, kind), extra=";max-width:760px")

    def figures(self) -> dict[str, go.Figure]:
        if self.rep is None:
            return {}
        names = ("input table", "part norms", "parts in 2-D")
        return {name: go.Figure(fig) for name, fig in zip(names, self._widgets())}

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_text(self, _=None) -> None:
        with self.busy(self.show_button, text="Reading the input…"):
            self.update()

    def update(self, force: bool = False) -> None:
        """Read the current text (unless it is what is shown already) and redraw; on bad input the
        pictures are cleared (the message says why), so an old result never sits under it."""
        if not force and self.rep is not None and (self.rep.text_a, self.rep.text_b) == self._inputs():
            return
        self.rep = self._compute()
        self._draw()

    def _compute(self) -> Representation | None:
        """The representation of the current text, cut to what is drawn; None (and a message) on bad input."""
        with self.reporting():
            a, b = self._inputs()
            full = input_representation(self.model, self.tok, a, b)
            unknown = self.unknown_notes(full.tokens, "they all get the same token embedding")
            self.show_messages(input_notes(full, self.max_shown, pair_asked=bool(self.text_b.value), tok=self.tok,
                                           segments=lacks(self.model, "segment_embeddings"),
                                           positions=lacks(self.model, "position_embeddings"), unknown=unknown))
            return first_tokens(full, self.max_shown)
        return None

    def _inputs(self) -> tuple[str, str | None]:
        return self.text_a.value, self.text_b.value.strip() or None

    # -- drawing --------------------------------------------------------------------------
    def _figures(self) -> tuple[go.Figure, go.Figure, go.Figure]:
        if self.rep is None:
            blank = empty_figure("Type a sentence and press Show.")
            return blank, go.Figure(blank), go.Figure(blank)
        return (plot_input_table(self.rep), plot_part_norms(self.rep, hidden=HIDDEN_PARTS),
                plot_part_projection(self.rep))

    def _widgets(self) -> tuple[go.FigureWidget, go.FigureWidget, go.FigureWidget]:
        return self.table, self.norms, self.projection

    def _draw(self) -> None:
        """New tokens: redraw the three figures."""
        self.table, self.norms, self.projection = (
            show_figure(box, new) for box, new in zip(self.boxes, self._figures())
        )
