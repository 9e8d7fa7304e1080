""""Does attention explain it?" in the Mask, Next sentence and "Use it" views, without a browser:
closed it computes nothing; opened it draws attention, rollout and the attribution of the tab's own
prediction, with the rank agreement and the heads test."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import tiny_bert

import bertlab.panels.explain as explain_module
from bertlab.analysis.attribution import attribute as real_attribute
from bertlab.panels.explain import NOTHING_TO_EXPLAIN
from bertlab.panels.mask import MaskPanel
from bertlab.panels.nsp import NSPPanel
from bertlab.panels.use import UsePanel
from bertlab.tasks import CONLL_LABELS, SST2_LABELS

pytestmark = pytest.mark.usefixtures("one_thread")


class Calls(list):
    """Each attribution the sections compute: (target, method, busy sign on show, button disabled);
    `section` is the section whose busy sign is read."""

    section = None


@pytest.fixture
def calls(monkeypatch) -> Calls:
    seen = Calls()

    def counting(model, tok, ex, target, method="ig", **kw):
        section = seen.section
        busy = section is not None and "bertlab-busy" in section.message.value
        seen.append((target, method, busy, section is not None and section.explain_button.disabled))
        return real_attribute(model, tok, ex, target, method=method, **kw)

    monkeypatch.setattr(explain_module, "attribute", counting)
    return seen


def heatmap(section) -> np.ndarray:
    return np.array(section.figure_box.children[0].data[0].z, dtype=float)


def infos(panel) -> str:
    return " ".join(text for level, text in panel.messages if level == "info")


def test_mask_tab_explains_the_hidden_word_only_when_opened(default_model, calls):
    model, tok = default_model
    panel = MaskPanel(model, tok, text=f"The man went to the {tok.mask_token} store to buy milk.")
    section = panel.explain
    calls.section = section
    assert section.widget in panel.widget.children and not section.is_open
    assert calls == [] and section.figure_box.children == ()  # closed: nothing computed
    section.toggle.value = True
    assert len(calls) == 1
    target, method, busy, disabled = calls[0]
    assert method == "ig" and busy and disabled  # the busy sign while IG runs
    assert target.kind == "mlm" and target.position == panel.predictions[0].position
    assert target.index == panel.predictions[0].top.token_id  # a typed mask: the top guess is explained
    z = heatmap(section)
    assert z.shape == (3, len(panel.predictions[0].tokens))
    scores = np.array(section.attribution.scores)
    words = ~np.array(section.attribution.keep)
    np.testing.assert_allclose(z[2, words], np.round(scores[words] / np.abs(scores[words]).max(), 4), atol=1e-4)
    assert np.isnan(z[:, ~words]).all()  # special tokens are not coloured
    bars = section.figure_box.children[0].data[1]
    assert list(bars.x) == pytest.approx([section.check.heads.base, section.check.heads.ablated,
                                          section.check.heads.random_mean])
    assert "completeness gap" in infos(section) and "Switching off the 6 heads" in infos(section)
    assert section.attribution.completeness_gap <= 0.01
    assert "Mask: does attention explain it" not in panel.figures()  # the app prefixes the tab
    assert "does attention explain it" in panel.figures()

    section.layer.value, section.head.value = 2, 5  # another attention view: no new attribution
    assert len(calls) == 1 and section.check.view == "layer 2, head 5"
    section.method.value = "grad-x-input"
    assert len(calls) == 2 and calls[-1][1] == "grad-x-input" and section.attribution.completeness_gap is None

    panel.text.value = f"She drank a cup of {tok.mask_token} and a glass of {tok.mask_token}."
    assert len(calls) == 3 and len(section.choice.options) == 2  # one choice per hidden piece
    section.choice.value = 1
    assert calls[-1][0].position == panel.predictions[1].position
    section.toggle.value = False
    panel.text.value = f"My dog is {tok.mask_token}."
    assert len(calls) == 4 and section.figure_box.children == ()  # closed: nothing computed, the old one cleared


def test_mask_tab_hidden_word_explains_the_true_piece(default_model, calls):
    model, tok = default_model
    panel = MaskPanel(model, tok, text="The cat sat on the mat.")
    panel.word_buttons.children[5].value = True  # hide "mat"
    panel.explain.toggle.value = True
    assert calls[-1][0].index == tok.token_to_id("mat")


def test_mask_tab_without_an_mlm_head_says_so_in_the_section(tok, calls):
    panel = MaskPanel(tiny_bert(tok), tok)
    panel.explain.toggle.value = True
    assert calls == [] and panel.explain.figure_box.children == ()
    assert "MLM" in " ".join(text for _, text in panel.messages)  # the tab says it once, the section points there
    assert panel.explain.messages == [("info", NOTHING_TO_EXPLAIN)]


def test_next_sentence_tab_explains_isnext_and_clears_on_an_error(default_model, calls):
    model, tok = default_model
    panel = NSPPanel(model, tok, a="The man went to the store.", b="He bought a gallon of milk.")
    section = panel.explain
    section.toggle.value = True
    target = calls[-1][0]
    assert target.kind == "pair" and target.index == 0 and target.query == 0
    assert section.check.tokens == panel.result.tokens
    assert section.attribution.value == pytest.approx(panel.result.is_next_probability, abs=1e-5)
    assert "does attention explain it" in panel.figures()
    panel.text_b.value = ""
    assert section.figure_box.children == () and section.check is None  # an old figure never stays
    assert "empty" in " ".join(text for level, text in panel.messages if level == "error")
    assert section.messages == [("info", NOTHING_TO_EXPLAIN)]  # one red message on the page, not two


def test_use_it_explains_a_class_an_entity_tag_and_an_answer(tok, calls):
    base = tiny_bert(tok, seed=1)
    use = UsePanel()
    use.show_model(base.with_heads(task="sequence_classification", id2label=SST2_LABELS), tok, "sst2 model")
    use.explain.toggle.value = True
    target = calls[-1][0]
    assert target.kind == "class" and use.explain.figure_box.children
    probs = use.probs_box.children[0].data[0].x
    assert target.index == int(np.argmax(probs))  # the predicted class is explained

    use.show_model(base.with_heads(task="token_classification", id2label=CONLL_LABELS), tok, "ner model")
    assert calls[-1][0].kind == "tag" and use.explain.choice.options[0][0] == "tag of the first entity"
    words = [label for label, _ in use.explain.choice.options]
    use.explain.choice.value = 2  # word 1
    assert calls[-1][0].position is not None and words[2].startswith("tag of word 1")

    use.show_model(base.with_heads(task="question_answering"), tok, "qa model")
    assert calls[-1][0].kind == "start"
    use.explain.choice.value = 1
    assert calls[-1][0].kind == "end" and use.explain.figure_box.children
    assert "does attention explain it" in use.figures()
