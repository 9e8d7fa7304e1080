"""Masked-language-model masking as BERT, whole-word BERT, SpanBERT and RoBERTa do it.

Semantics (all strategies):

- **Budget.** Each sequence gets a budget of ``k = round(p * n)`` tokens, at least 1 when ``n > 0``, where
  ``n`` counts the tokens that may be chosen (never [CLS], [SEP], [PAD], [MASK], nor anything
  ``special_mask`` or ``attention_mask`` rules out). This is original BERT's ``create_masked_lm_predictions``
  (which counted [CLS]/[SEP] in ``n``; here they are not) with Python's round-half-to-even.
  With ``exact_count=False`` the budget is drawn ``k ~ Binomial(n, p)`` instead; for the token strategy this
  is, in distribution, exactly the per-token Bernoulli(p) of Hugging Face's ``DataCollatorForLanguageModeling``.
  ``max_predictions`` caps ``k`` (BERT used 20 for 128-token sequences).
- **token**: ``k`` tokens chosen uniformly without replacement.
- **whole_word**: words (a word = its first piece and the ``##`` pieces after it) in a random order,
  each taken if all its pieces fit in what is left of the budget, else skipped (original BERT's
  ``do_whole_word_mask``); so the count is exactly ``k`` whenever single-piece words can fill the end.
- **span** (SpanBERT): repeat until the budget is spent: draw a length ``L`` in words from a geometric
  distribution ``P(L) ∝ p_span (1 - p_span)^(L-1)`` truncated to ``1..max_span`` and renormalised (the
  SpanBERT paper's "clipped" distribution, mean 3.80 for p=0.2, max 10), then a start word uniformly among
  the free words at which ``L`` free, adjacent words begin (any free word if there is none); the span takes
  those whole words, stopping early at the budget. Spans never overlap nor cross [SEP].
- **entity** (ERNIE) and **phrase** (SpanBERT's noun-phrase row): the tagged mentions (named entities:
  PER/ORG/LOC/MISC; noun-phrase chunks: B-NP/I-NP) in a random order, each taken whole (all its pieces)
  if it fits what is left of the budget; then whole words, as **whole_word**, to fill the budget when the
  text has too few mentions. They need ``mentions`` [b, s]: each token's IOB code (`MENTION_O`,
  `MENTION_B`, `MENTION_I`) for that strategy's tag set, which tagged text (CoNLL-2003) gives; see
  `corpora.Document.spans` and `pairs.PairExample.mentions`.
- **80/10/10.** Each chosen token becomes [MASK] with probability 0.8, a random token (uniform over the
  vocabulary minus [MASK] and ``exclude_from_random``) with 0.1, or stays unchanged with 0.1.
  For spans the draw is per span by default (``span_level_replacement``, as SpanBERT), per token otherwise.
- ``labels`` hold the original id at chosen positions and -100 elsewhere; ``kind`` says which of the
  three cases each position got (see `MaskKind`), so a UI can colour them.

Dynamic masking (RoBERTa) re-masks at batch time with a generator seeded per epoch; static masking
fixes one mask per example from a per-example seed: see `MLMCollator`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from bertlab.runtime import derive_seed
from bertlab.tasks.batching import pad_inputs
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STRATEGIES = ("token", "whole_word", "span", "entity", "phrase")
TAGGED_STRATEGIES = ("entity", "phrase")  # strategies that need each token's mention code (tagged text)
MENTION_O, MENTION_B, MENTION_I = 0, 1, 2  # a token outside a mention, first in one, inside one
WHAT_IS_TAGGED = {"entity": "named entities (PER, ORG, LOC, MISC)", "phrase": "noun-phrase chunks (NP)"}
IGNORE_INDEX = -100  # label of positions that are not predicted (cross_entropy's ignore_index)


class MaskKind(IntEnum):
    """What masking did to a position (values of `MaskedTokens.kind`)."""

    NOT_CHOSEN = 0
    MASK = 1  # replaced by [MASK]
    RANDOM = 2  # replaced by a random token
    KEPT = 3  # chosen (predicted) but left unchanged


class MaskingError(ValueError):
    """Masking inputs or settings that cannot be used."""


@dataclass
class MaskingConfig:
    """The settings of `mask_tokens` (see the module docstring for their meaning)."""

    strategy: str = "token"
    mlm_probability: float = 0.15
    exact_count: bool = True
    max_predictions: int | None = None
    mask_prob: float = 0.8
    random_prob: float = 0.1
    span_p: float = 0.2
    max_span: int = 10
    span_level_replacement: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise MaskingError(f"strategy {self.strategy!r} is not one of {STRATEGIES}.")
        if not 0.0 < self.mlm_probability <= 1.0:
            raise MaskingError(f"mlm_probability must be in (0, 1], got {self.mlm_probability}.")
        if self.mask_prob < 0 or self.random_prob < 0 or self.mask_prob + self.random_prob > 1.0:
            raise MaskingError(
                f"mask_prob ({self.mask_prob}) and random_prob ({self.random_prob}) must be >= 0 and sum to <= 1."
            )
        if not 0.0 < self.span_p <= 1.0 or self.max_span < 1:
            raise MaskingError(f"span_p must be in (0, 1] and max_span >= 1, got {self.span_p}, {self.max_span}.")
        if self.max_predictions is not None and self.max_predictions < 1:
            raise MaskingError(f"max_predictions must be >= 1 or None, got {self.max_predictions}.")


@dataclass
class MaskedTokens:
    """The result of masking a batch; every tensor is [batch, seq]."""

    input_ids: Tensor  # [b, s] ids after masking (what the model reads)
    labels: Tensor  # [b, s] original id where chosen, -100 elsewhere
    kind: Tensor  # [b, s] int8 MaskKind
    unit_ids: Tensor  # [b, s] token/word/span (0, 1, ... within the row) of each chosen position; -1 elsewhere

    @property
    def chosen(self) -> Tensor:
        """[b, s] bool: positions the model must predict."""
        return self.kind != MaskKind.NOT_CHOSEN


# -- the public function --------------------------------------------------------------------


def mask_tokens(
    input_ids: Tensor,
    special_mask: Tensor,
    vocab_size: int,
    mask_id: int,
    generator: torch.Generator,
    *,
    strategy: str = "token",
    word_starts: Tensor | None = None,
    attention_mask: Tensor | None = None,
    mlm_probability: float = 0.15,
    exact_count: bool = True,
    max_predictions: int | None = None,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    span_p: float = 0.2,
    max_span: int = 10,
    span_level_replacement: bool = True,
    exclude_from_random: Sequence[int] = (),
    mentions: Tensor | None = None,
) -> MaskedTokens:
    """Choose tokens to predict and corrupt them 80/10/10 (see the module docstring).

    input_ids [b, s]; special_mask [b, s] (True/1 = never choose: [CLS], [SEP], [PAD]);
    attention_mask [b, s] (0 = padding, never chosen); word_starts [b, s] bool (True at the first piece
    of each word; needed by "whole_word", "span", "entity" and "phrase", see `word_starts_from_ids`);
    mentions [b, s] int (MENTION_O / _B / _I of each token; needed by "entity" and "phrase").
    All random draws come from `generator`."""
    cfg = MaskingConfig(
        strategy, mlm_probability, exact_count, max_predictions, mask_prob, random_prob, span_p, max_span,
        span_level_replacement,
    )
    eligible = _eligible(input_ids, special_mask, attention_mask, mask_id, vocab_size)  # [b, s]
    budget = _budget(eligible, cfg, generator)  # [b]
    if cfg.strategy == "token":
        chosen, unit_ids = _choose_tokens(eligible, budget, generator)
    else:
        if word_starts is None:
            raise MaskingError(
                f"strategy {cfg.strategy!r} needs word_starts [batch, seq] (True at the first piece of each "
                "word): build it with word_starts_from_ids(input_ids, tokenizer) or word_starts_from_word_ids()."
            )
        if word_starts.shape != input_ids.shape:
            raise MaskingError(f"word_starts has shape {tuple(word_starts.shape)}, input_ids {tuple(input_ids.shape)}.")
        if cfg.strategy in TAGGED_STRATEGIES:
            words, is_mention = _mention_units(eligible, word_starts.bool(), _check_mentions(mentions, input_ids,
                                                                                             cfg.strategy))
            chosen_words = _choose_mentions_first(words, is_mention, budget, generator)
        elif cfg.strategy == "whole_word":
            words = _Words.build(eligible, word_starts.bool())
            chosen_words = _choose_whole_words(words, budget, generator)
        else:
            words = _Words.build(eligible, word_starts.bool())
            chosen_words = _choose_spans(words, budget, span_length_probs(span_p, max_span), generator)
        chosen, unit_ids = words.to_tokens(chosen_words)
    per_unit = cfg.strategy == "span" and cfg.span_level_replacement  # entity/phrase: per token, as whole_word
    kind = _replacement_kinds(chosen, unit_ids if per_unit else None, cfg, generator)
    random_ids = _random_ids(vocab_size, mask_id, exclude_from_random, input_ids.device)
    return _apply(input_ids, kind, unit_ids, mask_id, random_ids, generator)


def span_length_probs(p: float = 0.2, max_span: int = 10) -> Tensor:
    """[max_span] probabilities of span lengths 1..max_span: geometric(p) truncated and renormalised."""
    lengths = torch.arange(1, max_span + 1, dtype=torch.float64)
    w = p * (1 - p) ** (lengths - 1)
    return w / w.sum()


def expected_span_length(p: float = 0.2, max_span: int = 10) -> float:
    """Mean span length in words of `span_length_probs` (3.797... for p=0.2, max_span=10)."""
    probs = span_length_probs(p, max_span)
    return float((probs * torch.arange(1, max_span + 1, dtype=torch.float64)).sum())


# -- eligibility and budget -------------------------------------------------------------------


def _eligible(
    input_ids: Tensor, special_mask: Tensor, attention_mask: Tensor | None, mask_id: int, vocab_size: int
) -> Tensor:
    if input_ids.dim() != 2:
        raise MaskingError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}.")
    if special_mask.shape != input_ids.shape:
        raise MaskingError(
            f"special_mask has shape {tuple(special_mask.shape)} but input_ids {tuple(input_ids.shape)}."
        )
    if input_ids.numel() and (int(input_ids.max()) >= vocab_size or int(input_ids.min()) < 0):
        raise MaskingError(
            f"input_ids hold ids outside the vocabulary of {vocab_size} (min {int(input_ids.min())}, "
            f"max {int(input_ids.max())}): were they made by another tokenizer?"
        )
    eligible = ~special_mask.bool() & (input_ids != mask_id)
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    return eligible


def _budget(eligible: Tensor, cfg: MaskingConfig, g: torch.Generator) -> Tensor:
    n = eligible.sum(1).to(torch.float64)  # [b]
    if cfg.exact_count:
        k = torch.round(n * cfg.mlm_probability)
        k = torch.where(n > 0, k.clamp(min=1), k)
    else:
        k = torch.binomial(n, torch.full_like(n, cfg.mlm_probability), generator=g)
    if cfg.max_predictions is not None:
        k = k.clamp(max=cfg.max_predictions)
    return k.long()


# -- token strategy --------------------------------------------------------------------------


def _choose_tokens(eligible: Tensor, budget: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
    scores = torch.rand(eligible.shape, generator=g, device=eligible.device)  # [b, s]
    scores = scores.masked_fill(~eligible, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)  # [b, s] rank of each position in a random order
    chosen = ranks < budget[:, None]
    unit_ids = torch.where(chosen, chosen.long().cumsum(1) - 1, -1)
    return chosen, unit_ids


# -- words -----------------------------------------------------------------------------------


@dataclass
class _Words:
    """Word structure of a batch: W = most words in a row."""

    token_word: Tensor  # [b, s] word index of each token, W for tokens outside words
    lengths: Tensor  # [b, W] pieces per word (0 = no such word)
    linked: Tensor  # [b, W] word w+1 directly follows word w (no special token between)
    eligible: Tensor  # [b, s]

    @classmethod
    def build(cls, eligible: Tensor, word_starts: Tensor) -> "_Words":
        b, s = eligible.shape
        prev_eligible = torch.cat([eligible.new_zeros(b, 1), eligible[:, :-1]], dim=1)  # [b, s]
        starts = eligible & (word_starts | ~prev_eligible)  # a special token ends the word before it
        num_words = int(starts.sum(1).max()) if b else 0
        w = max(num_words, 1)
        token_word = torch.where(eligible, starts.long().cumsum(1) - 1, w)  # [b, s]
        lengths = torch.zeros(b, w + 1, dtype=torch.long, device=eligible.device)
        lengths.scatter_add_(1, token_word, torch.ones_like(token_word))
        # a word is linked to the previous one when its first piece follows an eligible token
        linked_prev = torch.zeros(b, w + 1, dtype=torch.bool, device=eligible.device)
        linked_prev.scatter_(1, torch.where(starts, token_word, w), starts & prev_eligible)
        linked = torch.cat([linked_prev[:, 1:w], linked_prev.new_zeros(b, 1)], dim=1)  # [b, W]
        return cls(token_word, lengths[:, :w], linked, eligible)

    def to_tokens(self, chosen_words: Tensor) -> tuple[Tensor, Tensor]:
        """chosen_words [b, W] long (unit id, -1 = not chosen) -> chosen [b, s] bool, unit_ids [b, s]."""
        padded = torch.cat([chosen_words, chosen_words.new_full((chosen_words.shape[0], 1), -1)], dim=1)
        unit_ids = padded.gather(1, self.token_word)  # [b, s]
        return unit_ids >= 0, unit_ids


def _choose_whole_words(words: _Words, budget: Tensor, g: torch.Generator) -> Tensor:
    """Words in random order, each taken if it fits the remaining budget -> [b, W] unit ids (-1 = not)."""
    lengths = words.lengths  # [b, W]
    keys = torch.rand(lengths.shape, generator=g, device=lengths.device).masked_fill(lengths == 0, 2.0)
    return _take_in_order(lengths, keys, budget)


def _choose_mentions_first(words: _Words, is_mention: Tensor, budget: Tensor, g: torch.Generator) -> Tensor:
    """Mentions in random order, then the other words in random order, each taken whole if it fits the
    remaining budget -> [b, W] unit ids (-1 = not chosen)."""
    lengths = words.lengths  # [b, W]
    keys = torch.rand(lengths.shape, generator=g, device=lengths.device)  # [b, W] in [0, 1)
    keys = (keys + (~is_mention).to(keys.dtype)).masked_fill(lengths == 0, 3.0)  # mentions < words < none
    return _take_in_order(lengths, keys, budget)


def _take_in_order(lengths: Tensor, keys: Tensor, budget: Tensor) -> Tensor:
    """Units in the order of `keys` [b, W] (lengths [b, W] pieces, keys of absent units above all others),
    each taken if all its pieces fit the remaining budget -> [b, W] unit ids (-1 = not chosen)."""
    order = keys.argsort(dim=1)  # [b, W] word indices in the key order
    plen = lengths.gather(1, order)  # [b, W] lengths in that order
    remaining = budget.clone()  # [b]
    alive = (plen > 0) & (plen <= remaining[:, None])
    taken = torch.zeros_like(alive)
    while bool(alive.any()):
        # every alive word fits, so the first alive word of each row is taken: the loop ends
        new = alive & ((plen * alive).cumsum(1) <= remaining[:, None])
        taken |= new
        remaining -= (plen * new).sum(1)
        alive &= ~new & (plen <= remaining[:, None])
    chosen = torch.zeros_like(taken).scatter(1, order, taken)  # back to word order
    return torch.where(chosen, chosen.long().cumsum(1) - 1, -1)


def _choose_spans(words: _Words, budget: Tensor, probs: Tensor, g: torch.Generator) -> Tensor:
    """SpanBERT spans of whole words until the budget is spent -> [b, W] span ids (-1 = not chosen).

    One span per row per round; each round works on the rows that still have budget."""
    lengths = words.lengths.int()  # [b, W] (int32 throughout: this loop is memory-bound)
    b, w = lengths.shape
    idx = torch.arange(w, dtype=torch.int32, device=lengths.device)  # [W]
    tokens_upto = lengths.cumsum(1, dtype=torch.int32)  # [b, W] pieces in words 0..w
    free = lengths > 0
    span_of = torch.full((b, w), -1, dtype=torch.int32, device=lengths.device)
    num_spans = torch.zeros(b, dtype=torch.int32, device=lengths.device)
    remaining = budget.int()  # [b]
    rows = (remaining > 0).nonzero().squeeze(1)  # [r] rows still masking
    while rows.numel():
        r = rows.numel()
        ln, fr, rem = lengths[rows], free[rows], remaining[rows]  # [r, W], [r, W], [r]
        span_len = torch.multinomial(probs, r, replacement=True, generator=g).to(ln.device).int() + 1  # [r]
        run = _free_run(fr, words.linked[rows])  # [r, W] free adjacent words from w on
        start_ok = fr & (ln <= rem[:, None])
        whole = start_ok & (run >= span_len[:, None])
        allowed = torch.where(whole.any(1, keepdim=True), whole, start_ok)
        ok = allowed.any(1)  # [r] rows where a span can start
        keys = torch.rand((r, w), generator=g, device=ln.device).masked_fill(~allowed, -1.0)
        start = keys.argmax(1, keepdim=True)  # [r, 1]
        end = start + torch.minimum(span_len[:, None], run.gather(1, start))  # [r, 1] exclusive (long)
        upto = tokens_upto[rows]
        before = upto.gather(1, start) - ln.gather(1, start)  # [r, 1] pieces before the start
        new = (idx >= start) & (idx < end) & (upto - before <= rem[:, None]) & ok[:, None]  # [r, W]
        span_of[rows] = torch.where(new, num_spans[rows, None], span_of[rows])
        free[rows] = fr & ~new
        rem = rem - (ln * new).sum(1, dtype=torch.int32)
        remaining[rows] = rem
        num_spans[rows] += ok.int()
        rows = rows[ok & (rem > 0)]
    return span_of.long()


def _check_mentions(mentions: Tensor | None, input_ids: Tensor, strategy: str) -> Tensor:
    if mentions is None:
        raise MaskingError(tagged_text_needed(strategy))
    if mentions.shape != input_ids.shape:
        raise MaskingError(f"mentions has shape {tuple(mentions.shape)}, input_ids {tuple(input_ids.shape)}.")
    return mentions.to(input_ids.device)


def tagged_text_needed(strategy: str, corpus: str = "") -> str:
    """The message for `strategy` ("entity" / "phrase") asked of text without its tags."""
    what = f"{corpus} is plain text" if corpus else "this text has no tags"
    return (f"{strategy} masking hides whole {WHAT_IS_TAGGED[strategy]}, so it needs text tagged with them, and "
            f"{what}. Pre-train on CoNLL-2003's training text (corpus conll2003, or a CoNLL-2003 .txt file such "
            f"as $BERTLAB_DATA/conll2003/train.txt), or pick token, whole_word or span masking.")


def _mention_units(eligible: Tensor, word_starts: Tensor, mentions: Tensor) -> tuple[_Words, Tensor]:
    """Units of a batch for entity/phrase masking: each mention is one unit (all its words and pieces),
    each word outside a mention another -> (units as `_Words`, is_mention [b, W] bool)."""
    b = eligible.shape[0]
    inside = mentions != MENTION_O  # [b, s]
    prev_inside = torch.cat([inside.new_zeros(b, 1), inside[:, :-1]], dim=1)  # [b, s]
    # a unit starts at a mention's first token (B, or an I cut from its B), or at a word outside mentions
    starts = (mentions == MENTION_B) | (inside & ~prev_inside) | (~inside & (word_starts | prev_inside))
    units = _Words.build(eligible, starts)
    w = units.lengths.shape[1]
    first = eligible & (starts | ~torch.cat([eligible.new_zeros(b, 1), eligible[:, :-1]], dim=1))
    is_mention = torch.zeros(b, w + 1, dtype=torch.bool, device=eligible.device)
    is_mention.scatter_(1, torch.where(first, units.token_word, w), first & inside)
    return units, is_mention[:, :w]


def _free_run(free: Tensor, linked: Tensor) -> Tensor:
    """[b, W]: how many free words follow one another from word w on (0 if w is not free)."""
    w = free.shape[1]
    idx = torch.arange(w, dtype=torch.int32, device=free.device).expand_as(free)
    # a run stops at a taken/missing word, and after a word not linked to the next one
    stop_here = torch.where(free, torch.where(linked, w, idx + 1), idx)
    return (_suffix_min(stop_here) - idx).clamp(min=0)


def _suffix_min(x: Tensor) -> Tensor:
    return x.flip(1).cummin(1).values.flip(1)


# -- 80/10/10 -----------------------------------------------------------------------------------


def _replacement_kinds(chosen: Tensor, unit_ids: Tensor | None, cfg: MaskingConfig, g: torch.Generator) -> Tensor:
    """[b, s] int8 MaskKind; one draw per token, or per unit when `unit_ids` is given."""
    if unit_ids is None:
        u = torch.rand(chosen.shape, generator=g, device=chosen.device)  # [b, s]
    else:
        num_units = int(unit_ids.max()) + 1 if unit_ids.numel() else 0
        per_unit = torch.rand((chosen.shape[0], max(num_units, 1)), generator=g, device=chosen.device)
        u = per_unit.gather(1, unit_ids.clamp(min=0))  # [b, s]
    kind = torch.full(chosen.shape, int(MaskKind.KEPT), dtype=torch.int8, device=chosen.device)
    kind[u < cfg.mask_prob + cfg.random_prob] = int(MaskKind.RANDOM)
    kind[u < cfg.mask_prob] = int(MaskKind.MASK)
    kind[~chosen] = int(MaskKind.NOT_CHOSEN)
    return kind


def _random_ids(vocab_size: int, mask_id: int, exclude: Sequence[int], device: torch.device) -> Tensor:
    allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)
    banned = torch.tensor([mask_id, *exclude], dtype=torch.long, device=device)
    if int(banned.max()) >= vocab_size or int(banned.min()) < 0:
        raise MaskingError(f"mask_id / exclude_from_random hold ids outside the vocabulary of {vocab_size}.")
    allowed[banned] = False
    ids = allowed.nonzero().squeeze(1)  # [n_allowed]
    if ids.numel() == 0:
        raise MaskingError("no token is left to draw random replacements from: exclude fewer ids.")
    return ids


def _apply(
    input_ids: Tensor, kind: Tensor, unit_ids: Tensor, mask_id: int, random_ids: Tensor, g: torch.Generator
) -> MaskedTokens:
    draw = torch.randint(0, random_ids.numel(), input_ids.shape, generator=g, device=input_ids.device)
    out = input_ids.clone()
    is_random = kind == MaskKind.RANDOM
    out[is_random] = random_ids[draw[is_random]].to(out.dtype)
    out[kind == MaskKind.MASK] = mask_id
    chosen = kind != MaskKind.NOT_CHOSEN
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return MaskedTokens(out, labels, kind, torch.where(chosen, unit_ids, -1))


# -- word starts from a tokenizer ------------------------------------------------------------


def continuation_table(tokenizer: Tokenizer) -> Tensor:
    """[vocab] bool: True for pieces that continue a word (WordPiece's ``##...``; the tokenizer says which)."""
    table = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    for token, i in tokenizer.get_vocab().items():
        if tokenizer.is_continuation(token):
            table[i] = True
    return table


def word_starts_from_ids(input_ids: Tensor, tokenizer: Tokenizer | Tensor) -> Tensor:
    """[b, s] bool: True where a token is not a ``##`` continuation piece. `tokenizer` may also be a
    precomputed `continuation_table`."""
    table = tokenizer if isinstance(tokenizer, Tensor) else continuation_table(tokenizer)
    return ~table.to(input_ids.device)[input_ids]


def word_starts_from_word_ids(word_ids: Sequence[Sequence[int | None]], seq_len: int | None = None) -> Tensor:
    """[b, s] bool from per-token word indices (`Encoding.word_ids`; None for special tokens)."""
    seq_len = seq_len or max((len(w) for w in word_ids), default=0)
    out = torch.zeros(len(word_ids), seq_len, dtype=torch.bool)
    for row, ids in enumerate(word_ids):
        prev: int | None = None
        for col, w in enumerate(ids[:seq_len]):
            out[row, col] = w is not None and w != prev
            prev = w
    return out


def never_mask_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids never chosen for prediction: [CLS], [SEP], [PAD], [MASK]."""
    return [tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id]


_RESERVED = re.compile(r"^\[[^\[\]]+\]$")  # [PAD], [unused12], ...


def reserved_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids of bracketed tokens ([PAD], [UNK], [CLS], [SEP], [MASK], [unused0], ...): never drawn as random
    replacements."""
    return sorted(i for t, i in tokenizer.get_vocab().items() if _RESERVED.match(t))


# -- the collator ----------------------------------------------------------------------------


@dataclass
class MLMBatch:
    """A padded, masked batch; every tensor is [batch, seq] except `next_sentence_label` [batch]."""

    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor
    labels: Tensor  # -100 where not predicted
    kind: Tensor  # int8 MaskKind
    unit_ids: Tensor
    next_sentence_label: Tensor | None = None  # NSP/SOP labels when the examples carry one
    indices: list[int | None] = field(default_factory=list)  # example indices (when given)

    @property
    def original_ids(self) -> Tensor:
        """[b, s] the ids before masking."""
        return torch.where(self.labels != IGNORE_INDEX, self.labels, self.input_ids)


class MLMCollator:
    """Pad examples and mask them: dynamic masking (RoBERTa: a fresh mask every epoch) by default,
    static masking (one fixed mask per example, from a per-example seed) with ``static=True``.

    Examples are `pairs.PairExample`s or mappings with ``input_ids`` (and optionally ``token_type_ids``,
    ``label`` and ``index``; static masking needs ``index``; entity / phrase masking needs ``mentions``,
    a mapping from the strategy to one mention code per token).

    Dynamic masks come from the `generator` passed to the call when there is one: `training.loop.train`
    passes a generator fixed by (epoch, step, micro-batch, rank), so masks change every epoch and a
    resumed run masks as the first one did. Without it, they come from the collator's own generator,
    reseeded by `set_epoch(epoch)`; then they depend on the order of calls (keep ``num_workers=0``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: MaskingConfig | None = None,
        seed: int = 0,
        static: bool = False,
    ):
        self.tokenizer = tokenizer
        self.config = config or MaskingConfig()
        self.seed = seed
        self.static = static
        self._continuation = continuation_table(tokenizer)
        self._never = torch.tensor(never_mask_ids(tokenizer))
        self._exclude = reserved_ids(tokenizer)
        self.epoch = 0
        self._generator = torch.Generator().manual_seed(derive_seed(seed, "epoch", 0))

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: dynamic masks from here on are drawn from a generator seeded by it."""
        self.epoch = epoch
        self._generator = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))

    def __call__(self, examples: Sequence[Any], generator: torch.Generator | None = None) -> MLMBatch:
        """Pad and mask `examples`; dynamic masks are drawn from `generator` when given."""
        if not examples:
            raise MaskingError("cannot collate an empty list of examples.")
        ids, types, attn, labels, indices = self._pad(examples)
        mentions = self._mentions(examples, ids.shape)
        if self.static:
            masked = self._mask_static(ids, attn, indices, mentions)
        else:
            masked = self._mask(ids, attn, generator if generator is not None else self._generator, mentions)
        return MLMBatch(
            masked.input_ids, types, attn, masked.labels, masked.kind, masked.unit_ids,
            next_sentence_label=labels, indices=indices,
        )

    def _mentions(self, examples: Sequence[Any], shape: torch.Size) -> Tensor | None:
        """[b, s] mention codes of the strategy's tag set (entity / phrase), padded with MENTION_O; None for
        the strategies that need none. A clear error when an example carries no tags."""
        strategy = self.config.strategy
        if strategy not in TAGGED_STRATEGIES:
            return None
        out = torch.zeros(shape, dtype=torch.long)
        for row, e in enumerate(examples):
            codes = (_field(e, "mentions", None) or {}).get(strategy)
            if codes is None:
                raise MaskingError(tagged_text_needed(strategy))
            out[row, : len(codes)] = torch.as_tensor(codes, dtype=torch.long)
        return out

    def _mask_static(self, ids: Tensor, attn: Tensor, indices: list[int | None],
                     mentions: Tensor | None = None) -> MaskedTokens:
        """Mask each example alone, unpadded, with a generator seeded by its index: the mask never
        depends on the batch or epoch it lands in."""
        if any(i is None for i in indices):
            raise MaskingError("static masking needs each example's 'index' (its position in the data set).")
        out = MaskedTokens(ids.clone(), torch.full_like(ids, IGNORE_INDEX),
                           torch.zeros(ids.shape, dtype=torch.int8), torch.full_like(ids, -1))
        for row, index in enumerate(indices):
            n = int(attn[row].sum())
            g = torch.Generator().manual_seed(derive_seed(self.seed, "static", index))
            one = self._mask(ids[row : row + 1, :n], attn[row : row + 1, :n], g,
                             None if mentions is None else mentions[row : row + 1, :n])
            for name in ("input_ids", "labels", "kind", "unit_ids"):
                getattr(out, name)[row, :n] = getattr(one, name)[0]
        return out

    def _mask(self, ids: Tensor, attn: Tensor, g: torch.Generator, mentions: Tensor | None = None) -> MaskedTokens:
        return mask_tokens(
            ids,
            torch.isin(ids, self._never),
            self.tokenizer.vocab_size,
            self.tokenizer.mask_token_id,
            g,
            word_starts=word_starts_from_ids(ids.clamp(0, self.tokenizer.vocab_size - 1), self._continuation),
            attention_mask=attn,
            exclude_from_random=self._exclude,
            mentions=mentions,
            **asdict(self.config),
        )

    def _pad(self, examples: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor | None, list[int | None]]:
        ids, types, attn = pad_inputs([list(_field(e, "input_ids")) for e in examples],  # [b, s] each
                                      [_field(e, "token_type_ids", None) for e in examples],
                                      self.tokenizer.pad_token_id)
        raw_labels = [_field(e, "label", None) for e in examples]
        labels = None if any(lab is None for lab in raw_labels) else torch.tensor(raw_labels, dtype=torch.long)
        indices = [_field(e, "index", None) for e in examples]
        return ids, types, attn, labels, indices


def _field(example: Any, name: str, *default: Any) -> Any:
    if isinstance(example, Mapping):
        if name in example:
            return example[name]
    elif hasattr(example, name):
        return getattr(example, name)
    if default:
        return default[0]
    raise MaskingError(f"an example has no {name!r}: give mappings or objects with input_ids (and token_type_ids).")
