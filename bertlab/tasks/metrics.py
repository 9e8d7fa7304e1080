"""Metrics for the fine-tuning tasks: accuracy and confusion matrix, entity-level F1 as
seqeval / conlleval compute it, the official SQuAD v1.1 exact match and F1, and Pearson and
Spearman correlation with the mean squared error for a predicted number (SICK relatedness).

Scales follow the reference each metric comes from: accuracy and entity scores are
fractions (0-1, like seqeval), SQuAD exact match and F1 are percentages (0-100, like the
official script), correlations lie in -1..1 as scipy.stats gives them."""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

log = logging.getLogger(__name__)


class MetricError(ValueError):
    """Predictions and references that cannot be compared."""


# -- classification -----------------------------------------------------------------------


def accuracy(predictions: Sequence[int], references: Sequence[int]) -> float:
    """Fraction of predictions equal to their reference (0-1)."""
    _check_lengths(predictions, references)
    if not references:
        raise MetricError("accuracy of nothing: predictions and references are empty.")
    return sum(int(p) == int(r) for p, r in zip(predictions, references)) / len(references)


def confusion_matrix(predictions: Sequence[int], references: Sequence[int], num_labels: int) -> list[list[int]]:
    """Counts [num_labels, num_labels]: row = reference label, column = predicted label."""
    _check_lengths(predictions, references)
    matrix = [[0] * num_labels for _ in range(num_labels)]
    for p, r in zip(predictions, references):
        for value, what in ((p, "prediction"), (r, "reference")):
            if not 0 <= int(value) < num_labels:
                raise MetricError(f"{what} label id {value} is outside 0..{num_labels - 1}.")
        matrix[int(r)][int(p)] += 1
    return matrix


def classification_metrics(predictions: Sequence[int], references: Sequence[int], num_labels: int) -> dict[str, object]:
    """{"accuracy": 0-1, "confusion_matrix": rows = reference, columns = prediction}."""
    return {
        "accuracy": accuracy(predictions, references),
        "confusion_matrix": confusion_matrix(predictions, references, num_labels),
    }


# -- a predicted number (regression) -------------------------------------------------------


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation of two equally long lists (-1..1), as scipy.stats.pearsonr; 0.0 when one is constant."""
    _check_lengths(x, y)
    if len(x) < 2:
        raise MetricError(f"a correlation needs at least 2 pairs; got {len(x)}.")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    dx, dy = [a - mx for a in x], [b - my for b in y]
    sxx, syy = sum(a * a for a in dx), sum(b * b for b in dy)
    if sxx == 0 or syy == 0:
        return 0.0
    return max(-1.0, min(1.0, sum(a * b for a, b in zip(dx, dy)) / (sxx * syy) ** 0.5))


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank (scipy.stats.rankdata's "average")."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (-1..1): Pearson's of the ranks, ties averaged (scipy.stats.spearmanr)."""
    return pearson(ranks(x), ranks(y))


def regression_metrics(predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
    """{"pearson", "spearman": -1..1, "mse": mean squared error in the target's units squared}."""
    predictions, references = [float(p) for p in predictions], [float(r) for r in references]
    _check_lengths(predictions, references)
    if not references:
        raise MetricError("nothing to score: predictions and references are empty.")
    mse = sum((p - r) ** 2 for p, r in zip(predictions, references)) / len(references)
    return {"pearson": pearson(predictions, references), "spearman": spearman(predictions, references), "mse": mse}


# -- entities (seqeval / conlleval) -------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    """A labelled span of words: `start` and `end` are word indices, `end` inclusive."""

    type: str
    start: int
    end: int


def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '_'), as seqeval splits (prefix = first char)."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # Same rules as conlleval's endOfChunk (and seqeval's port of it).
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # Same rules as conlleval's startOfChunk: an I- after O or after another type starts one.
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def get_entities(tags: Sequence[str]) -> list[Entity]:
    """Entities in one sentence of IOB1/IOB2/IOBES tags, decoded as conlleval does:
    an I- tag without a B- before it starts an entity, a change of type ends one."""
    entities: list[Entity] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, chunk in enumerate([*tags, "O"]):
        if not chunk:
            raise MetricError(f"tag {i} is empty; expected 'O' or a tag like 'B-PER'.")
        tag, type_ = _split_tag(chunk)
        if _end_of_chunk(prev_tag, tag, prev_type, type_):
            entities.append(Entity(prev_type, begin, i - 1))
        if _start_of_chunk(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return entities


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_metrics(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, object]:
    """Entity-level scores over sentences of tags (exact span and type), as seqeval's
    default mode and conlleval: micro "precision"/"recall"/"f1" (0-1), "per_type"
    {type: {precision, recall, f1, support}}, token "accuracy", entity counts."""
    _check_lengths(predictions, references)
    gold: set[tuple[int, Entity]] = set()
    pred: set[tuple[int, Entity]] = set()
    tokens = correct_tokens = 0
    for n, (p, r) in enumerate(zip(predictions, references)):
        if len(p) != len(r):
            raise MetricError(f"sentence {n}: {len(p)} predicted tags for {len(r)} reference tags.")
        gold.update((n, e) for e in get_entities(r))
        pred.update((n, e) for e in get_entities(p))
        tokens += len(r)
        correct_tokens += sum(a == b for a, b in zip(p, r))
    hits = gold & pred
    per_type: dict[str, dict[str, float]] = {}
    for type_ in sorted({e.type for _, e in gold | pred}):
        n_gold = sum(e.type == type_ for _, e in gold)
        scores = _prf(sum(e.type == type_ for _, e in hits), sum(e.type == type_ for _, e in pred), n_gold)
        per_type[type_] = {**scores, "support": n_gold}
    return {
        **_prf(len(hits), len(pred), len(gold)),
        "accuracy": correct_tokens / tokens if tokens else 0.0,
        "per_type": per_type,
        "num_gold": len(gold),
        "num_predicted": len(pred),
        "num_correct": len(hits),
    }


# -- SQuAD v1.1 -----------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation: lower case, drop punctuation, drop the
    articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Bag-of-words F1 (0-1) between normalised answers, as the official v1.1 script."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Official SQuAD v1.1 "exact_match" and "f1" (0-100): best over the gold answers of
    each question, averaged over all questions in `references` (a missing prediction
    scores 0, as in the official script)."""
    if not references:
        raise MetricError("no reference questions to score.")
    em = f1 = 0.0
    missing = 0
    for qid, answers in references.items():
        if isinstance(answers, str):
            raise MetricError(f"question {qid}: references map an id to a LIST of gold answers, got a string.")
        if not answers:
            raise MetricError(f"question {qid} has no gold answer.")
        if qid not in predictions:
            missing += 1
            continue
        em += max(exact_match_score(predictions[qid], a) for a in answers)
        f1 += max(f1_score(predictions[qid], a) for a in answers)
    if missing:
        log.warning("%d of %d questions have no prediction and score 0.", missing, len(references))
    return {"exact_match": 100.0 * em / len(references), "f1": 100.0 * f1 / len(references)}


def _check_lengths(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise MetricError(f"{len(predictions)} predictions for {len(references)} references; give one each.")
