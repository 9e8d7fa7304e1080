"""The lectures' classic sentences: scored in one batched forward, as fill_mask scores each alone, for
every family's mask token, and shown on the picker's card before class."""

from __future__ import annotations

import pytest
from tiny_models import family_folder

from bertlab.analysis.classics import CLASSICS, TOP_K, Classic, classics_line, guess_classics
from bertlab.analysis.mask import fill_mask
from bertlab.loading import load
from bertlab.panels.picker import ModelPicker
from bertlab.panels.state import DEFAULT_NAME, ModelState


def test_the_batch_guesses_what_fill_mask_guesses_for_each_sentence_alone(default_model):
    model, tok = default_model
    results = guess_classics(model, tok)
    assert len(results) == len(CLASSICS) >= 12
    for r in results:
        alone = fill_mask(model, tok, r.sentence, k=TOP_K)[0]
        assert r.top == tuple(c.token for c in alone.candidates), r.sentence  # padding changes nothing
    # the verdict is the answers' list, not the model's first guess
    milk = results[0]
    assert milk.hit == any(w in CLASSICS[0].answers for w in milk.top)
    assert classics_line(results) == (f"guesses the lectures' examples: {sum(r.hit for r in results)} of "
                                      f"{len(results)} in its top 5")


def test_an_answer_counts_anywhere_in_the_top_k_and_only_there(default_model):
    model, tok = default_model
    (paris,) = guess_classics(model, tok, classics=(Classic("Paris is the capital of {mask}.", ("france",)),))
    assert paris.hit and "france" in paris.top
    (nothing,) = guess_classics(model, tok, classics=(Classic("Paris is the capital of {mask}.", ("zzz",)),))
    assert not nothing.hit


def test_each_family_spells_its_own_mask_token(tmp_path):
    model, tok = load(family_folder(tmp_path, "roberta"))
    results = guess_classics(model, tok)
    assert tok.mask_token != "[MASK]" and all(tok.mask_token in r.sentence for r in results)
    assert all(len(r.top) == TOP_K and all(w == w.strip() for w in r.top) for r in results)


def test_the_picker_card_says_how_the_model_guesses_the_lectures_examples(default_model, tiny_checkpoints):
    state = ModelState(*default_model)
    picker = ModelPicker(state)
    hits = sum(r.hit for r in guess_classics(*default_model))
    assert f"guesses the lectures' examples: {hits} of {len(CLASSICS)} in its top 5" in picker.card.value
    assert "bertlab download bert-base-uncased" in picker.card.value  # and how to have a real BERT for a lesson
    assert "bertlab serve --class N --model bert-base-uncased" in picker.card.value
    # the tooltip lists each sentence with its guesses, escaped
    assert "Paris is the capital of [MASK]. →" in picker.card.value
    headless, tok = load(tiny_checkpoints["BertModel"])
    state.add("headless", headless, tok, switch=True)
    assert "lectures' examples" not in picker.card.value and "✗ MLM head" in picker.card.value
    assert "bert-base-uncased" not in picker.card.value  # the hint is the offline default's
    state.switch(DEFAULT_NAME)
    assert f"{hits} of {len(CLASSICS)}" in picker.card.value


def test_a_model_is_scored_once(default_model, monkeypatch):
    from bertlab.panels import picker as picker_module

    calls = []
    real = picker_module.guess_classics
    monkeypatch.setattr(picker_module, "guess_classics", lambda *a, **k: calls.append(1) or real(*a, **k))
    state = ModelState(*default_model)
    picker = ModelPicker(state)
    state.add("again", *default_model, switch=True)  # the same model object under a second name
    state.switch(DEFAULT_NAME)
    assert calls == [1] and "of 12" in picker.card.value


@pytest.mark.parametrize("classic", CLASSICS)
def test_every_classic_has_one_mask_and_lower_case_answers(classic):
    assert classic.template.count("{mask}") == 1 and "[" not in classic.template
    assert classic.answers and all(a == a.casefold().strip() for a in classic.answers)
