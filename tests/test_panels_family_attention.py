"""The Family tab shows what a member changed in attention, computed from the model itself: ModernBERT's
local band beside full attention, DeBERTa's three score terms of one head side by side."""

from __future__ import annotations

import pytest
import torch
from test_family_modernbert import WINDOW, modernbert_tokenizer, write_checkpoint
from tiny_models import deberta_hub_folder, family_folder

from bertlab.analysis.family import attention_reach, score_terms
from bertlab.loading import load
from bertlab.panels.family import FamilyPanel
from bertlab.panels.state import ModelState

TEXT = "The quick brown fox jumps over the lazy dog near the <b>river</b> bank today."


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-attention")
    return {"bert": load(str(family_folder(root, "bert"))),
            "modernbert": load(str(write_checkpoint(root / "mb", "ModernBertForMaskedLM", modernbert_tokenizer()))),
            "deberta": load(str(deberta_hub_folder(root / "deberta")))}


@pytest.fixture(scope="module")
def panel(members):
    state = ModelState(*members["bert"], name="bert")
    for name in ("modernbert", "deberta"):
        state.add(name, *members[name])
    p = FamilyPanel(*members["bert"], state=state, text=TEXT)
    p.pick("bert", "modernbert", "deberta")
    p.update()
    return p


def test_the_band_is_what_the_local_layers_read(panel, members):
    assert not [t for level, t in panel.messages if level == "error"], panel.messages
    name, reach = panel.reach
    assert name == "modernbert" and reach.window == WINDOW // 2
    model, tok = members["modernbert"]
    assert reach.kinds == [layer.attn.kind for layer in model.model.layers]
    ids = torch.tensor([tok.encode(TEXT).ids])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_pattern"))
    for i, kind in enumerate(reach.kinds):  # where any head puts weight is where the layer may read
        seen = (cache[model.family.hook_name(i, "hook_pattern")][0] > 0).any(dim=0)  # [query, key]
        assert torch.equal(seen, reach.local if kind == "local" else reach.full), i
    assert not reach.local.all() and reach.full.all()
    fig = panel.figures()["attention band"]
    assert torch.equal(torch.tensor(fig.data[1].z), reach.local.to(torch.int64))
    assert torch.equal(torch.tensor(fig.data[0].z), reach.full.to(torch.int64))
    ticks = fig.layout.xaxis.ticktext
    assert len(ticks) == len(ids[0]) and not any("<" in t for t in ticks)  # the student's markup, escaped
    assert any("&lt;" in t for t in ticks)
    assert attention_reach(*members["bert"], TEXT) is None  # full attention everywhere: nothing to show


def test_the_three_score_terms_of_one_head_add_up_to_its_scores(panel, members):
    name, st = panel.terms
    assert name == "deberta" and set(st.terms) == {"c2c", "c2p", "p2c"}
    model, tok = members["deberta"]
    enc = tok.encode(TEXT)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_scores"))
    scores = cache[model.family.hook_name(st.layer, "hook_scores")][0, st.head]
    assert torch.allclose(st.terms["c2c"] + st.terms["c2p"] + st.terms["p2c"], scores, atol=1e-5)
    assert st.terms["c2p"].abs().max() > 0 and st.terms["p2c"].abs().max() > 0
    fig = panel.figures()["score terms"]
    for tr, key in zip(fig.data, ("c2c", "c2p", "p2c"), strict=True):
        assert torch.equal(torch.tensor(tr.z, dtype=torch.float32), st.terms[key]), key
    assert score_terms(*members["bert"], TEXT) is None and score_terms(*members["modernbert"], TEXT) is None
    other = score_terms(model, tok, TEXT, layer=0, head=2)
    assert other.layer == 0 and other.head == 2 and not torch.equal(other.terms["c2c"], st.terms["c2c"])
