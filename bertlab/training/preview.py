"""What the pre-training tab shows, computed: one text masked exactly as the training collator masks it
(`masking.mask_tokens`, the same never-masked and never-drawn ids), the same text under each strategy and
under RoBERTa's dynamic re-draws, and NSP / SOP pairs made by `pairs.build_pairs`. `viz.pretrain` draws them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertlab.inputs import InputError, require_text
from bertlab.runtime import derive_seed
from bertlab.tokenizer import DEFAULT_SPECIALS, Tokenizer
from bertlab.training.corpora import MENTION_KINDS, Span
from bertlab.training.masking import (
    STRATEGIES,
    TAGGED_STRATEGIES,
    MaskKind,
    continuation_table,
    mask_tokens,
    never_mask_ids,
    reserved_ids,
    tagged_text_needed,
    word_starts_from_ids,
)
from bertlab.training.pairs import PairExample, build_pairs, mention_codes

TaggedSpans = dict[str, list[Span]]  # mention kind ("entity", "phrase") -> character spans in one text


@dataclass
class VocabTables:
    """Per-tokenizer lookups that masking needs (built once: ~50 ms for a 30k vocabulary)."""

    continuation: torch.Tensor  # [vocab] bool: True for ## pieces
    never: torch.Tensor  # ids never chosen: [CLS], [SEP], [PAD], [MASK]
    reserved: list[int]  # ids never drawn as random replacements ([UNK], [unused0], ...)


def vocab_tables(tok: Tokenizer) -> VocabTables:
    return VocabTables(continuation_table(tok), torch.tensor(never_mask_ids(tok)), reserved_ids(tok))


@dataclass
class MaskedExample:
    """One text after masking; every list has one entry per token, [CLS] ... [SEP]."""

    tokens: list[str]  # the pieces before masking
    masked: list[str]  # what the model reads
    kinds: list[MaskKind]
    units: list[int]  # token / word / span number of each chosen position, -1 elsewhere
    strategy: str
    rate: float
    seed: int
    warning: str | None = None  # set when a long text was cut
    special: list[bool] | None = None  # True for the tokenizer's special tokens (never chosen)
    mask_token: str = DEFAULT_SPECIALS["mask"]  # how the tokenizer spells its mask token
    shown: list[str] | None = None  # `masked` as a student reads it (Tokenizer.readable_pieces); None = as is

    @property
    def num_eligible(self) -> int:
        """Tokens that may be chosen: all but the special ones."""
        return sum(not s for s in self.special) if self.special is not None else len(self.tokens)

    @property
    def labels(self) -> list[str | None]:
        """What the model must predict at each position (the original piece), None where nothing."""
        return [t if k != MaskKind.NOT_CHOSEN else None for t, k in zip(self.tokens, self.kinds)]

    def count(self, kind: MaskKind) -> int:
        return sum(k == kind for k in self.kinds)

    @property
    def num_chosen(self) -> int:
        return sum(k != MaskKind.NOT_CHOSEN for k in self.kinds)


def mask_example(
    tok: Tokenizer,
    text: str,
    strategy: str = "token",
    rate: float = 0.15,
    seed: int = 0,
    *,
    tables: VocabTables | None = None,
    max_length: int = 128,
    spans: TaggedSpans | None = None,
) -> MaskedExample:
    """`text` masked as the training collator masks it (`mask_tokens`, generator seeded by `seed`).
    `spans`: the text's mentions by kind (character spans), which entity / phrase masking need.

    Raises InputError for an empty text, one with nothing that may be masked, or entity / phrase masking
    of a text without its spans."""
    require_text(text)
    tables = tables or vocab_tables(tok)
    enc = tok.encode(text, max_length=max_length)
    ids = torch.tensor([enc.ids])  # [1, s]
    special = torch.isin(ids, tables.never)  # [1, s]
    if bool(special.all()):
        raise InputError(f"There is nothing to mask: the text holds only special tokens such as {tok.mask_token}. "
                         "Type a sentence of words.")
    mentions = None
    if strategy in TAGGED_STRATEGIES:
        if not spans or strategy not in spans:
            raise InputError(tagged_text_needed(strategy))
        mentions = torch.tensor([mention_codes(enc.offsets, spans[strategy])])  # [1, s]
        mentions[special] = 0
    out = mask_tokens(
        ids, special, tok.vocab_size, tok.mask_token_id, torch.Generator().manual_seed(seed),
        strategy=strategy, word_starts=word_starts_from_ids(ids, tables.continuation), mlm_probability=rate,
        exclude_from_random=tables.reserved, mentions=mentions,
    )
    masked = tok.convert_ids_to_tokens(out.input_ids[0].tolist())
    return MaskedExample(
        tokens=enc.tokens, masked=masked,
        kinds=[MaskKind(int(k)) for k in out.kind[0]], units=out.unit_ids[0].tolist(),
        strategy=strategy, rate=rate, seed=seed, warning=enc.warning,
        special=[bool(m) for m in enc.special_tokens_mask], mask_token=tok.mask_token,
        shown=tok.readable_pieces(masked),
    )


def mask_every_strategy(tok: Tokenizer, text: str, rate: float, seed: int,
                        tables: VocabTables | None = None, spans: TaggedSpans | None = None,
                        max_length: int = 128) -> dict[str, MaskedExample]:
    """The same text and seed under each strategy of `masking.STRATEGIES`; entity / phrase only when
    `spans` has that kind (see `untagged_strategies`)."""
    tables = tables or vocab_tables(tok)
    return {s: mask_example(tok, text, s, rate, seed, tables=tables, spans=spans, max_length=max_length)
            for s in STRATEGIES if s not in untagged_strategies(spans)}


def untagged_strategies(spans: TaggedSpans | None) -> list[str]:
    """The strategies that cannot mask a text with these `spans` (none given: entity and phrase)."""
    return [s for s in TAGGED_STRATEGIES if not spans or s not in spans]


def dynamic_draws(tok: Tokenizer, text: str, strategy: str, rate: float, seed: int, epochs: int = 3,
                  tables: VocabTables | None = None, spans: TaggedSpans | None = None) -> list[MaskedExample]:
    """The masks RoBERTa's dynamic masking would draw for this text in epochs 1..`epochs`
    (a generator per epoch, as `MLMCollator.set_epoch`); static masking repeats the first."""
    tables = tables or vocab_tables(tok)
    return [mask_example(tok, text, strategy, rate, derive_seed(seed, "epoch", e), tables=tables, spans=spans)
            for e in range(epochs)]


def spans_of_phrases(text: str, phrases: Sequence[tuple[str, str]]) -> list[Span]:
    """Character spans of `phrases` ((words, label) in the order they occur) found left to right in `text`."""
    out, pos = [], 0
    for words, label in phrases:
        start = text.find(words, pos)
        if start < 0:
            raise ValueError(f"{words!r} does not occur in the text after character {pos}.")
        out.append((start, start + len(words), label))
        pos = start + len(words)
    return out


def tagged_sentences(documents: Sequence, kinds: Sequence[str] = MENTION_KINDS) -> list[tuple[str, TaggedSpans]]:
    """(sentence, spans) of every sentence of tagged documents (`corpora.Document.spans`) that has a
    mention of each kind in `kinds` and 8 to 40 words: the tab's tagged examples."""
    out = []
    for doc in documents:
        spans = getattr(doc, "spans", None) or {}
        if not all(k in spans for k in kinds):
            continue
        for i, sentence in enumerate(doc.sentences):
            if 8 <= len(sentence.split()) <= 40 and all(spans[k][i] for k in kinds):
                out.append((sentence, {k: list(spans[k][i]) for k in kinds}))
    return out


@dataclass
class PairDemo:
    """Example pairs from a few documents: NSP pairs (one of each label when there is one) and a SOP pair."""

    nsp: list[PairExample]
    sop: list[PairExample]
    titles: list[str]  # title of each document the pairs' doc_index points at


def example_pairs(documents: Sequence, tok: Tokenizer, seed: int = 0, num_documents: int = 8,
                  max_seq_length: int = 40) -> PairDemo:
    """NSP and SOP pairs, with `build_pairs`, from `num_documents` documents drawn with `seed`
    (documents of 3+ sentences preferred, so that both halves of a pair come from one of them)."""
    rng = random.Random(seed)
    long = [d for d in documents if len(getattr(d, "sentences", d)) >= 3] or list(documents)
    if len(long) < 2:
        raise InputError("Sentence pairs need at least two documents of text.")
    chosen = rng.sample(long, min(num_documents, len(long)))
    kwargs = {"max_seq_length": max_seq_length, "short_seq_prob": 0.0, "seed": seed}
    nsp = build_pairs(chosen, tok, task="nsp", **kwargs)
    sop = build_pairs(chosen, tok, task="sop", **kwargs)
    one_each = [next(p for p in nsp if p.label == lab) for lab in (0, 1) if any(p.label == lab for p in nsp)]
    one_each_sop = [next(p for p in sop if p.label == lab) for lab in (0, 1) if any(p.label == lab for p in sop)]
    titles = [getattr(d, "title", "") or f"document {i}" for i, d in enumerate(chosen)]
    return PairDemo(one_each, one_each_sop, titles)
