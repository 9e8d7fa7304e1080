"""Every tab on every family member: tiny RoBERTa, ALBERT, DistilBERT and ELECTRA checkpoints
written by transformers (tokenizers trained here), driven like a student would (type, click).
No tab says "Something went wrong"; each shows the right figure, or says plainly what the model lacks."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_models import family_folder

from bertlab.analysis.replaced import replaced_tokens
from bertlab.loading import load
from bertlab.model import MissingHeadError
from bertlab.panels.app import App
from bertlab.panels.base import lacks
from bertlab.panels.mask import MaskPanel
from bertlab.panels.nsp import NSPPanel
from bertlab.panels.representation import RepresentationPanel
from bertlab.panels.state import ModelState
from bertlab.training.corpora import Document

DOCS = [Document(["The quick brown fox jumps over the lazy dog.", "Students train small models on a laptop.",
                  "BERT reads both directions at once.", "Numbers like these appear too."], title="Foxes")]
BROKE = "Something went wrong"


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    root = tmp_path_factory.mktemp("members")
    return {m: load(str(family_folder(root, m))) for m in ("roberta", "albert", "distilbert", "electra")}


def _all_notes(panel) -> str:
    return " ".join(text for _, text in panel.messages)


def _clean(panel) -> None:
    assert BROKE not in panel.message.value, panel.message.value
    assert not [t for level, t in panel.messages if level == "error"], panel.messages


def test_mask_tab_uses_robertas_own_mask_token(members):
    model, tok = members["roberta"]
    assert tok.mask_token == "<mask>"
    panel = MaskPanel(model, tok, text="The quick brown fox jumps.", classroom=None, class_poll_s=None)
    panel.text.value = "The quick brown <mask> jumps over the lazy dog."
    panel.predict_button.click()
    _clean(panel)
    (pred,) = panel.predictions
    assert pred.tokens[pred.position] == "<mask>" and len(pred.candidates) > 0
    assert list(panel.figures()) == ["guesses for the hidden words"]
    # Clicking a word hides it with <mask> as well.
    dog = next(b for b in panel.word_buttons.children if b.description.strip() == "dog")
    dog.value = True
    _clean(panel)
    assert len(panel.predictions) == 2


def test_electra_discriminator_shows_replaced_per_word(members):
    model, tok = members["electra"]
    panel = MaskPanel(model, tok, text="The chef cooked the meal.", classroom=None, class_poll_s=None)
    panel.text.value = "The quick brown fox jumps over the lazy dog."
    panel.predict_button.click()
    _clean(panel)
    assert panel.predictions == [] and panel.replaced is not None
    assert panel.word_buttons.layout.display == "none" and panel.k.layout.display == "none"  # nothing to hide
    assert "replaced" in _all_notes(panel) and "no MLM head" in _all_notes(panel)
    fig = panel.figures()["replaced? per word"]
    words = [w for w, _ in panel.replaced.words]
    assert words == "The quick brown fox jumps over the lazy dog.".replace(".", " .").split()
    # The bars are the discriminator's own sigmoid(rtd_logits), word by word (max over a word's pieces).
    enc = tok.encode(panel.text.value)
    with torch.inference_mode():
        p = torch.sigmoid(model(torch.tensor([enc.ids])).rtd_logits[0])
    expected = [float(p[a:b].max()) for _, a, b in enc.word_spans()]
    assert fig.data[0].y == pytest.approx(expected, abs=1e-4)
    assert replaced_tokens(model, tok, panel.text.value).flagged == [w for w, q in zip(words, expected) if q > 0.5]
    panel.each_button.click()  # needs an MLM head: no crash, no scores
    _clean(panel)
    assert panel.scores is None


def test_mask_tab_says_plainly_when_there_is_neither_mlm_nor_rtd(members, tmp_path):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    folder = tmp_path / "bare"
    model, tok = members["distilbert"]
    transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=80,
    )).save_pretrained(folder)
    tok.save(folder)
    bare, tok = load(str(folder))
    panel = MaskPanel(bare, tok, classroom=None, class_poll_s=None)
    _clean(panel)
    assert panel.messages == [("warning", lacks(bare, "mlm_head"))]
    assert "no MLM head" in lacks(bare, "mlm_head") and "ELECTRA" not in lacks(bare, "mlm_head")
    assert panel.figures() == {}


def test_albert_next_sentence_tab_is_sentence_order(members):
    model, tok = members["albert"]
    panel = NSPPanel(model, tok, documents=DOCS, classroom=None, class_poll_s=None)
    panel.text_a.value, panel.text_b.value = "The quick brown fox jumps.", "It lands on the lazy dog."
    panel.check_button.click()
    _clean(panel)
    assert "sentence order" in _all_notes(panel)
    figs = panel.figures()
    assert set(figs) == {"P(A before B)", "attention between the sentences"}
    bar = figs["P(A before B)"]
    assert bar.data[0].y == ("sentence order",) and "A before B" in bar.data[0].name
    p = panel.result.is_next_probability
    assert f"P(A before B) = {100 * p:.1f}%" in bar.layout.title.text
    enc = tok.encode(panel.text_a.value, panel.text_b.value)
    with torch.inference_mode():  # the SOP head's index 0 ("in order"), straight from the model
        logits = model(torch.tensor([enc.ids]), torch.tensor([enc.type_ids])).nsp_logits[0]
    assert p == pytest.approx(float(torch.softmax(logits, -1)[0]), abs=1e-5)
    panel.swap_button.click()
    _clean(panel)
    assert panel.result.text_a == "It lands on the lazy dog." and "P(A before B)" in panel.figures()


@pytest.mark.parametrize("member", ["roberta", "distilbert", "electra"])
def test_next_sentence_tab_says_when_there_is_neither_nsp_nor_sop(members, member):
    model, tok = members[member]
    panel = NSPPanel(model, tok, documents=DOCS, classroom=None, class_poll_s=None)
    panel.random_button.click()
    _clean(panel)
    assert ("warning", lacks(model, "pair_head")) in panel.messages
    assert "neither BERT's next-sentence prediction nor ALBERT's sentence order" in lacks(model, "pair_head")
    assert panel.result is None and list(panel.figures()) == ["attention between the sentences"]
    assert "no NSP or SOP head" in panel.probability_box.children[0].layout.annotations[0].text
    segments = lacks(model, "segment_embeddings")
    assert (segments is None) == (member == "electra")  # RoBERTa (one segment type) and DistilBERT (none)
    if segments:
        assert ("info", segments) in panel.messages


def test_distilbert_input_tab_has_no_segment_part(members):
    model, tok = members["distilbert"]
    panel = RepresentationPanel(model, tok)
    panel.text_a.value, panel.text_b.value = "The quick brown fox.", "It jumps."
    _clean(panel)
    assert ("info", lacks(model, "segment_embeddings")) in panel.messages
    assert not any("segment 1" in t for _, t in panel.messages)
    assert "segment" not in panel.rep.parts and {"token", "position", "sum"} <= set(panel.rep.parts)
    assert panel.figures()


@pytest.mark.parametrize("member", ["roberta", "albert", "distilbert", "electra"])
def test_every_tab_opens_and_runs_on_every_member(members, member, shared_data, caplog):
    model, tok = members[member]
    app = App(ModelState(model, tok, name=member))
    with caplog.at_level(logging.ERROR):
        for i, (title, _) in enumerate(app.tabs_spec):
            panel = app.open(i)
            assert panel is not None, f"{title} could not open on {member}"
            assert BROKE not in panel.message.value, (title, panel.message.value)
    assert not [r for r in caplog.records if "failed" in r.getMessage()], [r.getMessage() for r in caplog.records]


def test_a_missing_head_is_a_plain_warning_not_a_bug(members):
    model, tok = members["roberta"]
    panel = MaskPanel(model, tok, classroom=None, class_poll_s=None)
    with panel.reporting():
        model.require("nsp")
    assert BROKE not in panel.message.value
    assert panel.messages[0][0] == "warning" and "no NSP head" in panel.messages[0][1]


@pytest.mark.parametrize("member", ["roberta", "albert", "distilbert", "electra"])
def test_the_logit_lens_reads_every_members_own_mlm_head(members, member):
    """After the last layer the lens gives the model's own MLM output (each family's head, not BERT's `cls`)."""
    import torch

    from bertlab.analysis.ablation import logit_lens

    model, tok = members[member]
    if not model.has_mlm:  # the ELECTRA discriminator: a plain message, no lens
        with pytest.raises(MissingHeadError):
            logit_lens(model, tok, f"The quick brown {tok.mask_token} jumps.", k=3)
        return
    lens = logit_lens(model, tok, f"The quick brown {tok.mask_token} jumps.", k=3)
    q = lens.query
    with torch.no_grad():
        out = model(q.input_ids, q.token_type_ids)
    want = out.mlm_logits[0, q.position].float().log_softmax(-1)
    assert torch.allclose(lens.target_log_probs[-1], want[q.target_id], atol=1e-5)
    assert lens.top_ids[-1].tolist() == want.topk(3).indices.tolist()
