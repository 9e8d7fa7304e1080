"""What a compressed model costs and keeps: size (in memory and on disk), CPU latency, task score.

    row = measure(model, tok, "int8", sentences, score=lambda m: evaluate_set(m, dev)["accuracy"])
    row.as_dict()     # {"name": "int8", "memory_mb": ..., "latency_ms_b1": ..., "score": ...}
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertlab.compressed.structure import describe_compression, heads_per_layer, int8_parts, is_int8_linear
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tokenizer import Tokenizer

MB = 2**20


def memory_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take in memory: parameters and buffers (each tied tensor once), and
    the int8 layers' packed weights (1 byte a weight + a float32 scale per row) and biases."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    for m in model.modules():
        if is_int8_linear(m):
            q, scale, bias = int8_parts(m)
            total += q.numel() + scale.numel() * 4 + (bias.numel() * 4 if bias is not None else 0)
    return total


def disk_bytes(folder: str | Path) -> int:
    """Bytes of a saved model's weight files (model.safetensors, shards or pytorch_model.bin)."""
    folder = Path(folder)
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.is_file() and (p.suffix == ".safetensors" or p.name.startswith("pytorch_model")))


def timing_batches(tok: Tokenizer, sentences: Sequence[str], batch_size: int, reps: int,
                   max_length: int = 128) -> list:
    """`reps` + 1 encoded batches of `batch_size` sentences each (the first for warming up), taken in turn
    from `sentences` (cycling), each padded to its longest: what `latency_ms` times."""
    n = len(sentences)
    return [tok.encode_batch([sentences[(r * batch_size + i) % n] for i in range(batch_size)], max_length=max_length)
            for r in range(reps + 1)]


def latency_ms(model: nn.Module, tok: Tokenizer, sentences: Sequence[str], batch_size: int = 1,
               reps: int = 5, max_length: int = 128) -> float:
    """Median wall time (ms) of one forward pass over a batch of `batch_size` sentences, over `reps`
    different batches (see `timing_batches`) after one warm-up pass; on the model's device, with
    torch's current thread count."""
    return statistics.median(latency_samples(model, tok, sentences, batch_size, reps, max_length))


@torch.inference_mode()
def latency_samples(model: nn.Module, tok: Tokenizer, sentences: Sequence[str], batch_size: int = 1,
                    reps: int = 5, max_length: int = 128) -> list[float]:
    """The wall time (ms) of each of `reps` forward passes that `latency_ms` takes the median of."""
    device = model_device(model)
    batches = [tuple(t.to(device) for t in (b.input_ids, b.token_type_ids, b.attention_mask))
               for b in timing_batches(tok, sentences, batch_size, reps, max_length)]
    times = []
    with eval_mode(model):
        model(*batches[0])
        for batch in batches[1:]:
            t0 = time.perf_counter()
            model(*batch)
            times.append((time.perf_counter() - t0) * 1000)
    return times


@torch.inference_mode()
def samples_in_turns(models: Sequence[nn.Module], tok: Tokenizer, sentences: Sequence[str], batch_size: int = 1,
                     reps: int = 5, max_length: int = 128) -> list[list[float]]:
    """The wall times (ms) of each model's `reps` forward passes, the models taking turns batch by batch on
    the same batches (the order rotating), after one warm-up pass each: load on the machine hits them alike."""
    batches = [(b.input_ids, b.token_type_ids, b.attention_mask)
               for b in timing_batches(tok, sentences, batch_size, reps, max_length)]
    times: list[list[float]] = [[] for _ in models]
    for model in models:
        model(*batches[0])
    for r, batch in enumerate(batches[1:]):
        order = list(range(len(models)))
        for i in order[r % len(order):] + order[:r % len(order)]:
            t0 = time.perf_counter()
            models[i](*batch)
            times[i].append((time.perf_counter() - t0) * 1000)
    return times


def latency_fields(samples: dict[int, list[float]]) -> dict[str, Any]:
    """A Variant's latency fields (median and fastest–slowest by batch size) from timed samples by batch size."""
    out: dict[str, Any] = {}
    for b, times in samples.items():
        out[f"latency_ms_b{b}"] = statistics.median(times)
        out[f"latency_range_b{b}"] = (min(times), max(times))
    return out


@torch.inference_mode()
def matmul_flops(model: nn.Module, tok: Tokenizer, sentences: Sequence[str], max_length: int = 128) -> int:
    """Floating-point operations of the model's matrix products (torch's FlopCounterMode) over one forward
    pass of each of `sentences` at batch 1: the work a compression can take away."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model).eval()  # weights that need no gradient: the counter's module tracker then
    for p in probe.parameters():  # leaves a weight handed on as it is (DeBERTa's relative embeddings) alone
        p.requires_grad_(False)
    device = model_device(probe)
    total = 0
    for text in sentences:
        b = tok.encode_batch([text], max_length=max_length)
        with FlopCounterMode(display=False) as counter:
            probe(*(t.to(device) for t in (b.input_ids, b.token_type_ids, b.attention_mask)))
        total += counter.get_total_flops()
    return total


def embedding_parameters(model: nn.Module) -> int:
    """Parameters of the embedding tables (each tied table once)."""
    seen = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(seen.values())


@dataclass
class Variant:
    """One model of a comparison: what it is, what it weighs, how fast, how good."""

    name: str
    method: str  # "original", "int8", "pruned", "distilled" (or a combination)
    parameters: int  # float parameters + int8 weights, each counted once
    memory_mb: float
    disk_mb: float | None  # its saved folder's weights; None when not saved
    latency_ms_b1: float | None
    latency_ms_b32: float | None
    score: float | None  # the task's main metric on held-out examples (0-1)
    metric: str = "accuracy"
    layers: int = 0
    heads: int = 0
    note: str = ""
    folder: str | None = None
    latency_range_b1: tuple[float, float] | None = None  # fastest and slowest of the timed batches (ms)
    latency_range_b32: tuple[float, float] | None = None
    eval_examples: int | None = None  # how many held-out examples `score` was measured on
    eval_key: str = ""  # which examples: two scores compare only when their keys are equal

    def as_dict(self) -> dict:
        return asdict(self)


def count_parameters(model: nn.Module) -> int:
    seen: set[int] = set()
    n = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    for m in model.modules():
        if is_int8_linear(m):
            q, _, bias = int8_parts(m)
            n += q.numel() + (bias.numel() if bias is not None else 0)
    return n


def measure(model: nn.Module, tok: Tokenizer, name: str, method: str, sentences: Sequence[str],
            score: Callable[[nn.Module], float] | None = None, folder: str | Path | None = None,
            reps: int = 5, batch_sizes: Sequence[int] = (1, 32), metric: str = "accuracy") -> Variant:
    """A `Variant` row for `model`: sizes, median latency at batch 1 and 32 (0 in `batch_sizes` skips),
    and `score(model)` when given."""
    length = min(128, input_limit(model, tok))  # a small model may read fewer tokens than the sentences have
    samples = {b: latency_samples(model, tok, sentences, b, reps, length) for b in batch_sizes if b}
    lat = {b: statistics.median(times) for b, times in samples.items()}
    spread = {b: (min(times), max(times)) for b, times in samples.items()}
    return Variant(
        name=name, method=method, parameters=count_parameters(model), memory_mb=memory_bytes(model) / MB,
        disk_mb=disk_bytes(folder) / MB if folder is not None else None,
        latency_ms_b1=lat.get(1), latency_ms_b32=lat.get(32), score=score(model) if score is not None else None,
        metric=metric, layers=model.family.num_layers, heads=sum(heads_per_layer(model)),
        note=describe_compression(model), folder=str(folder) if folder is not None else None,
        latency_range_b1=spread.get(1), latency_range_b32=spread.get(32),
    )


__all__ = ["MB", "Variant", "count_parameters", "disk_bytes", "latency_ms", "latency_samples", "measure",
           "memory_bytes", "timing_batches", "matmul_flops", "embedding_parameters", "samples_in_turns",
           "latency_fields"]
