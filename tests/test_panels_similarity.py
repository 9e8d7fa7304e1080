"""Embeddings tab without a browser: build the panel, set widget values, assert on the three
figures (against the analysis functions run independently) and on each sub-tab's messages."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from bertlab.analysis.similarity import (
    BASELINE_SENTENCES,
    anisotropy_baseline,
    parse_contexts,
    token_similarity,
    word_in_contexts,
    word_projection,
)
from bertlab.loading import load
from bertlab.panels.similarity import (
    DEFAULT_MAP_SENTENCES,
    DEFAULT_MAP_WORDS,
    DEFAULT_TEXT,
    SimilarityPanel,
)

ATOL = 1e-3  # batched (padded) vs one at a time, and 4-decimal rounding in the figures
TWO_BANKS = "river | He sat on the bank of the river.\nmoney | The bank approved my loan."


@pytest.fixture
def panel(default_model) -> SimilarityPanel:
    model, tok = default_model
    return SimilarityPanel(model, tok)


@pytest.fixture
def runs(panel, monkeypatch) -> list[int]:
    """Counts forward passes of the panel's model from here on."""
    calls: list[int] = []
    real = panel.model.run_with_cache
    monkeypatch.setattr(panel.model, "run_with_cache", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def notes(panel, section: int, level: str) -> str:
    return " ".join(text for lvl, text in panel.notes[section] if lvl == level)


def z(panel) -> np.ndarray:
    return np.asarray(panel.token_figure.data[0].z, dtype=np.float32)


def lines(panel) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.y, dtype=np.float32) for t in panel.word_figure.data}


# -- 1. token x token -----------------------------------------------------------------------
def test_opens_with_the_last_stage_of_the_default_text(panel):
    want = token_similarity(panel.model, panel.tok, DEFAULT_TEXT)
    assert panel.token_stage.value == 6 and panel.token_stage.label == "layer 5"
    np.testing.assert_allclose(z(panel), want.matrix(6).numpy(), atol=ATOL)
    assert "18 tokens" in notes(panel, 0, "info") and panel.messages == panel.notes[0]
    assert [notes(panel, s, "error") for s in range(3)] == ["", "", ""]


def test_stage_slider_redraws_from_the_cache(panel, runs):
    want = token_similarity(panel.model, panel.tok, DEFAULT_TEXT)
    runs.clear()
    for stage in (0, 3):
        panel.token_stage.value = stage
        np.testing.assert_allclose(z(panel), want.matrix(stage).numpy(), atol=ATOL)
    assert "after layer 2" in panel.token_figure.layout.title.text
    assert runs == []


def test_new_text_reruns_once(panel, runs):
    panel.token_stage.value = 2
    panel.text.value = "Paris is big."
    assert runs == [1]
    want = token_similarity(panel.model, panel.tok, "Paris is big.")
    assert list(panel.token_figure.layout.xaxis.ticktext) == want.tokens
    np.testing.assert_allclose(z(panel), want.matrix(2).numpy(), atol=ATOL)


def test_awkward_text_gives_a_message(panel):
    cases = [
        ("", "error", "The text is empty"),
        ("I love pizza 🍕", "warning", "[UNK]"),
        ("[MASK]", "info", "3 tokens"),
        ("東京は大きい", "info", "8 tokens"),
    ]
    for text, level, expected in cases:
        panel.text.value = text
        assert expected in notes(panel, 0, level) and expected in " ".join(t for _, t in panel.messages), text
    assert list(panel.token_figure.layout.xaxis.ticktext) == ["[CLS]", "東", "京", "は", "大", "き", "##い", "[SEP]"]


def test_long_text_shows_the_first_tokens_with_a_note(panel):
    panel.text.value = " ".join(["word"] * 600)
    assert z(panel).shape == (128, 128)
    warn = notes(panel, 0, "warning")
    assert "602 tokens long" in warn and "first 128 of the 512 tokens" in warn


# -- 2. one word across contexts -------------------------------------------------------------
def test_word_lines_match_the_analysis_and_the_baseline(panel):
    senses, contexts = parse_contexts(panel.contexts.value)
    assert senses == ["river"] * 3 + ["money"] * 3
    want = word_in_contexts(panel.model, panel.tok, "bank", contexts, senses=senses)
    got = lines(panel)
    assert list(got) == ["same sense", "different senses", "random token pairs (baseline)"]
    np.testing.assert_allclose(got["same sense"], want.same_sense.numpy(), atol=ATOL)
    np.testing.assert_allclose(got["different senses"], want.different_sense.numpy(), atol=ATOL)
    baseline = anisotropy_baseline(panel.model, panel.tok, BASELINE_SENTENCES)  # built in: no data set needed
    np.testing.assert_allclose(got["random token pairs (baseline)"], baseline.mean.numpy(), atol=ATOL)
    assert got["same sense"][-1] > got["different senses"][-1] > got["random token pairs (baseline)"][-1] + 0.3
    assert "“bank” in 6 contexts" in notes(panel, 1, "info")


def test_unlabelled_contexts_give_one_line_and_reuse_the_baseline(panel, runs):
    panel.contexts.value = "He sat on the bank of the river.\nThe bank approved my loan."
    assert runs == [1]  # the two contexts in one batch; the baseline is cached
    assert list(lines(panel)) == ["all pairs of contexts", "random token pairs (baseline)"]
    assert panel.boxes[1].children == (panel.word_figure,)  # fewer traces: a fresh widget, on show


def test_bad_word_input_gives_a_message(panel):
    cases = [
        ("cat", TWO_BANKS, "'cat' does not occur in context 1"),
        ("bank", "The bank approved my loan.", "at least two contexts"),
        ("bank", "", "No contexts"),
        ("", TWO_BANKS, "The word is empty"),
        ("🍕", TWO_BANKS, "not in the model's vocabulary"),
        ("bank", "river | He sat on the bank.\nThe bank approved my loan.", "label every context or none"),
    ]
    panel.sections.selected_index = 1
    panel.word.value = "cat"
    assert "'cat' does not occur in context 1" in notes(panel, 1, "error")
    assert lines(panel) == {} and panel.word_result is None  # no old figure under the new error
    for word, contexts, expected in cases:  # (an intermediate state may be valid: only the end counts)
        panel.word.value, panel.contexts.value = word, contexts
        panel.word_button.click()
        assert expected in notes(panel, 1, "error") and panel.messages == panel.notes[1], expected
        assert notes(panel, 0, "error") == ""  # the other sub-tabs keep their own notes


def test_switching_sub_tab_shows_its_notes(panel):
    panel.word.value = "cat"
    assert panel.messages == panel.notes[0]  # the error waits in its own sub-tab
    panel.sections.selected_index = 1
    assert "does not occur" in " ".join(t for _, t in panel.messages)
    panel.sections.selected_index = 2
    assert panel.messages == panel.notes[2] and "points" in panel.messages[0][1]


# -- 3. map of words -------------------------------------------------------------------------
def test_map_points_and_stage_slider(panel, runs):
    sentences = [s for s in DEFAULT_MAP_SENTENCES.splitlines() if s.strip()]
    want = word_projection(panel.model, panel.tok, DEFAULT_MAP_WORDS.split(","), sentences)
    runs.clear()
    assert [t.name for t in panel.map_figure.data] == ["bank", "river", "money"]
    for stage in (6, 1):
        panel.map_stage.value = stage
        got = np.concatenate([np.stack([t.x, t.y], axis=1) for t in panel.map_figure.data]).astype(np.float32)
        order = np.argsort([["bank", "river", "money"].index(w) for w in want.words], kind="stable")
        np.testing.assert_allclose(got, want.points[stage].numpy()[order], atol=ATOL)
    assert "after layer 0" in panel.map_figure.layout.title.text
    assert runs == []


def test_new_words_redraw_the_map(panel):
    panel.map_words.value = "river, money"
    assert [t.name for t in panel.map_figure.data] == ["river", "money"]
    assert "7 points" in notes(panel, 2, "info")
    panel.map_words.value = "castle"
    assert "'castle' does not occur in any of the sentences" in notes(panel, 2, "error")
    assert len(panel.map_figure.data) == 0 and panel.proj is None  # no old map under the new error


def test_stage_moves_take_well_under_100_ms(panel):
    import time

    panel.text.value = " ".join(["word"] * 30)  # 32 tokens
    start = time.perf_counter()
    for stage in (0, 1, 2, 3, 4, 5, 6, 0, 1, 2):
        panel.token_stage.value = stage
        panel.map_stage.value = stage
    assert (time.perf_counter() - start) / 20 < 0.1  # per move


# -- the panel as a whole --------------------------------------------------------------------
def test_figures_for_export(panel):
    figs = panel.figures()
    assert set(figs) == {"token cosine", "word across stages", "word map", "sentence cosine"}
    assert all(type(f) is go.Figure for f in figs.values())


def test_set_model_recomputes_every_sub_tab(panel, tiny_checkpoints):
    tiny, tiny_tok = load(tiny_checkpoints["BertModel"])  # 2 layers, 1000-piece vocabulary
    panel.token_stage.value = 4
    panel.set_model(tiny, tiny_tok)
    assert [label for label, _ in panel.token_stage.options] == ["embeddings", "layer 0", "layer 1"]
    assert panel.token_stage.value == 2 and panel.map_stage.value == 2
    want = token_similarity(tiny, tiny_tok, DEFAULT_TEXT)
    np.testing.assert_allclose(z(panel), want.matrix(2).numpy(), atol=ATOL)
    # "bank" is not in the tiny vocabulary: a message, and no figure left over from the other model
    assert "not in the model's vocabulary" in notes(panel, 1, "error")
    assert len(panel.word_figure.data) == 0 and set(panel.figures()) == {"token cosine", "sentence cosine"}


def test_opening_a_sub_tab_keeps_its_figure_widget(panel):
    # Remaking it on show closed the old widget while its view, just shown, still talked to the
    # kernel ("No such comm" in JupyterLab): a figure made hidden now draws as the kernel has it.
    hidden = panel.map_figure
    panel.sections.selected_index = 2
    assert panel.map_figure is hidden and hidden.comm is not None and panel.boxes[2].children == (hidden,)
    panel.sections.selected_index = 0
    panel.map_words.value = "river, money"  # fewer traces, redrawn while hidden: a new widget ...
    redrawn = panel.map_figure
    assert redrawn is not hidden and panel.boxes[2].children == (redrawn,)
    assert hidden.comm is not None  # ... and the old one is closed only at the next swap
    panel.sections.selected_index = 2
    assert panel.map_figure is redrawn and [t.name for t in redrawn.data] == ["river", "money"]
    panel.map_words.value = "river"
    assert hidden.comm is None and redrawn.comm is not None


# -- An error clears the sub-tab's old figure; huge input is not echoed; busy sign -------
def test_an_error_clears_the_old_figure_of_its_sub_tab(panel):
    panel.text.value = ""
    assert "The text is empty" in notes(panel, 0, "error")
    assert panel.sim is None and len(panel.token_figure.data) == 0 and "token cosine" not in panel.figures()
    panel.text.value = DEFAULT_TEXT
    assert not notes(panel, 0, "error") and panel.sim is not None and len(panel.token_figure.data) == 1
    panel.sections.selected_index = 1
    panel.word.value = "cat"
    assert "does not occur" in notes(panel, 1, "error")
    assert panel.word_result is None and "word across stages" not in panel.figures()
    panel.sections.selected_index = 2
    panel.map_words.value = "castle"
    assert panel.proj is None and "word map" not in panel.figures()


def test_a_huge_word_is_not_echoed_whole(panel):
    panel.sections.selected_index = 1
    panel.word.value = " ".join(["bank"] * 5000)
    error = notes(panel, 1, "error")
    assert "does not occur" in error and len(error) < 400, len(error)
    panel.word.value = "\ud800"
    assert "broken character" in notes(panel, 1, "error")


def test_show_puts_up_a_busy_sign_and_disables_the_button(panel, monkeypatch):
    from bertlab.panels import similarity as panel_module

    seen = []
    real = panel_module.token_similarity

    def watching(*args, **kwargs):
        seen.append((panel.text_button.disabled, "bertlab-busy" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(panel_module, "token_similarity", watching)
    panel.text.value = "The cat sat."
    assert seen == [(True, True)] and not panel.text_button.disabled and "bertlab-busy" not in panel.message.value
