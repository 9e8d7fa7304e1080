"""Small helpers that training, analysis and viz all need, kept below all of them (they import only torch):
a seed derived from a run seed, the model's device and length limit, dropout off for a reading."""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from typing import Any, Iterator

import torch

log = logging.getLogger(__name__)


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of ints/strings: independent streams from one run seed."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Switch dropout off for a reading, then restore the model's mode."""
    was_training = model.training
    if not was_training:  # the usual case in the panels: no need to walk every module again
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def max_tokens(model: torch.nn.Module) -> int:
    """How many tokens the model reads at most."""
    return model.config.max_position_embeddings - model.config.position_offset


def cap_threads() -> int | None:
    """Hold torch to `BERTLAB_THREADS` threads (intra-op and inter-op), so that many kernels share
    the cores instead of each taking them all; returns the cap (None: unset, torch's default kept)."""
    from bertlab.settings import threads

    n = threads()
    if n is None:
        return None
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # settable once, before any inter-op work: a kernel that ran torch already
        log.info("torch's inter-op threads were already set; the intra-op cap (%d) applies", n)
    return n
