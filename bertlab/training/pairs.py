"""Sentence-pair examples for BERT's NSP and ALBERT's SOP, packed as original BERT packs them.

From each document, sentences are accumulated into a chunk until it reaches a target length
(``max_seq_length - 3`` tokens, or with probability `short_seq_prob` a random length in
``[2, max_seq_length - 3]``); the chunk is split at a random sentence boundary into A and B, and the pair is
truncated longest-first, one token at a time from a random end (``truncate_seq_pair``).

- **NSP** (BERT): with probability 0.5, B is replaced by a random stretch of sentences from a *different*
  document (label 1 = "B is random"; 0 = "B is the real continuation"), and the sentences of B that
  were not used are put back for the next chunk.
- **SOP** (ALBERT): with probability 0.5, A and B are swapped (label 1 = swapped; 0 = in order).

`sentence_pair_prob` (not in Google's code; 0 by default) makes that share of pairs from exactly one sentence
A and one sentence B (the next sentence, or one random sentence of another document): the short everyday
pairs a student types ("The man went to the store." / "He bought a gallon of milk.") that packed chunks of
Wikipedia almost never look like.

One deliberate difference from Google's ``create_instances_from_document``: there a chunk of a single
sentence always gets a random B, which pushes the share of random Bs above 50 %. Here, when the coin says
"real continuation" (or for SOP) and the chunk has one sentence, the next sentence joins the chunk; a
chunk made of a document's lone last sentence is dropped whatever the coin (so one-sentence documents only
serve as random Bs). Whether a chunk gives an example never depends on its coin: labels are 50/50.
Every random choice comes from ``random.Random(seed)``.
"""

from __future__ import annotations

import logging
import random
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import MENTION_KINDS, Span

log = logging.getLogger(__name__)

TASKS = ("nsp", "sop")
TokenDocument = list[list[Any]]  # a document: per sentence, its token ids (or TaggedToken tuples)
# A token of a tagged sentence: (id, one mention code per MENTION_KINDS); codes 0 = outside, 1 = first
# token of a mention, 2 = inside one (masking.MENTION_O / _B / _I)
TaggedToken = tuple[int, ...]


class PairError(ValueError):
    """Documents or settings from which no pairs can be made."""


@dataclass
class PairExample:
    """``[CLS] A [SEP] B [SEP]`` with segment ids and the NSP/SOP label."""

    input_ids: list[int]
    token_type_ids: list[int]  # 0 for [CLS] A [SEP], 1 for B [SEP]
    label: int  # NSP: 1 = B is from another document; SOP: 1 = A and B swapped; 0 otherwise
    task: str  # "nsp" or "sop"
    doc_index: int  # document A comes from (index into the documents given)
    b_doc_index: int  # document B comes from (differs from doc_index only for random NSP pairs)
    num_a: int  # tokens of A (after truncation)
    index: int = 0  # position in the list `build_pairs` returns (static masking seeds on it)
    mentions: dict[str, list[int]] | None = None  # tagged text: per MENTION_KINDS, a code per token

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_b(self) -> int:
        return len(self.input_ids) - self.num_a - 3

    @property
    def is_next(self) -> bool:
        """True when B really follows A in the same document (NSP label 0)."""
        return self.task == "nsp" and self.label == 0


def build_pairs(
    documents: Sequence[Any],
    tokenizer: Tokenizer,
    *,
    task: str = "nsp",
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    seed: int = 0,
    dupe_factor: int = 1,
    shuffle: bool = True,
    sentence_pair_prob: float = 0.0,
) -> list[PairExample]:
    """NSP or SOP examples from documents.

    `documents`: tokenized documents (per document, one list of token ids per sentence), or text
    documents (`corpora.Document`s or lists of sentence strings), which `tokenizer` tokenizes.
    `dupe_factor` passes over the documents that many times (each pass draws new chunks and partners).
    Examples are shuffled (with `shuffle`) and numbered by `index`."""
    if task not in TASKS:
        raise PairError(f"task {task!r} is not one of {TASKS}.")
    if max_seq_length < 5:
        raise PairError(f"max_seq_length must be at least 5 (three special tokens, a piece of A and one of B), "
                        f"got {max_seq_length}.")
    for name, p in (("short_seq_prob", short_seq_prob), ("sentence_pair_prob", sentence_pair_prob)):
        if not 0.0 <= p <= 1.0:
            raise PairError(f"{name} must be in [0, 1], got {p}.")
    docs = _as_token_documents(documents, tokenizer)
    kept = [i for i, d in enumerate(docs) if d]
    if not kept:
        raise PairError("the documents hold no tokens: give documents with at least one non-empty sentence.")
    if task == "nsp" and len(kept) < 2:
        raise PairError("NSP needs at least two documents: a random B must come from another document.")
    rng = random.Random(seed)
    nonempty = [docs[i] for i in kept]
    examples: list[PairExample] = []
    for _ in range(dupe_factor):
        for d in range(len(nonempty)):
            examples.extend(
                _pairs_from_document(nonempty, d, task, max_seq_length, short_seq_prob, sentence_pair_prob, rng,
                                     tokenizer)
            )
    for e in examples:  # back to the caller's document numbering
        e.doc_index, e.b_doc_index = kept[e.doc_index], kept[e.b_doc_index]
    if shuffle:
        rng.shuffle(examples)
    for i, e in enumerate(examples):
        e.index = i
    log.info("%d %s pairs from %d documents (%.1f%% label 1)", len(examples), task.upper(), len(kept),
             100.0 * sum(e.label for e in examples) / max(len(examples), 1))
    return examples


def tokenize_documents(documents: Sequence[Any], tokenizer: Tokenizer) -> list[TokenDocument]:
    """Token ids (no [CLS]/[SEP]) of each sentence of each text document; when any document is tagged
    (`corpora.Document.spans`), `TaggedToken`s instead: the same ids with their mention codes."""
    tagged = any(getattr(doc, "spans", None) for doc in documents)
    out = []
    for doc in documents:
        sentences = getattr(doc, "sentences", doc)
        if isinstance(sentences, str):
            raise PairError("a document is a single string: give a list of sentences (see corpora.split_sentences).")
        encodings = [tokenizer.encode(s, max_length=sys.maxsize) for s in sentences]
        if not tagged:
            out.append([enc.ids[1:-1] for enc in encodings])
            continue
        spans = getattr(doc, "spans", None) or {}
        per_kind = [spans.get(k) or [[] for _ in sentences] for k in MENTION_KINDS]
        out.append([
            list(zip(enc.ids[1:-1], *(mention_codes(enc.offsets[1:-1], kind[i]) for kind in per_kind)))
            for i, enc in enumerate(encodings)
        ])
    return out


def mention_codes(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[int]:
    """One code per token (character `offsets` in its sentence): 1 for the first token that starts inside a
    span, 2 for the next ones in that span, 0 outside every span."""
    codes = [0] * len(offsets)
    j = 0
    ordered = sorted(spans)
    for t, (start, end) in enumerate(offsets):
        while j < len(ordered) and ordered[j][1] <= start:
            j += 1
        if j < len(ordered) and ordered[j][0] <= start < ordered[j][1] and end > start:
            codes[t] = 2 if t and codes[t - 1] and offsets[t - 1][0] >= ordered[j][0] else 1
    return codes


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Cut the longer of A and B (B on ties) one token at a time, from the front or the back at random,
    until ``len(a) + len(b) <= max_num_tokens``. In place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _as_token_documents(documents: Sequence[Any], tokenizer: Tokenizer) -> list[TokenDocument]:
    first = next((s for d in documents for s in getattr(d, "sentences", d)), None)
    if isinstance(first, str) or any(isinstance(d, str) for d in documents[:1]):
        documents = tokenize_documents(documents, tokenizer)
    return [[list(s) for s in getattr(d, "sentences", d) if len(s)] for d in documents]  # no empty sentences


def _pairs_from_document(
    docs: list[TokenDocument],
    d: int,
    task: str,
    max_seq_length: int,
    short_seq_prob: float,
    sentence_pair_prob: float,
    rng: random.Random,
    tokenizer: Tokenizer,
) -> list[PairExample]:
    document = docs[d]
    max_num_tokens = max_seq_length - 3
    target = rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens
    out: list[PairExample] = []
    chunk: list[list[int]] = []
    length = 0
    i = 0
    single = False  # this chunk makes a one-sentence + one-sentence pair
    while i < len(document):
        if not chunk and sentence_pair_prob:  # no draw at 0, so seeded pairs stay as they were
            single = rng.random() < sentence_pair_prob
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target or single:
            if len(chunk) == 1 and i + 1 == len(document):
                break  # a lone last sentence: dropped whatever the coin, so labels stay 50/50
            coin = rng.random() < 0.5  # NSP: random B; SOP: swap
            if len(chunk) == 1 and not (task == "nsp" and coin):
                i += 1  # A and B both come from this chunk: it needs a second sentence
                chunk.append(document[i])
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for s in chunk[:a_end] for t in s]
            b_doc = d
            if task == "nsp" and coin:
                tokens_b, b_doc = _random_segment(docs, d, 1 if single else target - len(tokens_a), rng)
                i -= len(chunk) - a_end  # the sentences after A were not used: start the next chunk there
            else:
                tokens_b = [t for s in chunk[a_end:] for t in s]
                if task == "sop" and coin:
                    tokens_a, tokens_b = tokens_b, tokens_a
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            out.append(_example(tokens_a, tokens_b, int(coin), task, d, b_doc, tokenizer))
            chunk, length = [], 0
        i += 1
    return out


def _random_segment(docs: list[TokenDocument], d: int, target_len: int, rng: random.Random) -> tuple[list[int], int]:
    """Sentences from a random start in a random *other* document, up to `target_len` tokens."""
    other = rng.randrange(len(docs) - 1)
    other += other >= d
    doc = docs[other]
    tokens: list[int] = []
    for sentence in doc[rng.randrange(len(doc)) :]:
        tokens.extend(sentence)
        if len(tokens) >= target_len:
            break
    return tokens, other


def _example(
    a: list[int], b: list[int], label: int, task: str, d: int, b_doc: int, tokenizer: Tokenizer
) -> PairExample:
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    if not isinstance((a or b or [0])[0], tuple):
        return PairExample([cls, *a, sep, *b, sep], types, label, task, d, b_doc, num_a=len(a))
    rows = [(cls, *[0] * len(MENTION_KINDS)), *a, (sep, *[0] * len(MENTION_KINDS)), *b,
            (sep, *[0] * len(MENTION_KINDS))]
    ids, *codes = (list(column) for column in zip(*rows))
    return PairExample(ids, types, label, task, d, b_doc, num_a=len(a), mentions=dict(zip(MENTION_KINDS, codes)))
