"""Text that is mostly [UNK] (emoji, rare symbols): every tab that reads text says plainly that its result says
little about it, through one helper (bertlab.panels.base.unknown_notes). NSP used to give 100 % IsNext for a pair
of emoji with only a count of unknown pieces."""

from __future__ import annotations

import pytest

from bertlab.panels.base import unknown_notes

EMOJI_A, EMOJI_B = "\U0001F600 \U0001F603 \U0001F604", "\U0001F605 \U0001F606"
MOSTLY = "Most of this input"


def warnings(panel) -> str:
    return " ".join(text for level, text in panel.messages if level == "warning")


def test_the_helper_counts_the_text_not_the_special_tokens():
    specials = ["[CLS]", "[SEP]", "[UNK]"]
    one_of_two = ["[CLS]", "[UNK]", "cat", "[SEP]"]
    assert MOSTLY not in unknown_notes(one_of_two, "[UNK]", specials=specials)[0][1]  # half is not most
    two_of_three = ["[CLS]", "[UNK]", "[UNK]", "cat", "[SEP]"]
    assert MOSTLY in unknown_notes(two_of_three, "[UNK]", specials=specials)[0][1]
    assert unknown_notes(["[CLS]", "cat", "[SEP]"], "[UNK]", specials=specials) == []


def test_next_sentence_warns_on_a_pair_of_emoji(default_model):
    from bertlab.panels.nsp import NSPPanel

    panel = NSPPanel(*default_model, documents=[])
    panel.text_a.value, panel.text_b.value = EMOJI_A, EMOJI_B
    panel.check_button.click()
    assert panel.result is not None and MOSTLY in warnings(panel), panel.messages


@pytest.mark.parametrize("tab", ["attention", "representation", "similarity", "ablation"])
def test_every_text_tab_warns(default_model, tab):
    model, tok = default_model
    if tab == "attention":
        from bertlab.panels.attention import AttentionPanel

        panel = AttentionPanel(model, tok)
        panel.text_a.value = EMOJI_A
    elif tab == "representation":
        from bertlab.panels.representation import RepresentationPanel

        panel = RepresentationPanel(model, tok, text_b="")
        panel.text_a.value = EMOJI_A
        panel.show_button.click()
    elif tab == "similarity":
        from bertlab.panels.similarity import SimilarityPanel

        panel = SimilarityPanel(model, tok)
        panel.text.value = EMOJI_A
    else:
        from bertlab.panels.ablation import AblationPanel

        panel = AblationPanel(model, tok, target="")
        panel.text.value = f"{EMOJI_A} {tok.mask_token} \U0001F607"
    assert MOSTLY in warnings(panel), panel.messages
