"""Next-sentence prediction: does sentence B follow sentence A? And where does attention go
between the two sentences, layer by layer?

The NSP head reads the pooled [CLS] vector; Hugging Face's convention is kept: logit 0 is
IsNext (B follows A), logit 1 is NotNext (B is a random sentence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from bertlab.analysis.attention import attention_patterns
from bertlab.inputs import InputError, require_text
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tokenizer import DEFAULT_SPECIALS, Encoding, Tokenizer

A, B = "A", "B"
# Special tokens are grouped under their own spelling (RoBERTa's "<s>", "</s>"); these are WordPiece's.
CLS, SEP = DEFAULT_SPECIALS["cls"], DEFAULT_SPECIALS["sep"]
GROUPS: tuple[str, ...] = (A, B, CLS, SEP)  # order of the rows/columns of AttentionMass.mass


@dataclass
class AttentionMass:
    """Where attention goes between groups of tokens, per layer, averaged over heads.

    `mass[layer, i, j]` is the share of attention that tokens of group `groups[i]` (queries)
    put on tokens of group `groups[j]` (keys): the weights summed over the keys of group j,
    averaged over the queries of group i and over the heads. Each [layer, i, :] sums to 1.
    Groups no token belongs to are left out.
    """

    groups: tuple[str, ...]
    mass: torch.Tensor  # [layers, from group, to group]
    sizes: tuple[int, ...]  # tokens in each group

    @property
    def num_layers(self) -> int:
        return self.mass.shape[0]

    def share(self, source: str, target: str) -> torch.Tensor:
        """[layers]: the share of `source`'s attention that goes to `target` (e.g. "A", "B")."""
        return self.mass[:, self._index(source), self._index(target)]

    def _index(self, group: str) -> int:
        if group not in self.groups:
            raise KeyError(f"no token group {group!r}; the groups are {', '.join(self.groups)}.")
        return self.groups.index(group)


@dataclass
class NSPResult:
    """The NSP head's verdict on one pair, and the attention between the two sentences."""

    text_a: str
    text_b: str
    tokens: list[str]  # [CLS] A [SEP] B [SEP]
    sentence_b_start: int  # index of the first token of B
    logits: tuple[float, float]  # (IsNext, NotNext)
    is_next_probability: float  # softmax of the logits, index 0
    attention: AttentionMass
    warning: str | None = None  # set when the pair was cut to fit the model

    @property
    def not_next_probability(self) -> float:
        return 1.0 - self.is_next_probability

    @property
    def is_next(self) -> bool:
        """The model's verdict: True when it thinks B follows A."""
        return self.is_next_probability >= 0.5


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def next_sentence(model: torch.nn.Module, tok: Tokenizer, a: str, b: str) -> NSPResult:
    """P(B follows A) from the NSP head, and the attention mass between A and B per layer.

    Raises MissingHeadError without an NSP head, InputError for an empty sentence.
    A pair too long for the model is cut (longest sentence first), with `warning` set.
    """
    model.require("nsp")
    a = require_text(a, "first sentence (A)")
    if b is None or not str(b).strip():
        raise InputError(
            "The second sentence (B) is empty: NSP asks whether B follows A, so type a B "
            "(or swap in a random sentence)."
        )
    b = require_text(b, "second sentence (B)")
    enc = _encode_pair(model, tok, a, b)
    device = model_device(model)
    input_ids = torch.tensor([enc.ids], device=device)  # [1, seq]
    token_type_ids = torch.tensor([enc.type_ids], device=device)  # [1, seq]
    with eval_mode(model), torch.inference_mode():
        out, cache = model.run_with_cache(
            input_ids, token_type_ids=token_type_ids, names=model.family.layer_hook_names("hook_pattern"),
            mlm_positions=torch.zeros_like(input_ids, dtype=torch.bool) if model.has_mlm else None,  # not needed
        )
    logits = out.nsp_logits[0].float().cpu()  # [2]
    patterns = cache.stack("hook_pattern")[:, 0].float().cpu()  # [layers, heads, query, key]
    return NSPResult(
        text_a=a,
        text_b=b,
        tokens=list(enc.tokens),
        sentence_b_start=enc.sequence_ids.index(1),
        logits=(float(logits[0]), float(logits[1])),
        is_next_probability=float(logits.softmax(-1)[0]),
        attention=attention_mass(patterns, token_groups(enc)),
        warning=enc.warning,
    )


def token_groups(enc: Encoding) -> list[str]:
    """The group of each token of a pair: "A", "B", or a special token's own spelling ("[CLS]", "[SEP]")."""
    groups = []
    specials = [t for t, s in zip(enc.tokens, enc.special_tokens_mask) if s]
    cls, sep = (specials[0], specials[-1]) if specials else (CLS, SEP)  # the tokenizer's own spelling
    for special, seq in zip(enc.special_tokens_mask, enc.sequence_ids):
        if special:
            groups.append(cls if not groups else sep)
        else:
            groups.append(A if seq == 0 else B)
    return groups


def attention_mass(patterns: torch.Tensor, groups: Sequence[str]) -> AttentionMass:
    """Share of attention between token groups, per layer (see AttentionMass).

    patterns: [layers, heads, query, key] softmax weights; groups: one label per token
    (e.g. from `token_groups`). Labels outside GROUPS come after them, in order of appearance.
    """
    if patterns.dim() != 4 or patterns.shape[-1] != patterns.shape[-2]:
        raise ValueError(f"patterns must be [layers, heads, query, key]; got {tuple(patterns.shape)}.")
    if len(groups) != patterns.shape[-1]:
        raise ValueError(f"{len(groups)} group labels for {patterns.shape[-1]} tokens.")
    names = tuple(g for g in GROUPS if g in groups) + tuple(dict.fromkeys(g for g in groups if g not in GROUPS))
    member = torch.tensor([[g == n for g in groups] for n in names], dtype=patterns.dtype)  # [group, token]
    per_head = patterns.mean(dim=1)  # [layers, query, key]
    to_group = per_head @ member.T  # [layers, query, to group]
    sizes = member.sum(dim=1)  # [group]
    mass = (member @ to_group) / sizes[:, None]  # [layers, from group, to group]
    return AttentionMass(groups=names, mass=mass, sizes=tuple(int(s) for s in sizes))


SENTENCE_WORDS = (4, 40)  # sentences offered are this many words long (inclusive)


def _fits(sentence: str, words: tuple[int, int] = SENTENCE_WORDS) -> bool:
    low, high = words
    return low <= len(sentence.split()) <= high


def sentence_pool(documents: Iterable) -> dict[str, str]:
    """Sentences of a sensible length (SENTENCE_WORDS) -> the title of their document (`documents`: each
    with a `title` and its `sentences`, e.g. bertlab.training.corpora.Document)."""
    return {s: d.title for d in documents for s in d.sentences if _fits(s)}


def following_pairs(documents: Iterable) -> list[tuple[object, int]]:
    """(document, i) for each i such that sentences i and i + 1 of the document are both of a sensible length."""
    return [(d, i) for d in documents for i in range(len(d.sentences) - 1)
            if _fits(d.sentences[i]) and _fits(d.sentences[i + 1])]


def random_sentence(
    corpus_sentences: Sequence[str], rng: torch.Generator, exclude: Iterable[str] = ()
) -> str:
    """A sentence drawn uniformly from `corpus_sentences` with `rng`, skipping blank ones and
    those in `exclude` (e.g. the current A and B): the "swap in a random B" button."""
    exclude = {s.strip() for s in exclude}
    pool = [s for s in corpus_sentences if s.strip() and s.strip() not in exclude]
    if not pool:
        raise InputError("There is no other sentence to pick from: give a list of sentences.")
    return pool[int(torch.randint(len(pool), (1,), generator=rng))]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _encode_pair(model: torch.nn.Module, tok: Tokenizer, a: str, b: str) -> Encoding:
    enc = tok.encode(a, b, max_length=input_limit(model, tok))
    if A not in token_groups(enc) or B not in token_groups(enc):
        which = "first (A)" if A not in token_groups(enc) else "second (B)"
        raise InputError(f"The {which} sentence has no words the tokenizer can read: type a sentence.")
    return enc


def pair_attention_mass(
    model: torch.nn.Module, tok: Tokenizer, a: str, b: str
) -> tuple[AttentionMass, str | None]:
    """(attention mass between the parts of the pair A, B; a warning if it was cut), with the
    encoder alone: what `next_sentence` gives as `.attention`, for models without an NSP head."""
    limit = input_limit(model, tok)
    result = attention_patterns(model, tok, a, b, max_length=limit)
    groups = token_groups(tok.encode(a, b, max_length=limit))
    for group, which in ((A, "first (A)"), (B, "second (B)")):
        if group not in groups:
            raise InputError(f"The {which} sentence has no words the tokenizer can read: type a sentence.")
    return attention_mass(result.patterns, groups), result.warning
