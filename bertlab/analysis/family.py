"""The family side by side: one sentence through several models (BERT, RoBERTa, ALBERT, DistilBERT,
ELECTRA), each with its own tokenizer, heads and pre-training objective.

- `word_choices(text)`: the words a student may hide, by character span (the same for every tokenizer);
- `token_cut(model, tok, text)`: how the model's tokenizer cuts the text, each piece readable;
- `masked_word(model, tok, text, span, k)`: the model's top-k for that word, every piece of it masked;
- `parameter_count(model)`: the parameters and where they sit (embeddings, projection, layers, heads);
- `objective_of(model)`: the pre-training objective of the model's family, in words;
- `pair_scores(model, tok, text)`: NSP / SOP on the sentence's halves, in order and swapped;
- `electra_pair(generator, ..., discriminator, ...)`: the ELECTRA picture on the sentence: masked
  pieces, the generator's sampled replacements, the discriminator's P(replaced) per token.

Everything speaks the family protocol (`model.family`): no family's names or special tokens here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from bertlab import masks
from bertlab.analysis.attention import attention_windows
from bertlab.analysis.mask import MaskPrediction, fill_mask
from bertlab.analysis.nsp import next_sentence
from bertlab.analysis.replaced import ReplacedTokens, replaced_tokens
from bertlab.inputs import InputError, echo, require_text
from bertlab.runtime import eval_mode, input_limit, max_tokens, model_device
from bertlab.tokenizer import WORD_START_MARK, Encoding, Tokenizer

MAX_CHARS = 300  # the tab compares one sentence (or two): longer text is refused, not cut
KIND_NAMES = {"wordpiece": "WordPiece", "bpe": "byte-level BPE", "unigram": "SentencePiece (Unigram)"}
KIND_NOTES = {
    "wordpiece": "splits words into the longest pieces its vocabulary has; a piece that continues a word "
                 "starts with {prefix}",
    "bpe": "merges frequent byte pairs; it reads bytes, so any character is some pieces; a piece that starts "
           f"a word after a space is shown with {WORD_START_MARK} (its vocabulary spells the space Ġ)",
    "unigram": "keeps the most probable split of each word under a unigram model; a piece that starts a word "
               f"is shown with {WORD_START_MARK} (its vocabulary spells the space ▁)",
}
_WORD = re.compile(r"\w+(?:['’]\w+)*")


# ---------------------------------------------------------------------------------------------
# The sentence and the word to hide
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordChoice:
    """A word of the sentence by its characters: the same word for every tokenizer."""

    index: int
    text: str
    start: int  # character span in the sentence
    end: int


def check_sentence(text: str | None) -> str:
    """The text, or an InputError when it is empty or longer than the tab compares."""
    text = require_text(text, "sentence")
    if len(text) > MAX_CHARS:
        raise InputError(
            f"The sentence is {len(text):,} characters long: the Family tab compares one or two sentences "
            f"(at most {MAX_CHARS} characters). Shorten {echo(text)}."
        )
    return text


def word_choices(text: str) -> list[WordChoice]:
    """The words of `text` (letters and digits, with inner apostrophes), in order."""
    text = check_sentence(text)
    words = [WordChoice(i, m.group(0), m.start(), m.end()) for i, m in enumerate(_WORD.finditer(text))]
    if not words:
        raise InputError(f"{echo(text)} has no words (letters or digits): type a sentence.")
    return words


def default_word(words: Sequence[WordChoice]) -> WordChoice:
    """A sensible word to hide first: the last word of three or more letters (else the last word)."""
    long = [w for w in words if len(w.text) >= 3 and not w.text.isdigit()]
    return (long or list(words))[-1]


def halves(text: str) -> tuple[str, str]:
    """(A, B): the text cut at its last sentence end before the end, else at the middle word."""
    text = check_sentence(text).strip()
    ends = [m.end() for m in re.finditer(r"[.!?。！？]+\s+", text) if m.end() < len(text)]
    if ends:
        cut = ends[len(ends) // 2]
        return text[:cut].strip(), text[cut:].strip()
    words = list(re.finditer(r"\S+", text))
    if len(words) < 2:
        raise InputError("Sentence pairs need two or more words: type a longer sentence.")
    cut = words[len(words) // 2].start()
    return text[:cut].strip(), text[cut:].strip()


# ---------------------------------------------------------------------------------------------
# How each tokenizer cuts it
# ---------------------------------------------------------------------------------------------
@dataclass
class Piece:
    """One token as the model reads it."""

    token: str  # as the vocabulary holds it ("Ġfox", "▁the", "##ing", "[CLS]")
    label: str  # readable: the vocabulary's spelling, or the characters it stands for (byte pieces)
    text: str  # the characters of the sentence it covers ("" for a special token)
    word: int | None  # the tokenizer's word index (None for special tokens)
    starts_word: bool
    special: bool
    span: tuple[int, int] = (0, 0)  # characters of the sentence it covers


@dataclass
class TokenCut:
    """How one model's tokenizer cuts the sentence."""

    kind: str  # "wordpiece", "bpe" or "unigram" (from the family)
    pieces: list[Piece]
    text: str  # the sentence
    warning: str | None = None  # set when the model cannot read it all

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, self.kind)

    @property
    def num_tokens(self) -> int:
        return len(self.pieces)

    @property
    def split_words(self) -> list[tuple[str, list[str]]]:
        """(word as written, its pieces' labels) for each word cut into two or more pieces."""
        out: dict[int, list[Piece]] = {}
        for p in self.pieces:
            if p.word is not None:
                out.setdefault(p.word, []).append(p)
        return [(self.text[min(q.span[0] for q in ps):max(q.span[1] for q in ps)], [q.label for q in ps])
                for ps in out.values() if len(ps) > 1]


def kind_note(kind: str, tok: Tokenizer) -> str:
    """One sentence on how a tokenizer of `kind` cuts words."""
    return KIND_NOTES.get(kind, "").format(prefix=tok.continuing_prefix or "")


def token_cut(model: torch.nn.Module, tok: Tokenizer, text: str) -> TokenCut:
    """How `model`'s tokenizer cuts `text`: every piece with a readable label (byte-level pieces that
    stand for part of a character show that character and which byte of it they are)."""
    text = check_sentence(text)
    enc = _encode(model, tok, text)
    starts = model.family.word_starts(enc.word_ids)
    pieces: list[Piece] = []
    for i, (token, tid) in enumerate(zip(enc.tokens, enc.ids)):
        special = bool(enc.special_tokens_mask[i]) and enc.word_ids[i] is None
        a, b = enc.offsets[i]
        covered = "" if special else text[a:b]
        pieces.append(Piece(token, token if special else _readable(tok, token, tid, covered, enc, i), covered,
                            enc.word_ids[i], starts[i], special, (a, b)))
    return TokenCut(model.family.tokenizer_kind, pieces, text, enc.warning)


def _readable(tok: Tokenizer, token: str, tid: int, covered: str, enc: Encoding, i: int) -> str:
    """The piece as the Input tab shows it (`Tokenizer.readable_pieces`: bytes decoded, word starts as
    WORD_START_MARK); a piece holding part of a character's bytes: "😀 (byte piece 1/4)"."""
    if "\ufffd" in tok.decode([tid], skip_special_tokens=False):  # part of a character's bytes
        same = [j for j, o in enumerate(enc.offsets) if o == enc.offsets[i] and enc.word_ids[j] is not None
                and "\ufffd" in tok.decode([enc.ids[j]], skip_special_tokens=False)]
        if len(same) > 1 and covered:
            return f"{covered} (byte piece {same.index(i) + 1}/{len(same)})"
        return covered or token
    return tok.readable_pieces([token])[0]


# ---------------------------------------------------------------------------------------------
# The same masked word in each model
# ---------------------------------------------------------------------------------------------
@dataclass
class MaskedWord:
    """One model's guesses for the hidden word: every piece of it masked, one prediction per piece."""

    word: str  # the word the student chose, as written
    pieces: list[str]  # the pieces masked, as the vocabulary holds them
    labels: list[str]  # the same, readable
    predictions: list[MaskPrediction]  # one per masked piece, in order
    mask_token: str
    guess_labels: list[list[str]]  # each prediction's candidates, readable
    warning: str | None = None

    @property
    def first(self) -> MaskPrediction:
        return self.predictions[0]

    @property
    def rank(self) -> int | None:
        """Rank of the word's true first piece among the first position's guesses (1 = top)."""
        return self.first.original_rank

    @property
    def probability(self) -> float | None:
        return self.first.original_probability

    @property
    def joined_guess(self) -> list[str]:
        """Top guess at each masked piece."""
        return [labels[0] for labels in self.guess_labels]


def masked_word(model: torch.nn.Module, tok: Tokenizer, text: str, word: WordChoice, k: int = 5) -> MaskedWord:
    """Hide `word` (every piece of every tokenizer word it touches) behind this tokenizer's mask token
    and return the model's top-`k` per piece. MissingHeadError without an MLM head."""
    model.require("mlm")
    text = check_sentence(text)
    if text[word.start:word.end] != word.text:
        raise InputError(f"The word {echo(word.text)} is not in the sentence any more: choose a word again.")
    enc = _encode(model, tok, text)
    chosen = []
    for w, (_, first, end) in enumerate(enc.word_spans()):
        a, b = enc.offsets[first][0], enc.offsets[end - 1][1]
        if a < word.end and b > word.start:
            chosen.append(w)
    if not chosen:
        cut = " (the model cannot read that far: the text was cut)" if enc.truncated else ""
        raise InputError(f"This tokenizer has no piece for {echo(word.text)}{cut}: choose another word.")
    preds = fill_mask(model, tok, text, k=k, masked_words=chosen, whole_word=True)
    preds = [p for p in preds if p.original_token is not None]  # [MASK]s typed in the text are left out
    pieces = [p.original_token for p in preds]
    labels = [_readable(tok, p.original_token, p.original_id, "", enc, p.position) for p in preds]
    guesses = [[readable_candidate(tok, c.token, c.token_id) for c in p.candidates] for p in preds]
    return MaskedWord(word.text, pieces, labels, preds, tok.mask_token, guesses, enc.warning)


def readable_candidate(tok: Tokenizer, token: str, token_id: int) -> str:
    """A guessed piece as a student reads it (as the Input tab shows pieces)."""
    return tok.readable_pieces([token])[0]


# ---------------------------------------------------------------------------------------------
# Parameters and where they sit
# ---------------------------------------------------------------------------------------------
PARTS = ("word embeddings", "position + segment embeddings", "embedding projection", "norms outside the layers",
         "relative-position embeddings", "convolution beside the first layer", "encoder layers", "pooler",
         "pre-training heads", "task head")


@dataclass
class ParameterCount:
    """Where a model's parameters sit (each counted once: tied weights are not counted twice)."""

    parts: dict[str, int]  # PARTS -> count (all keys present)
    layers: int  # logical depth
    stored_layers: int  # distinct layers' weights (ALBERT: 1 shared layer used `layers` times)
    hidden_size: int
    embedding_size: int  # the word embeddings' width (ALBERT, ELECTRA: smaller than hidden_size)
    vocab_size: int

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def shared(self) -> bool:
        return self.stored_layers < self.layers

    @property
    def factorised(self) -> bool:
        return self.embedding_size != self.hidden_size

    @property
    def per_layer(self) -> int:
        return self.parts["encoder layers"] // max(self.stored_layers, 1)

    @property
    def unshared_encoder(self) -> int:
        """What the encoder would hold with a separate layer at every depth."""
        return self.per_layer * self.layers

    @property
    def unfactorised_embeddings(self) -> int:
        """What the word embeddings would hold at the full width (vocabulary × hidden size)."""
        return self.vocab_size * self.hidden_size


def parameter_count(model: torch.nn.Module) -> ParameterCount:
    """Count `model`'s parameters by where they sit, through the family protocol: the parts a family
    names itself (`Family.parameter_parts`: DeBERTa's relative-position embeddings, ModernBERT's norms
    outside the layers) first, then by embeddings, encoder layers and heads. Rotary positions have no
    parameters, so no part."""
    fam, cfg = model.family, model.config
    emb = fam.embeddings(model)
    word = getattr(emb, "word_embeddings", None)
    word_ids = {id(p) for p in word.parameters()} if word is not None else set()
    emb_ids = {id(p) for p in emb.parameters()}
    width = int(word.weight.shape[1]) if word is not None else cfg.hidden_size
    proj_ids = set()
    if width != cfg.hidden_size:  # a Linear from the embeddings' width to the layers' (factorised embeddings)
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.in_features == width and m.out_features == cfg.hidden_size:
                proj_ids |= {id(p) for p in m.parameters()}
    parts = dict.fromkeys(PARTS, 0)
    layer_seen: set[int] = set()
    prefix = fam.prefix + "."
    pooler = fam.pooler_prefix
    named = fam.family.parameter_parts  # the family's own parts first
    unknown = sorted({part for _, part in named} - set(PARTS))
    if unknown:
        raise ValueError(f"the {fam.title} family names parameter parts {unknown} that the Family tab does not "
                         f"draw; the parts are {', '.join(PARTS)}.")
    for name, p in model.named_parameters():  # tied weights come once
        n = p.numel()
        own = next((part for start, part in named if name.startswith(start)), None)
        if own is not None:
            part = own
        elif id(p) in word_ids:
            part = "word embeddings"
        elif id(p) in emb_ids:
            part = "position + segment embeddings"
        elif id(p) in proj_ids and name.startswith(prefix):
            part = "embedding projection"
        elif pooler is not None and name.startswith(pooler):
            part = "pooler"
        elif name.startswith(prefix):
            part = "encoder layers"
            layer = fam.layer_of(name)
            if layer is not None:
                layer_seen.add(layer)
        elif name.startswith(fam.head_prefixes):
            part = "pre-training heads"
        else:
            part = "task head"
        parts[part] += n
    stored = len(layer_seen) if layer_seen else int(getattr(cfg, "num_hidden_groups", 1) or 1)
    return ParameterCount(parts, fam.num_layers, stored, cfg.hidden_size, width, cfg.vocab_size)


# ---------------------------------------------------------------------------------------------
# Pre-training objectives
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Objective:
    """A model's pre-training objective, in words, and what of it this model can show."""

    name: str  # "MLM + NSP"
    about: str  # one or two sentences
    pair_task: str | None  # "nsp", "sop" or None: the sentence-pair head it has
    role: str  # "mlm", "generator", "discriminator", "encoder" (no pre-training head)
    demo: str  # what the tab shows of it on the sentence: "pair", "dynamic", "rtd", "distil" or ""
    changes: tuple[str, ...] = ()  # what the member changed in the architecture (short phrases)


def objective_of(model: torch.nn.Module) -> Objective:
    """The objective of `model`'s family (its family module says it) and the role this checkpoint plays in it."""
    fam = model.family
    if getattr(model, "has_rtd", False):
        role = "discriminator"
    elif model.has_mlm:
        role = fam.family.mlm_role
    else:
        role = "encoder"
    f = fam.family
    return Objective(f.objective, f.objective_about, fam.pair_task, role, f.objective_demo, f.changes)


@dataclass
class PairScores:
    """A sentence-pair head on the sentence's halves: P(in order / B follows A) both ways round."""

    task: str  # "nsp" or "sop"
    a: str
    b: str
    in_order: float  # P(index 0) for (A, B): NSP's IsNext, SOP's "in order"
    swapped: float  # P(index 0) for (B, A)


def pair_scores(model: torch.nn.Module, tok: Tokenizer, text: str) -> PairScores:
    """NSP (BERT) or SOP (ALBERT) on the halves of `text` (see `halves`), in order and swapped.
    MissingHeadError without a sentence-pair head."""
    model.require("nsp")
    a, b = halves(text)
    task = model.family.pair_task
    ab = next_sentence(model, tok, a, b).is_next_probability
    ba = next_sentence(model, tok, b, a).is_next_probability
    return PairScores(task, a, b, ab, ba)


# ---------------------------------------------------------------------------------------------
# ELECTRA: generator + discriminator on the sentence
# ---------------------------------------------------------------------------------------------
@dataclass
class ElectraPicture:
    """The ELECTRA lecture picture on one sentence; every list has one entry per token."""

    tokens: list[str]  # the original pieces
    masked: list[bool]  # pieces the generator had to fill
    sampled: list[str | None]  # the generator's sample at each masked piece (None elsewhere)
    sample_probability: list[float | None]  # its probability under the generator
    corrupted: list[str]  # what the discriminator read
    replaced: list[bool]  # the truth: sample differs from the original
    p_replaced: list[float]  # the discriminator's sigmoid, per token
    special: list[bool]
    seed: int
    warning: str | None = None

    @property
    def flagged(self) -> list[int]:
        """Positions the discriminator calls replaced (P > 0.5), specials left out."""
        return [i for i, (p, s) in enumerate(zip(self.p_replaced, self.special)) if p > 0.5 and not s]

    @property
    def accuracy(self) -> float:
        """Share of the ordinary pieces the discriminator gets right (replaced or not, at 0.5)."""
        rows = [(p > 0.5) == r for p, r, s in zip(self.p_replaced, self.replaced, self.special) if not s]
        return sum(rows) / max(len(rows), 1)


def electra_pair(generator: torch.nn.Module, gen_tok: Tokenizer, discriminator: torch.nn.Module,
                 disc_tok: Tokenizer, text: str, word: WordChoice | None = None, rate: float = 0.15,
                 seed: int = 0) -> ElectraPicture:
    """Mask the pieces of `word` and a `rate` share of the others (drawn with `seed`), let the generator
    sample a replacement at each from its softmax (special tokens never drawn), and ask the discriminator,
    for every piece of the result, whether it was replaced (as in ELECTRA's pre-training)."""
    discriminator.require("rtd")
    enc = _encode_for_pair(generator, gen_tok, discriminator, disc_tok, text,
                           "The generator and the discriminator must share one vocabulary (an ELECTRA pair is "
                           "trained together): pick the generator that belongs to this discriminator.")
    ordinary = [i for i, w in enumerate(enc.word_ids) if w is not None]
    if not ordinary:
        raise InputError("The sentence has no words the tokenizer can read: type a sentence.")
    g = torch.Generator().manual_seed(seed)
    chosen = set(hidden_positions(enc, word))
    others = [i for i in ordinary if i not in chosen]
    extra = max(0, round(rate * len(ordinary)) - len(chosen)) if chosen else max(1, round(rate * len(ordinary)))
    if extra and others:
        order = torch.randperm(len(others), generator=g)[:extra].tolist()
        chosen |= {others[j] for j in order}
    positions = sorted(chosen)
    ids = list(enc.ids)
    logits = _mlm_logits(generator, gen_tok, ids, positions)  # [masked, vocab], specials at -inf
    probs = logits.softmax(-1)  # [masked, vocab]
    samples = torch.multinomial(probs, 1, generator=g)[:, 0].tolist()  # [masked]
    corrupted = list(ids)
    sampled: list[str | None] = [None] * len(ids)
    sample_p: list[float | None] = [None] * len(ids)
    for row, (pos, s) in enumerate(zip(positions, samples)):
        corrupted[pos] = s
        sampled[pos] = gen_tok.id_to_token(s)
        sample_p[pos] = float(probs[row, s])
    ddev = model_device(discriminator)
    y = torch.tensor([corrupted], device=ddev)  # [1, seq]
    with eval_mode(discriminator), torch.inference_mode():
        rtd = discriminator(y, torch.zeros_like(y), torch.ones_like(y)).rtd_logits[0].float()  # [seq]
    p = torch.sigmoid(rtd).cpu().tolist()
    return ElectraPicture(
        tokens=list(enc.tokens), masked=[i in chosen for i in range(len(ids))], sampled=sampled,
        sample_probability=sample_p, corrupted=gen_tok.convert_ids_to_tokens(corrupted),
        replaced=[c != o for c, o in zip(corrupted, ids)], p_replaced=p,
        special=[w is None for w in enc.word_ids], seed=seed, warning=enc.warning,
    )


# ---------------------------------------------------------------------------------------------
# DistilBERT: distillation on the hidden word
# ---------------------------------------------------------------------------------------------
@dataclass
class Distillation:
    """The distillation loss on one hidden word: how far the student's distribution at its first
    piece is from the teacher's (the soft targets DistilBERT was trained to match)."""

    word: str
    cross_entropy: float  # -sum_v p_teacher(v) log p_student(v), nats (temperature 1)
    kl: float  # KL(teacher || student), nats: the part of the cross-entropy the student could still lose
    teacher_entropy: float  # nats
    teacher_top: list[tuple[str, float]]
    student_top: list[tuple[str, float]]


def _encode_for_pair(a: torch.nn.Module, a_tok: Tokenizer, b: torch.nn.Module, b_tok: Tokenizer, text: str,
                     not_shared: str) -> Encoding:
    """`text` encoded for two models that must read one vocabulary (`not_shared` says so otherwise): `a`
    predicts masked words; the length is what both can read."""
    a.require("mlm")
    if a_tok.get_vocab() != b_tok.get_vocab():
        raise InputError(not_shared)
    text = check_sentence(text)
    limit = min(max_tokens(a), max_tokens(b))
    return a_tok.encode(text, max_length=min(a_tok.model_max_length, limit))


def distillation(student: torch.nn.Module, s_tok: Tokenizer, teacher: torch.nn.Module, t_tok: Tokenizer,
                 text: str, word: WordChoice, k: int = 3) -> Distillation:
    """The soft-target loss of DistilBERT's training on this sentence: hide `word` (all its pieces) in
    both models and compare their distributions at its first piece. They must share a vocabulary."""
    teacher.require("mlm")
    enc = _encode_for_pair(student, s_tok, teacher, t_tok, text,
                           "The student and the teacher must share one vocabulary to compare their guesses: pick "
                           "the teacher it was distilled from (e.g. bert-base-uncased for distilbert-base-uncased).")
    positions = hidden_positions(enc, word)
    if not positions:
        raise InputError(f"This tokenizer has no piece for {echo(word.text)}: choose another word.")
    s_logp = _mlm_logits(student, s_tok, enc.ids, positions)[0].log_softmax(-1)  # [vocab]
    t_logp = _mlm_logits(teacher, t_tok, enc.ids, positions)[0].log_softmax(-1)  # [vocab]
    t_p = t_logp.exp()
    keep = t_p > 0
    ce = float(-(t_p[keep] * s_logp[keep]).sum())
    entropy = float(-(t_p[keep] * t_logp[keep]).sum())

    def top(logp: torch.Tensor) -> list[tuple[str, float]]:
        values, idx = logp.topk(k)
        return [(readable_candidate(s_tok, s_tok.id_to_token(int(i)), int(i)), float(v.exp()))
                for v, i in zip(values, idx)]

    return Distillation(word.text, ce, ce - entropy, entropy, top(t_logp), top(s_logp))


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def hidden_positions(enc: Encoding, word: WordChoice | None) -> list[int]:
    """Token positions of the pieces that cover any character of `word` (specials never)."""
    if word is None:
        return []
    return [i for i, (a, b) in enumerate(enc.offsets)
            if enc.word_ids[i] is not None and a < word.end and b > word.start]


def _mlm_logits(model: torch.nn.Module, tok: Tokenizer, ids: Sequence[int], positions: Sequence[int]
                ) -> torch.Tensor:
    """[len(positions), vocab] float MLM logits on CPU with `positions` masked; special tokens and
    placeholders at -inf (never guessed, never sampled)."""
    x = torch.tensor([[tok.mask_token_id if i in set(positions) else t for i, t in enumerate(ids)]],
                     device=model_device(model))  # [1, seq]
    where = torch.zeros_like(x, dtype=torch.bool)  # [1, seq]
    where[0, list(positions)] = True
    with eval_mode(model), torch.inference_mode():
        logits = model(x, torch.zeros_like(x), torch.ones_like(x), mlm_positions=where).mlm_logits.float()
    logits = logits.cpu().clone()  # [masked, vocab]
    never = sorted(i for i in tok.placeholder_ids if i < logits.shape[-1])
    logits[:, never] = -math.inf
    return logits


def _encode(model: torch.nn.Module, tok: Tokenizer, text: str) -> Encoding:
    enc = tok.encode(text, max_length=input_limit(model, tok))
    if not enc.word_spans():
        raise InputError("The sentence has no words this tokenizer can read: type a sentence.")
    return enc


@dataclass
class ModelView:
    """Everything the Family tab shows for one model (each part None when it failed; `errors` says why)."""

    name: str
    family: str
    cut: TokenCut | None = None
    masked: MaskedWord | None = None
    params: ParameterCount | None = None
    objective: Objective | None = None
    pair: PairScores | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    positions: str = ""  # how the model knows where each token is, in a few words (its family says it)


def view_model(name: str, model: torch.nn.Module, tok: Tokenizer, text: str, word: WordChoice | None,
               k: int = 5) -> ModelView:
    """What the Family tab shows for one model. What the model lacks (an MLM head, a pair head) becomes
    a note, not an error: the other parts still show."""
    view = ModelView(name, model.family.name, objective=objective_of(model), params=parameter_count(model),
                     positions=model.family.positions_title)
    view.cut = token_cut(model, tok, text)
    if view.cut.warning:
        view.notes.append(("warning", view.cut.warning))
    if word is not None and model.has_mlm:
        try:
            view.masked = masked_word(model, tok, text, word, k)
        except InputError as e:
            view.notes.append(("warning", str(e)))
    elif word is not None and model.family.causal:
        view.notes.append(("info", "reads left to right, so it does not guess hidden words: it predicts the next "
                                   "word from the words before it (the Mask tab shows it)."))
    elif word is not None:
        view.notes.append(("info", "no MLM head, so it does not guess hidden words"
                                   + (" (it is a discriminator: it spots replaced pieces)."
                                      if view.objective.role == "discriminator" else ".")))
    if model.has_nsp:
        try:
            view.pair = pair_scores(model, tok, text)
        except InputError as e:
            view.notes.append(("info", str(e)))
    return view


# ---------------------------------------------------------------------------------------------
# What a member changed in attention: local bands, disentangled score terms
# ---------------------------------------------------------------------------------------------
SCORE_TERMS = ("c2c", "c2p", "p2c")  # content-to-content, content-to-position, position-to-content
TERM_TITLES = {"c2c": "content → content", "c2p": "content → position", "p2c": "position → content"}


@dataclass(frozen=True)
class AttentionReach:
    """Which keys each query may read in a layer with full attention and in a local layer (ModernBERT's
    band), from the model's own layers: every attention module's `kind` and `window`; a causal model's (the
    ModernBERT decoder's) keys to the right of the query are never read."""

    labels: list[str]  # the sentence's pieces, readable
    kinds: list[str]  # per layer: "global" or "local"
    window: int  # tokens a local layer's query sees on each side
    local: torch.Tensor  # [query, key] bool: True where a local layer's query may read the key
    full: torch.Tensor  # [query, key] bool: a global layer's (every key; a causal model's: every key to the left)
    causal: bool = False  # the model reads left to right: `window` tokens back, none ahead


def attention_reach(model: torch.nn.Module, tok: Tokenizer, text: str) -> AttentionReach | None:
    """The local band beside full attention on `text`; None for a model whose layers all attend fully."""
    windows = attention_windows(model)
    if all(w is None for w in windows):
        return None
    labels = [p.label for p in token_cut(model, tok, text).pieces]
    window = int(next(w for w in windows if w is not None))
    pos = torch.arange(len(labels))
    causal = bool(model.family.causal)
    full = masks.causal(len(labels)) if causal else masks.bidirectional(len(labels))
    return AttentionReach(labels=labels, kinds=["global" if w is None else "local" for w in windows], window=window,
                          local=((pos[:, None] - pos[None, :]).abs() <= window) & full, full=full, causal=causal)


@dataclass(frozen=True)
class ScoreTerms:
    """One head's attention scores taken apart (DeBERTa's disentangled attention), before the softmax."""

    labels: list[str]  # the sentence's pieces, readable
    layer: int
    head: int
    terms: dict[str, torch.Tensor]  # SCORE_TERMS that the model computes -> [query, key] float32


def score_terms(model: torch.nn.Module, tok: Tokenizer, text: str, layer: int | None = None, head: int = 0
                ) -> ScoreTerms | None:
    """The score terms of head `head` in layer `layer` (default: the last) on `text`, from the family's
    hook_c2c / hook_c2p / hook_p2c; None for a family without them."""
    fam = model.family
    shorts = [t for t in SCORE_TERMS if "hook_" + t in fam.family.hook_paths]
    if not shorts:
        return None
    layer = fam.num_layers - 1 if layer is None else layer
    heads = model.config.num_attention_heads
    if not 0 <= head < heads:
        raise InputError(f"head {head} does not exist: the model has {heads} heads per layer (0..{heads - 1}).")
    names = {t: fam.hook_name(layer, "hook_" + t) for t in shorts}
    labels = [p.label for p in token_cut(model, tok, text).pieces]
    enc = _encode(model, tok, text)
    device = model_device(model)
    ids = torch.tensor([enc.ids], device=device)
    types = torch.tensor([enc.type_ids], device=device)
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(ids, token_type_ids=types, names=list(names.values()))
    terms = {t: cache[n][0, head].to("cpu", torch.float32) for t, n in names.items() if n in cache}
    return ScoreTerms(labels=labels, layer=layer, head=head, terms=terms)


def plays(views: Sequence[ModelView], name: str, role: str) -> bool:
    """Whether the model `name` plays `role` ("generator", "discriminator", ...) among `views`."""
    return any(v.name == name and v.objective is not None and v.objective.role == role for v in views)


# -- the picked models together ---------------------------------------------------------------------
@dataclass
class Loaded:
    """A model picked for the comparison, loaded: its name in the model list, the model, its tokenizer."""

    name: str
    model: nn.Module
    tok: Tokenizer


def attention_changes(views: Sequence[ModelView], loaded: Sequence[Loaded], text: str
                      ) -> tuple[tuple[str, AttentionReach] | None, tuple[str, ScoreTerms] | None]:
    """What a member changed in attention, as (model name, result) of the first model shown in `views` that
    has it: a local band beside full attention, and the disentangled score terms of one head."""
    shown = {v.name for v in views}
    reach = terms = None
    for m in loaded:
        if m.name not in shown:
            continue
        if reach is None and (r := attention_reach(m.model, m.tok, text)) is not None:
            reach = (m.name, r)
        if terms is None and (st := score_terms(m.model, m.tok, text)) is not None:
            terms = (m.name, st)
    return reach, terms


def distillations(views: Sequence[ModelView], loaded: Sequence[Loaded], text: str, word: WordChoice | None
                  ) -> tuple[dict[str, tuple[str, Distillation]], list[tuple[str, str]]]:
    """A distilled student (DistilBERT) beside a teacher with its vocabulary: student -> (teacher, the
    soft-target loss on the word), and a note for each student without a teacher among `loaded`."""
    by_name = {m.name: m for m in loaded}
    out: dict[str, tuple[str, Distillation]] = {}
    notes: list[tuple[str, str]] = []
    for v in views:
        student = by_name.get(v.name)
        if v.objective is None or v.objective.demo != "distil" or student is None or word is None \
                or not student.model.has_mlm:
            continue
        vocab = student.tok.get_vocab()
        teachers = [m for m in loaded if m is not student and m.model.has_mlm and m.tok.get_vocab() == vocab
                    and not plays(views, m.name, "generator")]
        if not teachers:
            notes.append(("info", f"{v.name} was distilled from a teacher: pick a model with its vocabulary "
                                  "(e.g. bert-base-uncased for distilbert-base-uncased) to see the distillation "
                                  "loss on the hidden word."))
            continue
        t = teachers[0]
        out[v.name] = (t.name, distillation(student.model, student.tok, t.model, t.tok, text, word))
    return out, notes


def electra_demo(views: Sequence[ModelView], loaded: Sequence[Loaded], text: str, word: WordChoice | None,
                 seed: int = 0) -> tuple[ElectraPicture | None, ReplacedTokens | None, list[tuple[str, str]]]:
    """ELECTRA on the sentence: a generator + discriminator pair among `loaded` (the generator's replacements
    and the discriminator's verdict), or a discriminator alone (its verdict on the sentence as typed);
    (None, None, []) without a discriminator."""
    gens = [m for m in loaded if plays(views, m.name, "generator")]
    discs = [m for m in loaded if getattr(m.model, "has_rtd", False)]
    if not discs:
        return None, None, []
    d = discs[0]
    pair = next((g for g in gens if g.tok.get_vocab() == d.tok.get_vocab()), None)
    if pair is None:
        tip = (" The generator picked has another vocabulary: pick the one trained with this discriminator."
               if gens else " Pick its generator too to see the generator replace pieces first.")
        return None, replaced_tokens(d.model, d.tok, text), [(
            "info", f"{d.name} is an ELECTRA discriminator: it says, for every word of the sentence as typed, how "
                    f"likely it was replaced.{tip}")]
    picture = electra_pair(pair.model, pair.tok, d.model, d.tok, text, word, seed=seed)
    return picture, None, [("info", f"ELECTRA: {pair.name} (the generator) filled the hidden pieces with samples; "
                                    f"{d.name} (the discriminator) says for every piece whether it was replaced. "
                                    "Vermilion bars: really replaced; outlined: pieces that were hidden (a sample "
                                    "may equal the original).")]
