"""Sentence similarity from a frozen encoder: each sentence's token vectors of the last layer averaged
(mean pooling over its real tokens, specials included, as sentence-transformers pools), two sentences
compared by the cosine of those means, and the cosines scored against people's ratings.

    result = one_against_many(model, tok, "A man plays a guitar.", ["A person plays music.", "A cat sleeps."])
    result.cosines                                    # [0.71, 0.05]: one per other sentence, -1..1
    score = cosine_score(model, tok, get_task("sts").read("dev"))
    score.pearson, score.spearman                     # against SICK's relatedness (1-5), -1..1

This is the other way to the one number (besides a cross-encoder fine-tuned with a regression head, the
`sts` task): no training, each sentence encoded alone. It works as far as the encoder was trained to put
related sentences near each other, as a contrastive sentence objective does (the offline default's MiniLM
was trained so, on sentence pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from bertlab.analysis.predict import last_layer_output
from bertlab.inputs import InputError, require_text
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.settings import DataNotFoundError
from bertlab.tasks import get_task, subset
from bertlab.tasks.metrics import pearson, spearman
from bertlab.tokenizer import Encoding, Tokenizer

BATCH_SIZE = 32  # sentences per forward pass
MAX_OTHERS = 50  # sentences compared with the first one at a time (a bar each)


@torch.inference_mode()
def sentence_embeddings(model: torch.nn.Module, tok: Tokenizer, texts: Sequence[str],
                        batch_size: int = BATCH_SIZE) -> tuple[torch.Tensor, list[Encoding]]:
    """Mean-pooled last-layer vectors of `texts`: ([n, d_model] on the CPU, each text's encoding: its tokens, and
    its `warning` when it was cut to the model's limit). Any model works, with or without a head (the encoder's
    output is read)."""
    if not texts:
        raise InputError("There are no sentences to encode: type at least one.")
    limit = input_limit(model, tok)
    device = model_device(model)
    rows: list[torch.Tensor] = []
    encodings: list[Encoding] = []
    with eval_mode(model):
        for lo in range(0, len(texts), batch_size):
            batch = tok.encode_batch(list(texts[lo : lo + batch_size]), None, limit)
            mask = batch.attention_mask.to(device)  # [batch, seq]
            hidden = last_layer_output(model, batch.input_ids.to(device), batch.token_type_ids.to(device),
                                       mask).float()  # [batch, seq, d_model]
            weights = mask.unsqueeze(-1).float()  # [batch, seq, 1]
            rows.append(((hidden * weights).sum(1) / weights.sum(1).clamp(min=1)).cpu())  # [batch, d_model]
            encodings.extend(batch.encodings)
    return torch.cat(rows), encodings


def pair_cosines(model: torch.nn.Module, tok: Tokenizer, a: Sequence[str], b: Sequence[str],
                 batch_size: int = BATCH_SIZE) -> list[float]:
    """The cosine (-1..1) of the sentence embeddings of a[i] and b[i], for each i."""
    if len(a) != len(b):
        raise InputError(f"{len(a)} first sentences but {len(b)} second ones: give one of each per pair.")
    x, _ = sentence_embeddings(model, tok, list(a), batch_size)
    y, _ = sentence_embeddings(model, tok, list(b), batch_size)
    return F.cosine_similarity(x, y, dim=-1, eps=1e-8).tolist()


@dataclass
class SentenceSimilarity:
    """One sentence against several: the cosine of its embedding with each other one's."""

    sentence: str
    others: list[str]
    cosines: list[float]  # one per other sentence, -1..1
    warnings: list[str] = field(default_factory=list)  # sentences cut to the model's limit, said once each
    tokens: list[str] = field(default_factory=list)  # every sentence's tokens, one after the other

    def ranked(self) -> list[tuple[str, float]]:
        """(other sentence, cosine), most similar first."""
        return sorted(zip(self.others, self.cosines), key=lambda p: -p[1])


def split_sentences(text: str) -> tuple[str, list[str]]:
    """The first non-empty line of `text` and the lines after it; an InputError the student can act on when
    there is no sentence, or no other one to compare it with."""
    require_text(text, "text")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise InputError("There is only one sentence: put the sentence on the first line and at least one other "
                         "sentence to compare it with on the lines below.")
    if len(lines) - 1 > MAX_OTHERS:
        raise InputError(f"There are {len(lines) - 1} sentences below the first; compare at most {MAX_OTHERS} at a "
                         "time.")
    return lines[0], lines[1:]


def one_against_many(model: torch.nn.Module, tok: Tokenizer, sentence: str,
                     others: Sequence[str]) -> SentenceSimilarity:
    """The cosine of `sentence`'s embedding with each of `others` (see `sentence_embeddings`)."""
    sentence = require_text(sentence, "sentence")
    others = [require_text(o, f"sentence {i + 2}") for i, o in enumerate(others)]
    if not others:
        raise InputError("Give at least one other sentence to compare the first one with.")
    vectors, encodings = sentence_embeddings(model, tok, [sentence, *others])
    cosines = F.cosine_similarity(vectors[:1], vectors[1:], dim=-1, eps=1e-8).tolist()  # [n_others]
    cut = [f"Sentence {i + 1}: {e.warning}" for i, e in enumerate(encodings) if e.warning]
    return SentenceSimilarity(sentence, list(others), cosines, cut, [t for e in encodings for t in e.tokens])


@dataclass(frozen=True)
class CosineScore:
    """How well the cosine of two sentence embeddings follows people's ratings of the pairs."""

    pearson: float  # -1..1
    spearman: float  # -1..1, of the ranks
    pairs: int  # how many pairs were scored


def cosine_score(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[object],
                 batch_size: int = BATCH_SIZE) -> CosineScore:
    """Pearson and Spearman of the cosine against the gold score of scored pairs (text_a, text_b, score:
    e.g. SICK's relatedness, `get_task("sts").read("dev")`)."""
    if len(examples) < 2:
        raise InputError(f"A correlation needs at least 2 scored pairs; got {len(examples)}.")
    cosines = pair_cosines(model, tok, [e.text_a for e in examples], [e.text_b for e in examples], batch_size)
    gold = [float(e.score) for e in examples]
    return CosineScore(pearson(cosines, gold), spearman(cosines, gold), len(examples))


def sick_held_out(n: int | None = None, path: str | None = None, seed: int = 0) -> tuple[list[object], str]:
    """A seeded `n` (None = all) of SICK's held-out scored pairs (its TRIAL part, the dev part the `sts` task
    scores a fine-tuned model on, never trained on), from `path` or BERTLAB_DATA; and where they came from."""
    try:
        held_out = get_task("sts").read("dev", path=path)
    except DataNotFoundError as e:
        raise InputError(f"{e} Scoring on SICK needs its copy: point BERTLAB_DATA at the folder that holds "
                         "sick/ (or give a SICK file).") from None
    return subset(held_out, n, seed, "sts cosine"), f"SICK's held-out part (TRIAL, {len(held_out):,} pairs)"


def sick_cosine_score(model: torch.nn.Module, tok: Tokenizer, n: int | None = None,
                      path: str | None = None, seed: int = 0) -> tuple[CosineScore, str]:
    """`cosine_score` on `sick_held_out(n, path, seed)`, and where the pairs came from."""
    pairs, where = sick_held_out(n, path, seed)
    return cosine_score(model, tok, pairs), where


__all__ = [
    "MAX_OTHERS", "CosineScore", "SentenceSimilarity", "cosine_score", "one_against_many", "pair_cosines",
    "sentence_embeddings", "sick_cosine_score", "sick_held_out", "split_sentences",
]
