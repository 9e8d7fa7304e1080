"""Use it: a fine-tuned model on the student's own text (class probabilities, entailment, relatedness,
entities or the answer span), why it answered so, and the [CLS] vectors of dev examples before and after fine-tuning."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.analysis.attribution import ExplainInput, Target
from bertlab.analysis.predict import answer, classify, cls_maps, entail, entities, relatedness
from bertlab.analysis.sample_size import examples_text, too_few
from bertlab.analysis.targets import class_target, explain_choices, span_target, tag_target
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.panels.base import Level, Panel, input_notes
from bertlab.panels.explain import ExplainSection
from bertlab.runtime import input_limit
from bertlab.tasks import subset
from bertlab.tasks.models import model_task
from bertlab.tokenizer import DEFAULT_SPECIALS, Tokenizer
from bertlab.viz.figure_widget import show_figure
from bertlab.viz.finetune import (
    answer_html,
    entities_html,
    plot_class_probabilities,
    plot_cls_pca,
    plot_span_probabilities,
    relatedness_html,
    top_spans_html,
    using_html,
)
from bertlab.viz.theme import FAINT, help_html

PCA_SAMPLE = 200  # dev examples in the [CLS] picture
PICKED = "the model picked above"  # the name "Use it" gives the picker's model (no run of this tab made it)
USE_HELP = (
    "Try the model just made (or a fine-tuned model picked above) on your own text. "
    "The {cls} picture projects dev examples onto 2 axes before and after fine-tuning."  # the model's {cls}
)
DEFAULT_SENTENCE = "A gripping, funny and beautifully acted film."
DEFAULT_PREMISE, DEFAULT_HYPOTHESIS = "A man is playing a guitar on a stage.", "A person is playing an instrument."
DEFAULT_NER_TEXT = "Angela Merkel met Emmanuel Macron in Paris to talk about Airbus and the European Union."
DEFAULT_QUESTION = "Who designed the Eiffel Tower?"
DEFAULT_PARAGRAPH = (
    "The Eiffel Tower was built for the 1889 World's Fair in Paris. It was designed by the engineering "
    "company of Gustave Eiffel and is 330 metres tall, the tallest structure in the city."
)


class UsePanel(Panel):
    """Class probabilities, entailment, entities or the answer span of a fine-tuned model, and
    the [CLS] vectors of dev examples before and after fine-tuning."""

    title = "Use it"
    teaches = "A fine-tuned head turns the encoder's vectors into a task's answer: try it on your own text."

    def __init__(self, model: Bert | None = None, tok: Tokenizer | None = None,
                 dev_examples: Callable[[str], list[Any]] | None = None) -> None:
        super().__init__()
        self.model: Bert | None = None
        self.tok = tok
        self.name = ""
        self.kind: str | None = None  # sst2, nli, sts, classification, ner, qa
        self.task: str | None = None  # the fine-tuning task the model came from, when known
        self.before: Bert | None = None
        self.dev: list[Any] | None = None
        self.dev_examples = dev_examples
        self._figures: dict[str, go.Figure] = {}  # the view's figure (by name), on show
        self._pca_figure: go.Figure | None = None
        wide = widgets.Layout(width="min(100%, 720px)")

        def button(text: str, tip: str) -> widgets.Button:
            b = widgets.Button(description=text, button_style="primary", tooltip=tip)
            b.on_click(lambda _: self.update())
            return b

        def text_box(view: str, value: str, description: str, area: bool = False,
                     placeholder: str = "") -> widgets.Widget:
            cls = widgets.Textarea if area else widgets.Text
            w = cls(value=value, description=description, placeholder=placeholder, continuous_update=False,
                    layout=widgets.Layout(width="min(100%, 720px)", height="4.5em" if area else None))
            w.observe(lambda _change: self._on_input(view), names="value")
            return w

        self.header = widgets.HTML()
        self.sentence = text_box("sst2", DEFAULT_SENTENCE, "Sentence", area=True)
        self.sentence_b = text_box("sst2", "", "Sentence B", placeholder="optional second sentence")
        self.premise = text_box("nli", DEFAULT_PREMISE, "Premise (A)")
        self.hypothesis = text_box("nli", DEFAULT_HYPOTHESIS, "Hypothesis (B)")
        self.sts_a = text_box("sts", DEFAULT_PREMISE, "Sentence A")
        self.sts_b = text_box("sts", DEFAULT_HYPOTHESIS, "Sentence B")
        self.relatedness_out = widgets.HTML(layout=wide)
        self.ner_text = text_box("ner", DEFAULT_NER_TEXT, "Text", area=True)
        self.question = text_box("qa", DEFAULT_QUESTION, "Question")
        self.paragraph = text_box("qa", DEFAULT_PARAGRAPH, "Paragraph", area=True)
        self.top_k = widgets.IntSlider(value=5, min=1, max=10, description="Top k spans")
        self.top_k.observe(lambda _change: self._on_input("qa"), names="value")
        self.probs_box = widgets.Box([])
        self.entities_out = widgets.HTML(layout=wide)
        self.answer_out = widgets.HTML(layout=wide)
        self.spans_box = widgets.Box([])
        self.top_spans = widgets.HTML()
        classify_button = button("Classify", "Class probabilities")
        self.views: dict[str, widgets.VBox] = {
            "sst2": widgets.VBox([self.sentence, classify_button, self.probs_box]),  # SST-2 reads one sentence
            # another sentence classifier may have been trained on pairs: it gets a sentence B field
            "classification": widgets.VBox([self.sentence, self.sentence_b, classify_button, self.probs_box]),
            "nli": widgets.VBox([self.premise, self.hypothesis, button("Infer", "Entailment probabilities"),
                                 self.probs_box]),
            "sts": widgets.VBox([self.sts_a, self.sts_b, button("Rate", "Predicted relatedness (1-5)"),
                                 self.relatedness_out]),
            "ner": widgets.VBox([self.ner_text, button("Find entities", "Tag each word"), self.entities_out]),
            "qa": widgets.VBox([self.question, self.paragraph, widgets.HBox([button("Answer", "Find the span"),
                                                                            self.top_k]),
                                self.answer_out, self.top_spans, self.spans_box]),
        }
        self.view = widgets.Box([])
        self.pca_button = widgets.Button(icon="braille")
        self.pca_button.on_click(self._on_pca)
        self.pca_box = widgets.Box([])
        self.help = widgets.HTML()
        self._label_cls(tok.cls_token if tok is not None else DEFAULT_SPECIALS["cls"])
        self.explain = ExplainSection(None, tok, self._explain_request, host=self)  # "Does attention explain it?"
        self._widget = widgets.VBox([self.help, self.header, self.view, self.message, self.explain.widget,
                                     self.pca_button, self.pca_box], layout=widgets.Layout(width="100%"))
        if model is not None and model_task(model):
            self.show_model(model, tok, PICKED)
        else:
            self._show_header()

    def set_model(self, model: Bert, tok: Tokenizer) -> None:
        if model_task(model):
            self.show_model(model, tok, PICKED)

    def _label_cls(self, cls: str) -> None:
        """Name the [CLS] picture after the tokenizer's own first token."""
        self.pca_button.description = f"{cls} before / after"
        self.pca_button.tooltip = f"PCA of the {cls} vectors of {PCA_SAMPLE} dev examples"
        self.help.value = help_html(USE_HELP.format(cls=html.escape(cls)))

    def figures(self) -> dict[str, go.Figure]:
        pca = {f"{self.tok.cls_token} PCA": self._pca_figure} if self._pca_figure is not None else {}
        return {**self._figures, **pca, **self.explain.figures()}

    def made_with(self) -> dict[str, str]:
        """Every figure here is the model just fine-tuned's, unless it is the model picked above."""
        if self.model is None or self.name == PICKED:
            return {}
        return {name: self.name for name in self.figures()}

    def show_model(self, model: Bert, tok: Tokenizer, name: str, before: Bert | None = None,
            dev: list[Any] | None = None, task: str | None = None) -> None:
        """Show the view for `model`'s head and run it on the text already typed."""
        self.model, self.tok, self.name = model, tok, name
        self._label_cls(tok.cls_token)
        self.kind = model_task(model)
        self.task = task or (self.kind if self.kind in ("sst2", "nli") else None)
        self.before, self.dev = before, dev
        self._figures, self._pca_figure = {}, None
        self.pca_box.children = ()
        self._show_header()
        self.view.children = (self.views[self.kind],) if self.kind else ()
        self.explain.set_model(model, tok, refresh=False)  # update refreshes it
        self.update()

    def _show_header(self) -> None:
        if self.model is None or self.kind is None:
            self.header.value = (f'<span style="{FAINT}">Fine-tune a model above (or pick a fine-tuned one) '
                                 "to try it here.</span>")
            self.pca_button.disabled = True
            return
        self.header.value = using_html(self.name, self.kind, self.model.config.id2label.values())
        self.pca_button.disabled = False

    # -- the views --------------------------------------------------------------------------------
    def _on_input(self, view: str) -> None:
        """An input of `view` changed: rerun only if that view is on show."""
        if {"classification": "sst2"}.get(self.kind or "", self.kind) == view:
            self.update()

    def update(self) -> None:
        """Run the model on the current view's input and show the result (or a message)."""
        if self.model is None or self.kind is None:
            return
        self._figures = {}  # until the new result is drawn
        with self.reporting(self.probs_box, self.entities_out, self.answer_out, self.top_spans, self.spans_box,
                            self.relatedness_out):
            notes = {"sst2": self._classify, "classification": self._classify, "nli": self._entail,
                     "sts": self._relate, "ner": self._entities, "qa": self._answer}[self.kind]()
            self.show_messages(notes)
        self.explain.set_choices(explain_choices(self.kind, self.ner_text.value))
        self.explain.refresh()

    def _explain_request(self, which: int) -> tuple[ExplainInput, Target]:
        """What "Does attention explain it?" explains: the predicted class, the tag of the first entity
        (or of word `which` - 1), the answer's start (`which` 0) or end (1)."""
        if self.kind in ("sst2", "classification"):
            text_b = self.sentence_b.value if self.kind == "classification" else None
            return class_target(self.model, self.tok, self.sentence.value, text_b)
        if self.kind == "nli":
            return class_target(self.model, self.tok, self.premise.value, self.hypothesis.value)
        if self.kind == "sts":
            raise InputError("Explaining a predicted number is not offered here: the explanations follow the "
                             "probability of a class, a tag or an answer span.")
        if self.kind == "ner":
            return tag_target(self.model, self.tok, self.ner_text.value, None if which == 0 else which - 1)
        if self.kind == "qa":
            return span_target(self.model, self.tok, self.question.value, self.paragraph.value, end=which == 1)
        raise InputError("Fine-tune a model first (or pick a fine-tuned one): there is no prediction to explain.")

    def _classify(self) -> list[tuple[Level, str]]:
        text_b = self.sentence_b.value if self.kind == "classification" else None  # not on show for SST-2
        pred = classify(self.model, self.tok, self.sentence.value, text_b)
        return self._show_probabilities(pred)

    def _entail(self) -> list[tuple[Level, str]]:
        return self._show_probabilities(entail(self.model, self.tok, self.premise.value, self.hypothesis.value))

    def _relate(self) -> list[tuple[Level, str]]:
        pred = relatedness(self.model, self.tok, self.sts_a.value, self.sts_b.value)
        self.relatedness_out.value = relatedness_html(pred)
        return input_notes(pred.warning, pred.tokens, self.tok.unk_token)

    def _show_probabilities(self, pred) -> list[tuple[Level, str]]:
        fig = plot_class_probabilities(pred)
        self._figures = {"class probabilities": fig}
        show_figure(self.probs_box, fig)
        return input_notes(pred.warning, pred.tokens, self.tok.unk_token)

    def _entities(self) -> list[tuple[Level, str]]:
        text = self.ner_text.value
        found = entities(self.model, self.tok, text)
        self.entities_out.value = entities_html(text, found)
        self._figures = {}
        enc = self.tok.encode(text, max_length=input_limit(self.model, self.tok))
        notes = input_notes(enc.warning and (enc.warning + " Words after the cut are not tagged."), enc.tokens,
                           self.tok.unk_token)
        return notes or [("info", f"{len(found)} entit{'y' if len(found) == 1 else 'ies'} found.")]

    def _answer(self) -> list[tuple[Level, str]]:
        result = answer(self.model, self.tok, self.question.value, self.paragraph.value, k=self.top_k.value)
        self.answer_out.value = answer_html(result)
        self.top_spans.value = top_spans_html(result.top_k)
        fig = plot_span_probabilities(result)
        self._figures = {"answer span probabilities": fig}
        show_figure(self.spans_box, fig)
        notes: list[tuple[Level, str]] = []
        if result.windows > 1:
            notes.append(("info", (f"The paragraph is long: the model read it in {result.windows} overlapping "
                                  "windows and kept the best span of all.")))
        return notes + input_notes(None, result.tokens, self.tok.unk_token)

    # -- [CLS] before and after -------------------------------------------------------------------
    def _on_pca(self, _=None) -> None:
        self._pca_figure = None  # until the new picture is drawn
        cls = self.tok.cls_token if self.tok is not None else DEFAULT_SPECIALS["cls"]
        with self.reporting(self.pca_box), self.busy(self.pca_button, text=f"Computing the {cls} vectors of up to "
                                                     f"{PCA_SAMPLE} dev examples before and after fine-tuning…"):
            self.show_cls_pca()

    def show_cls_pca(self) -> None:
        """PCA of the last layer's [CLS] of PCA_SAMPLE dev examples, before and after fine-tuning."""
        if self.model is None or self.kind is None:
            raise InputError("Fine-tune a model first: the picture compares the sentence vectors before and after.")
        if self.kind not in ("sst2", "nli") or self.task not in ("sst2", "nli"):
            cls = self.tok.cls_token
            raise InputError(f"The {cls} picture is for sentence classification (SST-2 or NLI), where the head "
                             f"reads {cls} and the dev examples are coloured by their class; NER and QA read every "
                             "token, and a relatedness (sts) model predicts a number, not a class.")
        examples = self.dev if self.dev else (self.dev_examples(self.task) if self.dev_examples else [])
        if not examples:
            raise InputError(f"No {self.task} dev examples to project: check the data source above.")
        sample = subset(examples, PCA_SAMPLE, 0, "cls pca")
        if len(sample) < 2:  # two points make a line at best: a 2-D map needs two vectors or more
            where = ("Raise “Max dev examples” above and fine-tune again" if self.dev else
                     "Choose a data source above with more dev examples")
            raise InputError(f"The {self.tok.cls_token} picture places dev examples on 2 axes, so it needs at least "
                             f"2 of them; there is only {examples_text(len(sample), 'dev examples')}. {where}.")
        models = {"before fine-tuning": self.before, "after fine-tuning": self.model} if self.before is not None \
            else {"this model": self.model}
        points, explained = cls_maps(models, self.tok, sample)
        labels = [str(self.model.config.id2label[e.label]) for e in sample]
        texts = [e.text_a if e.text_b is None else f"{e.text_a} / {e.text_b}" for e in sample]
        fig = plot_cls_pca(points, labels, texts, explained, cls_token=self.tok.cls_token)
        self._pca_figure = fig
        show_figure(self.pca_box, fig)
        note = "" if self.before is not None else " Fine-tune here to see it before and after."
        few = too_few(len(sample), "dev examples")
        self.show_messages([("info", f"{self.tok.cls_token} of {examples_text(len(sample), 'dev examples')}, coloured "
                                     f"by their gold label.{note}")] + ([("warning", few)] if few else []))

