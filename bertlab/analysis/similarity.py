"""Embeddings and similarity: token x token cosines per layer, one word across contexts
against an anisotropy baseline, and a 2-D map of contextual word vectors.

Stages: stage 0 is the embeddings output (`model.family.embedding_hook`, the first layer's input), stage
s >= 1 the output of encoder layer s - 1 (its `hook_resid_post`), i.e. after s
layers. Layers are numbered from 0 as in the hook names and the attention panel.
Also home of the small helpers the other analysis modules share (encoding, hidden
states, word lookup, 2-D projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
import torch.nn.functional as F

from bertlab.analysis import encode_input
from bertlab.families.bert import Bert
from bertlab.inputs import InputError, echo, require_text
from bertlab.tasks.layer_features import hidden_states, stage_names  # noqa: F401 (shared by the analysis modules)
from bertlab.tokenizer import Encoding, Tokenizer

BATCH_SIZE = 16  # sentences per forward pass
# Varied everyday sentences for the anisotropy baseline (random token pairs from different sentences).
BASELINE_SENTENCES: tuple[str, ...] = (
    "The children played football in the park until it got dark.",
    "She poured a cup of coffee and read the morning paper.",
    "Heavy rain caused flooding in several towns along the coast.",
    "The committee will announce its decision next Tuesday.",
    "He learned to play the violin when he was seven years old.",
    "Most plants need sunlight, water and nutrients to grow.",
    "The museum opened a new exhibition about ancient Egypt.",
    "Prices rose sharply after the company reported strong profits.",
    "Our train was delayed because of a signal failure.",
    "The doctor told him to rest for a few days.",
    "A small cat was sleeping on the warm windowsill.",
    "They built a wooden bridge across the narrow stream.",
    "Scientists measured the temperature of the deep ocean.",
    "The recipe calls for two eggs and a spoon of sugar.",
    "Voters waited in long lines outside the polling station.",
    "The old castle stands on a hill above the village.",
)


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------
def batch_hidden_states(model: Bert, tok: Tokenizer, encodings: Sequence[Encoding]) -> list[torch.Tensor]:
    """Hidden states of each encoding, unpadded: a list of [stage, seq_i, d_model], in chunks of BATCH_SIZE."""
    out: list[torch.Tensor] = []
    for start in range(0, len(encodings), BATCH_SIZE):
        chunk = list(encodings[start : start + BATCH_SIZE])
        batch = tok.pad(chunk)
        states = hidden_states(model, batch.input_ids, batch.token_type_ids, batch.attention_mask)
        out.extend(states[:, i, : len(e)] for i, e in enumerate(chunk))  # [stage, seq_i, d]
    return out


def cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarity of the rows of x: [..., n, d] -> [..., n, n]."""
    unit = F.normalize(x.float(), dim=-1, eps=1e-8)
    return unit @ unit.transpose(-1, -2)


def project_2d(x: torch.Tensor, center: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Project rows of x [n, d] on their top two principal directions.

    Returns (points [n, 2], explained [2]): the share of the (centred, if `center`) squared
    norm each direction carries. Signs are fixed so that the point farthest along each
    direction has a positive coordinate (the same input always gives the same picture).
    """
    x = x.float()
    if x.dim() != 2 or x.shape[0] < 2:
        raise InputError(f"a 2-D map needs at least two vectors; got {x.shape[0] if x.dim() == 2 else 0}.")
    if center:
        x = x - x.mean(dim=0, keepdim=True)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)  # u [n, r], s [r], vh [r, d]
    points = u[:, :2] * s[:2]  # [n, min(2, r)]
    if points.shape[1] < 2:  # one-dimensional input (d == 1)
        points = F.pad(points, (0, 2 - points.shape[1]))
    biggest = points.abs().argmax(dim=0)  # [2]
    signs = torch.sign(points[biggest, torch.arange(2)])
    signs[signs == 0] = 1.0
    total = (s**2).sum()
    explained = (s[:2] ** 2 / total) if total > 0 else torch.zeros(2)
    return points * signs, F.pad(explained, (0, 2 - explained.shape[0]))


def word_pieces(tok: Tokenizer, word: str) -> list[str]:
    """The WordPiece pieces of `word`; InputError when it is empty or not in the vocabulary."""
    if not isinstance(word, str) or not word.strip():
        raise InputError("The word is empty: type the word to look for.")
    require_text(word, "word")
    pieces = tok.tokenize(word.strip())
    if not pieces or tok.unk_token_id in tok.encode_ids([word.strip()])[0]:
        unk = tok.id_to_token(tok.unk_token_id)
        raise InputError(f"{echo(word)} is not in the model's vocabulary (it becomes {unk}): choose another word.")
    return pieces


def word_forms(tok: Tokenizer, word: str) -> list[list[str]]:
    """The pieces of `word` as it is tokenized alone and as it is after a space: byte-level BPE marks a
    word that follows a space ("Ġbank" inside a sentence, "bank" at its start); WordPiece and SentencePiece
    give one form. InputError as `word_pieces`."""
    forms = [word_pieces(tok, word)]
    spaced = tok.tokenize(" " + word.strip())
    if spaced and spaced != forms[0] and tok.unk_token_id not in tok.encode_ids([" " + word.strip()])[0]:
        forms.append(spaced)
    return forms


def find_word_forms(enc: Encoding, forms: Sequence[Sequence[str]], tok: Tokenizer) -> list[tuple[int, int]]:
    """Token spans where any of the word's forms (`word_forms`) occurs as a whole word, in order."""
    return sorted({span for form in forms for span in find_word(enc, form, tok)})


def find_word(enc: Encoding, pieces: Sequence[str], tok: Tokenizer | None = None) -> list[tuple[int, int]]:
    """Token spans (start, end) where `pieces` occur as whole words (never inside a longer word; with `tok`,
    punctuation the tokenizer keeps inside a word does not count as more of the word)."""
    n, tokens, words = len(pieces), enc.tokens, enc.word_ids
    spans = []
    for i in range(len(tokens) - n + 1):
        if tokens[i : i + n] != list(pieces) or any(w is None for w in words[i : i + n]):
            continue
        end = i + n
        if _continues(enc, i, i - 1, tok) or _continues(enc, end - 1, end, tok):  # part of a longer word
            continue
        spans.append((i, end))
    return spans


def _continues(enc: Encoding, inside: int, outside: int, tok: Tokenizer | None) -> bool:
    """Whether token `outside`, next to token `inside`, carries the same word on with a letter or digit.
    Punctuation that a tokenizer keeps in the word (SentencePiece splits only at spaces: "bank." is one
    word to DeBERTa-v3) does not make the word a longer one. Without `tok` any token of the same word does."""
    if not _same_word(enc, inside, outside):
        return False
    if tok is None:
        return True
    core = tok.join_pieces([enc.tokens[outside]])  # the piece's own characters, its word marks dropped
    return bool(core) and (core[-1] if outside < inside else core[0]).isalnum()


def _same_word(enc: Encoding, i: int, j: int) -> bool:
    """Whether tokens i and j exist and belong to one word."""
    if i < 0 or j >= len(enc.tokens):
        return False
    word, seq = enc.word_ids, enc.sequence_ids
    return word[i] is not None and (word[i], seq[i]) == (word[j], seq[j])


# ---------------------------------------------------------------------------------------------
# Token x token cosine similarity at every stage
# ---------------------------------------------------------------------------------------------
@dataclass
class TokenSimilarity:
    """Cosine similarity between every pair of tokens of one input, at every stage."""

    tokens: list[str]  # [CLS] ... [SEP] (... [SEP])
    matrices: torch.Tensor  # [stage, seq, seq] cosine in [-1, 1]
    stage_names: list[str]
    sentence_b_start: int | None = None
    warning: str | None = None

    @property
    def num_stages(self) -> int:
        return self.matrices.shape[0]

    def matrix(self, stage: int) -> torch.Tensor:
        """[seq, seq] cosines at `stage` (0 = embeddings, s = after layer s - 1)."""
        if not 0 <= stage < self.num_stages:
            raise IndexError(
                f"stage {stage} does not exist: use 0 (embeddings) to {self.num_stages - 1} (after the last layer)."
            )
        return self.matrices[stage]


def token_similarity(model: Bert, tok: Tokenizer, a: str, b: str | None = None) -> TokenSimilarity:
    """Token x token cosine similarity of `a` (and sentence `b`) at every stage: [stage, seq, seq]."""
    enc = encode_input(model, tok, a, b)
    states = hidden_states(model, torch.tensor([enc.ids]), torch.tensor([enc.type_ids]))[:, 0]  # [stage, seq, d]
    return TokenSimilarity(
        tokens=list(enc.tokens),
        matrices=cosine_matrix(states),
        stage_names=stage_names(model.config.num_hidden_layers),
        sentence_b_start=enc.sequence_ids.index(1) if 1 in enc.sequence_ids else None,
        warning=enc.warning,
    )


# ---------------------------------------------------------------------------------------------
# Anisotropy baseline: how similar are two random tokens?
# ---------------------------------------------------------------------------------------------
@dataclass
class Anisotropy:
    """Mean cosine of random token pairs from different sentences, per stage."""

    mean: torch.Tensor  # [stage]
    pairs: torch.Tensor  # [pair, 2, 2]: ((sentence, token), (sentence, token)) of each pair
    sentences: list[str]
    seed: int


def anisotropy_baseline(
    model: Bert,
    tok: Tokenizer,
    sentences: Sequence[str] = BASELINE_SENTENCES,
    num_pairs: int = 500,
    seed: int = 0,
) -> Anisotropy:
    """Mean cosine similarity of `num_pairs` random pairs of (non-special) tokens taken from two
    different sentences, at every stage. Contextual vectors share a common direction, so this is
    well above 0; a word's similarity across contexts means something only above this line."""
    sentences = [s for s in sentences if isinstance(s, str) and s.strip()]
    if len(sentences) < 2:
        raise InputError("The baseline needs at least two non-empty sentences.")
    if num_pairs < 1:
        raise InputError(f"num_pairs must be at least 1; got {num_pairs}.")
    encs = [encode_input(model, tok, s) for s in sentences]
    states = batch_hidden_states(model, tok, encs)
    where = torch.tensor(
        [(si, ti) for si, e in enumerate(encs) for ti, special in enumerate(e.special_tokens_mask) if not special]
    )  # [token, 2] (sentence, position)
    if len(torch.unique(where[:, 0])) < 2:
        raise InputError("The baseline needs real words in at least two sentences.")
    g = torch.Generator().manual_seed(seed)
    picked = torch.empty(0, 2, dtype=torch.long)
    while len(picked) < num_pairs:  # draw pairs, keep those from two different sentences
        draw = torch.randint(len(where), (2 * num_pairs, 2), generator=g)
        draw = draw[where[draw[:, 0], 0] != where[draw[:, 1], 0]]
        picked = torch.cat([picked, draw])[:num_pairs]
    pairs = where[picked]  # [pair, 2, 2]
    first = torch.stack([states[s][:, t] for s, t in pairs[:, 0].tolist()], dim=1)  # [stage, pair, d]
    second = torch.stack([states[s][:, t] for s, t in pairs[:, 1].tolist()], dim=1)
    mean = F.cosine_similarity(first, second, dim=-1, eps=1e-8).mean(dim=1)  # [stage]
    return Anisotropy(mean=mean, pairs=pairs, sentences=list(sentences), seed=seed)


# ---------------------------------------------------------------------------------------------
# One word in several contexts
# ---------------------------------------------------------------------------------------------
@dataclass
class WordAcrossContexts:
    """A word's contextual vector in each context, and how similar they are at every stage."""

    word: str
    pieces: list[str]  # its pieces (as in the first context); the vector is their mean
    contexts: list[str]
    senses: list[str] | None  # one label per context, or None
    spans: list[tuple[int, int]]  # (start, end) token span of the word in each context
    vectors: torch.Tensor  # [context, stage, d_model]
    cosines: torch.Tensor  # [stage, context, context]
    all_pairs: torch.Tensor  # [stage] mean cosine over all pairs of contexts
    same_sense: torch.Tensor | None  # [stage] mean over pairs with the same sense (None: no such pair)
    different_sense: torch.Tensor | None  # [stage] mean over pairs with different senses
    baseline: Anisotropy
    stage_names: list[str]
    notes: list[str] = field(default_factory=list)  # e.g. a word found twice in one context


def word_in_contexts(
    model: Bert,
    tok: Tokenizer,
    word: str,
    contexts: Sequence[str],
    senses: Sequence[str] | None = None,
    baseline_sentences: Sequence[str] = BASELINE_SENTENCES,
    num_pairs: int = 500,
    seed: int = 0,
    baseline: Anisotropy | None = None,
) -> WordAcrossContexts:
    """The contextual vector of `word` (mean of its pieces; first occurrence) in each context at
    every stage, pairwise cosines across contexts, means for same/different senses, and the
    anisotropy baseline (computed from `baseline_sentences`, `num_pairs`, `seed`, unless a
    precomputed `baseline` is given). InputError names the context when the word is missing."""
    forms = word_forms(tok, word)
    contexts = list(contexts)
    if len(contexts) < 2:
        raise InputError("Give at least two contexts: similarity compares the word across contexts.")
    if senses is not None:
        senses = [str(s).strip() for s in senses]
        if len(senses) != len(contexts):
            raise InputError(f"{len(contexts)} contexts but {len(senses)} sense labels: give one label per context.")
    encs, spans, notes = [], [], []
    for i, text in enumerate(contexts, start=1):
        enc = encode_input(model, tok, text, what=f"context {i}")
        found = find_word_forms(enc, forms, tok)
        if not found:
            raise InputError(
                f"{echo(word)} does not occur in context {i} ({echo(text)}). Each context must "
                f"contain the word as written (another form, such as a plural, is a different word)."
            )
        if len(found) > 1:
            notes.append(f"{echo(word)} occurs {len(found)} times in context {i}; the first is used.")
        encs.append(enc)
        spans.append(found[0])
    states = batch_hidden_states(model, tok, encs)
    vectors = torch.stack([s[:, a:b].mean(dim=1) for s, (a, b) in zip(states, spans)])  # [context, stage, d]
    cosines = cosine_matrix(vectors.transpose(0, 1))  # [stage, context, context]
    upper = torch.ones(len(contexts), len(contexts), dtype=torch.bool).triu(1)
    same = diff = None
    if senses is not None:
        labels = torch.tensor([senses.index(s) for s in senses])
        equal = labels[:, None] == labels[None, :]
        same = _pair_mean(cosines, upper & equal)
        diff = _pair_mean(cosines, upper & ~equal)
    return WordAcrossContexts(
        word=word.strip(),
        pieces=encs[0].tokens[spans[0][0]:spans[0][1]],  # as the first context has them
        contexts=contexts,
        senses=senses,
        spans=spans,
        vectors=vectors,
        cosines=cosines,
        all_pairs=_pair_mean(cosines, upper),
        same_sense=same,
        different_sense=diff,
        baseline=baseline or anisotropy_baseline(model, tok, baseline_sentences, num_pairs, seed),
        stage_names=stage_names(model.config.num_hidden_layers),
        notes=notes,
    )


def _pair_mean(cosines: torch.Tensor, which: torch.Tensor) -> torch.Tensor | None:
    """Mean of cosines [stage, n, n] over the pairs where `which` [n, n] is True: [stage], or None."""
    if not bool(which.any()):
        return None
    return cosines[:, which].mean(dim=1)


# ---------------------------------------------------------------------------------------------
# A 2-D map of contextual vectors of chosen words
# ---------------------------------------------------------------------------------------------
@dataclass
class WordProjection:
    """Every occurrence of the chosen words in the sentences, projected to 2-D at every stage."""

    words: list[str]  # the word of each point
    sentence_index: list[int]  # which sentence each point comes from
    sentences: list[str]
    spans: list[tuple[int, int]]  # token span of each point in its sentence
    vectors: torch.Tensor  # [stage, point, d_model]
    points: torch.Tensor  # [stage, point, 2] centred PCA, fitted at each stage
    explained: torch.Tensor  # [stage, 2] share of variance on each axis
    stage_names: list[str]


def word_projection(model: Bert, tok: Tokenizer, words: Sequence[str], sentences: Sequence[str]) -> WordProjection:
    """Find every occurrence of each word in the sentences, take its contextual vector (mean of
    its pieces) at every stage, and project each stage's vectors to 2-D (centred PCA)."""
    words = [w.strip() for w in words if isinstance(w, str) and w.strip()]
    if not words:
        raise InputError("No words given: type the words to place on the map.")
    forms = {w: word_forms(tok, w) for w in words}
    sentences = list(sentences)
    encs = [encode_input(model, tok, s, what=f"sentence {i}") for i, s in enumerate(sentences, start=1)]
    hits: list[tuple[str, int, tuple[int, int]]] = []  # (word, sentence, span)
    for w in words:
        found = [(w, si, span) for si, e in enumerate(encs) for span in find_word_forms(e, forms[w], tok)]
        if not found:
            raise InputError(f"{echo(w)} does not occur in any of the sentences: add a sentence that contains it.")
        hits.extend(found)
    if len(hits) < 2:
        raise InputError("The map needs at least two occurrences: add words or sentences.")
    used = sorted({si for _, si, _ in hits})
    states = dict(zip(used, batch_hidden_states(model, tok, [encs[i] for i in used])))
    vectors = torch.stack([states[si][:, a:b].mean(dim=1) for _, si, (a, b) in hits], dim=1)  # [stage, point, d]
    projected = [project_2d(v, center=True) for v in vectors]
    return WordProjection(
        words=[w for w, _, _ in hits],
        sentence_index=[si for _, si, _ in hits],
        sentences=sentences,
        spans=[span for _, _, span in hits],
        vectors=vectors,
        points=torch.stack([p for p, _ in projected]),
        explained=torch.stack([e for _, e in projected]),
        stage_names=stage_names(model.config.num_hidden_layers),
    )


def first_similarity_tokens(sim: TokenSimilarity, n: int) -> TokenSimilarity:
    """The cosines among the first `n` tokens (computed with the whole text as context)."""
    if len(sim.tokens) <= n:
        return sim
    b = sim.sentence_b_start
    return replace(sim, tokens=sim.tokens[:n], matrices=sim.matrices[:, :n, :n],
                   sentence_b_start=b if b is not None and b < n else None)


def parse_contexts(text: str) -> tuple[list[str] | None, list[str]]:
    """(sense labels or None, contexts) from one context per line, each optionally "label | sentence"."""
    lines = text_lines(text)
    if not lines:
        raise InputError("No contexts: type at least two sentences that contain the word, one per line.")
    split = [line.partition("|") for line in lines]
    labelled = [bool(bar) and bool(label.strip()) for label, bar, _ in split]
    if not any(labelled):
        return None, lines
    if not all(labelled):
        missing = ", ".join(str(i) for i, ok in enumerate(labelled, start=1) if not ok)
        raise InputError(
            f"Some contexts have a sense label (“river | …”) and some do not (line {missing}): "
            "label every context or none."
        )
    return [label.strip() for label, _, _ in split], [sentence.strip() for _, _, sentence in split]


def text_lines(text: str) -> list[str]:
    """The lines of `text` that hold something, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def stage_options(num_layers: int) -> tuple[tuple[str, int], ...]:
    """A stage slider's options: (label, stage index), stage 0 = the embeddings."""
    return tuple((name, i) for i, name in enumerate(stage_names(num_layers)))
