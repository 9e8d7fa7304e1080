"""Mask tab: hide words (click them, or type [MASK]) and see what the MLM head guesses for each;
or hide every word in turn to see which words the context gives away."""

from __future__ import annotations

import html
from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attribution import ExplainInput, Target
from bertlab.analysis.mask import (
    MaskPrediction,
    WordScore,
    fill_mask,
    first_words,
    mask_each_word,
    next_word,
    read_words,
)
from bertlab.analysis.replaced import ReplacedTokens, replaced_tokens
from bertlab.analysis.targets import input_from_tokens, word_target
from bertlab.classroom.store import QuestionStore
from bertlab.inputs import InputError
from bertlab.panels.base import Level, Panel, lacks, unknown_notes
from bertlab.panels.classroom import POLL_LIVE_S, AnswerHold
from bertlab.panels.explain import ExplainSection
from bertlab.panels.views import Hold, above, class_question, hidden_by
from bertlab.tokenizer import Tokenizer, spell_specials
from bertlab.viz.figure_widget import show_figure, show_or_clear, shown_figure
from bertlab.viz.mask import (
    empty_figure,
    guess_notes,
    help_text,
    plot_fill_mask,
    plot_word_predictability,
    reads_html,
    score_notes,
    update_fill_mask,
    word_tip,
)
from bertlab.viz.replaced import plot_replaced
from bertlab.viz.theme import help_html

DEFAULT_TEMPLATE = "The man went to the {mask} to buy a gallon of milk."  # spelled with the model's mask token
DEFAULT_TEXT = spell_specials(DEFAULT_TEMPLATE)  # as the offline default (WordPiece) spells it
NEXT_WORD_TEXT = "The man went to the store to buy a gallon of"  # a left-to-right model guesses what follows
NEXT_WORD_NOTE = (
    "This {title} model was trained to guess the next word{why}, so it does not fill in a hidden word: here are "
    "its guesses for the word after your text. BERT masks words because a model that reads both ways would see the "
    "word it is asked to predict."
)
LEFT_TO_RIGHT = " (it reads left to right: each word sees only the words before it)"
K_MAX = 20  # guesses computed per [MASK]; the slider shows the first k (moving it never re-runs the model)
MAX_WORD_BUTTONS = 120  # one toggle per word up to here; later words can still be hidden by typing [MASK]
MAX_EACH_WORDS = 64  # "mask each word in turn" runs the model once per word: longer texts are cut here
CACHE_SIZE = 64  # remembered fill-mask results (text, hidden words, whole-word) per model
NOTHING_HIDDEN_TEMPLATE = (
    "Nothing is hidden yet: click a word above to hide it, or type {mask} in the text "
    "(e.g. 'The cat sat on the {mask}.')."
)
NOTHING_HIDDEN = spell_specials(NOTHING_HIDDEN_TEMPLATE)
REPLACED_HELP = (
    "Replaced? ELECTRA's discriminator was trained to spot words that a small generator swapped in. Each bar "
    "is, for one word of the text, the probability that it was replaced (red above 50%). Change a word to a "
    "plausible wrong one (e.g. 'bought' to 'ate') and see whether the discriminator notices."
)


class MaskPanel(Panel):
    """Top-k guesses for hidden words, and how predictable each word of a sentence is."""

    title = "Mask"
    teaches = (
        "BERT is trained to guess hidden words from both sides of the context: hide some and read its "
        "guesses, or hide each word in turn to see which words the context gives away."
    )

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, text: str | None = None, k: int = 5,
                 classroom: QuestionStore | None = None, class_poll_s: float | None = POLL_LIVE_S) -> None:
        """`classroom`: the class store whose questions this tab shows (default: the kernel's own,
        `BERTLAB_CLASS_STORE`, in class mode; none otherwise)."""
        super().__init__()
        self._read_text: str | None = None  # the text the word buttons were made from
        self.model, self.tok = model, tok
        if text is None:
            text = NEXT_WORD_TEXT if self._next_word_model(model) else tok.spell(DEFAULT_TEMPLATE)
        self.text = widgets.Textarea(
            value=text, description="Text", placeholder=f"Type a sentence; put {tok.mask_token} where a word should go",
            continuous_update=False, layout=widgets.Layout(width="min(100%, 720px)", height="4.5em"),
        )
        self.predict_button = widgets.Button(description="Predict", button_style="primary",
                                             tooltip="Run the model on the text")
        self.k = widgets.IntSlider(value=min(max(k, 1), K_MAX), min=1, max=K_MAX, description="Top k")
        self.whole_word = widgets.Checkbox(value=False, description="Whole-word masking", indent=False,
                                           tooltip="Hide every piece of a clicked word, not only the first")
        self.each_button = widgets.Button(description="Mask each word in turn", layout=widgets.Layout(width="auto"),
                                          tooltip="Hide every word once and colour it by how well it is guessed back")
        self.scale = widgets.ToggleButtons(options=[("probability", "probability"), ("log10", "log10")],
                                           value="probability", description="Colour by",
                                           style=widgets.ToggleButtonsStyle(button_width="auto"))
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="Scoring",
                                            layout=widgets.Layout(display="none"))
        self.word_buttons = widgets.Box(layout=widgets.Layout(display="flex", flex_flow="row wrap", width="100%"))
        self.reads = widgets.HTML()  # the text as the model reads it, hidden pieces marked
        self.help = widgets.HTML(help_html(html.escape(help_text(tok))))

        self.words: list[str] = []
        self.hidden: set[int] = set()  # words hidden by clicking, indices as in text_words
        self.predictions: list[MaskPrediction] = []  # K_MAX guesses per [MASK]; [] when there is nothing to show
        self.scores: list[WordScore] | None = None  # "mask each word in turn"; None when not on show
        self.replaced: ReplacedTokens | None = None  # ELECTRA's discriminator: P(replaced) per word
        self.scoring = False  # the student asked for the word scores: keep them in step with the text
        self._word_notes: list[tuple[Level, str]] = []
        self._cut = False  # the text is longer than the model reads
        self._fill_notes: list[tuple[Level, str]] = []
        self._each_notes: list[tuple[Level, str]] = []
        self._cache: dict[tuple[str, tuple[int, ...], bool], list[MaskPrediction]] = {}
        self._buttons: list[widgets.ToggleButton] = []  # one per word place, reused from text to text
        self._relabelling = Hold()  # set while the words are put on the buttons (not the student's clicks)
        self._drawn: tuple[list[MaskPrediction], int] | None = None  # (guesses, k) on show: not redrawn unchanged

        self.fill_box = widgets.VBox([])
        self.fill_box.add_class("bertlab-mask-guesses")  # for the browser tests
        self.each_box = widgets.VBox([])  # filled when the student asks for it
        self.explain = ExplainSection(model, tok, self._explain_request, host=self)  # "Does attention explain it?"
        self.class_box = class_question(  # the teacher's question, in class mode
            classroom, "mask", (self.fill_box, self.each_box, self.explain.widget), poll_s=class_poll_s,
            mask_token=tok.mask_token, on_change=self._on_question)
        self.answer_hold = AnswerHold(self.class_box.store if self.class_box else None)  # the answer, until the reveal
        self._on_text()

        self.text.observe(self._on_text, names="value")
        self.predict_button.on_click(self._on_predict)
        self.whole_word.observe(self._on_hidden, names="value")
        self.k.observe(self._on_k, names="value")
        self.each_button.on_click(self._on_each)
        self.scale.observe(self._on_scale, names="value")
        self._widget = widgets.VBox(
            above(self.class_box, [
                widgets.HBox([self.text, self.predict_button]),
                self.word_buttons,
                self.reads,
                widgets.HBox([self.k, self.whole_word], layout=widgets.Layout(align_items="center")),
                self.message,
                self.fill_box,
                self.explain.widget,
                widgets.HBox([self.each_button, self.scale, self.progress],
                             layout=widgets.Layout(flex_flow="row wrap")),
                self.each_box,
                self.help,
            ]),
            layout=widgets.Layout(width="100%"),
        )

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Same text and hidden words, another model (and maybe another tokenizer: words re-read)."""
        self.model, self.tok = model, tok
        self._cache.clear()
        self._drawn = None  # drawn whole again (the theme may have changed too)
        self.explain.set_model(model, tok, refresh=False)  # _on_text refreshes it
        self._on_text()

    def figures(self) -> dict[str, go.Figure]:
        if hidden_by(self.class_box):  # not even through Export before the guess
            return {}
        out = {}
        if self.predictions:
            out["guesses for the hidden words"] = go.Figure(self.fill_box.children[0])
        if self.scores:
            out["how predictable each word is"] = go.Figure(self.each_box.children[0])
        if self.replaced is not None:
            out["replaced? per word"] = go.Figure(self.fill_box.children[0])
        return {**out, **self.explain.figures()}

    def _on_question(self) -> None:
        """The class question came, was revealed or went: guesses already on show for its sentence are
        held back now, or computed again after the reveal (cached: no model run for other sentences)."""
        with self.reporting():
            self._refresh(rescore=self.scoring)

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_predict(self, _=None) -> None:
        # In the browser a click often follows the edit that already redrew (the box sends its
        # value when it loses focus): read again only a text not read yet.
        if self.text.value != self._read_text:
            self._on_text()

    def _on_text(self, _=None) -> None:
        self._read_text = self.text.value
        with self.busy(self.predict_button, self.each_button), self.reporting():
            self._read_words()
            self._refresh(rescore=self.scoring)
            self._label_words()  # after the chart: the page draws the guesses first

    def _on_word(self, index: int, change) -> None:
        if self._relabelling or change["owner"].disabled:
            return
        with self.reporting():
            (self.hidden.add if change["new"] else self.hidden.discard)(index)
            change["owner"].button_style = "warning" if change["new"] else ""
            self._refresh(rescore=False)

    def _on_hidden(self, _=None) -> None:
        with self.reporting():
            self._refresh(rescore=False)

    def _on_k(self, _=None) -> None:
        """Only the number of bars changes: no model run, the figure is patched in place."""
        with self.reporting():
            if self.predictions:
                self._draw_fill()

    def _on_each(self, _=None) -> None:
        with self.busy(self.predict_button, self.each_button, text="Hiding each word in turn…"), self.reporting():
            self.scoring = True
            self._refresh(rescore=True)

    def _on_scale(self, _=None) -> None:
        with self.reporting():
            self._draw_scores()

    def _refresh(self, rescore: bool) -> None:
        """Recompute the guesses (cached), and the word scores if asked, and redraw."""
        usable = self._predict()
        self._draw_fill()
        if rescore:
            self._score_words(usable)
            self._draw_scores()
        self._show_notes()
        self.explain.set_choices([f"guess for {p.label}" for p in self.predictions])
        self.explain.refresh()  # after the tab's notes: the section points at them when it has nothing

    @staticmethod
    def _next_word_model(model: torch.nn.Module) -> bool:
        """A model with a next-word head (GPT-2, a next-token BERT): the tab guesses the word after the text."""
        return bool(getattr(model, "has_lm", False))

    # -- the words to click --------------------------------------------------------------------
    def _read_words(self) -> None:
        """Split the text into words; a word stays hidden if it is still the same word at the same place."""
        old = self.words
        self.words, warning, self._cut = read_words(self.model, self.tok, self.text.value)
        self._word_notes = [("warning", warning)] if warning else []
        if len(self.words) > MAX_WORD_BUTTONS:
            self._word_notes.append((
                "info", f"Only the first {MAX_WORD_BUTTONS} words have a button: type {self.tok.mask_token} to hide "
                "a later word.",
            ))
        self.hidden = {i for i in self.hidden if i < len(self.words) and i < len(old) and old[i] == self.words[i]}

    def _label_words(self) -> None:
        """Put the words on the toggles, making only those a longer text needs."""
        shown = self.words[:MAX_WORD_BUTTONS]
        while len(self._buttons) < len(shown):  # made once per place, then relabelled: an edit sends what changed
            self._buttons.append(self._word_button(len(self._buttons)))
        with self._relabelling():
            for i, word in enumerate(shown):
                self._label(self._buttons[i], i, word)
        if len(self.word_buttons.children) != len(shown):
            self.word_buttons.children = self._buttons[:len(shown)]

    def _word_button(self, index: int) -> widgets.ToggleButton:
        button = widgets.ToggleButton(layout=widgets.Layout(width="auto", margin="1px"))
        button.observe(lambda change: self._on_word(index, change), names="value")
        return button

    def _label(self, button: widgets.ToggleButton, index: int, word: str) -> None:
        """Show `word` (the index-th) on `button`: hidden or not, fixed when there is nothing to hide."""
        hidden = word == self.tok.mask_token or index in self.hidden
        tip, fixed = word_tip(self.tok, word)  # fixed: nothing to hide, the button only shows the word
        with button.hold_sync():
            button.value, button.disabled, button.tooltip = hidden, fixed, tip
            button.description = word if len(word) <= 18 else word[:17] + "…"
            button.button_style = "warning" if hidden else ""

    # -- computing -------------------------------------------------------------------------------
    def _predict(self) -> bool:
        """K_MAX guesses for the current text and hidden words (cached), or [] and a note saying why
        not. False when the model or the text cannot be used at all."""
        self.predictions, self._fill_notes, self.replaced = [], [], None
        if self._next_word_model(self.model):
            return self._predict_next()
        if not self.model.has_mlm:
            self._fill_notes = [("warning", lacks(self.model, "mlm_head"))]
            if getattr(self.model, "has_rtd", False) and self.text.value.strip():
                try:
                    self.replaced = replaced_tokens(self.model, self.tok, self.text.value)
                except InputError as e:
                    self._fill_notes.append(("error", str(e)))
                else:
                    self._fill_notes = [("info", f"This {self.model.family.name} model has no MLM head, so it "
                                                 f"guesses no hidden words. {REPLACED_HELP}")] + (
                        [("warning", self.replaced.warning)] if self.replaced.warning else [])
            return False
        held = self.answer_hold.note(self.text.value, self.tok.mask_token)
        if held is not None:
            self._fill_notes = [("info", held)]
            return False
        if self.words and not self.hidden and self.tok.mask_token not in self.words and not self._cut:
            self._fill_notes = [("info", NOTHING_HIDDEN)]
            return True
        key = (self.text.value, tuple(sorted(self.hidden)), self.whole_word.value)
        try:
            if key not in self._cache:
                if len(self._cache) >= CACHE_SIZE:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = fill_mask(self.model, self.tok, key[0], K_MAX, list(key[1]), key[2])
        except InputError as e:
            self._fill_notes = [("error", str(e))]
            return False
        self.predictions = self._cache[key]
        unknown = unknown_notes(self.predictions[0].tokens, self.tok.id_to_token(self.tok.unk_token_id),
                                "the model cannot guess them, nor use them as context")
        self._fill_notes = guess_notes(self.predictions, self.words, self.hidden, self.whole_word.value, self.tok,
                                       unknown)
        return True

    def _predict_next(self) -> bool:
        """A left-to-right model: K_MAX guesses for the token after the text, and the note saying why."""
        why = LEFT_TO_RIGHT if self.model.family.causal else ""
        note = ("info", NEXT_WORD_NOTE.format(title=self.model.family.title, why=why))
        if not self.text.value.strip():
            self._fill_notes = [note, ("info", "Type the start of a sentence to see what it guesses comes next.")]
            return False
        key = (self.text.value, (), False)
        try:
            if key not in self._cache:
                if len(self._cache) >= CACHE_SIZE:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = [next_word(self.model, self.tok, self.text.value, K_MAX)]
        except InputError as e:
            self._fill_notes = [("error", str(e))]
            return False
        self.predictions = self._cache[key]
        warning = self.predictions[0].warning
        self._fill_notes = [note] + ([("warning", warning)] if warning else [])
        return False  # nothing to score word by word: that hides each word, which needs an MLM head

    def _score_words(self, usable: bool) -> None:
        """Hide each word in turn (at most MAX_EACH_WORDS, the text cut after them), with a progress
        bar; nothing when the text or model is unusable (the guesses' note already says why)."""
        self.scores, self._each_notes = None, []
        if not usable:
            return
        text, cut = first_words(self.tok, self.text.value, MAX_EACH_WORDS)
        self.progress.value, self.progress.layout.display = 0, None

        def progress(done: int, total: int) -> None:
            self.progress.max, self.progress.value = total, done

        try:
            self.scores = mask_each_word(self.model, self.tok, text, progress=progress)
        except InputError as e:
            self._each_notes = [("error", str(e))]
            return
        finally:
            self.progress.layout.display = "none"
        self._each_notes = score_notes(self.scores, self.tok)
        if cut:
            self._each_notes.append((
                "warning",
                (f"Only the first {MAX_EACH_WORDS} words were scored (one model run per word), and the model "
                 "read only those: shorten the text to score all of it."),
            ))

    # -- drawing ---------------------------------------------------------------------------------
    def _draw_fill(self) -> None:
        """The guesses (top k of each) and the text as the model reads it; a hint when there are none."""
        rtd = self.replaced is not None  # a discriminator hides nothing: no word buttons, top k or whole words
        ahead = self._next_word_model(self.model)  # a left-to-right model hides nothing either: it reads on
        for w in (self.word_buttons, self.k, self.whole_word):
            w.layout.display = "none" if rtd or (ahead and w is not self.k) else None
        for w in (self.each_button, self.scale, self.explain.widget):
            w.layout.display = "none" if ahead else None
        if rtd or not self.predictions:
            self._drawn = None  # the guesses' figure makes way: the next one is drawn whole
        if rtd:
            self.reads.value = ""
            show_figure(self.fill_box, plot_replaced(self.replaced))
            return
        if not self.predictions:
            self.reads.value = ""
            hint = "This model cannot guess hidden words." if not self.model.has_mlm else (
                f"Click a word above, or type {self.tok.mask_token} in the text, to see the model's guesses.")
            show_figure(self.fill_box, empty_figure(hint))
            return
        self.reads.value = reads_html(self.predictions[0].tokens, self.tok)
        k = self.k.value
        if self._drawn is not None and self._drawn[0] is self.predictions and self._drawn[1] == k:
            return  # the cache handed back the guesses on show: nothing changed
        shown = [replace(p, candidates=p.candidates[:k]) for p in self.predictions]
        fig = shown_figure(self.fill_box)
        if self._drawn is None or fig is None or not update_fill_mask(fig, shown):
            show_figure(self.fill_box, plot_fill_mask(shown, mask_token=self.tok.mask_token))
        self._drawn = (self.predictions, k)

    def _draw_scores(self) -> None:
        show_or_clear(self.each_box, None if self.scores is None else plot_word_predictability(
            self.scores, scale=self.scale.value, unk_token=self.tok.unk_token))

    def _explain_request(self, which: int) -> tuple[ExplainInput, Target]:
        """The hidden piece "Does attention explain it?" explains: its true piece when a word was hidden,
        else the model's top guess."""
        self.model.require("mlm")
        if not self.predictions:
            raise InputError(f"Nothing is hidden: hide a word (or type {self.tok.mask_token}) to explain a guess.")
        p = self.predictions[min(which, len(self.predictions) - 1)]
        ex = input_from_tokens(self.model, self.tok, p.tokens)
        return ex, word_target(self.tok, ex, p.position, p.original_id if p.original_id is not None else p.top.token_id)

    def _show_notes(self) -> None:
        self.show_messages(self._fill_notes + self._each_notes + self._word_notes)
