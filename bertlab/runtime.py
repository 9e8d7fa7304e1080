"""Small helpers that training, analysis, viz and the panels all need, kept below all of them (they import only
torch): a seed derived from a run seed, the model's device and length limit, dropout off for a reading, the
device a run trains on, memory handed back after a run, and the one out-of-memory message."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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


def input_limit(model: torch.nn.Module, tok: Any) -> int:
    """How many tokens one input to `model` may have: the tokenizer's limit or the model's positions,
    whichever is less."""
    return min(tok.model_max_length, max_tokens(model))


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


def resolve_device(name: str = "auto") -> torch.device:
    """The device a run trains on: "auto" is cuda:LOCAL_RANK when CUDA is available, else cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available here; use device='auto'.")
    return device


def describe_device(device: torch.device) -> str:
    """Where work runs, as a student reads it: "cuda:0 (the GPU's name)" or "cpu (N threads)"."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name()})"
    return f"cpu ({torch.get_num_threads()} threads)"


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`) and the GPU's cached
    blocks to the driver; False where there is no `malloc_trim`.

    Batches of changing shapes (dynamic padding) leave holes in the heap that glibc keeps, and a finished
    training thread's optimizer state stays in that thread's arena: a kernel that goes on living (a
    notebook, a class) then holds gigabytes it no longer uses. Trimming hands them back.
    """
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once; None elsewhere (macOS, Windows, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def is_out_of_memory(error: BaseException | str | None) -> bool:
    """Whether an exception (or a failed run's error text) is the GPU running out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return error is not None and re.search(r"out of (gpu )?memory", str(error), re.IGNORECASE) is not None


def out_of_memory_text(batch_size: int, max_length: int | None, step: int | None = None) -> str:
    """What to do when a run ran out of GPU memory: the one message the loop and every panel give."""
    length = max_length or 128
    at = f" at step {step}" if step is not None else ""
    return (f"Out of GPU memory with batches of {batch_size} × up to {length} tokens{at}. Try a smaller batch "
            f"(e.g. {max(1, batch_size // 2)}) with gradients accumulated over 2 batches to keep the effective "
            f"batch, or shorter sequences (max length {max(32, length // 2)}), then start again. Earlier runs and "
            f"saved models are not affected.")
