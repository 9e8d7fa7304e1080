"""Embeddings tab: how similar BERT's vectors are, token to token and one word across contexts,
against the similarity of random tokens (anisotropy), a 2-D map of words in context, and whole
sentences compared by the cosine of their mean-pooled vectors (one against several, and scored
against people's relatedness on SICK's held-out pairs).

Four sub-tabs, each with its own inputs; the stage sliders redraw from cached results.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.sentences import (
    CosineScore,
    SentenceSimilarity,
    cosine_score,
    one_against_many,
    sick_held_out,
    split_sentences,
)
from bertlab.analysis.similarity import (
    Anisotropy,
    TokenSimilarity,
    WordAcrossContexts,
    WordProjection,
    anisotropy_baseline,
    first_similarity_tokens,
    parse_contexts,
    stage_options,
    text_lines,
    token_similarity,
    word_in_contexts,
    word_projection,
)
from bertlab.panels.base import Level, Panel, run_button
from bertlab.panels.views import Hold, help_note, on_input
from bertlab.tasks.models import model_task
from bertlab.tokenizer import Tokenizer
from bertlab.training.finetune import evaluate
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.mask import empty_figure
from bertlab.viz.similarity import (
    map_notes,
    plot_sentence_similarity,
    plot_token_similarity,
    plot_word_across_layers,
    plot_word_projection,
    score_html,
    sentence_notes,
    token_notes,
    word_notes,
)

DEFAULT_TEXT = "I went to the bank to deposit money, then sat on the river bank."
DEFAULT_WORD = "bank"
DEFAULT_CONTEXTS = """river | He sat on the bank of the river.
river | The river bank was muddy after the rain.
river | We fished from the grassy bank of the lake.
money | I deposited money at the bank.
money | The bank approved my loan.
money | She works as a cashier in a bank downtown."""
DEFAULT_MAP_WORDS = "bank, river, money"
DEFAULT_MAP_SENTENCES = """He sat on the bank of the river.
The river bank was muddy after the rain.
We fished from the grassy bank of the lake.
I deposited money at the bank.
The bank approved my loan.
She works as a cashier in a bank downtown.
The river flooded the whole valley.
They swam across the cold river.
He saved money for a new bike.
She lent me some money for lunch."""
DEFAULT_SENTENCES = """A man is playing a guitar.
A person is playing a musical instrument.
A man is playing a flute.
A woman is slicing an onion.
A cat is sleeping on the sofa."""
SCORE_PAIRS = 100  # SICK held-out pairs the "Score on SICK" button scores by default (a seeded subset)
MAX_SHOWN = 128  # tokens in the cosine matrix; beyond this a cell is smaller than a pixel pair
SECTIONS = ("Tokens", "One word", "Word map", "Sentences")
RESULTS = ("sim", "word_result", "proj", "sentences_result")  # the attribute that holds each sub-tab's result
# each sub-tab's figure before a result
HINTS = ("Type a text and press Show.", "Type a word and at least two contexts that contain it, then press Compare.",
         "Type words and sentences that contain them, then press Map.",
         "Type a sentence on the first line and others below it, then press Compare.")
BUSY = ("Computing the cosines…", "Reading the word in every context…", "Placing the words…",
        "Encoding the sentences…")
HELP = (
    "Contextual vectors share a common direction (they are <i>anisotropic</i>), so even two random "
    "tokens have a clearly positive cosine: the grey dashed line in “One word” measures "
    "it on 500 random token pairs from 16 built-in everyday sentences. A word's similarity across "
    "contexts says something about meaning only where it rises above that line. "
    "Sliders redraw from the stored vectors (no new run)."
)
TOKENS_HELP = "Each cell is the cosine between two tokens' vectors at the chosen stage (−1 blue … +1 red)."
CONTEXTS_HELP = (
    "One context per line, each containing the word as written. Optionally start each line with a sense "
    "label and a bar (“river | …”, “money | …”) to compare same-sense with different-sense pairs."
)
SENTENCES_HELP = (
    "The first line is compared with each line below it: every sentence is encoded alone, its token vectors "
    "of the last layer are averaged (mean pooling), and two sentences compare by the cosine of those means. "
    "That means something when the encoder was trained to put related sentences near each other: the MiniLM "
    "encoder as its package ships it was, on sentence pairs (the offline default re-trained its layers for "
    "the masked-word heads, which costs some of that). “Score on SICK” measures how well the cosine follows people's "
    "relatedness ratings (1-5) on held-out SICK pairs; the Fine-tuning tab's sts task trains a cross-encoder "
    "(both sentences read together, a regression head) on the other pairs and scores it on the same ones: "
    "pick that model above and this button shows its head's scores beside its cosine."
)
MAP_HELP = ("Words separated by commas; one sentence per line. Every occurrence of each word becomes a point; "
            "hover a point to see its sentence.")


class SimilarityPanel(Panel):
    """Cosine similarity of contextual vectors: token × token, one word across contexts, a 2-D map."""

    title = "Embeddings"
    teaches = (
        "A word's contextual vector changes with its context, and all vectors share a common direction, "
        "so similarity only means something above the random-pair baseline."
    )

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Tokenizer,
        text: str = DEFAULT_TEXT,
        word: str = DEFAULT_WORD,
        contexts: str = DEFAULT_CONTEXTS,
        map_words: str = DEFAULT_MAP_WORDS,
        map_sentences: str = DEFAULT_MAP_SENTENCES,
        sentences: str = DEFAULT_SENTENCES,
        max_shown: int = MAX_SHOWN,
    ) -> None:
        super().__init__()
        self.model, self.tok, self.max_shown = model, tok, max_shown
        self._baseline: Anisotropy | None = None  # per model; computed on first use
        self.hold = Hold()  # set while slider options are replaced (no redraw then)
        self.notes: list[list[tuple[Level, str]]] = [[] for _ in SECTIONS]  # each sub-tab's messages
        wide = widgets.Layout(width="min(100%, 720px)")
        box = widgets.Layout(width="min(100%, 720px)", height="10em")
        stages = stage_options(model.config.num_hidden_layers)

        # 1. token x token
        self.text = widgets.Textarea(value=text, description="Text", continuous_update=False,
                                     placeholder="Type a sentence, then press Show",
                                     layout=widgets.Layout(width="min(100%, 720px)", height="4.5em"))
        self.text_button = run_button()
        self.token_stage = widgets.SelectionSlider(options=stages, value=len(stages) - 1, description="Stage",
                                                   continuous_update=True, layout=wide)
        # 2. one word across contexts
        self.word = widgets.Text(value=word, description="Word", continuous_update=False,
                                 placeholder="a word in every context")
        self.contexts = widgets.Textarea(value=contexts, description="Contexts", continuous_update=False,
                                         placeholder="one sentence per line", layout=box)
        self.word_button = run_button("Compare")
        # 3. map of words
        self.map_words = widgets.Text(value=map_words, description="Words", continuous_update=False,
                                      placeholder="bank, river, money", layout=wide)
        self.map_sentences = widgets.Textarea(value=map_sentences, description="Sentences", continuous_update=False,
                                              placeholder="one sentence per line", layout=box)
        self.map_button = run_button("Map")
        self.map_stage = widgets.SelectionSlider(options=stages, value=len(stages) - 1, description="Stage",
                                                 continuous_update=True, layout=wide)
        # 4. sentences: one against several, and the cosine scored on SICK
        self.sentences = widgets.Textarea(value=sentences, description="Sentences", continuous_update=False,
                                          placeholder="the sentence on the first line, others below", layout=box)
        self.sentences_button = run_button("Compare")
        self.score_pairs = widgets.BoundedIntText(value=SCORE_PAIRS, min=2, max=10_000, description="Pairs",
                                                  layout=widgets.Layout(width="180px"))
        self.score_button = widgets.Button(description="Score on SICK", button_style="info",
                                           tooltip="Pearson and Spearman of the cosine on SICK's held-out pairs")
        self.score_out = widgets.HTML()
        self.score: CosineScore | None = None

        self.sections = widgets.Tab(children=[widgets.VBox() for _ in SECTIONS], titles=list(SECTIONS))
        # each sub-tab: how it computes (result, notes) or raises InputError
        self._computes = (self._compute_tokens, self._compute_word, self._compute_map, self._compute_sentences)
        for section in range(len(SECTIONS)):
            setattr(self, RESULTS[section], self._run(section))
        # Each FigureWidget starts from a complete figure (one filled after creation shows blank in Voilà).
        self.boxes = [widgets.Box([SyncedFigureWidget(self._figure(section))]) for section in range(len(SECTIONS))]
        self.sections.children = [
            widgets.VBox([help_note(TOKENS_HELP, "760px"), self.text, widgets.HBox([self.text_button]),
                          self.token_stage, self.message, self.boxes[0]]),
            widgets.VBox([help_note(CONTEXTS_HELP, "760px"), self.word, self.contexts, self.word_button, self.message,
                          self.boxes[1]]),
            widgets.VBox([help_note(MAP_HELP, "760px"), self.map_words, self.map_sentences, self.map_button,
                          self.map_stage, self.message, self.boxes[2]]),
            widgets.VBox([help_note(SENTENCES_HELP, "760px"), self.sentences, self.sentences_button, self.message,
                          self.boxes[3], widgets.HBox([self.score_pairs, self.score_button]), self.score_out]),
        ]  # one message line, shown in every sub-tab, holding the open sub-tab's notes
        self.show_messages(self.notes[0])

        inputs = ((self.text,), (self.word, self.contexts), (self.map_words, self.map_sentences), (self.sentences,))
        for section, (button, texts) in enumerate(zip(self._buttons(), inputs)):
            on_input(lambda _, section=section: self._on_input(section), button, *texts)
        self.token_stage.observe(self._on_token_stage, names="value")
        self.map_stage.observe(self._on_map_stage, names="value")
        self.score_button.on_click(self._on_score)
        self.sections.observe(self._on_section, names="selected_index")
        self._widget = widgets.VBox([self.sections, help_note(HELP, "760px")], layout=widgets.Layout(width="100%"))

    # the figure on show in each sub-tab
    token_figure = property(lambda self: self.boxes[0].children[0])
    word_figure = property(lambda self: self.boxes[1].children[0])
    map_figure = property(lambda self: self.boxes[2].children[0])
    sentences_figure = property(lambda self: self.boxes[3].children[0])

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        self.model, self.tok, self._baseline = model, tok, None
        self.score, self.score_out.value = None, ""  # the score was the previous model's
        for section in range(len(SECTIONS)):
            setattr(self, RESULTS[section], self._run(section))
        stages = stage_options(model.config.num_hidden_layers)
        for slider in (self.token_stage, self.map_stage):
            if slider.options != stages:  # another depth: keep the same stage where it exists
                value = min(slider.value, len(stages) - 1)
                with self.hold():
                    slider.options, slider.value = stages, value
        for section in range(len(SECTIONS)):
            self._redraw(section)

    def figures(self) -> dict[str, go.Figure]:
        shown = zip(("token cosine", "word across stages", "word map", "sentence cosine"), RESULTS, self.boxes)
        return {name: go.Figure(box.children[0]) for name, result, box in shown if getattr(self, result) is not None}

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_input(self, section: int) -> None:
        """New input in sub-tab `section`: compute and redraw it. On bad input its old figure goes too
        (its message says why): never an old result under a new error."""
        with self.busy(self._buttons()[section], text=BUSY[section]):
            setattr(self, RESULTS[section], self._run(section))
            self._redraw(section)

    def _on_token_stage(self, _=None) -> None:
        """Another stage of the same text: only the cosines and the title change."""
        if self.sim is None or self.hold:
            return
        with self.reporting():
            new = plot_token_similarity(self.sim, self.token_stage.value)
            with self.token_figure.batch_update():
                self.token_figure.data[0].z = new.data[0].z
                self.token_figure.layout.title.text = new.layout.title.text

    def _on_map_stage(self, _=None) -> None:
        """Another stage of the same points: only their places, the axes and the title change."""
        if self.proj is None or self.hold:
            return
        with self.reporting():
            new = plot_word_projection(self.proj, self.map_stage.value)
            with self.map_figure.batch_update():
                for old_trace, new_trace in zip(self.map_figure.data, new.data):
                    old_trace.x, old_trace.y = new_trace.x, new_trace.y
                self.map_figure.layout.title.text = new.layout.title.text
                self.map_figure.layout.xaxis.title.text = new.layout.xaxis.title.text
                self.map_figure.layout.yaxis.title.text = new.layout.yaxis.title.text

    def _on_section(self, change) -> None:
        section = change["new"]
        if section is None:
            return
        # Only the notes change: a figure made or redrawn while its sub-tab was hidden draws as the
        # kernel has it (SyncedFigureWidget), so it is never remade here. (Remaking it closed the old
        # widget while its view, just shown, still talked to the kernel: "No such comm".)
        self.show_messages(self.notes[section])

    def _buttons(self) -> tuple[widgets.Button, ...]:
        return self.text_button, self.word_button, self.map_button, self.sentences_button

    def _on_score(self, _=None) -> None:
        """Score the cosine on SICK's held-out pairs; on an error the old score goes too (its message says why)."""
        self.score, self.score_out.value = None, ""
        section = SECTIONS.index("Sentences")
        pairs = self.score_pairs.value
        with self.busy(self.score_button, self.sentences_button,
                       text=f"Encoding {pairs:,} SICK pairs and scoring the cosine…"):
            with self.reporting(self.score_out):
                held_out, where = sick_held_out(pairs)
                self.score = cosine_score(self.model, self.tok, held_out)
                head = self._head_scores(held_out)
                self.score_out.value = score_html(self.score, where, head)
                self.show_messages([])
            self.notes[section] = list(self.messages)

    # -- computations: each returns (result, notes) or raises InputError --------------------
    def _run(self, section: int):
        """Run one sub-tab's computation; its notes, or the error, become that sub-tab's messages."""
        result = None
        with self.reporting():
            result, notes = self._computes[section]()
            self.show_messages(notes)
        self.notes[section] = list(self.messages)
        self.show_messages(self.notes[self.sections.selected_index or 0])
        return result

    def _compute_tokens(self) -> tuple[TokenSimilarity, list[tuple[Level, str]]]:
        sim = token_similarity(self.model, self.tok, self.text.value)
        unknown = self.unknown_notes(sim.tokens, "they share one embedding")
        return first_similarity_tokens(sim, self.max_shown), token_notes(sim, self.max_shown, unknown)

    def _compute_word(self) -> tuple[WordAcrossContexts, list[tuple[Level, str]]]:
        senses, contexts = parse_contexts(self.contexts.value)
        result = word_in_contexts(self.model, self.tok, self.word.value, contexts, senses=senses,
                                  baseline=self.baseline())
        return result, word_notes(result)

    def _compute_map(self) -> tuple[WordProjection, list[tuple[Level, str]]]:
        words = [w for w in self.map_words.value.split(",") if w.strip()]
        proj = word_projection(self.model, self.tok, words, text_lines(self.map_sentences.value))
        return proj, map_notes(proj)

    def _head_scores(self, pairs: list) -> dict[str, float] | None:
        """A fine-tuned sts model's own scores on the same pairs (its head reads both sentences together),
        to show beside its encoder's cosine; None for any other model."""
        if model_task(self.model) != "sts":
            return None
        return evaluate(self.model, self.tok, "sts", pairs)

    def _compute_sentences(self) -> tuple[SentenceSimilarity, list[tuple[Level, str]]]:
        sentence, others = split_sentences(self.sentences.value)
        result = one_against_many(self.model, self.tok, sentence, others)
        return result, sentence_notes(result) + self.unknown_notes(result.tokens, "they share one vector")

    def baseline(self) -> Anisotropy:
        """The anisotropy baseline of the current model (built-in sentences, so no data set needed)."""
        if self._baseline is None:
            self._baseline = anisotropy_baseline(self.model, self.tok)
        return self._baseline

    # -- drawing --------------------------------------------------------------------------
    def _figure(self, section: int) -> go.Figure:
        """The figure of sub-tab `section`: its result at the chosen stage, or the hint that says how to get one."""
        result = getattr(self, RESULTS[section])
        if result is None:
            return empty_figure(HINTS[section])
        if section == 0:
            return plot_token_similarity(result, min(self.token_stage.value, result.num_stages - 1))
        if section == 1:
            return plot_word_across_layers(result)
        if section == 3:
            return plot_sentence_similarity(result)
        return plot_word_projection(result, min(self.map_stage.value, result.points.shape[0] - 1))

    def _redraw(self, section: int) -> None:
        """New result: show its figure in sub-tab `section` (in place when its traces are of the same kinds)."""
        show_figure(self.boxes[section], self._figure(section))
