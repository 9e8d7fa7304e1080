"""No answer before the reveal: while a class question is live, every view that would show the
model's guess for its sentence (Mask, Ablation and its logit lens, Family, replay) holds it back with
one note, and shows it again once the teacher has revealed it; other sentences are not held."""

from __future__ import annotations

import pytest

from bertlab.classroom.questions import mask_question, same_sentence
from bertlab.classroom.store import ClassStore
from bertlab.panels.classroom import HELD_NOTE, AnswerHold

ASKED = "The man went to the {mask} to buy a gallon of milk."
OTHER = "The cat sat on the {mask}."


@pytest.mark.parametrize("typed, same", [
    ("The man went to the [MASK] to buy a gallon of milk.", True),
    ("the man   went to the [MASK] to buy a gallon of milk", True),  # case, spaces, punctuation
    ("The man went to the store to buy a gallon of milk.", True),  # the answer typed in: the Family tab hides it
    ("The man went to the [MASK] to buy a gallon of [MASK].", True),
    ("The man went to the [MASK] to buy a gallon of beer and bread.", False),
    ("The cat sat on the [MASK].", False),
    ("", False),
])
def test_the_question_sentence_is_recognised_however_it_is_typed(typed, same):
    assert same_sentence(typed, "The man went to the [MASK] to buy a gallon of milk.", "[MASK]") is same


@pytest.fixture
def live(default_model, tmp_path, monkeypatch):
    """A class store (as `bertlab serve --class` gives every kernel) with ASKED live, not revealed."""
    model, tok = default_model
    path = tmp_path / "class.sqlite"
    monkeypatch.setenv("BERTLAB_CLASS_STORE", str(path))
    store = ClassStore(path)
    question = store.push(mask_question(model, tok, ASKED.format(mask=tok.mask_token)))
    return store, question


def _held(panel) -> bool:
    return panel.messages == [("info", HELD_NOTE)]


def test_the_ablation_tab_and_its_logit_lens_hold_the_answer_until_the_reveal(default_model, live):
    from bertlab.panels.ablation import AblationPanel

    model, tok = default_model
    store, question = live
    panel = AblationPanel(model, tok)
    panel.text.value = ASKED.format(mask=tok.mask_token)
    assert _held(panel) and panel.figures() == {} and panel.lens is None and panel.ablation is None
    panel.effects_button.click()
    assert panel.effects is None and _held(panel)
    panel.text.value = OTHER.format(mask=tok.mask_token)  # any other sentence: as ever
    assert panel.lens is not None and "logit lens" in panel.figures()
    store.reveal(question.id)
    panel.text.value = ASKED.format(mask=tok.mask_token)
    assert not _held(panel) and panel.lens is not None and panel.ablation is not None


def test_the_mask_tab_holds_the_answer_after_the_guess_until_the_reveal(default_model, live):
    from bertlab.panels.mask import MaskPanel

    model, tok = default_model
    store, question = live
    panel = MaskPanel(model, tok, class_poll_s=None)
    panel.class_box.poll()
    panel.class_box.input.value = "shop"
    panel.class_box.send()  # the guess is in: the tab's own results come back, but not this answer
    assert not panel.class_box.hiding
    panel.text.value = ASKED.format(mask=tok.mask_token)
    assert panel.predictions == [] and ("info", HELD_NOTE) in panel.messages and panel.figures() == {}
    panel.each_button.click()  # hiding each word in turn would give it too
    assert panel.scores is None
    panel.text.value = OTHER.format(mask=tok.mask_token)
    assert panel.predictions and ("info", HELD_NOTE) not in panel.messages
    store.reveal(question.id)
    panel.text.value = ASKED.format(mask=tok.mask_token)
    assert panel.predictions and panel.predictions[0].candidates[0].token == question.model[0][0]


def test_guesses_drawn_before_the_push_are_held_back_once_it_comes(default_model, tmp_path, monkeypatch):
    from bertlab.panels.mask import MaskPanel

    model, tok = default_model
    path = tmp_path / "class.sqlite"
    monkeypatch.setenv("BERTLAB_CLASS_STORE", str(path))
    store = ClassStore(path)
    panel = MaskPanel(model, tok, text=ASKED.format(mask=tok.mask_token), class_poll_s=None)
    panel.class_box.poll()
    assert panel.predictions  # no question yet: the tab works as ever
    question = store.push(mask_question(model, tok, ASKED.format(mask=tok.mask_token)))
    panel.class_box.poll()  # what its thread does every second
    assert panel.predictions == [] and ("info", HELD_NOTE) in panel.messages
    store.reveal(question.id)
    panel.class_box.poll()
    assert panel.predictions and ("info", HELD_NOTE) not in panel.messages


def test_the_family_tab_holds_the_answer(default_model, live):
    from bertlab.panels.family import FamilyPanel

    model, tok = default_model
    store, question = live
    panel = FamilyPanel(model, tok, text=ASKED.format(mask="store"))  # the answer typed in, to be hidden
    assert _held(panel) and panel.figures() == {} and panel.views == []
    store.reveal(question.id)
    panel.compare_button.click()
    assert panel.views and panel.figures()


def test_outside_class_mode_nothing_is_held(default_model, monkeypatch):
    monkeypatch.delenv("BERTLAB_CLASS_STORE", raising=False)
    hold = AnswerHold.of_kernel()
    assert hold.store is None and hold.note(ASKED.format(mask="[MASK]"), "[MASK]") is None
