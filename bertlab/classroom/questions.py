"""Questions the teacher pushes, with the model's answer from the analysis functions, and what the
class answered (pure: model and text in, a `Question` or a tally out)."""

from __future__ import annotations

import re
from collections import Counter

import torch

from bertlab.analysis import normalise_masks
from bertlab.analysis.mask import fill_mask
from bertlab.analysis.nsp import next_sentence
from bertlab.classroom.store import Question, normalise_guess
from bertlab.inputs import InputError, echo
from bertlab.tokenizer import Tokenizer

# What students pick for a pair: the model's two verdicts, as its sentence head was pre-trained to
# give them (BERT's next-sentence prediction; ALBERT's sentence-order prediction, which only ever saw
# two consecutive segments, in order or swapped, so "is B random?" is not its question).
PAIR_CHOICES = {
    "nsp": ("B follows A", "B is random"),
    "sop": ("A comes before B", "B comes before A"),
}
PAIR_ASKS = {  # the question under the pair, to the student
    "nsp": "Does the model think B follows A, or that B is a random sentence?",
    "sop": "Does the model think A comes before B (their order in the text), or that they are swapped?",
}
NSP_CHOICES = PAIR_CHOICES["nsp"]
DEFAULT_K = 10  # the model's guesses kept for a [MASK] question


def mask_question(model: torch.nn.Module, tok: Tokenizer, text: str, k: int = DEFAULT_K) -> Question:
    """A fill-the-[MASK] question: `text` with exactly one [MASK], and the model's top `k` guesses."""
    text = normalise_masks(" ".join(str(text).split()), tok)
    predictions = fill_mask(model, tok, text, k)
    if len(predictions) != 1:
        m = tok.mask_token
        raise InputError(f"The sentence has {len(predictions)} {m}s: a class question hides one word. "
                         f"Keep one {m} (e.g. 'The cat sat on the {m}.').")
    return Question("mask", text,
                    model=[(c.token, c.probability) for c in predictions[0].candidates])


def pair_objective(model: torch.nn.Module) -> str:
    """The pre-training objective of `model`'s sentence-pair head: "sop" (ALBERT's sentence order) or
    "nsp" (BERT's next sentence; also what a model without such a head is asked, and refuses)."""
    return model.family.pair_task or "nsp"


def pair_choices(question: Question) -> tuple[str, str]:
    """The two answers of a pair question, in their fixed order (never the model's ranking)."""
    asked = {answer for answer, _ in question.model}
    return next((c for c in PAIR_CHOICES.values() if set(c) == asked), NSP_CHOICES)


def pair_ask(question: Question) -> str:
    """The question under a pair, as the model's objective asks it."""
    return PAIR_ASKS["sop" if pair_choices(question) == PAIR_CHOICES["sop"] else "nsp"]


def nsp_question(model: torch.nn.Module, tok: Tokenizer, a: str, b: str) -> Question:
    """A sentence-pair question as the model's pair head was pre-trained (`pair_objective`): for BERT
    does B follow A, for ALBERT are A and B in order; the head's two probabilities, in PAIR_CHOICES order
    (logit 0 is IsNext / in order)."""
    result = next_sentence(model, tok, a, b)
    yes, no = PAIR_CHOICES[pair_objective(model)]
    return Question("nsp", " ".join(a.split()), " ".join(b.split()), model=[
        (yes, result.is_next_probability), (no, result.not_next_probability)])


def tally(answers: dict[str, str]) -> list[tuple[str, int]]:
    """(guess, students) pairs, most frequent first (ties alphabetical)."""
    return sorted(Counter(answers.values()).items(), key=lambda item: (-item[1], item[0]))


def model_rank(question: Question, guess: str) -> tuple[int, float] | None:
    """(rank, probability) of `guess` among the model's answers (1 = its top one), or None when it is
    not among them. Matches the guess as counted (case folded)."""
    for rank, (answer, probability) in enumerate(question.model, start=1):
        if normalise_guess(answer) == guess:
            return rank, probability
    return None


def verdict(question: Question, guess: str | None) -> str:
    """One line for a student once the question is revealed: how the model rated their guess."""
    if guess is None:
        return "You did not send a guess for this one."
    found = model_rank(question, guess)
    top = question.model[0][0] if question.model else "?"
    if found is None:
        return (f"You guessed {echo(guess, 30)}: not among the model's top {len(question.model)} "
                f"(its top answer is '{top}').")
    rank, probability = found
    where = "the model's top answer" if rank == 1 else f"the model's number {rank} (its top answer is '{top}')"
    return f"You guessed {echo(guess, 30)}: {where}, at {probability:.0%}."


class AnswerHeld(Exception):
    """A view was asked for the model's guess for the live class question's sentence before the reveal
    (bertlab.panels.classroom.AnswerHold raises it; `Panel.reporting` shows it as a note, not an error)."""


_HIDDEN = "\x00"  # stands for the mask token while sentences are compared


def _words(text: str, mask_token: str) -> list[str]:
    text = str(text).replace(mask_token, f" {_HIDDEN} ").casefold()
    return re.findall(rf"{_HIDDEN}|\w+", text)


def same_sentence(text: str, question_text: str, mask_token: str) -> bool:
    """Whether `text` is the question's sentence as far as the model's answer goes: the same words
    (case, spaces and punctuation aside) wherever the question shows one, and anything (a mask, a
    guess, the answer) where it hides one. `mask_token`: the tokenizer's, in both texts."""
    asked, typed = _words(question_text, mask_token), _words(text, mask_token)
    if _HIDDEN not in asked or len(asked) != len(typed):
        return False
    return all(a == t or _HIDDEN in (a, t) for a, t in zip(asked, typed))
