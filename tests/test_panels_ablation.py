"""Ablation tab without a browser: build the panel, flip head toggles, press the buttons, and
check the numbers against the pure functions of bertlab.analysis.ablation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from bertlab.analysis.ablation import (
    head_ablation,
    logit_lens,
    masked_log_probs,
    masked_query,
    single_head_effects,
)
from bertlab.inputs import InputError
from bertlab.panels.ablation import DEFAULT_TARGET, DEFAULT_TEXT, AblationPanel

TINY_TEXT = "one ! two [MASK] three ! !"


@pytest.fixture
def panel(default_model) -> AblationPanel:
    model, tok = default_model
    return AblationPanel(model, tok)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    from bertlab.loading import load

    return load(tiny_checkpoints["BertForPreTraining"])  # 2 layers x 4 heads, MLM head


def notes(panel, level: str) -> str:
    return " ".join(text for lvl, text in panel.messages if lvl == level)


# -- the analysis additions: progress, a [MASK] lost to the cut ----------------------------------
def test_progress_reports_every_forward_pass(default_model):
    model, tok = default_model
    query = masked_query(model, tok, DEFAULT_TEXT, DEFAULT_TARGET)
    seen: list[tuple[int, int]] = []
    masks = torch.ones(5, 6, 12)
    masks[1:, 0, :4] = 0
    chunked = masked_log_probs(model, query, masks, batch_size=2, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(2, 5), (4, 5), (5, 5)]
    torch.testing.assert_close(chunked, masked_log_probs(model, query, masks), atol=1e-4, rtol=0)
    seen.clear()
    effects = single_head_effects(model, tok, DEFAULT_TEXT, DEFAULT_TARGET, batch_size=30,
                                  progress=lambda d, t: seen.append((d, t)))
    assert seen == [(30, 73), (60, 73), (73, 73)] and effects.effects.shape == (6, 12)


def test_a_mask_cut_off_by_a_long_text_is_named(default_model):
    model, tok = default_model
    with pytest.raises(InputError, match="The \\[MASK\\] was cut off.*tokens were cut"):
        masked_query(model, tok, "word " * 600 + "[MASK].")
    with pytest.raises(InputError, match="has no \\[MASK\\]"):
        masked_query(model, tok, "word " * 600)  # no [MASK] at all: the usual message


# -- the panel ---------------------------------------------------------------------------------
def test_panel_opens_on_the_default_question(panel):
    model, tok = panel.model, panel.tok
    expected = head_ablation(model, tok, DEFAULT_TEXT, [], DEFAULT_TARGET)
    assert panel.ablation.base_log_prob == pytest.approx(expected.base_log_prob, abs=1e-4)
    assert panel.ablation.heads_off == [] and "paris" in notes(panel, "info")
    assert f"{expected.base_log_prob:.2f}" in panel.summary.value and "Click heads" in panel.summary.value
    assert len(panel.head_buttons) == 6 and all(len(row) == 12 for row in panel.head_buttons)
    lens = logit_lens(model, tok, DEFAULT_TEXT, DEFAULT_TARGET)
    np.testing.assert_allclose(panel.lens_figure.data[0].z, lens.top_probs.numpy(), atol=1e-4)
    assert [list(r) for r in panel.lens_figure.data[0].text] == lens.top_tokens
    assert panel.effects is None and not panel.effects_box.children
    assert set(panel.figures()) == {"logit lens"} and type(panel.figures()["logit lens"]) is go.Figure
    assert panel.lens_box in panel.widget.children and panel.message in panel.widget.children


def test_switching_heads_off_changes_the_log_prob(panel):
    panel.head_buttons[4][9].value = True
    panel.head_buttons[0][3].value = True
    expected = head_ablation(panel.model, panel.tok, DEFAULT_TEXT, [(0, 3), (4, 9)], DEFAULT_TARGET)
    assert panel.heads_off() == [(0, 3), (4, 9)] and panel.ablation.heads_off == [(0, 3), (4, 9)]
    assert panel.ablation.change == pytest.approx(expected.change, abs=1e-4) and expected.change != 0
    assert f"{expected.change:+.2f} nats" in panel.summary.value and "L0H3, L4H9" in panel.summary.value
    assert panel.head_buttons[4][9].button_style == "danger"
    panel.reset_button.click()
    assert panel.heads_off() == [] and panel.ablation.heads_off == []
    assert panel.head_buttons[4][9].button_style == ""


def test_effect_of_every_head_draws_the_heatmap_with_progress(panel):
    panel.effects_button.click()
    expected = single_head_effects(panel.model, panel.tok, DEFAULT_TEXT, DEFAULT_TARGET)
    z = np.asarray(panel.effects_figure.data[0].z)
    assert z.shape == (6, 12)
    np.testing.assert_allclose(z, expected.effects.numpy(), atol=1e-3)
    assert (panel.progress.value, panel.progress.max) == (73, 73)
    assert panel.progress.layout.visibility == "hidden" and not panel.effects_button.disabled
    assert set(panel.figures()) == {"head effects", "logit lens"}
    # a click on a cell switches that head off
    panel._on_effects_click(panel.effects_figure.data[0], SimpleNamespace(xs=[7], ys=[2]), None)
    assert panel.heads_off() == [(2, 7)] and panel.ablation.heads_off == [(2, 7)]


def test_new_text_drops_stale_head_effects(panel):
    panel.effects_button.click()
    panel.show_button.click()  # same inputs: kept
    assert panel.effects is not None and panel.effects_box.children
    panel.text.value = "The capital of Italy is [MASK]."
    assert panel.effects is None and not panel.effects_box.children
    assert "press “Effect of every head” again" in notes(panel, "info")
    assert "head effects" not in panel.figures()


def test_blank_target_follows_the_top_guess(panel):
    panel.target.value = "  "
    top = panel.ablation.base_top[0][0]
    assert panel.ablation.query.target == top and panel.ablation.base_rank == 1
    assert "top guess" in notes(panel, "info")


@pytest.mark.parametrize(
    "text, target, level, needle",
    [
        ("", "paris", "error", "type a sentence"),
        ("   ", "paris", "error", "type a sentence"),
        ("No mask in here.", "paris", "error", "has no [MASK]"),
        ("[MASK] and [MASK]", "paris", "error", "2 [MASK]"),
        (DEFAULT_TEXT, "copenhagenization", "error", "pieces"),
        (DEFAULT_TEXT, "🙂", "error", "not in the model's vocabulary"),
        ("word " * 600 + "[MASK].", "paris", "error", "cut off"),
        ("[MASK] " + "word " * 600, "paris", "warning", "cut"),
        ("我爱北京 🙂 [MASK]", "paris", "warning", "[UNK]"),
        ("[MASK]", "paris", "error", "nothing to guess from"),
        ("[mask] [MASK]", "paris", "error", "2 [MASK]"),  # typed in any case, as in the Mask tab
        ("The capital of \ud800 is [MASK].", "paris", "error", "broken character"),
        ("\u200b\x00\u200b", "paris", "error", "invisible characters"),
        (DEFAULT_TEXT, "\ud800", "error", "broken character"),
    ],
)
def test_odd_input_gives_a_message_not_a_traceback(panel, text, target, level, needle):
    panel.target.value = target
    panel.text.value = text
    assert needle in notes(panel, level)
    if level == "error":
        assert "Something went wrong" not in notes(panel, "error")
    else:
        assert not notes(panel, "error")


def test_no_mlm_head_points_to_pretraining(panel, default_model):
    model, tok = default_model
    panel.effects_button.click()
    panel.set_model(model.with_heads(()), tok)
    assert "no MLM head" in notes(panel, "warning") and "Pre-training tab" in notes(panel, "warning")
    assert not notes(panel, "error") and panel.figures() == {} and panel.effects_button.disabled
    panel.head_buttons[0][0].value = True  # a click does not raise either
    panel.effects_button.click()
    panel.set_model(model, tok)
    assert not notes(panel, "warning") and set(panel.figures()) == {"logit lens"}
    assert panel.ablation.heads_off == [(0, 0)]


def test_set_model_rebuilds_the_grid_and_recomputes(panel, tiny):
    panel.text.value, panel.target.value = TINY_TEXT, ""
    panel.head_buttons[1][2].value = True
    panel.head_buttons[5][11].value = True
    panel.effects_button.click()
    model, tok = tiny
    panel.set_model(model, tok)
    assert len(panel.head_buttons) == 2 and all(len(row) == 4 for row in panel.head_buttons)
    assert panel.heads_off() == [(1, 2)]  # kept where the head still exists
    expected = head_ablation(model, tok, TINY_TEXT, [(1, 2)])
    assert panel.ablation.ablated_log_prob == pytest.approx(expected.ablated_log_prob, abs=1e-4)
    effects = single_head_effects(model, tok, TINY_TEXT)
    np.testing.assert_allclose(panel.effects_figure.data[0].z, effects.effects.numpy(), atol=1e-3)
    assert np.asarray(panel.lens_figure.data[0].z).shape == (3, 5)  # embeddings + 2 layers


# -- stale results, odd input, the busy sign -------------------------------------------
def test_an_error_clears_the_previous_sentences_results(panel):
    panel.effects_button.click()
    assert set(panel.figures()) == {"head effects", "logit lens"} and panel.summary.value
    panel.text.value = "No mask in here."
    assert "has no [MASK]" in notes(panel, "error")
    assert "token position" not in notes(panel, "error")  # the panel has no such control
    assert panel.ablation is None and panel.lens is None and panel.effects is None
    assert panel.summary.value == "" and panel.figures() == {} and panel.effects_button.disabled
    panel.head_buttons[0][1].value = True  # a head click on bad text: still nothing stale
    assert panel.summary.value == "" and panel.figures() == {}
    panel.text.value = DEFAULT_TEXT
    assert not notes(panel, "error") and set(panel.figures()) == {"logit lens"}
    assert panel.ablation.heads_off == [(0, 1)] and not panel.effects_button.disabled


def test_lowercase_mask_is_accepted_as_in_the_mask_tab(panel, default_model):
    model, tok = default_model
    panel.text.value = "The capital of France is [mask]."
    assert not notes(panel, "error")
    assert panel.ablation.query.tokens[panel.ablation.query.position] == tok.mask_token
    expected = head_ablation(model, tok, DEFAULT_TEXT, [], DEFAULT_TARGET)
    assert panel.ablation.base_log_prob == pytest.approx(expected.base_log_prob, abs=1e-5)


def test_a_huge_target_is_not_echoed_whole(panel):
    panel.target.value = " ".join(["tokenization"] * 5000)
    error = notes(panel, "error")
    assert "split into" in error and len(error) < 400 and "characters)" in error


def test_show_puts_up_a_busy_sign_and_disables_the_button(panel, monkeypatch):
    from bertlab.panels import ablation as panel_module

    seen = []
    real = panel_module.head_ablation

    def watching(*args, **kwargs):
        seen.append((panel.show_button.disabled, "Working" in panel.message.value))
        return real(*args, **kwargs)

    monkeypatch.setattr(panel_module, "head_ablation", watching)
    panel.text.value = "The capital of Italy is [MASK]."
    assert seen == [(True, True)]
    assert not panel.show_button.disabled and "Working" not in panel.message.value
