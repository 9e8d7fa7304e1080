"""Probes per layer: the readers, the features and their cache, the control task, the scalar mix, and the
structural probe's metrics on hand-made trees."""

from __future__ import annotations

import pytest
import torch

from bertlab.analysis.probe_data import TaggedSentence, read_conll2003, read_conllu, read_for, split_sentences
from bertlab.analysis.probes import (
    MixProbe,
    StageProbes,
    accuracy,
    control_labels,
    labelled_words,
    pool_words,
    probe_property,
    train_probe,
    word_features,
)
from bertlab.analysis.structural import (
    MixStructuralProbe,
    StructuralProbe,
    distance_spearman,
    gold_edges,
    min_spanning_tree,
    predict_tree,
    probe_tree,
    spearman,
    train_structural,
    tree_distances,
    uuas,
)
from bertlab.inputs import InputError

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""
CONLLU = """# sent_id = 1
1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tdo\tdo\tAUX\t_\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\t_\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_
3.1\tgone\t_\t_\t_\t_\t_\t_\t_\t_
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_
2\tthere\tthere\tADV\t_\t_\t1\tobl:npmod\t_\t_
"""


def test_readers(tmp_path):
    c = tmp_path / "c.txt"
    c.write_text(CONLL)
    sents = read_conll2003(c)
    assert [s.words for s in sents] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"]]
    assert sents[0].tags["pos"][1] == "VBZ" and sents[0].tags["chunk"][3] == "I-NP" and sents[1].tags["ner"] == [
        "B-PER", "I-PER"]
    u = tmp_path / "u.conllu"
    u.write_text(CONLLU)
    ud = read_conllu(u)
    assert ud[0].words == ["do", "n't", "go", "."] and ud[0].heads == [2, 2, -1, 2]
    assert ud[1].tags["deprel"] == ["root", "obl"] and ud[0].tags["upos"][3] == "PUNCT"
    with pytest.raises(ValueError, match="CoNLL-U"):
        read_for("upos", c)
    with pytest.raises(ValueError, match="not one of"):
        read_for("sentiment", c)
    train, ev = split_sentences(list(range(10)), every=5)
    assert ev == [4, 9] and len(train) == 8


def test_pooling_first_and_mean():
    states = torch.arange(2 * 5 * 1, dtype=torch.float).view(2, 5, 1)  # [stage, seq, d]
    word_ids = [None, 0, 0, 1, None]
    assert pool_words(states, word_ids, "first")[:, :, 0].tolist() == [[1, 3], [6, 8]]
    assert pool_words(states, word_ids, "mean")[:, :, 0].tolist() == [[1.5, 3], [6.5, 8]]


@pytest.fixture(scope="module")
def conll(shared_data_dir):
    train = read_conll2003(shared_data_dir / "conll2003" / "train.txt")[:60]
    ev = read_conll2003(shared_data_dir / "conll2003" / "dev.txt")[1:41]
    return train, ev


@pytest.fixture(scope="module")
def shared_data_dir():
    from bertlab.settings import data_dir

    if not (data_dir() / "conll2003").is_dir():
        pytest.skip("the shared data (BERTLAB_DATA) is not present")
    return data_dir()


def test_features_are_cached_and_read_back(default_model, conll, tmp_path):
    model, tok = default_model
    train, _ = conll
    first = word_features(model, tok, train[:5], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    again = word_features(model, tok, train[:5], cache_dir=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert first[0].shape == (model.config.num_hidden_layers + 1, len(train[0].words), model.config.hidden_size)
    mean = word_features(model, tok, train[:5], pool="mean", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2
    assert not all(torch.equal(a, b) for a, b in zip(mean, first))  # some word has several pieces


def test_control_labels_are_consistent_per_word_type():
    y = torch.tensor([0, 0, 1, 2, 0])
    labels, table = control_labels(["The", "cat", "the", "dog", "cat"], y, 3, seed=1)
    assert labels[0] == labels[2] and labels[1] == labels[4]
    again, _ = control_labels(["dog", "the", "bird"], y, 3, seed=1, table=table)
    assert again[0] == labels[3] and again[1] == labels[0]


def test_one_hot_mix_equals_that_layers_probe(default_model, conll, tmp_path):
    model, tok = default_model
    train, _ = conll
    f = word_features(model, tok, train, cache_dir=tmp_path)
    x, y, _, labels = labelled_words(f, train, "pos")
    stages = x.shape[1]
    per_stage = train_probe(StageProbes(stages, x.shape[2], len(labels)), x, y, epochs=3)
    s = 2
    mixed = train_probe(MixProbe(stages, x.shape[2], len(labels), fixed=torch.eye(stages)[s]), x, y, epochs=3)
    torch.testing.assert_close(mixed.probe.weight[0], per_stage.weight[s], atol=1e-4, rtol=1e-3)
    with torch.no_grad():
        assert torch.equal(mixed(x)[:, 0].argmax(-1), per_stage(x)[:, s].argmax(-1))


def test_probes_beat_the_majority_and_shuffled_labels_stay_at_chance(default_model, conll, tmp_path):
    model, tok = default_model
    train, ev = conll
    r = probe_property(model, tok, train, ev, "pos", cache_dir=tmp_path, epochs=4)
    assert r.stages[0] == "embeddings" and len(r.accuracy) == model.config.num_hidden_layers + 1
    assert max(r.accuracy) > r.majority + 0.3
    assert r.selectivity == [a - c for a, c in zip(r.accuracy, r.control_accuracy)]
    assert abs(sum(r.mix_weights) - 1) < 1e-5 and r.mix_accuracy > r.majority
    out = r.as_json()
    assert set(out) >= {"property", "layers", "accuracy", "control_accuracy", "selectivity", "mix"}
    # labels shuffled across words: nothing to learn that carries to new words
    f_tr, f_ev = word_features(model, tok, train, cache_dir=tmp_path), word_features(model, tok, ev, cache_dir=tmp_path)
    x, y, _, labels = labelled_words(f_tr, train, "pos")
    xe, ye, _, _ = labelled_words(f_ev, ev, "pos", labels)
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    probe = train_probe(StageProbes(x.shape[1], x.shape[2], len(labels)), x, shuffled, epochs=4)
    with torch.no_grad():
        acc = accuracy(probe(xe), ye)
    majority = float((ye == torch.bincount(y).argmax()).float().mean())
    assert acc.max().item() <= majority + 0.05


def test_macro_accuracy_weighs_each_gold_label_alike():
    from bertlab.analysis.probes import score

    y = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 1, 2])  # 80 % "O"
    always_o = torch.zeros(10, 1, dtype=torch.long)
    assert score(always_o, y, "accuracy").item() == pytest.approx(0.8)
    assert score(always_o, y, "macro accuracy").item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="measure"):
        score(always_o, y, "f2")


def test_named_entities_are_scored_by_macro_accuracy_and_the_probe_beats_its_control(
        default_model, shared_data_dir, tmp_path):
    """Plain accuracy on a label that is 85 % "O" put the control task above the probe (selectivity below 0):
    macro accuracy does not reward saying "O", and the result says it used it."""
    model, tok = default_model
    train = read_conll2003(shared_data_dir / "conll2003" / "train.txt")[:300]
    ev = read_conll2003(shared_data_dir / "conll2003" / "dev.txt")[:150]
    r = probe_property(model, tok, train, ev, "ner", cache_dir=tmp_path)
    assert r.measure == "macro accuracy" and r.as_json()["measure"] == "macro accuracy"
    assert min(r.selectivity[1:]) > 0, r.selectivity  # every layer above its control (the embeddings: word types)
    assert r.majority < 0.5  # always "O" scores 1 / labels, not 0.85
    assert probe_property(model, tok, train[:60], ev[:40], "pos", cache_dir=tmp_path, epochs=2).measure == "accuracy"


def test_a_property_the_file_lacks(default_model, conll):
    model, tok = default_model
    train, ev = conll
    with pytest.raises(InputError, match="no 'upos' tags"):
        probe_property(model, tok, train, ev, "upos")


# -- the structural probe's metrics on hand-made trees ------------------------------------------
HEADS = [1, -1, 1, 2]  # 0 <- 1 (root) -> 2 -> 3


def test_tree_distances_and_edges():
    d = tree_distances(HEADS)
    assert d.tolist() == [[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]]
    assert gold_edges(HEADS) == [(0, 1), (1, 2), (2, 3)]
    assert gold_edges(HEADS, [True, True, True, False]) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="one tree"):
        tree_distances([-1, -1])


def test_mst_and_uuas():
    d = tree_distances(HEADS)
    assert min_spanning_tree(d) == [(0, 1), (1, 2), (2, 3)]
    assert uuas(d, HEADS) == (3, 3)
    star = torch.tensor([[0, 1, 1, 1], [1, 0, 2, 2], [1, 2, 0, 2], [1, 2, 2, 0]], dtype=torch.float)
    assert min_spanning_tree(star) == [(0, 1), (0, 2), (0, 3)]
    assert uuas(star, HEADS) == (1, 3)  # only 0-1 is a gold edge


def test_spearman():
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([10.0, 20, 30])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1])) == pytest.approx(-1.0)
    assert spearman(torch.tensor([1.0, 2, 2, 3]), torch.tensor([1.0, 2, 3, 4])) == pytest.approx(0.9487, abs=1e-4)
    d = tree_distances(HEADS)
    assert distance_spearman(d, d) == pytest.approx([1.0] * 4)


def test_structural_probe_learns_trees(default_model, shared_data_dir, tmp_path):
    model, tok = default_model
    ud = read_conllu(shared_data_dir / "ud_ewt" / "en_ewt-ud-dev.conllu")
    train, ev = split_sentences(ud)
    r = probe_tree(model, tok, train[:60], ev[:20], rank=16, epochs=3, cache_dir=tmp_path)
    assert len(r.uuas) == model.config.num_hidden_layers + 1
    assert max(r.spearman) > 0.3 and max(r.uuas) > 0.25
    p = predict_tree(model, tok, r.probe, ev[0], 3)
    assert len(p.edges) == len(p.words) - 1 and p.gold == gold_edges(ev[0].heads)
    own = predict_tree(model, tok, r.probe, "the cat sat on the mat", 3)
    assert own.gold is None and len(own.edges) == 5
    with pytest.raises(InputError, match="two words"):
        predict_tree(model, tok, r.probe, "cat", 3)
    assert TaggedSentence(["a"]).heads is None
    # the scalar mix of every stage, fitted the same way: a probability per stage, and trees no worse than
    # the weakest stage's (a fit this small barely moves the weights from uniform)
    assert r.mix_weights is not None and abs(sum(r.mix_weights) - 1) < 1e-5 and len(r.mix_weights) == len(r.uuas)
    assert r.mix_uuas > min(r.uuas) and r.mix_spearman > 0.3
    out = r.as_json()["mix"]
    assert set(out) >= {"weights", "gamma", "accuracy", "spearman"} and out["accuracy"] == out["uuas"]


def test_a_one_hot_tree_mix_is_that_stages_structural_probe():
    torch.manual_seed(0)
    h = torch.randn(3, 4, 7, 16)  # [batch, stage, words, d]
    per_stage = StructuralProbe(4, 16, rank=8, seed=1)
    mixed = MixStructuralProbe(4, 16, rank=8, fixed=torch.eye(4)[2])
    with torch.no_grad():
        mixed.probe.B.copy_(per_stage.B[2:3])
        torch.testing.assert_close(mixed(h)[:, 0], per_stage(h)[:, 2])
        mixed.probe.B.copy_(per_stage.B[1:2])
        assert not torch.allclose(mixed(h)[:, 0], per_stage(h)[:, 2])
    fitted = train_structural([h[i] for i in range(3)], [tree_distances([-1, 0, 1, 2, 3, 4, 5])] * 3, rank=8,
                              epochs=2, probe=MixStructuralProbe(4, 16, rank=8))
    assert fitted.mix.logits.grad is not None  # the weights are learned with the map


def test_a_character_the_vocabulary_lacks_is_read_as_the_unknown_token(tmp_path):
    """A Unigram tokenizer (DeBERTa-v3, ALBERT) writes a character its vocabulary lacks as itself but reads
    it as the unknown token: word features use the ids, so such words still get a vector."""
    from test_family_deberta import deberta_tokenizer

    from bertlab.tasks.features import encode_words
    from bertlab.tokenizer import Tokenizer

    deberta_tokenizer().save_pretrained(tmp_path)
    tok = Tokenizer.from_folder(tmp_path)
    ids, word_ids = encode_words(["Zürich’s", "PRESIDENT"], tok)
    assert None not in ids and tok.unk_token_id in ids
    assert ids[1:-1] == tok.encode_ids(["Zürich’s"])[0] + tok.encode_ids(["PRESIDENT"])[0]
    assert word_ids[0] is None and set(word_ids[1:-1]) == {0, 1}
