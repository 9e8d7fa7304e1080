"""The Family tab's "Both ways vs left to right": a tiny BERT (written by transformers) beside a tiny GPT-2 (as
test_gpt2 writes one) on one sentence. The causal pattern is zero right of the diagonal and the encoder's is
not; the grids are the masks the models apply; the causal guess at a position ignores every later token while
the encoder's does not; the section builds, redraws and says plainly what is wrong."""

from __future__ import annotations

import pytest
import torch
from test_gpt2 import gpt2_tokenizer, write_checkpoint
from tiny_models import family_folder

from bertlab import masks
from bertlab.analysis.both_ways import ADD_CAUSAL, both_ways, encode, pattern, pick_pair, reach
from bertlab.analysis.family import MAX_CHARS, Loaded, word_choices
from bertlab.loading import load
from bertlab.panels.family import FamilyPanel
from bertlab.panels.state import ModelState

TEXT = "The quick brown fox jumps over the lazy dog."
LATER = "The quick brown fox sleeps under a warm red blanket."  # same start, other words after "fox"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("both-ways")
    bert = load(str(family_folder(root, "bert")))
    torch.manual_seed(0)
    with torch.no_grad():  # weights drawn wide, as test_gpt2 draws them: each guess leans on its context
        for p in bert[0].parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    gpt2 = load(str(write_checkpoint(root / "gpt2", "GPT2LMHeadModel", gpt2_tokenizer())))
    return Loaded("bert", *bert), Loaded("gpt2", *gpt2)


def _word(text: str, which: str):
    return next(w for w in word_choices(text) if w.text == which)


def test_the_pair_is_an_encoder_and_a_causal_model(pair):
    bert, gpt2 = pair
    assert pick_pair([gpt2, bert]) == (bert, gpt2)
    assert pick_pair([bert]) == (bert, None)


def test_patterns_full_vs_triangular_and_grids_are_the_masks(pair):
    bert, gpt2 = pair
    for layer in range(2):
        for head in range(4):
            tri = pattern(gpt2.model, gpt2.tok, TEXT, layer, head)
            above = ~masks.causal(tri.shape[0])
            assert float(tri[above].abs().max()) == 0.0
            full = pattern(bert.model, bert.tok, TEXT, layer, head)
            assert float(full[~masks.causal(full.shape[0])].min()) > 0.0  # every key to the right gets weight
    enc_b, enc_g = encode(bert.model, bert.tok, TEXT), encode(gpt2.model, gpt2.tok, TEXT)
    assert torch.equal(reach(bert.model, enc_b), masks.bidirectional(len(enc_b)))
    assert torch.equal(reach(gpt2.model, enc_g), masks.causal(len(enc_g)))


def test_the_left_guess_ignores_later_words_and_the_masked_guess_does_not(pair):
    bert, gpt2 = pair
    a = both_ways(bert, gpt2, TEXT, _word(TEXT, "fox"), layer=1, head=2, k=5)
    b = both_ways(bert, gpt2, LATER, _word(LATER, "fox"), layer=1, head=2, k=5)
    ga, gb = a.causal.guess, b.causal.guess
    assert a.causal.position == b.causal.position and ga.original_token == gb.original_token
    assert [c.token for c in ga.candidates] == [c.token for c in gb.candidates]
    assert all(abs(x.probability - y.probability) < 1e-6 for x, y in zip(ga.candidates, gb.candidates))
    ea, eb = a.encoder.guess, b.encoder.guess
    assert max(abs(x.probability - y.probability) for x, y in zip(ea.candidates, eb.candidates)) > 1e-4
    assert a.causal.reads == "from the left only" and a.encoder.reads == "from both sides"
    # The causal pattern of the rows up to "fox" does not move either; the encoder's does.
    p = a.causal.position
    assert torch.allclose(a.causal.pattern[:p + 1, :p + 1], b.causal.pattern[:p + 1, :p + 1], atol=1e-6)
    assert not torch.allclose(a.encoder.pattern[:3, :3], b.encoder.pattern[:3, :3], atol=1e-4)


def test_the_first_word_has_nothing_to_its_left(pair):
    bert, gpt2 = pair
    r = both_ways(bert, gpt2, TEXT, _word(TEXT, "The"))
    assert r.causal.guess is None and "nothing stands to its left" in r.causal.note
    assert r.encoder.guess is not None


def _panel(pair, *names):
    by = {m.name: m for m in pair}
    state = ModelState(by[names[0]].model, by[names[0]].tok, name=names[0])
    for n in names[1:]:
        state.add(n, by[n].model, by[n].tok)
    panel = FamilyPanel(by[names[0]].model, by[names[0]].tok, state=state, text=TEXT)
    panel.pick(*names)
    return panel


def test_panel_draws_redraws_and_says_what_is_wrong(pair):
    panel = _panel(pair, "bert", "gpt2")
    sec = panel.both
    assert sec.result is not None and "both ways" in panel.figures()
    assert not [t for level, t in panel.messages if level == "error"], panel.messages
    fig = panel.figures()["both ways"]
    assert "triangular" in " ".join(a.text for a in fig.layout.annotations)
    before = [list(map(list, fig.data[0].z))]
    busy = []
    original = panel.busy
    panel.busy = lambda *a, **kw: busy.append(kw.get("text")) or original(*a, **kw)
    sec.layer.value = 1
    assert busy and sec.result.layer == 1
    assert [list(map(list, panel.figures()["both ways"].data[0].z))] != before
    # A word that is no longer in the sentence: a note, no stale figure.
    stale = word_choices(TEXT)[3]
    panel.word.value = None
    sec.redo("The cat sat.", stale, 5)
    sec.draw()
    assert sec.result is None and "not in the sentence" in sec.note.value and not sec.box.children
    # Empty and very long sentences: the tab's message, the section empty.
    for bad, says in (("   ", "sentence"), ("word " * (MAX_CHARS // 4), "characters long")):
        panel.text.value = bad
        assert says in panel.message.value and not sec.box.children and sec.result is None
    panel.text.value = TEXT
    assert sec.box.children and sec.result is not None


def test_without_a_causal_model_the_section_says_how_to_add_one(pair):
    panel = _panel(pair, "bert")
    assert panel.both.result is None and not panel.both.box.children
    assert "bertlab download openai-community/gpt2" in panel.both.note.value
    assert ADD_CAUSAL.split(":")[0] in panel.both.note.value


def test_a_control_character_guess_is_spelled_out():
    from bertlab.analysis.both_ways import visible

    assert visible("a\x03b") == "aU+0003b" and visible("fox") == "fox"
