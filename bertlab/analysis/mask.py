"""Masked-word prediction: what the MLM head guesses for a [MASK], and how predictable each word is.

Words are the tokenizer's words (`Encoding.word_ids`): "don't" is three words (don ' t),
"playing." is two (playing .), and a word may be split into several WordPiece pieces
("tokenization" -> token ##ization). `text_words(tok, text)` lists them with their indices.

Probabilities are a softmax over the whole vocabulary; the top-k lists and the ranks only
count ordinary tokens: never the special ones ([CLS], [SEP], [PAD], [UNK], [MASK]) nor
placeholders such as [unused17]. All [MASK]s in one text
are predicted at once, each independently of the others' guesses (as in BERT's training).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from bertlab.analysis import normalise_masks, require_context
from bertlab.inputs import InputError, require_text
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tokenizer import Encoding, Tokenizer, join_wordpieces

# tokenizer -> {(vocab, device): [vocab] bool}: `_ordinary`'s masks, dropped with their tokenizer
_ORDINARY: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, str], torch.Tensor]] = weakref.WeakKeyDictionary()
Progress = Callable[[int, int], None]  # (words done, words in all)


@dataclass
class Candidate:
    """One guess for a masked position."""

    token: str
    token_id: int
    probability: float  # softmax over the whole vocabulary, 0..1


@dataclass
class MaskPrediction:
    """The model's guesses for one [MASK]."""

    position: int  # index of the [MASK] in `tokens`
    word_index: int | None  # the word of the text it stands in (see `text_words`)
    candidates: list[Candidate]  # top-k ordinary tokens, most probable first
    tokens: list[str]  # the input as the model read it, [MASK]s in place
    original_token: str | None = None  # the piece that was masked; None for a [MASK] typed in the text
    original_id: int | None = None
    original_probability: float | None = None  # its probability at this position
    original_rank: int | None = None  # 1 + ordinary tokens more probable than it (1 = top guess)
    piece: int = 0  # which piece of its word this is (0 = first), for words masked whole
    warning: str | None = None  # set when a long text was cut to fit the model
    next_word: bool = False  # a left-to-right model's guess for the token after `tokens` (no [MASK] in them)

    @property
    def top(self) -> Candidate:
        return self.candidates[0]

    @property
    def label(self) -> str:
        """A short name for titles: the masked piece, the position of a typed [MASK], or the next word's."""
        if self.next_word:
            return f"the token after '{self.tokens[self.position]}' (token {self.position + 1})"
        if self.original_token is not None:
            return f"'{self.original_token}' (token {self.position})"
        return f"{self.tokens[self.position]} at token {self.position}"  # the tokenizer's mask token


@dataclass
class WordScore:
    """How predictable one word is when all of its pieces are masked (and nothing else).

    A word the vocabulary lacks (it reads as [UNK]) or a special token typed in the text ([CLS],
    [SEP]) is not scored: `skipped` says why ("unknown", "special"), its lists are empty and its
    log-probability is NaN."""

    word_index: int
    word: str  # the word as written in the text
    pieces: list[str]  # its WordPiece pieces
    piece_probabilities: list[float]  # each piece's probability at its (masked) position
    piece_ranks: list[int]  # each piece's rank there (1 = top guess)
    guess_pieces: list[str]  # the top ordinary guess at each masked position
    log_probability: float  # sum of the pieces' natural-log probabilities (NaN when skipped)
    warning: str | None = None  # set when a long text was cut to fit the model
    skipped: str | None = None  # why the word was not scored: "unknown" ([UNK]) or "special" ([CLS], ...)
    joined_guess: str | None = None  # the guess as one word, joined by the tokenizer

    @property
    def scored(self) -> bool:
        return self.skipped is None

    @property
    def probability(self) -> float:
        """Product of the pieces' probabilities: the word's probability if the pieces were
        guessed independently (exactly the model's probability for a one-piece word)."""
        return math.exp(self.log_probability)

    @property
    def rank(self) -> int | None:
        """The worst of the pieces' ranks: 1 means every piece was the model's top guess (None when skipped)."""
        return max(self.piece_ranks) if self.piece_ranks else None

    @property
    def guess(self) -> str:
        """The top guesses joined as a word ("play" + "##ing" -> "playing")."""
        return self.joined_guess if self.joined_guess is not None else join_pieces(self.guess_pieces)

    @property
    def correct(self) -> bool:
        return self.scored and self.guess_pieces == self.pieces


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def text_words(tok: Tokenizer, text: str) -> list[str]:
    """The words of `text` as the tokenizer splits them, in order: index i is word i."""
    text = normalise_masks(require_text(text), tok)
    enc = tok.encode(text)
    return [_word_text(text, enc, start, end) for _, start, end in enc.word_spans()]


def fill_mask(
    model: torch.nn.Module,
    tok: Tokenizer,
    text: str,
    k: int = 5,
    masked_words: Sequence[int] | None = None,
    whole_word: bool = False,
) -> list[MaskPrediction]:
    """The top-`k` guesses for every [MASK] in `text`, in token order.

    The text may hold [MASK]s (any case: "[mask]" works too), and/or `masked_words` names
    words to hide (indices as in `text_words`). A chosen word split into several pieces has
    only its first piece masked (the model still sees the rest, which helps it), or every
    piece when `whole_word` is True (then each piece gets its own prediction). For a chosen
    word, the prediction also gives the true piece's probability and rank.
    Raises MissingHeadError without an MLM head, InputError for text it cannot use.
    """
    model.require("mlm")
    if k < 1:
        raise InputError(f"k is the number of guesses to show: use 1 or more, not {k}.")
    text, enc = _encode(model, tok, text)
    mask_at = _mask_positions(enc, _check_words(masked_words or [], _spans(enc), enc), whole_word, tok)
    if not mask_at and enc.truncated and tok.mask_token in text:
        raise InputError(
            f"The {tok.mask_token} is in the part of the text that was cut: the model reads {len(enc)} tokens "
            f"at most. Shorten the text or put the {tok.mask_token} earlier."
        )
    if not mask_at:
        raise InputError(
            f"There is nothing to guess: put {tok.mask_token} where a word should go "
            f"(e.g. 'The cat sat on the {tok.mask_token}.'), or choose a word to hide."
        )
    require_context(enc, set(mask_at), tok)
    positions = sorted(mask_at)
    ids = _with_masks(enc.ids, positions, tok)
    logp = _masked_log_probs(model, [ids], enc.type_ids, [positions])  # [n, vocab]
    ordinary = _ordinary(tok, logp.shape[-1], logp.device)  # [vocab]
    tokens = tok.convert_ids_to_tokens(ids)
    out = []
    for row, p in enumerate(positions):
        word, piece = mask_at[p]
        pred = MaskPrediction(
            position=p, word_index=word, piece=piece, tokens=tokens, warning=enc.warning,
            candidates=_top_k(logp[row], ordinary, k, tok),
        )
        if enc.ids[p] != tok.mask_token_id:  # a word the caller chose: say how the true piece fared
            _add_original(pred, enc.ids[p], enc.tokens[p], logp[row], ordinary)
        out.append(pred)
    return out


def next_word(model: torch.nn.Module, tok: Tokenizer, text: str, k: int = 5) -> MaskPrediction:
    """A left-to-right model's top-`k` guesses for the token that follows `text` (read with its LM head at the
    last token, which sees the whole text: every token before it). `position` is that last token's index.
    Raises MissingHeadError without an LM head, InputError for text it cannot use."""
    model.require("lm")
    if k < 1:
        raise InputError(f"k is the number of guesses to show: use 1 or more, not {k}.")
    enc = tok.encode(require_text(text), max_length=input_limit(model, tok))
    if not enc.ids:
        raise InputError("The text has no words the tokenizer can read: type a sentence.")
    device = model_device(model)
    with eval_mode(model), torch.inference_mode():
        last = model(torch.tensor([enc.ids], device=device)).last_hidden_state[0, -1]  # [d_model]
        logp = model.next_token_logits(last).float().log_softmax(dim=-1)  # [vocab]
    candidates = _top_k(logp, _ordinary(tok, logp.shape[-1], logp.device), k, tok)
    return MaskPrediction(position=len(enc) - 1, word_index=None, candidates=candidates, tokens=list(enc.tokens),
                          warning=enc.warning, next_word=True)


def mask_each_word(
    model: torch.nn.Module,
    tok: Tokenizer,
    text: str,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> list[WordScore]:
    """Hide each word of `text` in turn (all of its pieces, nothing else) and score how well
    the model guesses it back: one WordScore per word, in order.

    One input row per word, `batch_size` rows per forward pass. A multi-piece word's
    probability is the product of its pieces' probabilities, each read with all of the
    word's pieces masked (an independence approximation; a one-piece word's is exact).
    [MASK]s typed in the text stay masked in every row and are left out. Words the vocabulary lacks
    ([UNK]) and special tokens typed in the text ([CLS], [SEP]) are not hidden nor scored: they come
    back in their place as WordScores with `skipped` set.
    `progress(done, total)` is called after each batch (total = the words scored).
    """
    model.require("mlm")
    if batch_size < 1:
        raise InputError(f"batch_size must be 1 or more, not {batch_size}.")
    text, enc = _encode(model, tok, text)
    spans = _spans(enc)
    kinds = [_word_kind(enc.ids[s:e], tok) for s, e in spans]  # None = a word to score
    shown = [w for w, kind in enumerate(kinds) if kind != "mask"]
    words = [w for w in shown if kinds[w] is None]
    if not shown:
        raise InputError(f"The text is only {tok.mask_token}s: there is no word to score. Type a sentence.")
    if len(shown) == 1:
        raise InputError(
            "The text has a single word: hiding it leaves the model nothing to guess from. "
            "Type a sentence of two or more words."
        )
    if not words:
        raise InputError(
            f"No word here can be scored: each is either not in this model's vocabulary (it reads as "
            f"{tok.id_to_token(tok.unk_token_id)}) or a special token typed in the text. Type ordinary words."
        )
    ordinary = _ordinary(tok, model.config.vocab_size, model_device(model))  # [vocab]
    scored: dict[int, WordScore] = {}
    for first in range(0, len(words), batch_size):
        chunk = words[first : first + batch_size]
        positions = [list(range(*spans[w])) for w in chunk]  # the pieces hidden in each row
        rows = [_with_masks(enc.ids, pos, tok) for pos in positions]
        logp = _masked_log_probs(model, rows, enc.type_ids, positions)  # [pieces in chunk, vocab]
        per_word = logp.split([len(pos) for pos in positions])  # each [pieces of the word, vocab]
        for w, pos, lp in zip(chunk, positions, per_word):
            scored[w] = _word_score(w, pos, lp, enc, text, ordinary, tok)
        if progress is not None:
            progress(first + len(chunk), len(words))
    return [scored[w] if w in scored else _skipped(w, spans[w], enc, text, kinds[w]) for w in shown]


def join_pieces(pieces: Sequence[str], tok: Tokenizer | None = None) -> str:
    """Pieces of one word back into it, as `tok` joins them (without one, WordPiece's rule):
    ["play", "##ing"] -> "playing"."""
    return tok.join_pieces(pieces) if tok is not None else join_wordpieces(pieces)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _encode(model: torch.nn.Module, tok: Tokenizer, text: str) -> tuple[str, Encoding]:
    """(text with [MASK]s spelled as the tokenizer expects, its encoding), cut to what the
    model reads with the tokenizer's warning. The encoding's offsets point into that text."""
    text = normalise_masks(require_text(text), tok)
    enc = tok.encode(text, max_length=input_limit(model, tok))
    if not enc.word_spans():
        raise InputError("The text has no words the tokenizer can read: type a sentence.")
    return text, enc


def _spans(enc: Encoding) -> list[tuple[int, int]]:
    """(first token, end token) of each word, word index = list index."""
    return [(start, end) for _, start, end in enc.word_spans()]


def _mask_positions(
    enc: Encoding, chosen: list[int], whole_word: bool, tok: Tokenizer
) -> dict[int, tuple[int | None, int]]:
    """{token position to hide: (word index, piece within the word)}: the [MASK]s typed in the
    text, then the first piece (or, `whole_word`, every piece) of each chosen word."""
    mask_at: dict[int, tuple[int | None, int]] = {
        p: (enc.word_ids[p], 0) for p, i in enumerate(enc.ids) if i == tok.mask_token_id
    }
    spans = _spans(enc)
    for w in chosen:
        start, end = spans[w]
        for piece, p in enumerate(range(start, end if whole_word else start + 1)):
            mask_at.setdefault(p, (w, piece))
    return mask_at


def _with_masks(ids: Sequence[int], positions: Sequence[int], tok: Tokenizer) -> list[int]:
    """A copy of `ids` with [MASK] at `positions`."""
    out = list(ids)
    for p in positions:
        out[p] = tok.mask_token_id
    return out


def _check_words(words: Sequence[int], spans: list[tuple[int, int]], enc: Encoding) -> list[int]:
    out = []
    for w in words:
        if isinstance(w, bool) or not isinstance(w, int):
            raise InputError(f"Words to hide are given by their index (0, 1, 2, ...), not {w!r}.")
        if not 0 <= w < len(spans):
            cut = " (the end of the text was cut to fit the model)" if enc.truncated else ""
            raise InputError(
                f"There is no word {w}: the text has {len(spans)} words, numbered 0 to {len(spans) - 1}{cut}."
            )
        if w not in out:
            out.append(w)
    return out


def _word_kind(ids: Sequence[int], tok: Tokenizer) -> str | None:
    """Why a word (its piece ids) is not scored: "mask" (typed), "unknown" ([UNK]), "special"
    (e.g. [CLS] typed in the text); None for an ordinary word."""
    if tok.mask_token_id in ids:
        return "mask"
    if tok.unk_token_id in ids:
        return "unknown"
    if any(i in tok.special_ids for i in ids):
        return "special"
    return None


def _skipped(w: int, span: tuple[int, int], enc: Encoding, text: str, kind: str | None) -> WordScore:
    """The WordScore of a word that is not scored (`kind`: "unknown" or "special")."""
    start, end = span
    return WordScore(
        word_index=w, word=_word_text(text, enc, start, end), pieces=enc.tokens[start:end],
        piece_probabilities=[], piece_ranks=[], guess_pieces=[], log_probability=math.nan,
        warning=enc.warning, skipped=kind,
    )


def _word_text(text: str, enc: Encoding, start: int, end: int) -> str:
    return text[enc.offsets[start][0] : enc.offsets[end - 1][1]]


def _masked_log_probs(
    model: torch.nn.Module,
    rows: list[list[int]],
    type_ids: list[int],
    positions: list[list[int]],
) -> torch.Tensor:
    """Log-softmax of the MLM logits at the given positions of each row: [n, vocab], in row order,
    positions ascending within a row (the order of `mlm_positions`)."""
    device = model_device(model)
    input_ids = torch.tensor(rows, device=device)  # [rows, seq]
    token_type_ids = torch.tensor([type_ids] * len(rows), device=device)  # [rows, seq]
    where = torch.zeros_like(input_ids, dtype=torch.bool)  # [rows, seq]
    for r, pos in enumerate(positions):
        where[r, pos] = True
    with eval_mode(model), torch.inference_mode():
        out = model(input_ids, token_type_ids=token_type_ids, mlm_positions=where)
    return out.mlm_logits.float().log_softmax(dim=-1)  # [n, vocab]


def _ordinary(tok: Tokenizer, vocab: int, device: torch.device) -> torch.Tensor:
    """[vocab] bool: True for tokens that may be guessed: not special ([CLS], [MASK], ...)
    and not a placeholder such as [unused17]. Built once per (tokenizer, vocab, device); do not
    modify the returned tensor."""
    per_tok = _ORDINARY.setdefault(tok, {})
    key = (vocab, str(device))
    if key not in per_tok:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[: tok.vocab_size] = True  # ids past the tokenizer's vocabulary (padded embeddings) have no text
        keep[[i for i in tok.placeholder_ids if i < vocab]] = False
        per_tok[key] = keep.to(device)
    return per_tok[key]


def _top_k(logp: torch.Tensor, ordinary: torch.Tensor, k: int, tok: Tokenizer) -> list[Candidate]:
    """logp: [vocab] -> the k most probable ordinary tokens."""
    k = min(k, int(ordinary.sum()))
    values, ids = logp.masked_fill(~ordinary, -math.inf).topk(k)
    return [
        Candidate(token=tok.id_to_token(int(i)), token_id=int(i), probability=float(v.exp()))
        for v, i in zip(values, ids)
    ]


def _add_original(
    pred: MaskPrediction, true_id: int, true_token: str, logp: torch.Tensor, ordinary: torch.Tensor
) -> None:
    """Fill in how the hidden piece fared at this position (logp: [vocab])."""
    pred.original_id, pred.original_token = true_id, true_token
    pred.original_probability = float(logp[true_id].exp())
    pred.original_rank = _rank(logp, true_id, ordinary)


def _rank(logp: torch.Tensor, token_id: int, ordinary: torch.Tensor) -> int:
    """1 + the number of ordinary tokens strictly more probable than `token_id` (logp: [vocab])."""
    return 1 + int(((logp > logp[token_id]) & ordinary).sum())


def _word_score(
    w: int,
    positions: list[int],
    logp: torch.Tensor,  # [pieces, vocab]
    enc: Encoding,
    text: str,
    ordinary: torch.Tensor,
    tok: Tokenizer,
) -> WordScore:
    true_ids = [enc.ids[p] for p in positions]
    piece_logp = [float(logp[j, t]) for j, t in enumerate(true_ids)]
    guesses = logp.masked_fill(~ordinary, -math.inf).argmax(dim=-1)  # [pieces]
    return WordScore(
        word_index=w,
        word=_word_text(text, enc, positions[0], positions[-1] + 1),
        pieces=[enc.tokens[p] for p in positions],
        piece_probabilities=[math.exp(v) for v in piece_logp],
        piece_ranks=[_rank(logp[j], t, ordinary) for j, t in enumerate(true_ids)],
        guess_pieces=tok.convert_ids_to_tokens(guesses.tolist()),
        log_probability=sum(piece_logp),
        warning=enc.warning,
        joined_guess=tok.join_pieces(tok.convert_ids_to_tokens(guesses.tolist())),
    )


def first_words(tok: Tokenizer, text: str, n: int) -> tuple[str, bool]:
    """(`text` cut after its first `n` words, whether it was cut)."""
    if not text.strip():
        return text, False
    enc = tok.encode(text)
    spans = enc.word_spans()
    if len(spans) <= n:
        return text, False
    return text[: enc.offsets[spans[n - 1][2] - 1][1]], True


def read_words(model: torch.nn.Module, tok: Tokenizer, text: str) -> tuple[list[str], str | None, bool]:
    """The words of `text` as the Mask tab offers them for hiding (`text_words`; none for a blank or unusable
    text: `fill_mask` says why), the input's warning, and whether the model reads only part of the text."""
    try:
        words = text_words(tok, text) if text.strip() else []
    except InputError:
        return [], None, False
    if not words:
        return [], None, False
    enc = tok.encode(text, max_length=input_limit(model, tok))
    return words, enc.warning, enc.truncated


def next_word_at(model: torch.nn.Module, tok: Tokenizer, text: str, position: int, k: int = 5) -> MaskPrediction:
    """A left-to-right model's top-`k` guesses for token `position` of `text`, read with its LM head at
    token `position - 1`. The whole text goes in, as in training: the causal mask alone keeps the tokens
    from `position` on out of sight. `original_*` say how the true token fared.
    Raises MissingHeadError without an LM head, InputError for a position with nothing to its left."""
    model.require("lm")
    if k < 1:
        raise InputError(f"k is the number of guesses to show: use 1 or more, not {k}.")
    enc = tok.encode(require_text(text), max_length=input_limit(model, tok))
    if not 0 < position < len(enc):
        raise InputError(f"Token {position + 1} has no tokens to its left in this model's reading (it reads "
                         f"{len(enc)} tokens): a left-to-right model guesses a token from the ones before it.")
    device = model_device(model)
    with eval_mode(model), torch.inference_mode():
        before = model(torch.tensor([enc.ids], device=device)).last_hidden_state[0, position - 1]  # [d_model]
        logp = model.next_token_logits(before).float().log_softmax(dim=-1)  # [vocab]
    ordinary = _ordinary(tok, logp.shape[-1], logp.device)
    pred = MaskPrediction(position=position - 1, word_index=None, candidates=_top_k(logp, ordinary, k, tok),
                          tokens=list(enc.tokens), warning=enc.warning, next_word=True)
    _add_original(pred, enc.ids[position], enc.tokens[position], logp, ordinary)
    return pred
