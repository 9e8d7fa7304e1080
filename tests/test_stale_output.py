"""No old result under a new message: every view empties what it showed when a new input fails, and a
section inside a tab never repeats the tab's error as a second one. Driven through the widgets, no browser."""

from __future__ import annotations

import os
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest
from tiny_models import tiny_bert

from bertlab.panels.base import Panel, clear_view
from bertlab.panels.explain import NOTHING_TO_EXPLAIN
from bertlab.panels.finetune import FinetunePanel
from bertlab.panels.mask import MaskPanel
from bertlab.panels.pretrain import FALLBACK_DOCUMENTS, PretrainPanel
from bertlab.tasks import CONLL_LABELS, NLI_LABELS, SST2_LABELS
from bertlab.tasks.readers import ClassificationExample
from bertlab.tokenizer import Tokenizer
from bertlab.training.pretrain import new_model

pytestmark = pytest.mark.usefixtures("one_thread")


def levels(panel: Panel, level: str) -> list[str]:
    return [text for lv, text in panel.messages if lv == level]


def red_blocks(*panels: Panel) -> int:
    """Red notes on the page the panels draw (what a student sees), counted in their message lines."""
    return sum(p.message.value.count("bertlab-error") for p in panels)


@pytest.fixture(scope="module")
def heads(tok):
    base = tiny_bert(tok, seed=1)
    return base, {
        "sst2": base.with_heads(task="sequence_classification", id2label=SST2_LABELS),
        "nli": base.with_heads(task="sequence_classification", id2label=NLI_LABELS),
        "ner": base.with_heads(task="token_classification", id2label=CONLL_LABELS),
        "qa": base.with_heads(task="question_answering"),
    }


# -- the kit's helper --------------------------------------------------------------------------
def test_reporting_empties_the_views_it_is_given_and_shows_one_message():
    panel = Panel()
    box, text = widgets.Box([go.FigureWidget(go.Bar(y=[1]))]), widgets.HTML("an old answer")
    kept = widgets.Box([widgets.HTML("another view's result")])
    with panel.reporting(box, text):
        raise ValueError("Type a sentence first.")
    assert box.children == () and text.value == "" and len(kept.children) == 1
    assert panel.messages == [("error", "Type a sentence first.")]
    with panel.reporting(box):  # no error: nothing is emptied
        box.children = (widgets.HTML("new"),)
    assert len(box.children) == 1
    with pytest.raises(TypeError):
        clear_view(widgets.IntSlider())


# -- "Use it": each view's answer goes when its input fails -------------------------------------
@pytest.mark.parametrize("kind, field, shown", [
    ("sst2", "sentence", ("probs_box",)),
    ("nli", "premise", ("probs_box",)),
    ("ner", "ner_text", ("entities_out",)),
    ("qa", "question", ("answer_out", "top_spans", "spans_box")),
])
def test_use_it_clears_its_answer_when_the_new_input_fails(heads, tok, tmp_path, kind, field, shown):
    _, models = heads
    panel = FinetunePanel(models[kind], tok, runs_dir=tmp_path, device="cpu")
    use = panel.use
    drawn = {name: getattr(use, name) for name in shown}
    assert all(w.children if isinstance(w, widgets.Box) else w.value for w in drawn.values())  # the default input
    before = set(use.figures())
    getattr(use, field).value = ""
    assert levels(use, "error") and red_blocks(use) == 1
    for name, w in drawn.items():  # no "The model says: negative (51.7 %)" under "The text is empty"
        assert (w.children == ()) if isinstance(w, widgets.Box) else (w.value == ""), name
    assert not (set(use.figures()) & before) or before == set()
    getattr(use, field).value = "A new sentence to read."
    assert not levels(use, "error") and all(
        w.children if isinstance(w, widgets.Box) else w.value for w in drawn.values())


def test_use_it_with_attention_explained_shows_one_error_not_two(heads, tok, tmp_path):
    _, models = heads
    use = FinetunePanel(models["sst2"], tok, runs_dir=tmp_path, device="cpu").use
    use.explain.toggle.value = True
    assert use.explain.figure_box.children  # the explanation of the default sentence
    for _ in range(3):
        use.sentence.value = ""
        assert red_blocks(use, use.explain) == 1 and use.explain.figure_box.children == ()
        assert use.explain.messages == [("info", NOTHING_TO_EXPLAIN)]
        use.sentence.value = "A warm and funny film."
        assert red_blocks(use, use.explain) == 0 and use.explain.figure_box.children


# -- the Mask tab's "Does attention explain it?" -----------------------------------------------
def test_an_open_explanation_adds_no_second_error_to_inputs_without_a_mask(default_model):
    model, tok = default_model
    panel = MaskPanel(model, tok, text=f"The man went to the {tok.mask_token} store.")
    section = panel.explain
    section.toggle.value = True
    assert section.figure_box.children and red_blocks(panel, section) == 0
    for text in ("", "no hidden word here", tok.mask_token, "", "still nothing hidden"):
        panel.text.value = text
        assert red_blocks(panel, section) == (1 if levels(panel, "error") else 0), text  # the tab's, if any
        assert section.figure_box.children == () and section.figures() == {}
        assert section.messages == [("info", NOTHING_TO_EXPLAIN)]  # points at the tab's message, never stacks
    panel.text.value = f"Paris is the {tok.mask_token} of France."
    assert section.figure_box.children and red_blocks(panel, section) == 0 and section.check is not None


def test_with_no_message_in_the_tab_the_section_says_why_itself(default_model):
    model, tok = default_model
    panel = MaskPanel(model, tok, text=f"The man went to the {tok.mask_token} store.")
    panel.explain.toggle.value = True
    panel.show_messages([])  # e.g. a tab whose prediction has no notes
    panel.predictions = []
    panel.explain.run()
    (level, text), = panel.explain.messages
    assert level == "info" and text.startswith("Nothing to explain: Nothing is hidden")


# -- Pre-training, section 1 -------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "[MASK]", "[MASK] [MASK] [CLS]"])
def test_the_masked_example_goes_when_the_new_text_cannot_be_masked(default_model, text):
    model, tok = default_model
    panel = PretrainPanel(model, tok, pair_documents=FALLBACK_DOCUMENTS)
    assert panel.example is not None and panel.example_html.value and panel.strategies_html.value
    panel.text.value = text
    assert len(levels(panel, "error")) == 1
    assert panel.example is None
    assert panel.example_html.value == panel.strategies_html.value == panel.dynamic_html.value == ""
    panel.text.value = "The cat sat on the mat."
    assert panel.example is not None and panel.example_html.value and not levels(panel, "error")


# -- Pre-training, section 2: a probe without [MASK] --------------------------------------------
WORDS = ["cat", "dog", "bird", "fish", "tree", "house", "river", "hill"]


def _small_run_panel(tmp_path: Path, probe: str) -> PretrainPanel:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "the", "a", "saw", "near", *WORDS]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = Tokenizer.from_folder(tmp_path)
    docs = [" ".join(f"The {WORDS[(d + s) % 8]} saw a {WORDS[(d + 2 * s) % 8]} near the {WORDS[(d * s) % 8]}."
                     for s in range(8)) for d in range(20)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs), encoding="utf-8")
    p = PretrainPanel(new_model("tiny", tok), tok, text="the cat saw a dog .", probe=probe,
                      pair_documents=FALLBACK_DOCUMENTS)
    p.runs_dir = tmp_path / "runs"
    p.corpus_path.value = str(corpus)
    p.size.value, p.steps.value, p.batch.value, p.seq_len.value = "tiny", 4, 4, 32
    return p


def test_a_probe_without_mask_says_so_in_its_place_for_the_whole_run(tmp_path):
    p = _small_run_panel(tmp_path, "the cat saw a dog .")
    p.start.click()
    assert p.job.wait(120)
    assert p.result is not None and p.result.status == "completed", p.run_messages
    assert p.probe_rows == []
    assert "The probe has no [MASK]" in p.probe_html.value and "put [MASK] where a word should go" in p.probe_html.value
    assert "bertlab-warning" in p.probe_html.value


def test_the_run_status_says_training_once(tmp_path):
    p = _small_run_panel(tmp_path, "the cat saw a [MASK] .")
    said = []
    shown = p.show_run_message
    p.show_run_message = lambda text, level="info", **kw: (said.append(text), shown(text, level, **kw))
    p.start.click()
    assert p.job.wait(120)
    start = [t for t in said if "Press Stop" in t]
    assert start and start[0].startswith("Training 4 steps on cpu") and "Training: training" not in start[0]
    assert "probe has no" not in p.probe_html.value


# -- Fine-tuning with one dev example -------------------------------------------------------------
def _one(text: str, label: int) -> ClassificationExample:
    return ClassificationExample(guid=text, text_a=text, text_b=None, label=label)


def test_the_cls_picture_of_one_dev_example_says_what_to_change(heads, tok, tmp_path):
    base, models = heads
    panel = FinetunePanel(base, tok, runs_dir=tmp_path, device="cpu")
    use = panel.use
    use.show_model(models["sst2"], tok, "sst2 · full", before=base, dev=[_one("A fine film.", 1)], task="sst2")
    use.pca_button.click()
    (error,) = levels(use, "error")
    assert "needs at least 2" in error and "Max dev examples" in error and "1 dev example" in error
    assert "2-D map" not in error and use.pca_box.children == () and "[CLS] PCA" not in use.figures()
    few = [_one(t, i % 2) for i, t in enumerate(["Good.", "Bad.", "Fine.", "Awful."])]
    use.show_model(models["sst2"], tok, "sst2 · full", before=base, dev=few, task="sst2")
    use.pca_button.click()
    assert use.pca_box.children and not levels(use, "error")
    assert any("Only 4 dev examples" in t for t in levels(use, "warning"))


SST2 = Path(os.environ.get("BERTLAB_DATA", "/nonexistent")) / "sst2"


@pytest.mark.skipif(not SST2.is_dir(), reason="BERTLAB_DATA has no sst2 folder")
def test_a_run_scored_on_one_dev_example_warns_and_its_cls_picture_says_what_to_change(tok, tmp_path):
    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path, device="cpu")
    panel.max_train.value, panel.max_dev.value, panel.epochs.value, panel.batch.value = 8, 1, 1, 8
    panel.max_length.value = 32
    panel.path.value = str(SST2)
    panel.start_button.click()
    assert panel.job.wait(120)
    finished = " ".join(t for _, t in panel.messages)
    assert "on 1 dev example" in finished, panel.messages
    assert any("Only 1 dev example" in t for t in levels(panel, "warning"))  # not a bare "dev accuracy 1"
    panel.use.pca_button.click()
    (error,) = levels(panel.use, "error")
    assert "at least 2" in error and "Max dev examples" in error


# -- redrawing in place leaves nothing of the figure before ----------------------------------------
def test_a_redraw_in_place_resets_what_the_new_figure_does_not_set():
    from bertlab.viz.figure_widget import redraw

    widget = go.FigureWidget(go.Heatmap(z=[[1, 2]], x=["a", "b"]))
    widget.update_layout(title_text="Layer 0, head 0", xaxis=dict(tickangle=45, title_text="key"))
    blank = go.Figure(go.Heatmap(z=[[]]))
    blank.update_layout(xaxis=dict(visible=False), annotations=[dict(text="Type a sentence and press Show.")])
    redraw(widget, blank)
    assert widget.data[0].x is None and widget.layout.title.text is None
    assert widget.layout.xaxis.tickangle is None and widget.layout.xaxis.visible is False
    assert [a.text for a in widget.layout.annotations] == ["Type a sentence and press Show."]


def test_the_attention_heatmap_keeps_no_old_title_over_an_empty_text(default_model):
    from bertlab.panels.attention import AttentionPanel

    model, tok = default_model
    panel = AttentionPanel(model, tok)
    assert panel.figure.layout.title.text and panel.figure.data[0].x is not None
    panel.text_a.value = ""
    assert levels(panel, "error") and panel.figures() == {}
    assert panel.figure.layout.title.text is None and panel.figure.data[0].x is None  # no "Layer 0, head 0: …"
