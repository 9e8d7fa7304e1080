"""Features for sentence(-pair) classification and token classification (NER):
token ids, segment ids, labels aligned to WordPiece, and the way back from token
predictions to words and entity spans."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

from bertlab.tasks.metrics import get_entities
from bertlab.tasks.readers import CONLL_LABELS, ClassificationExample, ScoredExample, TokenExample
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label of tokens the loss skips (torch's cross_entropy default)


class FeatureError(ValueError):
    """Examples that cannot be turned into features (unknown label, bad lengths)."""


# -- sentence / pair classification --------------------------------------------------------


@dataclass
class ClassificationFeature:
    """[CLS] A [SEP] (B [SEP]) as ids, with its class id."""

    guid: str
    input_ids: list[int]
    token_type_ids: list[int]  # 0 for [CLS] A [SEP], 1 for B [SEP]
    label: int

    def __len__(self) -> int:
        return len(self.input_ids)


def featurize_classification(
    examples: Sequence[ClassificationExample], tokenizer: Tokenizer, max_length: int = 128
) -> list[ClassificationFeature]:
    """Encode sentences (or pairs: A = segment 0, B = segment 1), cut longest-first to `max_length`."""
    out = []
    for ex in examples:
        enc = tokenizer.encode(ex.text_a, ex.text_b, max_length=max_length)
        out.append(ClassificationFeature(ex.guid, enc.ids, enc.type_ids, ex.label))
    return out


@dataclass
class RegressionFeature:
    """[CLS] A [SEP] B [SEP] as ids, with the number to predict (e.g. SICK relatedness 1-5)."""

    guid: str
    input_ids: list[int]
    token_type_ids: list[int]
    target: float

    def __len__(self) -> int:
        return len(self.input_ids)


def featurize_regression(
    examples: Sequence[ScoredExample], tokenizer: Tokenizer, max_length: int = 128
) -> list[RegressionFeature]:
    """Encode pairs (A = segment 0, B = segment 1) with their scores, cut longest-first to `max_length`."""
    out = []
    for ex in examples:
        enc = tokenizer.encode(ex.text_a, ex.text_b, max_length=max_length)
        out.append(RegressionFeature(ex.guid, enc.ids, enc.type_ids, float(ex.score)))
    return out


# -- token classification (NER) -------------------------------------------------------------


@dataclass
class TokenFeature:
    """One sentence of pre-split words as WordPiece ids, labels aligned to pieces."""

    guid: str
    input_ids: list[int]
    token_type_ids: list[int]
    labels: list[int]  # one per token; IGNORE_INDEX for specials and ignored pieces
    word_ids: list[int | None]  # word of each token; None for [CLS]/[SEP]
    num_words: int  # words in the sentence, including any cut by max_length

    def __len__(self) -> int:
        return len(self.input_ids)


class WordPieces:
    """WordPiece ids of single words, cached (a corpus repeats its words a lot). Each word
    is tokenized on its own, as HF's `is_split_into_words=True` does, so a word that the
    pre-tokenizer splits further ("U.S." -> u . s .) keeps one word id for all its pieces."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def __call__(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self.tokenizer.encode_ids([word])[0]  # ids, not pieces: a Unigram piece may be a character
            # the vocabulary lacks, written as itself but read as the unknown token
            self._cache[word] = ids
        return ids


def encode_words(
    words: Sequence[str], tokenizer: Tokenizer, max_length: int = 128, pieces: WordPieces | None = None
) -> tuple[list[int], list[int | None]]:
    """[CLS] pieces of every word [SEP], cut to `max_length` tokens: (ids, word_ids).
    A word with no pieces (e.g. a zero-width space) gets no token."""
    if max_length < 3:
        raise FeatureError(f"max_length={max_length} leaves no room for a word between {tokenizer.cls_token} and "
                           f"{tokenizer.sep_token}.")
    pieces = pieces or WordPieces(tokenizer)
    ids, word_ids = [tokenizer.cls_token_id], [None]
    for w, word in enumerate(words):
        word_pieces = pieces(word)
        ids.extend(word_pieces)
        word_ids.extend([w] * len(word_pieces))
    ids, word_ids = ids[: max_length - 1], word_ids[: max_length - 1]
    return ids + [tokenizer.sep_token_id], word_ids + [None]


def continuation_label(tag: str, label2id: Mapping[str, int]) -> str:
    """The tag for the second and later pieces of a word: B-X -> I-X (when I-X is a label)."""
    if tag.startswith("B-") and "I-" + tag[2:] in label2id:
        return "I-" + tag[2:]
    return tag


def align_labels(
    tags: Sequence[str],
    word_ids: Sequence[int | None],
    label2id: Mapping[str, int],
    all_pieces: bool = False,
) -> list[int]:
    """One label id per token: the first piece of a word gets the word's tag; later pieces
    get IGNORE_INDEX, or with `all_pieces` the I- version of the tag; specials IGNORE_INDEX."""
    labels: list[int] = []
    prev: int | None = None
    for w in word_ids:
        if w is None:
            labels.append(IGNORE_INDEX)
        elif w != prev:
            labels.append(_label_id(tags[w], label2id))
        elif all_pieces:
            labels.append(_label_id(continuation_label(tags[w], label2id), label2id))
        else:
            labels.append(IGNORE_INDEX)
        prev = w
    return labels


def _label_id(tag: str, label2id: Mapping[str, int]) -> int:
    if tag not in label2id:
        raise FeatureError(f"tag {tag!r} is not among the task's labels {sorted(label2id)}.")
    return label2id[tag]


def ner_labels(examples: Sequence[TokenExample]) -> dict[int, str]:
    """id2label for your own tag set: "O" first, then B-/I- of each type in alphabetical order."""
    types = sorted({t[2:] for ex in examples for t in ex.tags if t != "O"})
    prefixes = sorted({t[0] for ex in examples for t in ex.tags if t != "O"}, key="BIES".index)
    labels = ["O"] + [f"{p}-{t}" for t in types for p in prefixes]
    return dict(enumerate(labels))


def featurize_ner(
    examples: Sequence[TokenExample],
    tokenizer: Tokenizer,
    max_length: int = 128,
    id2label: Mapping[int, str] = CONLL_LABELS,
    label_all_pieces: bool = False,
) -> list[TokenFeature]:
    """Encode pre-split sentences word by word and align their tags (see `align_labels`).
    Sentences longer than `max_length` tokens are cut; their last words get no label."""
    label2id = {v: k for k, v in id2label.items()}
    pieces = WordPieces(tokenizer)
    out: list[TokenFeature] = []
    cut = 0
    for ex in examples:
        if len(ex.words) != len(ex.tags):
            raise FeatureError(f"example {ex.guid}: {len(ex.words)} words but {len(ex.tags)} tags.")
        ids, word_ids = encode_words(ex.words, tokenizer, max_length, pieces)
        try:
            labels = align_labels(ex.tags, word_ids, label2id, label_all_pieces)
        except FeatureError as e:
            raise FeatureError(f"example {ex.guid}: {e}") from None
        cut += sum(len(pieces(w)) for w in ex.words) + 2 > max_length
        out.append(TokenFeature(ex.guid, ids, [0] * len(ids), labels, word_ids, len(ex.words)))
    if cut:
        log.warning("%d of %d sentences were longer than %d tokens and were cut.", cut, len(examples), max_length)
    return out


def word_predictions(
    token_predictions: Sequence[int],
    word_ids: Sequence[int | None],
    num_words: int,
    id2label: Mapping[int, str],
) -> list[str]:
    """One tag per word from per-token label ids: the prediction on the word's first piece.
    Words without a token (cut, or no pieces) get "O". Padding beyond word_ids is ignored."""
    tags = ["O"] * num_words
    prev: int | None = None
    for w, pred in zip(word_ids, token_predictions):
        if w is not None and w != prev:
            tags[w] = id2label[int(pred)]
        prev = w
    return tags


@dataclass
class EntitySpan:
    """An entity for highlighting: words[start:end], and its characters in " ".join(words)."""

    type: str
    start: int  # first word
    end: int  # one past the last word
    text: str
    char_start: int
    char_end: int


def entity_spans(words: Sequence[str], tags: Sequence[str]) -> list[EntitySpan]:
    """Entities of one sentence, decoded as the entity metric does (conlleval rules)."""
    if len(words) != len(tags):
        raise FeatureError(f"{len(words)} words but {len(tags)} tags.")
    starts, pos = [], 0
    for word in words:
        starts.append(pos)
        pos += len(word) + 1
    spans = []
    for e in get_entities(tags):
        char_start, char_end = starts[e.start], starts[e.end] + len(words[e.end])
        text = " ".join(words[e.start : e.end + 1])
        spans.append(EntitySpan(e.type, e.start, e.end + 1, text, char_start, char_end))
    return spans
