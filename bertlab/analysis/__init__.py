"""Pure computations behind the panels: model + tokenizer + text in, dataclasses out."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from bertlab.model import Bert


class InputError(ValueError):
    """Text a panel cannot use (empty, no [MASK], empty second sentence, ...); the message is for the student."""


def require_text(text: str | None, what: str = "text") -> str:
    """`text` unchanged, or an InputError saying what is missing when it is empty or blank."""
    if text is None or not str(text).strip():
        raise InputError(f"The {what} is empty: type a sentence first.")
    return str(text)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Switch dropout off for a reading, then restore the model's mode."""
    was_training = model.training
    if not was_training:  # the usual case in the panels: walking every module again costs ~4 ms
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def max_tokens(model: "Bert") -> int:
    """How many tokens the model reads at most."""
    return model.config.max_position_embeddings - model.config.position_offset
