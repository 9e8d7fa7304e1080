"""Family tab: one sentence through two to four models side by side (the picker's models): how each
tokenizer cuts it, each model's guesses for the same hidden word, where the parameters sit, and each
model's pre-training objective on that sentence; for an ELECTRA generator + discriminator, the
generator's replacements and the discriminator's verdict per piece."""

from __future__ import annotations

import html
import logging

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.family import (
    AttentionReach,
    Distillation,
    ElectraPicture,
    Loaded,
    ModelView,
    ScoreTerms,
    WordChoice,
    attention_changes,
    check_sentence,
    default_word,
    distillations,
    electra_demo,
    kind_note,
    view_model,
    word_choices,
)
from bertlab.analysis.replaced import ReplacedTokens
from bertlab.hub import RECOMMENDED
from bertlab.inputs import InputError
from bertlab.panels.base import Level, Panel
from bertlab.panels.classroom import AnswerHold
from bertlab.panels.family_both_ways import BothWaysSection
from bertlab.panels.state import ModelState
from bertlab.panels.views import Hold, on_input
from bertlab.settings import in_hub_cache
from bertlab.tokenizer import Tokenizer
from bertlab.training.preview import dynamic_draws
from bertlab.viz.family import (
    card_extra,
    followed_text,
    kinds_html,
    objective_html,
    objectives_html,
    plot_attention_reach,
    plot_electra,
    plot_masked_words,
    plot_parameters,
    plot_score_terms,
    plot_token_cuts,
)
from bertlab.viz.figure_widget import box_figures, show_figure, show_or_clear
from bertlab.viz.replaced import plot_replaced
from bertlab.viz.theme import help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog. It sleeps in the sun."
SLOTS = 4  # models side by side at most
NONE = "—"
HUB = "hub:"  # option values of hub-cache models not loaded yet
HELP = (
    "Pick two to four models (the model list above: the offline default, models you loaded or trained; "
    "and models in this machine's hub cache). Each reads the same sentence with its own tokenizer; choose "
    "a word to hide and compare their guesses. A word may be several pieces: then every piece is hidden "
    "behind the model's own mask token and the bars show the guesses for the first piece. Pick an ELECTRA "
    "generator and its discriminator together to watch replaced-token detection."
)
ONE_MODEL = ("Only one model is picked: add another (load one in the model list above, e.g. a folder or a "
             "cached hub model, or train one in the Pre-training tab) to compare the family side by side.")


class FamilyPanel(Panel):
    """The family side by side on one sentence."""

    title = "Family"
    teaches = ("BERT, RoBERTa, ALBERT, DistilBERT and ELECTRA side by side on one sentence: their tokenizers, "
               "their guesses for a hidden word, where their parameters sit, and what each was pre-trained to do.")
    uses_state = True  # the app passes its ModelState: the tab lists the picker's models

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, state: ModelState | None = None,
                 text: str = DEFAULT_TEXT, k: int = 5, seed: int = 0, workspace: Workspace | None = None) -> None:
        super().__init__()
        self.answer_hold = AnswerHold.of_kernel()  # the class question's answer, until the teacher reveals it
        self.state = state or ModelState(model, tok, name="this model")
        self.workspace = workspace
        self.seed = seed
        self.views: list[ModelView] = []
        self.picture: ElectraPicture | None = None
        self.replaced: ReplacedTokens | None = None
        self.distilled: dict[str, tuple[str, Distillation]] = {}  # student -> (teacher, the loss on the word)
        # what a member changed in attention, on the sentence: (model name, result) of the first that has it
        self.reach: tuple[str, AttentionReach] | None = None  # a local band beside full attention
        self.terms: tuple[str, ScoreTerms] | None = None  # disentangled score terms of one head
        self._loaded: list[Loaded] = []
        self.hold = Hold()  # set while the tab fills its own dropdowns: no run then
        self.text = widgets.Textarea(value=text, description="Sentence", continuous_update=False,
                                     layout=widgets.Layout(width="min(100%, 720px)", height="3.2em"))
        self.slots = [widgets.Dropdown(description=f"Model {i + 1}", layout=widgets.Layout(width="min(100%, 340px)"))
                      for i in range(SLOTS)]
        self.word = widgets.Dropdown(description="Hide word", layout=widgets.Layout(width="min(100%, 260px)"))
        self.k = widgets.IntSlider(value=k, min=1, max=10, description="Top k", continuous_update=False,
                                   layout=widgets.Layout(width="min(100%, 260px)"))
        self.compare_button = widgets.Button(description="Compare", button_style="primary",
                                             tooltip="Run the sentence through every picked model")
        self.draw_button = widgets.Button(description="ELECTRA: draw again",
                                          tooltip="Mask other pieces and let the generator sample again")
        self.help = widgets.HTML(help_html(html.escape(HELP)))
        self.cuts_box, self.mask_box, self.params_box, self.electra_box = (widgets.VBox([]) for _ in range(4))
        self.band_box, self.terms_box = widgets.VBox([]), widgets.VBox([])
        self.kinds = widgets.HTML()
        self.objectives = widgets.HTML()
        self.both = BothWaysSection(self._on_both)  # an encoder beside a left-to-right model
        self._fill_options(first=True)
        self._fill_words()
        self.update()
        on_input(self._on_change, *self.slots, self.word, self.k)
        self.text.observe(self._on_text, names="value")
        self.compare_button.on_click(lambda _: self.update())
        self.draw_button.on_click(self._on_draw)
        self.state.observe(self._on_state)
        self._widget = widgets.VBox([
            self.help,
            widgets.HBox(self.slots[:2], layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox(self.slots[2:], layout=widgets.Layout(flex_flow="row wrap")),
            self.text,
            widgets.HBox([self.word, self.k, self.compare_button], layout=widgets.Layout(flex_flow="row wrap")),
            self.message,
            self.cuts_box, self.kinds, self.mask_box, self.params_box, self.band_box, self.terms_box,
            self.both.widget,
            widgets.HTML('<div style="font-weight:600;margin-top:8px">Pre-training objectives on this sentence</div>'),
            self.objectives,
            widgets.HBox([self.draw_button]), self.electra_box,
        ], layout=widgets.Layout(width="100%"))

    # -- the model list ------------------------------------------------------------------------------
    def options(self) -> list[tuple[str, str]]:
        """(label, value) of the models a slot may show: the picker's, then cached hub models not loaded yet."""
        out = [(NONE, "")] + [(name, name) for name in self.state.entries]
        listed = {e.source for e in self.state.entries.values() if e.source}
        out += [(f"{m.name} (hub cache)", HUB + m.name) for m in RECOMMENDED
                if m.name not in listed and m.name not in self.state.entries and in_hub_cache(m.name)]
        return out

    def _fill_options(self, first: bool = False) -> None:
        options = self.options()
        values = [v for _, v in options]
        with self.hold():
            for i, slot in enumerate(self.slots):
                old = slot.value if not first else None
                if old and old.startswith(HUB) and old.removeprefix(HUB) in values:  # a hub model just loaded
                    old = old.removeprefix(HUB)
                slot.options = options
                if first:
                    slot.value = self._default_for(i)
                else:
                    slot.value = old if old in values else ""

    def _default_for(self, i: int) -> str:
        """Slot 1: the picker's current model; slot 2: another loaded model (none when there is none)."""
        loaded = [n for n, e in self.state.entries.items() if e.loaded and n != self.state.name]
        return {0: self.state.name, 1: loaded[0] if loaded else ""}.get(i, "")

    def _fill_words(self) -> None:
        """The words of the sentence, offered for hiding; keeps the chosen one when it is still there."""
        try:
            words = word_choices(self.text.value)
        except InputError:
            words = []
        old = self.word.value
        with self.hold():
            self.word.options = [(f"{w.index + 1}. {w.text}", w) for w in words]
            same = [w for w in words if old is not None and (w.text, w.index) == (old.text, old.index)]
            self.word.value = same[0] if same else (default_word(words) if words else None)

    def _on_state(self, state: ModelState) -> None:
        """A model joined the picker's list (or it switched): offer it."""
        self._fill_options()

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """The picker switched: Model 1 shows the picked model, as every tab shows it, and the tab says so
        where the student reads, naming the model it replaced (one pick away in another slot)."""
        before = self.slots[0].value
        self._fill_options()
        with self.hold():
            self.slots[0].value = self.state.name
        self.update()
        if before and before != self.state.name:
            kept = [i + 1 for i, s in enumerate(self.slots) if i and s.value == before]
            self.show_messages(self.messages + [("info", followed_text(self.state.name, before.removeprefix(HUB),
                                                                       kept))])

    def pick(self, *names: str) -> None:
        """Show these models (picker names, at most four), then compare once."""
        values = [v for _, v in self.slots[0].options]
        unknown = [n for n in names if n not in values]
        if unknown or len(names) > SLOTS:
            raise ValueError(f"pick up to {SLOTS} of {', '.join(v for v in values if v)}; not {unknown}.")
        with self.hold():
            for i, slot in enumerate(self.slots):
                slot.value = names[i] if i < len(names) else ""
        self.update()

    # -- callbacks ---------------------------------------------------------------------------------------
    def _on_text(self, _=None) -> None:
        self._fill_words()
        self.update()

    def _on_change(self, _=None) -> None:
        if not self.hold:
            self.update()

    def _on_both(self) -> None:
        """The section's layer or head changed: compare the pair again (the rest stays)."""
        with self.busy(self.compare_button, text="Comparing both ways and left to right…"):
            with self.reporting():
                self.both.redo(self.text.value, self.word.value, self.k.value)
            self.both.draw()

    def _on_draw(self, _=None) -> None:
        self.seed += 1
        self.update()

    def update(self) -> None:
        """Run the sentence through every picked model and redraw (errors in the page, figures cleared)."""
        with self.busy(self.compare_button, self.draw_button, text="Running the sentence through the models…"):
            drawn = False
            with self.reporting():
                self._forget()
                notes = self._compute()
                self._draw()  # in place where a figure is on show already (smooth in the browser)
                self.show_messages(notes)
                drawn = True
            if not drawn:  # an old result never sits under a new message
                self._clear()

    def _forget(self) -> None:
        """No results (before a run, or when it failed)."""
        self.views, self.picture, self.replaced, self.distilled, self._loaded = [], None, None, {}, []
        self.reach = self.terms = None
        self.both.result = None

    def _clear(self) -> None:
        self._forget()
        for box in (self.cuts_box, self.mask_box, self.params_box, self.electra_box, self.band_box, self.terms_box):
            box.children = ()
        self.kinds.value = self.objectives.value = ""
        self.draw_button.layout.display = "none"
        self.both.clear()

    def _compute(self) -> list[tuple[Level, str]]:
        text = check_sentence(self.text.value)
        self.answer_hold.check(text, self.state.tok.mask_token)
        word: WordChoice | None = self.word.value
        notes: list[tuple[Level, str]] = []
        loaded = self._load_picked(notes)
        if not loaded:
            raise InputError("Pick at least one model that loads (Model 1 … Model 4).")
        if len(loaded) == 1:
            notes.append(("info", ONE_MODEL))
        for m in loaded:
            try:
                view = view_model(m.name, m.model, m.tok, text, word, self.k.value)
            except InputError as e:
                notes.append(("warning", f"{m.name}: {e}"))
                continue
            notes += [(level, f"{m.name}: {t}") for level, t in view.notes]  # type: ignore[misc]
            self.views.append(view)
        self._loaded = loaded
        self.picture, self.replaced, electra = electra_demo(self.views, loaded, text, word, self.seed)
        self.distilled, distil = distillations(self.views, loaded, text, word)
        self.reach, self.terms = attention_changes(self.views, loaded, text)
        shown = {v.name for v in self.views}
        self.both.compute([m for m in loaded if m.name in shown], text, word, self.k.value)
        return notes + electra + distil

    def _load_picked(self, notes: list[tuple[Level, str]]) -> list[Loaded]:
        """The picked models, loaded (a model that fails to load becomes an error note; the others show)."""
        out: list[Loaded] = []
        seen: set[str] = set()
        for slot in self.slots:
            value = slot.value
            if not value or value in seen:
                continue
            seen.add(value)
            try:
                out.append(self._get(value))
            except Exception as e:  # noqa: BLE001 (a broken folder or checkpoint: say which, keep the rest)
                log.info("family tab: %s did not load: %s", value, e)
                shown = value.removeprefix(HUB)
                notes.append(("error", f"{shown} could not be loaded ({str(e)[:160]}); pick another model."))
        return out

    def _get(self, value: str) -> Loaded:
        from bertlab.loading import load

        if value.startswith(HUB):  # a cached hub model: load it and list it in the picker too
            name = value.removeprefix(HUB)
            where = (self.workspace or Workspace.for_session()).model_source(name)
            model, tok = load(where)
            listed = self.state.add(name, model, tok, source=where)
            with self.hold():
                for slot in self.slots:
                    if slot.value == value:
                        slot.value = listed
            return Loaded(listed, model, tok)
        entry = self.state.entries[value]
        if not entry.loaded:
            entry.model, entry.tok = load(entry.source)
        return Loaded(value, entry.model, entry.tok)

    # -- drawing -----------------------------------------------------------------------------------------
    def _draw(self) -> None:
        views = self.views
        if not views:
            self._clear()
            return
        show_figure(self.cuts_box, plot_token_cuts([(v.name, v.cut) for v in views]))
        kinds = {}
        for v in views:
            m = self._loaded_of(v.name)
            if m is not None:
                kinds.setdefault(v.cut.kind_name, kind_note(v.cut.kind, m.tok))
        self.kinds.value = kinds_html(kinds)
        rows = [(v.name, v.masked, "no MLM head: it does not guess words" if v.masked is None else "")
                for v in views]
        show_or_clear(self.mask_box, plot_masked_words(rows) if any(v.masked is not None for v in views) else None)
        show_figure(self.params_box, plot_parameters([(v.name, v.params) for v in views]))
        show_or_clear(self.band_box, None if self.reach is None else plot_attention_reach(*self.reach))
        show_or_clear(self.terms_box, None if self.terms is None else plot_score_terms(*self.terms))
        self.both.draw()
        self.objectives.value = objectives_html([objective_html(v, self._extra(v)) for v in views])
        self.draw_button.layout.display = None if self.picture is not None else "none"
        show_or_clear(self.electra_box, plot_electra(self.picture) if self.picture is not None
                      else None if self.replaced is None else plot_replaced(self.replaced))

    def _loaded_of(self, name: str) -> Loaded | None:
        return next((m for m in self._loaded if m.name == name), None)

    def _extra(self, view: ModelView) -> str:
        """What a card adds for its objective (see `card_extra`): RoBERTa's card, the sentence in three epochs."""
        m = self._loaded_of(view.name)
        if view.objective is None or m is None:
            return ""
        draws: list | str | None = None
        if view.objective.demo == "dynamic":
            try:
                draws = dynamic_draws(m.tok, self.text.value, "token", 0.15, self.seed, epochs=3)
            except (ValueError, IndexError) as e:
                draws = str(e)
        return card_extra(view, draws, self.distilled.get(view.name))

    def figures(self) -> dict[str, go.Figure]:
        return box_figures({"tokenizers": self.cuts_box, "hidden word": self.mask_box, "parameters": self.params_box,
                            "ELECTRA": self.electra_box, "attention band": self.band_box,
                            "score terms": self.terms_box, "both ways": self.both.box})
