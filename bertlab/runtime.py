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
import threading
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


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class HeapCreep:
    """When a CPU training run trims the C heap between steps: only once the process's resident memory has crept
    past what the run's first steps settled on (more than `growth` times it plus `slack`), then it learns the level
    afresh from the next `settle` steps. Batches of changing shapes leave holes in a kept heap (`kept_heap`) that
    can add up to gigabytes over a long run (a long QA run once did); a trim hands them back, and the next step
    faults its memory in again, page by page, so trimming on a fixed count of steps costs every run that never
    creeps. Where resident memory cannot be read (not Linux),
    it trims every `every` steps. `after_step()` says whether it trimmed."""

    def __init__(self, every: int, trim: Callable[[], object], *, growth: float = 1.5, slack: int = 128 * 2**20,
                 settle: int = 3, resident: Callable[[], int | None] | None = None) -> None:
        self.every, self.trim, self.growth, self.slack, self.settle = every, trim, growth, slack, settle
        self.resident = resident or resident_bytes
        self.steps = 0  # steps seen
        self.level = 0  # the largest resident memory over the steps that settled it
        self.settled = 0  # steps that went into `level` since the start or the last trim
        self.trims = 0

    def after_step(self) -> bool:
        self.steps += 1
        now = self.resident()
        if now is None:
            due = self.steps % self.every == 0
        elif self.settled < self.settle:
            self.level, self.settled = max(self.level, now), self.settled + 1
            due = False
        else:
            due = now > self.level * self.growth + self.slack
        if due:
            self.trim()
            self.trims += 1
            self.level = self.settled = 0
        return due


# glibc's mallopt parameters (malloc.h) and what a training run sets them to
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_MMAP_THRESHOLD = 32 * 2**20  # the largest glibc takes on 64-bit: blocks up to 32 MiB come from the heap
HEAP_KEPT = 2**31 - 1  # free memory at the heap's top that glibc keeps instead of handing back (an int's largest)
HEAP_AFTER = 64 * 2**20  # after a run: what glibc's own adaptive threshold reaches once 32 MiB blocks are freed


@contextmanager
def kept_heap() -> Iterator[bool]:
    """While a CPU training run lasts, glibc keeps the memory a step frees for the next step, instead of handing it
    back to the system and faulting it in again, page by page, in the next (its adaptive thresholds do so until they
    settle on a workload's sizes, and again when the sizes change): blocks up to 32 MiB come from the heap and its
    free top is kept. Afterwards the heap is trimmed (`release_free_memory`) and a modest threshold set back.
    Yields whether it applies (glibc only)."""
    mallopt = _mallopt()
    if mallopt is None:
        yield False
        return
    with _HEAP_RUNS.lock:  # the setting is the process's: the last of several runs at once sets it back
        _HEAP_RUNS.count += 1
        mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, HEAP_KEPT)
    try:
        yield True
    finally:
        with _HEAP_RUNS.lock:
            _HEAP_RUNS.count -= 1
            last = _HEAP_RUNS.count == 0
            if last:
                mallopt(M_TRIM_THRESHOLD, HEAP_AFTER)
        if last:
            release_free_memory()


class _HeapRuns:
    """How many `kept_heap` blocks are open in this process (the glibc setting is process-wide)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0


_HEAP_RUNS = _HeapRuns()


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, looked up once; None elsewhere (macOS, Windows, musl)."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


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
