"""Mask tab without a browser: build the panel, click word toggles and buttons, move the slider,
and check the figures against the pure computations and the messages the student sees."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import pytest
from ipywidgets.widgets.widget import _instances

from bertlab.analysis.mask import fill_mask, mask_each_word
from bertlab.panels import mask as mask_panel
from bertlab.panels.base import lacks
from bertlab.panels.mask import (
    DEFAULT_TEXT,
    MAX_WORD_BUTTONS,
    NOTHING_HIDDEN,
    MaskPanel,
    show_figure,
)
from bertlab.viz.mask import reads_html, strip_grid

MILK = "The man went to the store to buy a gallon of milk."  # word 9 is "gallon"


@pytest.fixture
def panel(default_model) -> MaskPanel:
    return MaskPanel(*default_model)


@pytest.fixture
def runs(panel, monkeypatch) -> list[int]:
    """Counts forward passes of the panel's model from here on."""
    calls: list[int] = []
    real = panel.model.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(panel.model, "forward", counting)
    return calls


def fill(panel) -> go.FigureWidget:
    return panel.fill_box.children[0]


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


def button(panel, word: str):
    return next(b for b in panel.word_buttons.children if b.description == word)


# -- opening ----------------------------------------------------------------------------------
def test_opens_with_the_guesses_for_the_default_mask(panel):
    expected = fill_mask(panel.model, panel.tok, DEFAULT_TEXT, k=5)
    (bars,) = fill(panel).data
    assert list(bars.y) == [c.token for c in expected[0].candidates]
    np.testing.assert_allclose(bars.x, [c.probability for c in expected[0].candidates], rtol=1e-4)
    assert "1 hidden piece" in notes(panel, "info") and not notes(panel, "error")
    words = [b.description for b in panel.word_buttons.children]
    assert words == ["The", "man", "went", "to", "the", "[MASK]", "to", "buy", "a", "gallon", "of", "milk", "."]
    typed = panel.word_buttons.children[5]
    assert typed.value and typed.disabled  # a typed [MASK] is shown hidden, and only the text removes it
    assert "the man went to the" in panel.reads.value and "[MASK]</span>" in panel.reads.value
    assert list(panel.figures()) == ["guesses for the hidden words"]


def test_top_k_slider_patches_the_figure_without_running_the_model(panel, runs):
    widget = fill(panel)
    panel.k.value = 9
    assert fill(panel) is widget and len(widget.data[0].y) == 9  # same widget, patched
    panel.k.value = 2
    assert list(widget.data[0].y) == [panel.predictions[0].candidates[i].token for i in range(2)]
    assert runs == []


# -- hiding words -----------------------------------------------------------------------------
def test_clicking_words_hides_them_and_clicking_again_shows_them(default_model, runs):
    panel = MaskPanel(*default_model, text=MILK)
    assert notes(panel, "info") == NOTHING_HIDDEN and not fill(panel).data  # a hint, no bars
    assert panel.figures() == {}
    button(panel, "gallon").value = True
    (bars,) = fill(panel).data
    expected = fill_mask(panel.model, panel.tok, MILK, k=5, masked_words=[9])[0]
    assert list(bars.y) == [c.token for c in expected.candidates]
    assert "'gallon'" in fill(panel).layout.annotations[0].text and "rank" in fill(panel).layout.annotations[0].text
    assert "a [MASK]" in panel.reads.value.replace("</span>", "").replace(
        '<span style="background:#ffe08a;border-radius:3px;padding:0 2px;font-weight:600">', "")
    button(panel, "store").value = True
    assert len(fill(panel).data) == 2 and panel.hidden == {5, 9}  # swapped in: one chart per hidden piece
    assert "all at once" in notes(panel, "info")
    assert button(panel, "store").button_style == "warning"
    before = len(runs)
    button(panel, "store").value = False  # back to a state seen before: cached, no model run
    assert len(fill(panel).data) == 1 and len(runs) == before


def test_whole_word_masking_hides_every_piece(default_model):
    panel = MaskPanel(*default_model, text="Tokenization is fun.")
    button(panel, "Tokenization").value = True
    assert len(fill(panel).data) == 1
    assert "token ##ization" in notes(panel, "info") and "whole-word" in notes(panel, "info")
    assert "[MASK]</span>ization" in panel.reads.value  # the model still sees the second piece
    panel.whole_word.value = True
    assert len(fill(panel).data) == 2
    assert [p.original_token for p in panel.predictions] == ["token", "##ization"]
    assert "##ization" not in notes(panel, "info")


def test_editing_the_text_keeps_hidden_words_that_stay_in_place(default_model):
    panel = MaskPanel(*default_model, text=MILK)
    button(panel, "man").value = True
    panel.text.value = MILK.replace("milk", "juice")
    assert panel.hidden == {1} and button(panel, "man").value
    panel.text.value = "A woman went out."  # word 1 is another word now
    assert panel.hidden == set() and notes(panel, "info") == NOTHING_HIDDEN


# -- mask each word in turn -------------------------------------------------------------------
def test_mask_each_word_draws_the_strip_and_follows_the_text(panel):
    assert panel.each_box.children == ()
    panel.each_button.click()
    strip, skipped = panel.each_box.children[0].data  # scored words, and the grey ones not scored
    assert all(v is None for row in skipped.z for v in row)  # every word here is in the vocabulary
    scores = mask_each_word(panel.model, panel.tok, DEFAULT_TEXT)
    z, text, _ = strip_grid(scores, 12)
    assert [list(r) for r in strip.text] == text
    np.testing.assert_allclose(np.array(strip.z, dtype=float), np.array(z, dtype=float), rtol=1e-4)
    assert "12 words" in notes(panel, "info")  # 13 words, the typed [MASK] is not scored
    assert set(panel.figures()) == {"guesses for the hidden words", "how predictable each word is"}
    widget = panel.each_box.children[0]
    panel.scale.value = "log10"
    assert panel.each_box.children[0] is widget and max(widget.data[0].z[0][:12]) <= 0  # log10 P
    panel.text.value = "Paris is the capital of France."
    assert [w for w in panel.each_box.children[0].data[0].text[0] if w] == [
        "Paris", "is", "the", "capital", "of", "France", "."]
    panel.text.value = "  "
    assert panel.each_box.children == () and notes(panel, "error") == "The text is empty: type a sentence first."


def test_mask_each_word_scores_only_the_first_words_of_a_long_text(panel, monkeypatch):
    monkeypatch.setattr(mask_panel, "MAX_EACH_WORDS", 5)
    panel.text.value = "one two three four five six seven eight"
    panel.each_button.click()
    assert [s.word for s in panel.scores] == ["one", "two", "three", "four", "five"]
    assert "Only the first 5 words were scored" in notes(panel, "warning")


# -- awkward input: a message, never a traceback ----------------------------------------------
@pytest.mark.parametrize(
    "text, level, match",
    [
        ("", "error", "The text is empty"),
        ("[MASK]", "error", "Every word is hidden"),
        ("[mask] [ MASK ]", "error", "Every word is hidden"),
        ("hello", "info", "Nothing is hidden yet"),
    ],
)
def test_unusable_text_gets_a_message(panel, text, level, match):
    panel.text.value = text
    assert match in notes(panel, level)
    assert not fill(panel).data and panel.predictions == [] and panel.figures() == {}
    panel.each_button.click()  # no strip and no second, different complaint for the same text
    if level == "error":
        assert panel.each_box.children == () and len(panel.messages) == 1


def test_cjk_and_emoji_work_with_a_note_on_unknown_pieces(panel):
    panel.text.value = "我爱北京 🙂 and the [MASK] café."
    assert len(fill(panel).data) == 1 and not notes(panel, "error")
    assert "[UNK]" in notes(panel, "warning")
    assert "我" in [b.description for b in panel.word_buttons.children]


def test_long_text_is_cut_with_a_note_and_few_buttons(panel):
    panel.text.value = "The quick brown fox jumps over the lazy dog. " * 60 + "The [MASK] end."
    assert len(panel.word_buttons.children) == MAX_WORD_BUTTONS
    warning = notes(panel, "warning")
    assert "512" in warning and "cut" in warning
    assert "The [MASK] is in the part of the text that was cut" in notes(panel, "error")
    button(panel, "lazy").value = True  # a word inside what the model reads works
    assert len(fill(panel).data) == 1 and "cut" in notes(panel, "warning")


def test_a_model_without_mlm_head_points_to_pretraining_then_switches_back(default_model, bare_default):
    panel = MaskPanel(*bare_default)
    assert notes(panel, "warning") == lacks(panel.model, "mlm_head") and "Pre-training tab" in notes(panel, "warning")
    assert not fill(panel).data and panel.figures() == {} and "cannot guess" in fill(panel).layout.annotations[0].text
    panel.each_button.click()
    assert panel.each_box.children == () and panel.messages == [("warning", lacks(panel.model, "mlm_head"))]
    panel.set_model(*default_model)  # the picker switched to a model with the head: same text, redrawn
    assert len(fill(panel).data) == 1 and not notes(panel, "warning")
    assert len(panel.each_box.children[0].data) == 2  # the strip (scored, grey) was asked for: it follows the model


def test_a_bug_becomes_a_message(panel, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(panel.model, "forward", broken)
    panel.text.value = "Something [MASK] new."
    assert "Something went wrong" in notes(panel, "error") and "boom" in notes(panel, "error")


# -- helpers ------------------------------------------------------------------------------------
def test_show_figure_patches_when_traces_line_up_and_swaps_otherwise():
    box = widgets.VBox([])
    show_figure(box, go.Figure(go.Bar(x=[1, 2], y=["a", "b"]), layout={"annotations": [{"text": "x"}]}))
    first = box.children[0]
    show_figure(box, go.Figure(go.Bar(x=[3], y=["c"])))
    assert box.children[0] is first and list(first.data[0].x) == [3] and first.layout.annotations == ()
    show_figure(box, go.Figure([go.Bar(x=[1]), go.Bar(x=[2])]))
    assert box.children[0] is not first and len(box.children[0].data) == 2
    show_figure(box, go.Figure())
    assert box.children[0].data == ()


def test_reads_html_joins_pieces_and_marks_masks():
    out = reads_html(["[CLS]", "[MASK]", "##ization", "is", "<b>", "[SEP]"])
    assert "[CLS]" not in out and "[SEP]" not in out
    assert "[MASK]</span>ization is &lt;b&gt;</div>" in out


# -- Unknown and special words, bad characters, the busy sign ---------------------------
def test_mask_each_word_reports_unknown_words_as_unknown_not_scored(panel):
    panel.text.value = "The cat 🙂 sat on the mat."
    assert button(panel, "🙂").disabled  # the model cannot guess an [UNK] back: nothing to hide
    panel.each_button.click()
    smiley = next(s for s in panel.scores if s.word == "🙂")
    assert smiley.skipped == "unknown" and smiley.rank is None and not smiley.correct
    strip, grey = panel.each_box.children[0].data
    assert strip.z[0][2] is None and grey.z[0][2] == 1  # grey, not coloured as easy to guess
    assert "not in this model's vocabulary ('🙂')" in notes(panel, "warning")
    assert "unknown, not scored" in notes(panel, "warning")
    assert "Each of the 7 words" in notes(panel, "info")  # 8 words (the full stop is one), one unknown


def test_typed_special_tokens_are_not_scored_as_words(panel):
    cls, sep = (panel.tok.id_to_token(i) for i in (panel.tok.cls_token_id, panel.tok.sep_token_id))
    panel.text.value = f"{cls} the cat sat on the mat {sep}"
    assert button(panel, cls).disabled and button(panel, sep).disabled
    panel.each_button.click()
    assert {s.word: s.skipped for s in panel.scores if not s.scored} == {cls: "special", sep: "special"}
    assert "special tokens, not words" in notes(panel, "info")
    assert [s.word for s in panel.scores if s.scored] == ["the", "cat", "sat", "on", "the", "mat"]


def test_a_broken_character_is_a_clear_message_and_clears_the_old_results(panel):
    panel.each_button.click()
    assert panel.scores and panel.predictions
    panel.text.value = "The cat \ud800 sat."
    assert "broken character (U+D800" in notes(panel, "error") and "Something went wrong" not in notes(panel, "error")
    assert panel.predictions == [] and panel.scores is None and panel.each_box.children == ()
    assert panel.figures() == {} and panel.word_buttons.children == ()
    panel.text.value = DEFAULT_TEXT
    assert not notes(panel, "error") and panel.scores and panel.predictions


def test_mask_each_word_shows_a_busy_sign_and_disables_its_buttons(panel, monkeypatch):
    seen = []
    real = mask_panel.mask_each_word

    def watching(*args, **kwargs):
        seen.append((panel.each_button.disabled, panel.predict_button.disabled, "bertlab-busy" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(mask_panel, "mask_each_word", watching)
    panel.each_button.click()
    assert seen == [(True, True, True)]
    assert not panel.each_button.disabled and "bertlab-busy" not in panel.message.value


# -- what an edit sends to the browser ----------------------------------------------------------
def test_an_edit_opens_no_widget_and_redraws_the_chart_in_one_message(panel, monkeypatch):
    """A new sentence relabels the word toggles and patches the chart's bars and title in place:
    no widget is opened (each one is a round of messages and views in the page), one figure message."""
    sentences = [f"The {w} went to the {{m}} after school." for w in ("cat", "dog", "boy", "girl")]
    panel.text.value = sentences[0].format(m=panel.tok.mask_token)
    chart, toggles = fill(panel), list(panel.word_buttons.children)
    messages: list[str] = []
    for name in ("_send_update_msg", "_send_restyle_msg", "_send_relayout_msg", "_send_addTraces_msg"):
        real = getattr(chart, name)
        monkeypatch.setattr(chart, name, lambda *a, _real=real, _name=name, **k: (messages.append(_name),
                                                                                 _real(*a, **k)))
    opened = len(_instances)
    for s in sentences[1:]:
        panel.text.value = s.format(m=panel.tok.mask_token)
        expected = fill_mask(panel.model, panel.tok, panel.text.value, k=5)[0]
        assert list(fill(panel).data[0].y) == [c.token for c in expected.candidates]
    assert len(_instances) == opened  # nothing opened, nothing left behind
    assert fill(panel) is chart and list(panel.word_buttons.children) == toggles
    assert messages == ["_send_update_msg"] * 3
    assert [b.description for b in toggles][:2] == ["The", "girl"]


def test_guesses_already_on_show_are_not_sent_again(panel, monkeypatch):
    chart = fill(panel)
    sent: list[int] = []
    real = chart._send_update_msg
    monkeypatch.setattr(chart, "_send_update_msg", lambda *a, **k: (sent.append(1), real(*a, **k)))
    panel._on_question()  # e.g. a class question came and went: the same guesses, from the cache
    panel.predict_button.click()
    assert sent == [] and fill(panel) is chart


def test_a_relabelled_toggle_hides_its_new_word_and_a_fixed_one_does_nothing(panel):
    panel.text.value = f"{panel.tok.mask_token} sat on the mat."
    first = panel.word_buttons.children[0]
    assert first.disabled and first.value  # the typed mask: shown hidden, nothing to click
    panel.text.value = "The cat sat on the mat."
    assert panel.word_buttons.children[0] is first and not first.disabled and not first.value
    first.value = True
    assert panel.hidden == {0} and first.button_style == "warning"
    assert "'the'" in fill(panel).layout.annotations[0].text.lower()
