"""One compression method from start to saved folder, as the Compression tab and the CLI run it.

    data = TaskData.read("sst2", tok, model, data=None, max_dev=872)     # held-out dev examples
    made = run_quantize(model, tok, data, out_dir="runs/int8")            # -> CompressedModel(model, variant, ...)
    made = run_prune(model, tok, data, keep=0.5, out_dir=..., on_point=...)
    made = run_distill(model, tok, data, DistillConfig(layers=3), out_dir=..., callbacks=[...])

Every method scores its result on the same held-out examples (never trained on; the
fine-tuning lab's dev part, or its seeded 10 % when the data has none) and measures size and
CPU latency, so the variants of a session compare in one table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from bertlab.compress.distill import DistillConfig, distill
from bertlab.compress.measure import (
    MB,
    Variant,
    count_parameters,
    embedding_parameters,
    latency_fields,
    matmul_flops,
    measure,
    samples_in_turns,
)
from bertlab.compress.onnx import OnnxRuntimeModel, export_int8, onnx_missing
from bertlab.compress.prune import CurvePoint, accuracy_curve, head_importance, heads_to_prune, prune
from bertlab.compress.quantize import quantize
from bertlab.compressed.storage import save_compressed
from bertlab.compressed.structure import CompressError, is_compressed, quantization_info
from bertlab.runtime import max_tokens
from bertlab.tasks import Task, collate, get_task, read_train_dev, subset
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.finetune import DEFAULT_MAX_LENGTH, EvalSet, evaluate_set, featurize, require_task_head
from bertlab.training.loop import TrainEvent

log = logging.getLogger(__name__)

METHODS = ("quantize", "prune", "distill")
IMPORTANCE_EXAMPLES = 256  # training examples the head scores average over
LATENCY_SENTENCES = 160  # dev sentences the latency is timed on (cycled)
WORK_SENTENCES = 8  # dev sentences a pruned model's matmul work is counted on
PLAIN_SENTENCES = ["the film was a delight from start to end .", "a dull , tired story with nothing new ."]  # no head


@dataclass
class TaskData:
    """A task's training examples (for head scores and distillation) and held-out dev examples (for
    every score), read once per session."""

    task: Task
    train: list[Any]
    dev: list[Any]
    eval_set: EvalSet
    note: str
    data: str | None = None  # where they came from (None = BERTLAB_DATA)

    @classmethod
    def read(cls, task: str, tok: Tokenizer, model: nn.Module, data: str | None = None,
             eval_data: str | None = None, max_train: int | None = None, max_dev: int | None = None,
             seed: int = 0, max_length: int | None = None,
             split: Any | None = None) -> TaskData:
        """Read `task`'s data (or take `split`, a DataSplit read before) and featurize the dev part."""
        t = get_task(task)
        require_task_head(model, t)
        split = split if split is not None else read_train_dev(t, data, eval_data, seed)
        train, dev = subset(split.train, max_train, seed, "train"), subset(split.dev, max_dev, seed, "dev")
        if not dev:
            raise CompressError(f"no held-out {t.name} examples to score on: give data with a dev part.")
        length = min(max_length or DEFAULT_MAX_LENGTH[t.head], max_tokens(model))
        eval_set = EvalSet.build(t, dev, tok, length, dict(model.config.id2label), None, 64)
        return cls(t, train, dev, eval_set, split.note, data)

    @property
    def key(self) -> str:
        """Which dev examples these are: scores compare only between models scored on the same key."""
        digest = hashlib.sha256("\n".join(str(getattr(e, "guid", i)) for i, e in enumerate(self.dev)).encode())
        return f"{self.task.name}:{len(self.dev)}:{digest.hexdigest()[:16]}"

    def score(self, model: nn.Module) -> float:
        """The task's main metric (accuracy for SST-2) on the dev examples, 0-1."""
        return float(evaluate_set(model, self.eval_set)[self.task.main_metric])

    def sentences(self, n: int = LATENCY_SENTENCES) -> list[str]:
        """Dev texts for timing (the first sentence of a pair)."""
        texts = [getattr(ex, "text_a", None) or " ".join(getattr(ex, "words", [])) for ex in self.dev[:n]]
        return [t for t in texts if t] or ["a short sentence to time the model on ."]

    def batches(self, tok: Tokenizer, model: nn.Module, n: int = IMPORTANCE_EXAMPLES,
                batch_size: int = 32, seed: int = 0) -> list[dict]:
        """Collated labelled batches of `n` training examples (never the dev ones)."""
        examples = subset(self.train, n, seed, "importance")
        if not examples:
            raise CompressError(f"no {self.task.name} training examples to score the heads on.")
        length = min(DEFAULT_MAX_LENGTH[self.task.head], max_tokens(model))
        feats = featurize(self.task, examples, tok, length, dict(model.config.id2label))
        return [collate(feats[i:i + batch_size], pad_token_id=tok.pad_token_id)
                for i in range(0, len(feats), batch_size)]


def check_method(method: str, model: nn.Module) -> None:
    """A CompressError saying what to pick instead when `method` cannot start from `model`."""
    if method not in METHODS:
        raise CompressError(f"unknown method {method!r}: pick {', '.join(METHODS)}.")
    if method == "quantize" and quantization_info(model):
        raise CompressError("this model is int8 already: pick the float model it came from.")
    if method == "prune" and quantization_info(model):
        raise CompressError("this model is int8: prune the float model it came from, then quantize.")
    if method == "distill" and is_compressed(model):
        raise CompressError("distil from a float teacher: this one has pruned heads or int8 weights.")
    if method == "distill" and model.family.num_layers < 2:
        raise CompressError("a one-layer model has no fewer layers to distil into.")


@dataclass
class CompressedModel:
    """A compressed model and its row of the comparison (plus the pruning curve, when pruned)."""

    model: nn.Module
    variant: Variant
    curve: list[CurvePoint] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    peer: Variant | None = None  # the same int8 model exported to ONNX and run by ONNX Runtime, timed beside it
    peer_note: str = ""  # why there is no peer row (onnxruntime not installed)


def measure_variant(model: nn.Module, tok: Tokenizer, data: TaskData | None, name: str, method: str,
                    folder: str | Path | None = None, reps: int = 5,
                    batch_sizes: Sequence[int] = (1, 32)) -> Variant:
    """The comparison row of `model`: sizes, latency at batch 1 and 32, score on the dev examples (and
    which examples those were). `data` None (a model with no task head to score): size and latency only,
    timed on PLAIN_SENTENCES."""
    if data is None:
        return measure(model, tok, name, method, PLAIN_SENTENCES, folder=folder, reps=reps, batch_sizes=batch_sizes)
    variant = measure(model, tok, name, method, data.sentences(), score=data.score, folder=folder, reps=reps,
                      batch_sizes=batch_sizes, metric=data.task.main_metric)
    return dataclasses.replace(variant, eval_examples=len(data.dev), eval_key=data.key)


def save_variant(model: nn.Module, tok: Tokenizer, out_dir: str | Path | None) -> Path | None:
    """Save a variant (compressed format when pruned or int8, HF layout otherwise); None: not saved."""
    if out_dir is None:
        return None
    if is_compressed(model):
        return save_compressed(model, tok, out_dir)
    return save_model_atomically(model, tok, out_dir)


def run_quantize(model: nn.Module, tok: Tokenizer, data: TaskData | None, out_dir: str | Path | None = None,
                 name: str = "int8", reps: int = 5, batch_sizes: Sequence[int] = (1, 32),
                 onnx: bool = True) -> CompressedModel:
    """Quantize `model` to int8 and measure it; `onnx` (and a task head to score, and onnxruntime installed):
    export it to ONNX beside its weights and time ONNX Runtime's int8 side by side with torch's (in turns, the
    same sentences), scored on the same dev examples (`CompressedModel.peer`)."""
    small = quantize(model)
    folder = save_variant(small, tok, out_dir)
    missing = onnx_missing() if onnx and data is not None else None
    if not onnx or data is None or missing:
        made = CompressedModel(small, measure_variant(small, tok, data, name, "int8", folder, reps, batch_sizes))
        made.peer_note = missing or ""
        return made
    variant = measure_variant(small, tok, data, name, "int8", folder, reps, batch_sizes=())
    with tempfile.TemporaryDirectory(prefix="bertlab-onnx-") as scratch:  # the session reads its file at the start
        try:
            files = export_int8(small, tok, folder if folder is not None else scratch)
            peer = OnnxRuntimeModel(files.int8, small)
        except Exception as e:  # an operator the exporter cannot write: torch's row stands alone, said plainly
            log.warning("ONNX export of the int8 model failed", exc_info=True)
            note = f"The int8 model could not be exported to ONNX ({type(e).__name__}: {str(e)[:200]}): " \
                   "torch's int8 row stands alone."
            made = CompressedModel(small, measure_variant(small, tok, data, name, "int8", folder, reps, batch_sizes))
            made.peer_note = note
            return made
        size_mb = files.int8.stat().st_size / MB
    length = min(128, max_tokens(small))
    timed = {b: samples_in_turns([small, peer], tok, data.sentences(), b, reps, length) for b in batch_sizes if b}
    variant = dataclasses.replace(variant, **latency_fields({b: t[0] for b, t in timed.items()}))
    peer_row = dataclasses.replace(variant, name=f"{name} (ONNX Runtime)", method="int8 (onnxruntime)",
                                   disk_mb=size_mb, memory_mb=size_mb,
                                   folder=str(files.int8) if folder is not None else None, score=data.score(peer),
                                   note="exported to ONNX, run by ONNX Runtime (dynamic int8, per-row weights)",
                                   **latency_fields({b: t[1] for b, t in timed.items()}))
    return CompressedModel(small, variant, peer=peer_row)


def run_prune(model: nn.Module, tok: Tokenizer, data: TaskData, keep: float = 0.5,
              out_dir: str | Path | None = None, name: str | None = None,
              fractions: Sequence[float] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1),
              on_point: Callable[[CurvePoint], None] | None = None,
              progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None,
              reps: int = 5, batch_sizes: Sequence[int] = (1, 32), importance_examples: int = IMPORTANCE_EXAMPLES
              ) -> CompressedModel:
    """Score the heads (Michel et al.) on training examples, draw the dev score against heads kept,
    and prune to `keep` (the fraction of heads kept)."""
    scores = head_importance(model, data.batches(tok, model, importance_examples), progress=progress, cancel=cancel)
    curve = accuracy_curve(model, scores, data.score, fractions, on_point=on_point, cancel=cancel)
    if cancel is not None and cancel.is_set():
        raise CompressError("cancelled: nothing was pruned.")
    small = prune(model, scores, keep)
    folder = save_variant(small, tok, out_dir)
    gone = heads_to_prune(model, scores, keep)
    variant = measure_variant(small, tok, data, name or f"pruned {keep:.0%}", "pruned", folder, reps, batch_sizes)
    timed = data.sentences(WORK_SENTENCES)
    length = min(128, max_tokens(model))
    shares = {"weights_removed": 1 - count_parameters(small) / count_parameters(model),
              "embeddings_share": embedding_parameters(model) / count_parameters(model),
              "work_removed": 1 - matmul_flops(small, tok, timed, length) / matmul_flops(model, tok, timed, length)}
    return CompressedModel(small, variant, curve, {"pruned_heads": {str(k): v for k, v in gone.items()}, **shares})


def pruned_why(row: dict[str, Any], base: dict[str, Any], summary: dict[str, Any]) -> str:
    """Plain words for a pruned row whose size or speed barely moved (or got worse) against `base`, from what was
    measured: the share of the weights and of the matmul work pruning took away, and the two timings. "" when the
    row is clearly smaller and faster."""
    if "weights_removed" not in summary:
        return ""
    size = (row.get("disk_mb") or row["memory_mb"]) / (base.get("disk_mb") or base["memory_mb"])
    b1, base_b1 = row.get("latency_ms_b1"), base.get("latency_ms_b1")
    speed = base_b1 / b1 if b1 and base_b1 else None
    if size <= 0.8 and (speed is None or speed >= 1.1):
        return ""

    def share(x: float) -> str:
        return f"{x:.0%}" if x >= 0.01 else "under 1%"

    parts = [f"Pruning removes only the dropped heads' query, key, value and output weights: "
             f"{share(summary['weights_removed'])} of this model's weights (the embeddings, "
             f"{share(summary['embeddings_share'])} of it, and the feed-forward layers stay), and "
             f"{share(summary['work_removed'])} of its matmul work per sentence."]
    if speed is not None and speed < 1.1:
        spread, base_spread = row.get("latency_range_b1"), base.get("latency_range_b1")
        overlap = bool(spread and base_spread) and spread[0] <= base_spread[1] and base_spread[0] <= spread[1]
        if overlap:
            parts.append(f"A time {summary['work_removed']:.0%} shorter at most is within how much the timings "
                         f"vary here (fastest–slowest in the table): the two cannot be told apart.")
        else:
            parts.append(f"It timed {speed:.2f}× the original's speed: the two were timed at different moments, "
                         f"so a change in this machine's load shows as a difference the models do not have; at "
                         f"best it would run {1 / (1 - summary['work_removed']):.2f}× as fast, if the time were "
                         f"all matmul work.")
    return " ".join(parts)


def run_distill(model: nn.Module, tok: Tokenizer, data: TaskData, cfg: DistillConfig,
                out_dir: str | Path | None = None, name: str | None = None,
                callbacks: Sequence[Callable[[TrainEvent], None]] = (), cancel: threading.Event | None = None,
                reps: int = 5, batch_sizes: Sequence[int] = (1, 32)) -> CompressedModel:
    """Distil `model` into a `cfg.layers`-layer student on `data`'s training examples (scored on its dev ones)."""
    cfg = dataclasses.replace(cfg, task=data.task.name, out_dir=str(out_dir) if out_dir is not None else None)
    result = distill(model, tok, cfg, callbacks, cancel, train_examples=data.train, eval_examples=data.dev)
    if result.status == "failed":
        raise CompressError(f"distillation failed: {result.train.error}")
    if result.status == "cancelled" or result.train.step == 0:  # a half-trained student is no variant to compare
        raise CompressError(f"cancelled after step {result.train.step} of {result.train.total_steps}: the "
                            "half-trained student is not kept.")
    result.student.cpu()  # latency is measured on the CPU, like every variant's
    variant = measure_variant(result.student, tok, data, name or f"student {cfg.layers} layers", "distilled",
                              result.saved_to, reps, batch_sizes)
    return CompressedModel(result.student, variant, summary=result.summary())


LATENCY_FIELDS = ("latency_ms_b1", "latency_ms_b32", "latency_range_b1", "latency_range_b32")


class Comparison:
    """A session's comparison table: its rows (dicts of `Variant.as_dict()`), each variant's with the row of
    the model it came from (`baseline`), an original measured once per model and dev examples; every row
    named after the model it came from (`named`: its name in the model list), names kept unique. Each model
    is timed once per session: a row of it on other dev examples shows the same latency."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._originals: dict[tuple[int, str], dict[str, Any]] = {}  # (id(model), dev key) -> its row
        self._timings: dict[int, tuple[nn.Module, dict[str, Any]]] = {}  # id(model) -> (model, its latency fields)

    def timing(self, model: nn.Module) -> dict[str, Any] | None:
        """The latency fields `model` was timed with in this session, or None."""
        kept = self._timings.get(id(model))
        return kept[1] if kept is not None and kept[0] is model else None

    def _keep_timing(self, model: nn.Module, row: dict[str, Any]) -> None:
        if self.timing(model) is None:
            self._timings[id(model)] = (model, {k: row.get(k) for k in LATENCY_FIELDS})

    def original(self, model: nn.Module, tok: Tokenizer, data: TaskData | None, named: str, reps: int = 5,
                 measuring: Callable[[], None] | None = None) -> dict[str, Any]:
        """The row of the model a run starts from (a variant made here is its own original when compressed
        further), measured and added the first time (`measuring()` is called before): a run on other dev
        examples scores the original again on those, and shows the latency it was timed with before."""
        key = (id(model), data.key if data is not None else "")
        if key not in self._originals:
            if measuring is not None:
                measuring()
            label = f"original ({model.family.num_layers} layers)"
            timed = self.timing(model)
            variant = measure_variant(model, tok, data, self.unique(f"{named}: {label}"), "original", reps=reps,
                                      batch_sizes=() if timed is not None else (1, 32))
            self._originals[key] = {**variant.as_dict(), **(timed or {}), "baseline": None, "label": label}
            self._keep_timing(model, self._originals[key])
            self.rows.append(self._originals[key])
        return self._originals[key]

    def add(self, made: CompressedModel, original: dict[str, Any], named: str) -> dict[str, Any]:
        """Add the row of a variant made from `original`'s model; returns it."""
        row = {**made.variant.as_dict(), "baseline": original}
        row["label"] = row["name"]  # the method's short name, for the plot's markers
        row["name"] = self.unique(f"{named} → {row['name']}")
        row["why"] = pruned_why(row, original, made.summary)
        self.rows.append(row)
        if made.peer is not None:  # ONNX Runtime's run of the same int8 model, side by side
            peer = {**made.peer.as_dict(), "baseline": original, "label": made.peer.name}
            peer["name"] = self.unique(f"{named} → {made.peer.name}")
            self.rows.append(peer)
        self._keep_timing(made.model, row)
        self._originals[(id(made.model), row.get("eval_key", ""))] = row  # compressing it further compares with it
        return row

    def unique(self, name: str) -> str:
        """`name`, or `name #2`, `name #3`, ...: the first no row has."""
        taken, unique, n = {r["name"] for r in self.rows}, name, 2
        while unique in taken:
            unique, n = f"{name} #{n}", n + 1
        return unique


__all__ = ["METHODS", "CompressedModel", "TaskData", "check_method", "measure_variant", "run_distill", "run_prune",
           "run_quantize", "save_variant", "Comparison"]
