"""What it knows tab: probes per layer (with control tasks and the scalar mix) and the structural probe's tree,
activation patching, the neuron view of one head, and corpus neighbours.

Probe training and the neighbour index run in the background (progress and Cancel); the rest is quick and
runs with a busy sign. The data: the CoNLL-2003 and UD EWT files under BERTLAB_DATA, and the offline
Wikipedia corpus for the neighbours.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis import encode_input
from bertlab.analysis.neighbours import NeighbourIndex, build_index, corpus_neighbours
from bertlab.analysis.neurons import neuron_view
from bertlab.analysis.patching import component_grid, head_grid, patching_input
from bertlab.analysis.probes import Cancelled, ProbeResult
from bertlab.analysis.similarity import stage_names
from bertlab.analysis.structural import StructuralResult, predict_tree, probe_each
from bertlab.inputs import InputError
from bertlab.panels.base import Panel, clear_view
from bertlab.panels.runs import BackgroundRun, error_text
from bertlab.panels.views import CountSliders, help_note
from bertlab.tokenizer import Tokenizer
from bertlab.viz.figure_widget import box_figures, figure_box, show_figure
from bertlab.viz.knows import (
    plot_mix_weights,
    plot_neighbours,
    plot_neuron_view,
    plot_patching,
    plot_probe_layers,
    plot_tree,
)
from bertlab.viz.mask import empty_figure
from bertlab.viz.theme import MUTED

log = logging.getLogger(__name__)

SECTIONS = ("Probes", "Tree", "Patching", "Neuron view", "Neighbours")
PROPERTIES = (("part of speech (CoNLL-2003)", "pos"), ("chunk (CoNLL-2003)", "chunk"),
              ("named entity (CoNLL-2003)", "ner"), ("UPOS (UD EWT)", "upos"),
              ("dependency relation (UD EWT)", "deprel"), ("tree: structural probe (UD EWT)", "tree"))
# The default pair: the clean run must prefer the answer and the corrupted one the wrong word (on the offline
# default too, see tests/test_panels_knows.py), or no recovery figure means anything. {mask}: spelled by the tokenizer.
DEFAULT_CLEAN = "Paris is the capital of {mask}."
DEFAULT_CORRUPT = "Berlin is the capital of {mask}."
DEFAULT_ANSWER, DEFAULT_WRONG = "france", "germany"
DEFAULT_NEURON_TEXT = "The cat sat on the mat because it was tired."
DEFAULT_NEIGHBOUR_TEXT = "I went to the bank to deposit money."
PROBE_HELP = ("A linear probe per layer learns to read a property off frozen word vectors (a word's first piece). "
              "The dashed line is the control task: the same probe on a random label per word type; selectivity "
              "(hover) is accuracy − control. Named entities are scored by macro accuracy (each label's accuracy, "
              "averaged): 85 % of their words are “O”, so plain accuracy would reward saying “O”. The dotted line "
              "is the scalar mix: a learned weighted sum of all layers (its weights below). Trained on training "
              "sentences, scored on held-out ones. At the embeddings a word's vector is its type alone, which is all "
              "the control task needs: selectivity there can fall below 0.")
TREE_HELP = "The probe's tree is the minimum spanning tree of its distances; gold from UD EWT."
PATCH_HELP = ("Two sentences that differ in one word, each with one {mask}. Each cell copies one activation of the "
              "clean run into the corrupted run: 1 = the clean answer−wrong logit difference fully restored, "
              "0 = no effect.")
NEURON_HELP = ("A head's score from one token to another is its query vector times the other's key vector, "
               "summed and divided by √d_head: the product column shows which dimensions make the score.")
NEIGHBOUR_HELP = ("The corpus tokens whose vectors at this stage are nearest (cosine) to the word's: the same "
                  "word in other senses, other words in the same role. The index is built once per model and stage.")


class KnowsPanel(Panel):
    """Probes per layer, the structural probe's tree, activation patching, the neuron view and corpus neighbours."""

    title = "What it knows"
    teaches = ("What each layer's vectors hold (part of speech, entities, syntax), which positions and layers carry "
               "a prediction, and how one attention score is made.")

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, corpus: Callable[[], list[str]] | None = None) -> None:
        super().__init__()
        self.model, self.tok = model, tok
        self._corpus = corpus or wiki_sentences
        self.results: dict[str, ProbeResult | StructuralResult] = {}
        self.index: NeighbourIndex | None = None
        self.ud_eval = []
        layers = model.config.num_hidden_layers
        self.sliders = CountSliders(model)
        # probes
        self.properties = [widgets.Checkbox(value=p in ("pos", "ner", "deprel"), description=label, indent=False,
                                            layout=widgets.Layout(width="auto", min_width="300px"))
                           for label, p in PROPERTIES]
        self.train_sentences = widgets.BoundedIntText(value=300, min=20, max=5000, description="Train sent.")
        self.eval_sentences = widgets.BoundedIntText(value=150, min=10, max=2000, description="Eval sent.")
        self.pool = widgets.Dropdown(options=[("first piece", "first"), ("mean of pieces", "mean")], value="first",
                                     description="Word =")
        self.train_button = widgets.Button(description="Train probes", button_style="primary")
        self.cancel_button = widgets.Button(description="Cancel", button_style="warning", disabled=True)
        self.job = BackgroundRun("bertlab-knows", cancel_button=self.cancel_button)
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="240px"))
        self.progress_text = widgets.HTML("")
        self.layers_box = figure_box("Pick properties and press Train probes.")
        self.mix_box = figure_box("The scalar mix's weights appear here.")
        # tree
        self.tree_sentence = widgets.Dropdown(options=[], description="Sentence", layout=widgets.Layout(width="720px"))
        self.tree_text = widgets.Text(value="", description="Or type", placeholder="words separated by spaces",
                                      layout=widgets.Layout(width="720px"))
        self.tree_stage = self.sliders("stage", "Stage", 3)
        self.tree_button = widgets.Button(description="Draw tree", button_style="primary")
        self.tree_box = figure_box("Train the tree probe in Probes first.")
        # patching
        wide = widgets.Layout(width="720px")
        self.clean = widgets.Text(value=tok.spell(DEFAULT_CLEAN), description="Clean", layout=wide)
        self.corrupt = widgets.Text(value=tok.spell(DEFAULT_CORRUPT), description="Corrupted", layout=wide)
        self.answer = widgets.Text(value=DEFAULT_ANSWER, description="Answer")
        self.wrong = widgets.Text(value=DEFAULT_WRONG, description="Wrong")
        self.kind = widgets.Dropdown(options=[("residual stream", "residual"), ("attention output", "attention"),
                                              ("MLP output", "mlp"), ("heads of one layer", "heads")],
                                     value="residual", description="Patch")
        self.head_layer = self.sliders("layer", "Layer", layers - 1)
        self.patch_button = widgets.Button(description="Patch", button_style="primary")
        self.patch_box = figure_box("Press Patch.")
        # neuron view
        self.neuron_text = widgets.Text(value=DEFAULT_NEURON_TEXT, description="Text", layout=wide)
        self.neuron_layer, self.neuron_head = self.sliders("layer", "Layer"), self.sliders("head", "Head")
        self.neuron_token = widgets.BoundedIntText(value=1, min=0, max=511, description="Token #")
        self.neuron_button = widgets.Button(description="Show", button_style="primary")
        self.neuron_box = figure_box("Press Show.")
        # neighbours
        self.corpus_size = widgets.BoundedIntText(value=3000, min=10, max=200000, description="Sentences")
        self.nb_stage = self.sliders("stage", "Stage", layers)
        self.build_button = widgets.Button(description="Build index", button_style="primary")
        self.nb_text = widgets.Text(value=DEFAULT_NEIGHBOUR_TEXT, description="Text", layout=wide)
        self.nb_word = widgets.Text(value="bank", description="Word")
        self.nb_k = widgets.BoundedIntText(value=10, min=1, max=100, description="k")
        self.find_button = widgets.Button(description="Find", button_style="primary")
        self.nb_box = figure_box("Build the index, then press Find.")

        run_row = widgets.HBox([self.train_button, self.cancel_button, self.progress, self.progress_text])
        self.sections = widgets.Tab(children=[
            widgets.VBox([help_note(PROBE_HELP), widgets.HBox(self.properties[:3]), widgets.HBox(self.properties[3:]),
                          widgets.HBox([self.train_sentences, self.eval_sentences, self.pool]), run_row,
                          self.layers_box, self.mix_box]),
            widgets.VBox([help_note(TREE_HELP),
                          self.tree_sentence, self.tree_text, widgets.HBox([self.tree_stage, self.tree_button]),
                          self.tree_box]),
            widgets.VBox([help_note(html.escape(tok.spell(PATCH_HELP))), self.clean, self.corrupt,
                          widgets.HBox([self.answer, self.wrong]),
                          widgets.HBox([self.kind, self.head_layer, self.patch_button]), self.patch_box]),
            widgets.VBox([help_note(NEURON_HELP), self.neuron_text,
                          widgets.HBox([self.neuron_layer, self.neuron_head, self.neuron_token, self.neuron_button]),
                          self.neuron_box]),
            widgets.VBox([help_note(NEIGHBOUR_HELP), widgets.HBox([self.corpus_size, self.nb_stage, self.build_button]),
                          self.nb_text, widgets.HBox([self.nb_word, self.nb_k, self.find_button]), self.nb_box]),
        ], titles=list(SECTIONS))
        self._widget = widgets.VBox([self.message, self.sections])
        self.train_button.on_click(lambda _: self._report(self.start_probes))
        self.cancel_button.on_click(lambda _: self.cancel())
        self.tree_button.on_click(lambda _: self._report(self.draw_tree, self.tree_box))
        self.patch_button.on_click(lambda _: self._report(self.patch, self.patch_box))
        self.neuron_button.on_click(lambda _: self._report(self.show_neurons))
        self.build_button.on_click(lambda _: self._report(self.start_index))
        self.find_button.on_click(lambda _: self._report(self.find, self.nb_box))

    def _report(self, fn: Callable[[], None], *shows: widgets.Box) -> None:
        """Run a button's job; on an error the figures it redraws (`shows`) go (see Panel.reporting)."""
        with self.reporting(*shows):
            fn()

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Results of the old model go; the next runs use this one."""
        if model is self.model:
            return
        self.model, self.tok = model, tok
        self.results, self.index = {}, None
        self.sliders.fit(model)
        for box in (self.layers_box, self.mix_box, self.tree_box):
            show_figure(box, empty_figure("Train the probes again for this model."))
        if not self.job.running:
            self.show_messages([])

    def figures(self) -> dict[str, go.Figure]:
        return box_figures({"probes": self.layers_box, "scalar mix": self.mix_box, "tree": self.tree_box,
                            "patching": self.patch_box, "neuron view": self.neuron_box, "neighbours": self.nb_box})

    # -- background runs --------------------------------------------------------------------------
    def cancel(self) -> None:
        self.job.cancel()
        self.progress_text.value = "Cancelling…"

    def _set_running(self, running: bool, text: str = "") -> None:
        """The two start buttons and the busy sign (the job handles Cancel)."""
        for b in (self.train_button, self.build_button):
            b.disabled = running
        self._busy_text = (text or "Working…") if running else None
        self.show_messages(self.messages)

    def _progress(self, what: str, done: int, total: int) -> None:
        self.progress.max, self.progress.value = max(1, total), min(done, max(1, total))
        self.progress_text.value = f'<span style="{MUTED}">{what}: {done}/{total}</span>'

    def _start(self, target: Callable[..., None], args: tuple, name: str, text: str) -> None:
        self.job.check_idle()
        self.job.name = name
        self.messages = []
        self._set_running(True, text)
        self.job.start(lambda: target(*args), on_error=self._failed, on_done=self._ended)

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, Cancelled):
            self.show_message("Cancelled.", "warning")
        else:
            self.show_message(error_text(error), "error")

    def _ended(self) -> None:
        self._set_running(False)
        self.progress_text.value = ""

    # -- probes -----------------------------------------------------------------------------------
    def start_probes(self) -> None:
        chosen = [p for (_, p), box in zip(PROPERTIES, self.properties) if box.value]
        if not chosen:
            raise InputError("Tick at least one property to probe.")
        self._start(self._train, (self.model, self.tok, chosen, self.train_sentences.value, self.eval_sentences.value,
                                  self.pool.value), "bertlab-probes", "Training probes…")

    def _train(self, model, tok, chosen: list[str], n_train: int, n_eval: int, pool: str) -> None:
        results: dict[str, ProbeResult | StructuralResult] = {}
        for prop, result, held_out in probe_each(model, tok, chosen, n_train, n_eval, pool, progress=self._progress,
                                                 cancelled=self.job.cancel_event.is_set):
            results[prop] = result
            if prop == "tree":
                self.ud_eval = held_out
            self.results = dict(results)
            self._draw_probes()
        if "tree" in results:
            self.tree_sentence.options = [(" ".join(s.words)[:100], i) for i, s in enumerate(self.ud_eval[:100])]
            self.tree_sentence.value = 0
        n = results[chosen[0]]
        self.show_message(f"Trained on {n.train_sentences} sentences, scored on {n.eval_sentences} held-out ones "
                          f"(word = {'first piece' if pool == 'first' else 'mean of pieces'}).")

    def _draw_probes(self) -> None:
        results = list(self.results.values())
        show_figure(self.layers_box, plot_probe_layers(results))
        mixed = [r for r in results if r.mix_weights is not None and len(r.mix_weights)]
        if mixed:
            show_figure(self.mix_box, plot_mix_weights(mixed))

    # -- tree -------------------------------------------------------------------------------------
    def draw_tree(self) -> None:
        result = self.results.get("tree")
        if not isinstance(result, StructuralResult):
            raise InputError("Train the tree probe first: tick “tree” in Probes and press Train probes.")
        typed = self.tree_text.value.strip()
        if typed:
            sentence = typed
        elif self.tree_sentence.value is not None:
            sentence = self.ud_eval[self.tree_sentence.value]
        else:
            raise InputError("Pick a sentence or type one.")
        with self.busy(self.tree_button, text="Drawing the tree…"):
            pred = predict_tree(self.model, self.tok, result.probe, sentence, self.tree_stage.value, result.pool)
            show_figure(self.tree_box, plot_tree(pred))
            self.show_messages([])

    # -- patching ---------------------------------------------------------------------------------
    def patch(self) -> None:
        with self.busy(self.patch_button, text="Patching…"):
            inp = patching_input(self.model, self.tok, self.clean.value, self.corrupt.value, self.answer.value,
                                 self.wrong.value)
            if self.kind.value == "heads":
                grid = head_grid(self.model, inp, self.head_layer.value)
            else:
                grid = component_grid(self.model, inp, self.kind.value)
            show_figure(self.patch_box, plot_patching(grid))
            self.grid = grid
            self.show_messages(([("warning", grid.warning)] if grid.warning else []) + self.unknown_notes(inp.tokens))

    # -- neuron view ------------------------------------------------------------------------------
    def show_neurons(self) -> None:
        """The neuron view of the text; where there is none (empty, too long, no such token) the view says
        why in its place, so the figure of an earlier text never stays under the message."""
        with self.busy(self.neuron_button, text="Reading q and k…"):
            try:
                view = neuron_view(self.model, self.tok, self.neuron_text.value, self.neuron_layer.value,
                                   self.neuron_head.value, self.neuron_token.value)
            except (ValueError, IndexError) as e:
                show_figure(self.neuron_box, empty_figure(str(e)))
                raise
            # A new figure widget for every view: plotly's front end fails to restyle this one in place when the
            # number of tokens changes ("Error setting state: Cannot read properties of undefined (reading
            # 'length')") and keeps the earlier text on show.
            clear_view(self.neuron_box)
            show_figure(self.neuron_box, plot_neuron_view(view))
            self.show_messages(self.unknown_notes(view.tokens))

    # -- neighbours -------------------------------------------------------------------------------
    def start_index(self) -> None:
        self._start(self._build, (self.model, self.tok, self.corpus_size.value, self.nb_stage.value),
                    "bertlab-neighbours", "Building the neighbour index…")

    def _build(self, model, tok, size: int, stage: int) -> None:
        self._progress("reading the corpus", 0, 1)
        sentences = self._corpus()[:size]
        self.index = build_index(model, tok, sentences, stage, progress=lambda d, t: self._progress("index", d, t),
                                 cancelled=self.job.cancel_event.is_set)
        self.show_message(f"Index of {len(self.index)} tokens ({len(sentences)} sentences) at "
                          f"{stage_names(model.config.num_hidden_layers)[stage]}: type a word and press Find.")

    def find(self) -> None:
        if self.index is None:
            raise InputError("Build the index first (Build index).")
        with self.busy(self.find_button, text="Searching…"):
            found = corpus_neighbours(self.model, self.tok, self.index, self.nb_text.value, self.nb_word.value,
                                      self.nb_k.value)
            name = stage_names(self.model.config.num_hidden_layers)[self.index.stage]
            show_figure(self.nb_box, plot_neighbours(found, self.nb_word.value, name))
            self.neighbours = found
            self.show_messages(self.unknown_notes(encode_input(self.model, self.tok, self.nb_text.value).tokens))


def wiki_sentences() -> list[str]:
    """The offline Wikipedia corpus's sentences (training part), in order."""
    from bertlab.training.corpora import load_corpus

    return [s for d in load_corpus("wiki-offline", "train") for s in d.sentences]
