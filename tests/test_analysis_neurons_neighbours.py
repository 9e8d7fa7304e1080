"""The neuron view (q, k, q∘k, scores of one head) and corpus neighbours."""

from __future__ import annotations

import pytest
import torch

from bertlab.analysis.neighbours import build_index, corpus_neighbours, nearest
from bertlab.analysis.neurons import neuron_view
from bertlab.inputs import InputError

SENTENCES = [
    "I went to the bank to deposit money.",
    "We sat on the bank of the river and watched the boats.",
    "The bank raised its interest rates again.",
    "She plays the violin in an orchestra.",
    "The river flooded the fields after the storm.",
]


def test_neuron_view_matches_the_models_scores(default_model):
    model, tok = default_model
    v = neuron_view(model, tok, "The cat sat on the mat.", layer=2, head=5, query=2)
    d_head = model.config.hidden_size // model.config.num_attention_heads
    assert v.q.shape == (d_head,) and v.k.shape == v.product.shape == (len(v.tokens), d_head)
    torch.testing.assert_close(v.product.sum(-1) / d_head**0.5, v.scores)
    torch.testing.assert_close(v.scores, v.model_scores, atol=1e-4, rtol=1e-4)
    assert v.weights.sum().item() == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(IndexError, match="heads 0.."):
        neuron_view(model, tok, "The cat sat.", layer=0, head=99, query=1)
    with pytest.raises(IndexError, match="tokens 0.."):
        neuron_view(model, tok, "The cat sat.", layer=0, head=0, query=50)


@pytest.mark.parametrize("stage", [1, 3, 6])  # at 0 (embeddings) "bank" at the same place in another sentence ties
def test_a_tokens_nearest_neighbour_is_itself(default_model, tmp_path, stage):
    model, tok = default_model
    index = build_index(model, tok, SENTENCES, stage, folder=tmp_path)
    assert len(index) == sum(len(tok.tokenize(s)) for s in SENTENCES)
    found = corpus_neighbours(model, tok, index, SENTENCES[1], "bank", k=3)
    assert found[0].sentence_index == 1 and found[0].piece == "bank"
    assert found[0].context[found[0].position] == "bank" and found[0].score == pytest.approx(1.0, abs=2e-3)
    assert [n.score for n in found] == sorted((n.score for n in found), reverse=True)


def test_the_index_is_built_once(default_model, tmp_path):
    model, tok = default_model
    calls = []
    first = build_index(model, tok, SENTENCES, 2, folder=tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (len(SENTENCES), len(SENTENCES))
    again = build_index(model, tok, SENTENCES, 2, folder=tmp_path, progress=lambda d, t: calls.append("again"))
    assert "again" not in calls and torch.equal(first.vectors, again.vectors) and again.pieces == first.pieces


def test_query_is_a_matrix_product(default_model, tmp_path):
    model, tok = default_model
    index = build_index(model, tok, SENTENCES, 1, folder=tmp_path)
    row = 7
    values, rows = nearest(index, index.vectors[row].float(), k=1)
    assert int(rows[0]) == row
    with pytest.raises(InputError, match="whole word"):
        corpus_neighbours(model, tok, index, "The cat sat.", "dog")
    with pytest.raises(IndexError, match="stage"):
        build_index(model, tok, SENTENCES, 99, folder=tmp_path)
    index.vectors = index.vectors.repeat(3, 1)  # three equal copies: the top 3 are the one row, thrice
    values, rows = nearest(index, index.vectors[row].float(), k=3)
    assert sorted(int(r) % (len(index.vectors) // 3) for r in rows) == [row] * 3


def test_neuron_view_uses_the_rotated_q_and_k_where_the_family_rotates(tmp_path):
    pytest.importorskip("transformers")
    from test_family_modernbert import _hf, modernbert_tokenizer, write_checkpoint

    import bertlab

    modernbert_tokenizer().save_pretrained(tmp_path / "tok")
    hf_tok = _hf().AutoTokenizer.from_pretrained(tmp_path / "tok")
    model, tok = bertlab.load(str(write_checkpoint(tmp_path / "mb", "ModernBertForMaskedLM", hf_tok)))
    v = neuron_view(model, tok, "The cat sat on the mat.", layer=0, head=1, query=3)  # layer 0 attends globally
    torch.testing.assert_close(v.scores, v.model_scores, atol=1e-4, rtol=1e-4)
    ids = torch.tensor([tok.encode("The cat sat on the mat.").ids])
    _, cache = model.run_with_cache(ids, names=[model.family.hook_name(0, "hook_q")])
    plain_q = cache[model.family.hook_name(0, "hook_q")][0, 3, 1]
    assert not torch.allclose(plain_q, v.q)  # the rotation moved it: the view shows what the scores multiply
