"""Next-sentence tab without a browser: build the panel, edit the sentences, press the buttons,
and check the figures against the pure computations and the messages the student sees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlab.analysis.nsp import CLS, A, B, next_sentence, pair_attention_mass
from bertlab.panels.base import lacks
from bertlab.panels.nsp import (
    DEFAULT_A,
    DEFAULT_B,
    EMPTY_B,
    NO_CORPUS,
    NSPPanel,
)
from bertlab.training.corpora import Document

DOCS = [
    Document(["The cat sat on the warm mat.", "It soon fell fast asleep there.", "Hi."], title="Cats"),
    Document(["Paris is the capital of France.", "It lies on the river Seine."], title="Paris"),
]


@pytest.fixture
def panel(default_model) -> NSPPanel:
    return NSPPanel(*default_model, documents=DOCS)


@pytest.fixture
def runs(panel, monkeypatch) -> list[int]:
    """Counts forward passes of the panel's model from here on."""
    calls: list[int] = []
    real = panel.model.run_with_cache

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(panel.model, "run_with_cache", counting)
    return calls


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


def probability_bar(panel) -> float:
    return float(panel.probability_box.children[0].data[0].x[0])


def mass_y(panel) -> np.ndarray:
    """[traces, layers]: the bars of the attention-mass figure."""
    return np.array([trace.y for trace in panel.mass_box.children[0].data], dtype=float)


def assert_shows(panel, a: str, b: str) -> None:
    expected = next_sentence(panel.model, panel.tok, a, b)
    assert probability_bar(panel) == pytest.approx(expected.is_next_probability, abs=1e-4)
    mass = expected.attention
    want = [mass.share(s, t).numpy() for s in (A, B, CLS) for t in mass.groups]  # 3 panels x 4 targets
    np.testing.assert_allclose(mass_y(panel), want, atol=1e-4)


# -- opening and editing ----------------------------------------------------------------------
def test_opens_with_the_default_pair(panel):
    assert (panel.text_a.value, panel.text_b.value) == (DEFAULT_A, DEFAULT_B)
    assert_shows(panel, DEFAULT_A, DEFAULT_B)
    assert panel.result.is_next_probability > 0.5  # bertlab's NSP head gets the classic pair right
    info = notes(panel, "info")
    assert "sentence A puts" in info and "on B" in info and not notes(panel, "error")
    assert set(panel.figures()) == {"P(B follows A)", "attention between the sentences"}


def test_editing_b_runs_the_model_once_and_patches_the_figures(panel, runs):
    bar, mass = panel.probability_box.children[0], panel.mass_box.children[0]
    panel.text_b.value = "Volcanoes erupt molten rock."
    assert len(runs) == 1
    assert panel.probability_box.children[0] is bar and panel.mass_box.children[0] is mass  # patched in place
    assert_shows(panel, DEFAULT_A, "Volcanoes erupt molten rock.")


def test_empty_b_says_so_and_takes_the_figures_down(panel):
    panel.text_b.value = "   "
    assert notes(panel, "error") == EMPTY_B
    assert panel.figures() == {} and panel.mass_box.children == ()
    assert not panel.probability_box.children[0].data  # a hint, no stale bar
    panel.text_b.value = DEFAULT_B
    assert not notes(panel, "error")
    assert_shows(panel, DEFAULT_A, DEFAULT_B)


def test_empty_a_says_so(panel):
    panel.text_a.value = ""
    assert "first sentence (A) is empty" in notes(panel, "error") and panel.figures() == {}


# -- the buttons ------------------------------------------------------------------------------
def test_random_b_comes_from_the_corpus_is_new_and_is_seeded(default_model, runs, panel):
    panel.random_button.click()
    first = panel.text_b.value
    pool = {s for d in DOCS for s in d.sentences if len(s.split()) >= 4}  # "Hi." is too short to offer
    assert first in pool and first != DEFAULT_B and len(runs) == 1
    assert "from the article" in panel.source.value
    assert_shows(panel, DEFAULT_A, first)
    for _ in range(4):
        before = panel.text_b.value
        panel.random_button.click()
        assert panel.text_b.value in pool and panel.text_b.value != before
    again = NSPPanel(*default_model, documents=DOCS)
    again.random_button.click()
    assert again.text_b.value == first  # same seed, same draw


def test_real_pair_takes_two_consecutive_sentences(panel, runs):
    panel.pair_button.click()
    a, b = panel.text_a.value, panel.text_b.value
    assert (a, b) in {("The cat sat on the warm mat.", "It soon fell fast asleep there."),
                      ("Paris is the capital of France.", "It lies on the river Seine.")}
    assert len(runs) == 1 and "follow each other" in panel.source.value
    assert_shows(panel, a, b)
    panel.text_a.value = a + " "  # the student edits: the note on where they came from goes
    assert panel.source.value == ""


def test_swap_puts_b_first(panel):
    panel.swap_button.click()
    assert (panel.text_a.value, panel.text_b.value) == (DEFAULT_B, DEFAULT_A)
    assert_shows(panel, DEFAULT_B, DEFAULT_A)


def test_no_corpus_gives_a_message(default_model):
    panel = NSPPanel(*default_model, documents=[Document(["Too short."])])
    panel.random_button.click()
    assert notes(panel, "error") == NO_CORPUS and panel.text_b.value == DEFAULT_B
    panel.pair_button.click()
    assert notes(panel, "error") == NO_CORPUS


def test_random_b_from_the_installed_corpus(default_model):
    panel = NSPPanel(*default_model)  # finds its corpus itself (ovos-wiki, gensim or BERTLAB_DATA)
    panel.random_button.click()
    if notes(panel, "error") == NO_CORPUS:
        pytest.skip("no offline corpus installed")
    assert panel.text_b.value != DEFAULT_B and "from the article" in panel.source.value
    assert panel.documents and not notes(panel, "error")


# -- awkward input ----------------------------------------------------------------------------
def test_long_pair_is_cut_with_a_note(panel):
    panel.text_b.value = "word " * 600
    assert "cut" in notes(panel, "warning") and "512" in notes(panel, "warning")
    assert len(panel.result.tokens) == 512 and not notes(panel, "error")


def test_cjk_and_emoji_get_a_note_on_unknown_pieces(panel):
    panel.text_b.value = "我爱北京 🙂🤖"
    assert "[UNK]" in notes(panel, "warning") and not notes(panel, "error")
    assert panel.result is not None


# -- models without an NSP head -----------------------------------------------------------------
def test_without_nsp_head_the_attention_is_still_shown(default_model, bare_default):
    panel = NSPPanel(*bare_default, documents=DOCS)
    warning = notes(panel, "warning")
    assert warning == lacks(bare_default[0], "pair_head") and "Pre-training tab" in warning
    assert panel.result is None and list(panel.figures()) == ["attention between the sentences"]
    assert "no NSP or SOP head" in panel.probability_box.children[0].layout.annotations[0].text
    mass, warning = pair_attention_mass(*bare_default, DEFAULT_A, DEFAULT_B)
    assert warning is None and mass.groups == (A, B, CLS, "[SEP]")
    np.testing.assert_allclose(mass_y(panel), [mass.share(s, t).numpy() for s in (A, B, CLS) for t in mass.groups],
                               atol=1e-4)
    panel.text_b.value = ""
    assert notes(panel, "error") == EMPTY_B
    panel.text_b.value = DEFAULT_B
    panel.set_model(*default_model)  # the picker switched to a model with the head
    assert not notes(panel, "warning") and panel.result is not None
    assert_shows(panel, DEFAULT_A, DEFAULT_B)


def test_pair_attention_mass_equals_what_next_sentence_gives(default_model):
    a, b = "Paris is big.", "It has many museums and parks."
    mass, _ = pair_attention_mass(*default_model, a, b)
    expected = next_sentence(*default_model, a, b).attention
    assert mass.groups == expected.groups and mass.sizes == expected.sizes
    torch.testing.assert_close(mass.mass, expected.mass, atol=1e-5, rtol=1e-4)


def test_a_bug_becomes_a_message(panel, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(panel.model, "run_with_cache", broken)
    panel.text_b.value = "Something new."
    assert "Something went wrong" in notes(panel, "error") and panel.figures() == {}


def test_check_shows_a_busy_sign_and_disables_the_buttons(default_model, monkeypatch):
    from bertlab.panels import nsp as panel_module

    model, tok = default_model
    panel = panel_module.NSPPanel(model, tok)
    seen = []
    real = panel_module.next_sentence

    def watching(*args, **kwargs):
        seen.append((panel.check_button.disabled, panel.random_button.disabled, "bertlab-busy" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(panel_module, "next_sentence", watching)
    panel.text_b.value = "It was very tired."
    assert seen == [(True, True, True)]
    assert not panel.check_button.disabled and "bertlab-busy" not in panel.message.value
    panel.text_b.value = "It was \ud83d tired."
    assert "broken character" in " ".join(t for _, t in panel.messages) and panel.figures() == {}
