"""Metrics: accuracy / confusion matrix, entity F1 as seqeval computes it, SQuAD v1.1 EM/F1."""

from __future__ import annotations

import pytest
import torch

from bertlab.tasks.metrics import (
    Entity,
    MetricError,
    accuracy,
    classification_metrics,
    confusion_matrix,
    entity_metrics,
    exact_match_score,
    f1_score,
    get_entities,
    normalize_answer,
    squad_metrics,
)

# -- classification -------------------------------------------------------------------------


def test_accuracy_and_confusion_matrix_rows_are_references():
    pred, gold = [0, 1, 2, 2, 1], [0, 1, 1, 2, 0]
    assert accuracy(pred, gold) == pytest.approx(3 / 5)
    assert confusion_matrix(pred, gold, 3) == [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    out = classification_metrics(pred, gold, 3)
    assert out["accuracy"] == pytest.approx(0.6)
    assert sum(map(sum, out["confusion_matrix"])) == 5


def test_classification_errors_are_clear():
    with pytest.raises(MetricError, match="2 predictions for 3 references"):
        accuracy([0, 1], [0, 1, 1])
    with pytest.raises(MetricError, match="outside 0..1"):
        confusion_matrix([2], [0], 2)
    with pytest.raises(MetricError, match="empty"):
        accuracy([], [])


# -- entities -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tags, expected",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
        # an I- with no B- before it starts an entity (conlleval), also at the start
        (["O", "I-PER", "I-PER", "O"], [("PER", 1, 2)]),
        (["I-ORG", "O"], [("ORG", 0, 0)]),
        # a change of type ends the entity and starts another
        (["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),
        (["I-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
        # B- after B- or I- of the same type starts a new one
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),
        # entity at the end of the sentence
        (["O", "O", "B-MISC", "I-MISC"], [("MISC", 2, 3)]),
        (["B-LOC"], [("LOC", 0, 0)]),
        (["O", "O"], []),
        # IOBES is decoded too
        (["S-PER", "B-LOC", "E-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
    ],
)
def test_get_entities_edge_cases(tags, expected):
    assert get_entities(tags) == [Entity(*e) for e in expected]


def test_entity_metrics_micro_and_per_type_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    m = entity_metrics(pred, gold)
    assert (m["num_gold"], m["num_predicted"], m["num_correct"]) == (3, 3, 2)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["accuracy"] == pytest.approx(5 / 6)
    assert m["per_type"]["PER"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1})
    assert m["per_type"]["LOC"] == pytest.approx({"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1})
    assert m["per_type"]["ORG"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})


def test_entity_metrics_need_exact_span_and_type():
    gold = [["B-PER", "I-PER", "O"]]
    assert entity_metrics([["B-PER", "O", "O"]], gold)["f1"] == 0.0  # span too short
    assert entity_metrics([["B-ORG", "I-ORG", "O"]], gold)["f1"] == 0.0  # wrong type
    assert entity_metrics([["I-PER", "I-PER", "O"]], gold)["f1"] == 1.0  # I- start = same span
    assert entity_metrics([["O", "O", "O"]], gold)["precision"] == 0.0  # nothing predicted: 0, no crash


def test_entity_metrics_reject_ragged_input():
    with pytest.raises(MetricError, match="sentence 0: 1 predicted tags for 2"):
        entity_metrics([["O"]], [["O", "O"]])


_TAGS = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def _random_tags(g: torch.Generator, k: int) -> list[str]:
    return [_TAGS[i] for i in torch.randint(0, len(_TAGS), (k,), generator=g).tolist()]


def test_entity_metrics_match_seqeval_on_random_tags():
    seqeval = pytest.importorskip("seqeval.metrics")
    g = torch.Generator().manual_seed(0)
    gold = [_random_tags(g, k) for k in torch.randint(1, 12, (300,), generator=g).tolist()]
    # predictions: gold with about a third of the tags replaced at random (broken spans,
    # I- after O, type switches inside entities)
    pred = [[t if torch.rand((), generator=g) < 0.67 else _random_tags(g, 1)[0] for t in s] for s in gold]
    ours = entity_metrics(pred, gold)
    assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
    assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
    assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
    report = seqeval.classification_report(gold, pred, output_dict=True)
    assert set(ours["per_type"]) == {"PER", "LOC", "MISC"}
    for type_, scores in ours["per_type"].items():
        ref = report[type_]
        assert scores["f1"] == pytest.approx(ref["f1-score"])
        assert scores["precision"] == pytest.approx(ref["precision"])
        assert scores["recall"] == pytest.approx(ref["recall"])
        assert scores["support"] == ref["support"]
    assert 0.2 < ours["f1"] < 0.9  # the comparison is not trivial


# -- SQuAD v1.1 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Cat", "cat"),
        ("  A  quick,   brown fox.  ", "quick brown fox"),
        ("an apple", "apple"),
        ("theater anthem", "theater anthem"),  # articles only as whole words
        ("Denver Broncos!", "denver broncos"),
        ("the-end", "theend"),  # punctuation is removed, not replaced by a space
        ("US$3 per barrel", "us3 per barrel"),
    ],
)
def test_squad_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_squad_exact_match_and_f1_by_hand():
    assert exact_match_score("The Cat", "cat") == 1.0
    assert exact_match_score("a cat", "cats") == 0.0
    # partial overlap: {big, black, cat} vs {black, cat, sat}: P = R = 2/3
    assert f1_score("the big black cat", "black cat sat") == pytest.approx(2 / 3)
    # repeated words count once each in the overlap: P = 1/3, R = 1
    assert f1_score("cat cat cat", "cat") == pytest.approx(0.5)
    assert f1_score("dog", "cat") == 0.0
    # the official v1.1 quirk: both empty after normalising -> EM 1 but F1 0
    assert exact_match_score("the", "a") == 1.0
    assert f1_score("the", "a") == 0.0


def test_squad_metrics_best_gold_answer_missing_counts_zero_percent_scale():
    references = {"q1": ["Denver Broncos", "Broncos"], "q2": ["1973"], "q3": ["in October 1973", "October"]}
    predictions = {"q1": "the Broncos", "q3": "October 1973"}
    m = squad_metrics(predictions, references)
    # q1: EM 1 (vs "Broncos"), F1 1; q2 missing: 0; q3: EM 0, F1 max(0.8, 2/3) = 0.8
    assert m["exact_match"] == pytest.approx(100 / 3)
    assert m["f1"] == pytest.approx(100 * 1.8 / 3)


def test_squad_metrics_reject_a_string_where_a_list_belongs():
    with pytest.raises(MetricError, match="LIST of gold answers"):
        squad_metrics({"q": "x"}, {"q": "x"})
