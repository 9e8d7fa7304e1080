"""The "What changed" section of the Fine-tuning tab: each run of the session against the model it started
from, side by side. Per layer, how much attention changed (Jensen-Shannon divergence per head) and how much
the representations changed (linear CKA, mean cosine) on a fixed probe set, and a 1-D slice of the dev loss
around each fine-tuned model (Hao et al. 2019; Li et al. 2018). Measured once when a run ends
(`measure_change`, in the training thread); the section only draws."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.analysis.finetune_diff import FinetuneDiff, LossSlice, finetune_diff, loss_slice
from bertlab.families.bert import Bert
from bertlab.panels.base import Panel
from bertlab.tokenizer import Tokenizer
from bertlab.training.finetune import dev_loss
from bertlab.viz.figure_widget import show_figure
from bertlab.viz.finetune_diff import plot_attention_change, plot_loss_slices, plot_representation_change
from bertlab.viz.theme import help_html

log = logging.getLogger(__name__)

SLICE_EXAMPLES = 32  # dev examples the loss slice is measured on
HELP = (
    "Each run against the model it started from, on 16 fixed sentences. Attention: the Jensen–Shannon "
    "divergence between each head's attention before and after (0 = unchanged, 1 bit = nothing in common). "
    "Representations: linear CKA and mean cosine of the token vectors after each layer (1 = unchanged; CKA "
    "ignores rotations and scale). A frozen encoder (feature-based) changes nothing; full fine-tuning changes "
    "the top layers most (Hao et al. 2019). The loss slice moves each fine-tuned model's weights along one "
    "random filter-normalised direction (Li et al. 2018): a wide, flat bowl is a minimum that small changes "
    "to the weights do not spoil."
)


@dataclass
class RunChange:
    """What one run changed, and the loss around where it ended."""

    diff: FinetuneDiff
    landscape: LossSlice | None  # None when the dev loss could not be measured (see `note`)
    note: str = ""


def measure_change(base: Bert, tuned: Bert, tok: Tokenizer, task: str, dev: Sequence[Any],
                   max_length: int = 128, seed: int = 0) -> RunChange:
    """JSD/CKA/cosine of `tuned` against `base`, and the dev-loss slice around `tuned`."""
    diff = finetune_diff(base, tuned, tok)
    try:
        loss = dev_loss(tuned, tok, task, dev, max_length, SLICE_EXAMPLES)
        landscape, note = loss_slice(tuned, loss, seed=seed), ""
    except (ValueError, KeyError, RuntimeError) as e:
        landscape, note = None, f"no loss slice: {e}"
    return RunChange(diff, landscape, note)


class ChangedSection(Panel):
    """Draws the session's runs' changes side by side."""

    title = "What changed"
    teaches = "Which layers fine-tuning changes, and how, for full fine-tuning, a frozen encoder and adapters."

    def __init__(self) -> None:
        super().__init__()
        self.changes: dict[str, RunChange] = {}
        self.attention_box = widgets.Box([], layout=widgets.Layout(overflow="auto"))
        self.representation_box = widgets.Box([], layout=widgets.Layout(overflow="auto"))
        self.landscape_box = widgets.Box([])
        self._figures: dict[str, go.Figure] = {}
        self._widget = widgets.VBox([
            widgets.HTML(help_html(HELP)), self.message,
            self.attention_box, self.representation_box, self.landscape_box,
        ], layout=widgets.Layout(width="100%"))
        self._widget.add_class("bertlab-changed")  # for the browser tests
        self.show_message("Fine-tune a model above: what it changed shows here, beside the session's other runs.")

    def set_model(self, model, tok) -> None:
        """The picked model does not change what the runs changed."""

    def figures(self) -> dict[str, go.Figure]:
        return dict(self._figures)

    def measuring(self, text: str) -> None:
        """The busy sign while a run's change is measured (in the background), until `add` or a message."""
        self._busy_text = text
        self.show_messages(self.messages)

    def add(self, label: str, change: RunChange) -> None:
        """Record one run's change and redraw every run side by side."""
        self._busy_text = None
        self.changes[label] = change
        self.draw(self.changes)

    def failed(self, text: str) -> None:
        """A run's change could not be measured: say so (the busy sign goes)."""
        self._busy_text = None
        self.show_message(text, "error")

    def draw(self, changes: Mapping[str, RunChange]) -> None:
        with self.reporting():
            diffs = {k: c.diff for k, c in changes.items()}
            slices = {k: c.landscape for k, c in changes.items() if c.landscape is not None}
            self._figures = {
                "attention change": plot_attention_change(diffs),
                "representation change": plot_representation_change(diffs),
                "loss slices": plot_loss_slices(slices),
            }
            for box, name in ((self.attention_box, "attention change"),
                              (self.representation_box, "representation change"),
                              (self.landscape_box, "loss slices")):
                show_figure(box, self._figures[name])
            notes = [("warning", f"{k}: {c.note}") for k, c in changes.items() if c.note]
            self.show_messages(notes)
