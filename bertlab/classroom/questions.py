"""Questions the teacher pushes, with the model's answer from the analysis functions, and what the
class answered (pure: model and text in, a `Question` or a tally out)."""

from __future__ import annotations

from collections import Counter

import torch

from bertlab.analysis import InputError, echo, normalise_masks
from bertlab.analysis.mask import fill_mask
from bertlab.analysis.nsp import next_sentence
from bertlab.classroom.store import Question, normalise_guess
from bertlab.tokenizer import Tokenizer

NSP_CHOICES = ("B follows A", "B is random")  # what students pick for a pair; the model's two verdicts
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


def nsp_question(model: torch.nn.Module, tok: Tokenizer, a: str, b: str) -> Question:
    """A does-B-follow-A question, and the NSP head's two probabilities (in NSP_CHOICES order)."""
    result = next_sentence(model, tok, a, b)
    return Question("nsp", " ".join(a.split()), " ".join(b.split()), model=[
        (NSP_CHOICES[0], result.is_next_probability), (NSP_CHOICES[1], result.not_next_probability)])


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
