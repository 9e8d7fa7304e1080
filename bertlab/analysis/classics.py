"""The lectures' classic fill-in sentences, and how many of them a model guesses (an acceptable answer
among its top 5): a figure a teacher reads on the model's card before class. A panel to show, never
text to train on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.analysis.mask import _ordinary
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

TOP_K = 5


@dataclass(frozen=True)
class Classic:
    template: str  # {mask} where the hidden word goes (spelled by each tokenizer)
    answers: tuple[str, ...]  # words a class would accept, lower case


CLASSICS = (
    Classic("The man went to the {mask} to buy a gallon of milk.",
            ("store", "shop", "market", "supermarket", "grocery", "shops", "stores")),
    Classic("Paris is the capital of {mask}.", ("france",)),
    Classic("My dog is {mask}.", ("cute", "happy", "sick", "dead", "old", "hungry", "sleeping", "lost", "missing",
                                  "gone", "friendly", "barking", "adorable", "beautiful", "lazy", "tired", "sad",
                                  "smart", "loyal", "playful", "fine", "alive")),
    Classic("The {mask} barked at the mailman.", ("dog", "dogs", "puppy")),
    Classic("I drink a cup of {mask} every morning.", ("coffee", "tea")),
    Classic("She takes her coffee with milk and {mask}.", ("sugar", "cream", "honey")),
    Classic("Newton and Leibniz both invented {mask}.", ("calculus",)),
    Classic("The derivative of a function gives the {mask} of its graph.", ("slope", "gradient", "tangent")),
    Classic("The cat sat on the {mask}.", ("mat", "floor", "bed", "couch", "sofa", "chair", "table", "ground",
                                           "roof", "porch", "fence", "rug", "carpet", "windowsill", "bench",
                                           "step", "steps", "stairs", "grass", "desk", "lap", "pillow")),
    Classic("The sun rises in the {mask}.", ("east",)),
    Classic("Romeo and {mask} is a play by Shakespeare.", ("juliet",)),
    Classic("He plays the {mask} in a rock band.", ("guitar", "drums", "bass", "piano", "keyboard", "keyboards",
                                                    "drum", "violin", "saxophone", "trumpet", "harmonica")),
)


@dataclass(frozen=True)
class ClassicResult:
    sentence: str  # as the model's tokenizer spells it
    top: tuple[str, ...]  # the model's top TOP_K guesses, as words
    hit: bool  # an acceptable answer is among them


def guess_classics(model: torch.nn.Module, tok: Tokenizer, k: int = TOP_K,
                   classics: tuple[Classic, ...] = CLASSICS) -> list[ClassicResult]:
    """Each classic sentence with the model's top `k` guesses for its hidden word: one batched forward.
    A guess counts when its word (case folded) is an acceptable answer; a word the tokenizer splits
    into pieces counts by its first piece only when that piece is the whole word. Raises
    MissingHeadError without an MLM head."""
    model.require("mlm")
    sentences = [tok.spell(c.template) for c in classics]
    batch = tok.encode_batch(sentences)
    device = model_device(model)
    ids = batch.input_ids.to(device)  # [n, seq]
    where = ids == tok.mask_token_id  # [n, seq]: one [MASK] per sentence
    if where.sum(dim=1).ne(1).any():
        raise ValueError("each classic sentence needs exactly one mask")
    with eval_mode(model), torch.inference_mode():
        out = model(ids, token_type_ids=batch.token_type_ids.to(device),
                    attention_mask=batch.attention_mask.to(device), mlm_positions=where)
    logits = out.mlm_logits.float()  # [n, vocab]
    ordinary = _ordinary(tok, logits.shape[-1], logits.device)
    top = logits.masked_fill(~ordinary, float("-inf")).topk(k, dim=-1).indices.tolist()  # [n, k]
    results = []
    for sentence, classic, row in zip(sentences, classics, top):
        words = tuple(tok.decode([i]).strip().casefold() for i in row)
        results.append(ClassicResult(sentence, words, any(w in classic.answers for w in words)))
    return results


def classics_line(results: list[ClassicResult], k: int = TOP_K) -> str:
    """"guesses the lectures' examples: 5 of 12 in its top 5"."""
    return f"guesses the lectures' examples: {sum(r.hit for r in results)} of {len(results)} in its top {k}"
