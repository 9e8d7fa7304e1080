"""Fine-tuning: a task (SST-2, NLI, STS, NER, QA) -> a task head on an encoder -> the shared loop
-> the task's real metric on the dev split -> a saved model that `bertlab.load` reads back.

    cfg = FinetuneConfig(task="sst2", mode="full", epochs=2, max_train_examples=2000)
    result = finetune(cfg)                 # result.metrics["accuracy"], result.model, result.tokenizer

Three ways to adapt the encoder (`mode`):

- "full": every weight learns;
- "feature": the encoder is frozen, only the head learns: the parts the family names as its task
  head (`model.family.task_head_prefixes`: the pooler + classifier for BERT's sentence classification,
  ModernBERT's `head.` before its classifier, DeBERTa's ContextPooler), the span head for QA;
  with `features` (ner), the BERT paper's feature-based approach instead: word features of the chosen
  layers (embeddings, last, second-to-last, sum or concatenation of the last four, a learned scalar mix),
  computed once and cached, and a linear head trained on them (`training.feature_head`);
- "adapter": Houlsby adapters (bottlenecks of `adapter_size` after attention and after the
  MLP of every layer), all LayerNorms and the head learn; the rest is frozen.

Settings left at None (the start encoder, epochs, lr, batch, length, warm-up) come from the task's
measured defaults in `finetune_defaults.recipe(task, mode)`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bertlab.config import BertConfig
from bertlab.families import ModelFamily, family_for
from bertlab.families.bert import Bert
from bertlab.model import ModelOutput
from bertlab.runtime import derive_seed, eval_mode, max_tokens, model_device
from bertlab.tasks import (
    CONLL_LABELS,
    IGNORE_INDEX,
    BucketBatchSampler,
    Task,
    best_answers,
    collate,
    featurize_classification,
    featurize_ner,
    featurize_qa,
    featurize_regression,
    get_task,
    ner_labels,
    predict_spans,
    read_train_dev,
    subset,
    word_predictions,
)
from bertlab.tasks.layer_features import FEATURES
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import WEIGHTS_FILE, save_model_atomically, write_error, write_text_atomically
from bertlab.training.finetune_defaults import Recipe, recipe
from bertlab.training.loop import ScoredRun, TrainConfig, TrainEvent, TrainResult, resolve_precision, train

log = logging.getLogger(__name__)

MODES = ("full", "feature", "adapter")
DEFAULT_MAX_LENGTH: dict[str, int] = {
    "sequence_classification": 128,
    "token_classification": 128,
    "question_answering": 384,
}
RESULTS_FILE = "finetune_results.json"
CHECKPOINTS = "checkpoints"  # sub-folder of out_dir for the loop's checkpoints


class FinetuneError(ValueError):
    """A fine-tuning run that cannot start or was given a model without the right head."""


# ---------------------------------------------------------------------------------------------
# Configuration and result
# ---------------------------------------------------------------------------------------------
@dataclass
class FinetuneConfig:
    """One fine-tuning run: task, data, model, mode, and the loop's settings."""

    task: str = "sst2"  # sst2 | nli | sts | ner | qa (bertlab.tasks.TASKS)
    data: str | os.PathLike | None = None  # the reader's path (file or folder); None = the copy under BERTLAB_DATA
    # A separate dev file/folder; None = `data`'s dev part, or (a data file without one) a seeded 10 % held out.
    eval_data: str | os.PathLike | None = None
    model: str | os.PathLike | Bert | None = None  # a `bertlab.load` source or a Bert (None = the task's start)
    mode: str = "full"  # "full", "feature" (frozen encoder) or "adapter" (Houlsby adapters)
    adapter_size: int = 64  # bottleneck width in adapter mode
    # Feature mode only: None = the model's own task head on the last layer, trained through the frozen encoder;
    # one of tasks.layer_features.FEATURES = the BERT paper's feature choice, word features cached once and a
    # linear head trained on them (training.feature_head; token tasks: ner).
    features: str | None = None
    # None = the task's measured default (finetune_defaults.recipe(task, mode)), for these five:
    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    eval_batch_size: int = 64
    max_length: int | None = None  # tokens per example (per window for QA)
    max_train_examples: int | None = None  # a seeded random subset, for quick runs
    max_eval_examples: int | None = None
    doc_stride: int | None = None  # QA: tokens shared by consecutive windows (None = featurize_qa's default)
    label_all_pieces: bool = False  # NER: label every piece of a word (B-X -> I-X) instead of the first only
    warmup_ratio: float | None = None  # share of the steps warming the lr up
    weight_decay: float = 0.01
    seed: int = 0
    out_dir: str | None = None  # final model (HF layout) here; checkpoints in out_dir/checkpoints
    eval_every: int | None = None  # steps between dev evaluations; None = once per epoch, 0 = at the end
    checkpoint_every: int = 0  # steps between checkpoints (0 = at the end only; needs out_dir)
    overwrite: bool = False  # start afresh when out_dir/checkpoints already holds checkpoints
    log_every: int = 10
    device: str = "auto"
    precision: str = "auto"  # "auto" (bf16 autocast where the device has native bf16), "bf16" or "fp32"
    extra_train: dict[str, Any] = field(default_factory=dict)  # any other TrainConfig field

    def __post_init__(self) -> None:
        get_task(self.task)  # a clear KeyError for an unknown task
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {self.mode!r}.")
        if self.features is not None:
            _check_features(self.features, self.mode, self.task)
        for name in ("eval_batch_size", "adapter_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}.")
        for name in ("epochs", "batch_size", "max_length", "max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None; got {value}.")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"lr must be positive; got {self.lr}.")
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1); got {self.warmup_ratio}.")

    @property
    def recipe(self) -> Recipe:
        """The task's measured defaults in this mode (what the settings left at None take)."""
        return recipe(self.task, self.mode, self.features)

    def resolved(self) -> FinetuneConfig:
        """A copy with every setting left at None taken from `recipe` (the model too)."""
        r = self.recipe
        fill = {k: getattr(r, k) for k in ("epochs", "lr", "batch_size", "max_length", "warmup_ratio")
                if getattr(self, k) is None}
        if self.model is None:
            fill["model"] = r.model
        return dataclasses.replace(self, **fill)

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else self.recipe.lr

    def sequence_length(self, task: Task) -> int:
        return self.max_length or self.recipe.max_length

    def train_config(self, batches_per_epoch: int) -> TrainConfig:
        """The loop's settings; `batches_per_epoch` (all processes) sets "evaluate once per epoch"."""
        c = self.resolved()
        per_step = int(os.environ.get("WORLD_SIZE", "1")) * int(c.extra_train.get("grad_accum_steps", 1))
        eval_every = max(1, batches_per_epoch // per_step) if c.eval_every is None else c.eval_every
        settings = dict(
            lr=c.learning_rate, weight_decay=c.weight_decay, warmup_ratio=c.warmup_ratio,
            epochs=c.epochs, batch_size=c.batch_size, seed=c.seed, log_every=c.log_every,
            eval_every=eval_every, checkpoint_every=c.checkpoint_every, device=c.device, precision=c.precision,
            out_dir=str(Path(c.out_dir) / CHECKPOINTS) if c.out_dir else None, overwrite=c.overwrite,
        )
        return TrainConfig(**{**settings, **c.extra_train})

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly settings (a Bert given as `model` shows as its one-line description)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(self.model, torch.nn.Module):
            d["model"] = self.model.describe()
        elif self.model is not None:
            d["model"] = str(self.model)
        d["lr"] = self.learning_rate
        return d


def _check_features(features: str, mode: str, task: str) -> None:
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}; got {features!r}.")
    if mode != "feature":
        raise ValueError(f"features {features!r} are a frozen encoder's features: they need mode 'feature' "
                         f"(--mode feature), not {mode!r}.")
    if get_task(task).head != "token_classification":
        raise ValueError(f"the feature choices (BERT's feature-based NER) tag words: use them with the ner task, "
                         f"not {task}; leave features out for {task}'s own head.")


@dataclass
class FinetuneResult(ScoredRun):
    """How a run went: the fine-tuned model, its dev metrics, the curves, the cost."""

    model: Bert  # in eval mode, on the device it trained on
    tokenizer: Tokenizer
    train: TrainResult  # status, training history (loss per log step), last checkpoint
    metrics: dict[str, Any]  # the last dev evaluation (the task's metric, e.g. accuracy or f1)
    history: list[dict[str, Any]]  # one entry per dev evaluation: step, epoch and the float metrics
    main_metric: str  # the name of the metric to rank runs by
    wall_time_s: float
    device: str
    mode: str
    trainable_parameters: int
    total_parameters: int
    train_examples: int
    eval_examples: int
    saved_to: Path | None = None  # the final model folder (or the last checkpoint of a cancelled run)
    data_note: str = ""  # where the train and dev examples came from
    dev_held_out: bool = False  # the dev examples were held out of the training data (no dev part given)
    precision: str = "fp32"  # what the matrix products ran in: "bf16" (autocast) or "fp32"

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (no model): what the CLI prints and out_dir/finetune_results.json holds."""
        return {
            "status": self.status, "error": self.error, "main_metric": self.main_metric, "score": self.score,
            "metrics": self.metrics, "history": self.history, "steps": self.train.step,
            "wall_time_s": round(self.wall_time_s, 2), "device": self.device, "mode": self.mode,
            "trainable_parameters": self.trainable_parameters, "total_parameters": self.total_parameters,
            "train_examples": self.train_examples, "eval_examples": self.eval_examples,
            "data": self.data_note, "dev_held_out": self.dev_held_out, "precision": self.precision,
            "saved_to": str(self.saved_to) if self.saved_to else None,
        }


# ---------------------------------------------------------------------------------------------
# Heads, modes, losses
# ---------------------------------------------------------------------------------------------
def with_task_head(model: Bert, task: Task, id2label: Mapping[int, str] | None = None,
                   adapter_size: int | None = None) -> Bert:
    """A copy of `model` with the task's head (kept when the model already has it with the same
    labels, fresh otherwise), no pre-training heads, and `adapter_size` adapters when asked."""
    id2label = dict(task.id2label if id2label is None else id2label)
    cfg = model.config
    same = cfg.task == task.head and (task.head == "question_answering" or dict(cfg.id2label) == id2label)
    adapters: int | None = -1
    if adapter_size is not None and cfg.adapter_size is None:
        adapters = adapter_size
    elif adapter_size is not None and cfg.adapter_size != adapter_size:
        log.warning("the model already has %d-wide adapters: keeping them (asked for %d).",
                    cfg.adapter_size, adapter_size)
    if cfg.task is not None and not same:  # a different head (or labels): drop it first
        model = model.with_heads((), None, None)
    model = model.with_heads((), task.head, id2label if task.head != "question_answering" else None, adapters)
    extra = {k: v for k, v in model.config.extra.items() if k != "problem_type"}  # a copy: the base keeps its own
    if task.problem_type is not None:  # transformers reads it (regression: MSE on one output)
        extra["problem_type"] = task.problem_type
    model.config.extra = extra
    return model


def regression_output(model: torch.nn.Module) -> torch.nn.Linear:
    """The Linear that gives a one-output sequence head's number (the last one-output Linear of the model,
    in any family's layout: BERT's `classifier`, RoBERTa's `classifier.out_proj`, ...)."""
    found = [m for _, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not found:
        raise FinetuneError("this model has no one-output head to predict a number with.")
    return found[-1]


@torch.no_grad()
def start_at_mean(model: torch.nn.Module, targets: Sequence[float]) -> None:
    """Set a new regression head's bias to the mean training target, so that the first steps learn what
    tells pairs apart rather than where the scale lies (SICK's scores are 1-5; a fresh head gives about 0)."""
    if targets:
        regression_output(model).bias.fill_(sum(targets) / len(targets))


def is_trainable(name: str, mode: str, family: ModelFamily | None = None) -> bool:
    """Whether parameter `name` of a model of `family` (`model.family`; default: the neutral spec's family)
    learns in `mode` (see the module docstring)."""
    if mode == "full":
        return True
    if family is None:
        family = ModelFamily(family_for(BertConfig().model_type), BertConfig())
    head = name.startswith(family.task_head_prefixes)
    if mode == "feature":
        return head
    if mode == "adapter":
        return head or ".adapter." in name or (family.is_layer_norm(name) and name.startswith(family.prefix + "."))
    raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")


def set_trainable(model: Bert, mode: str) -> tuple[int, int]:
    """Freeze what `mode` keeps fixed; returns (trainable, total) parameter counts."""
    trainable = total = 0
    family = model.family
    for name, p in model.named_parameters():
        p.requires_grad = is_trainable(name, mode, family)
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def _forward(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], logits_only: bool = False) -> ModelOutput:
    """logits_only: only the logits are read, so a BERT sentence classifier may compute its last layer
    for [CLS] alone (`all_positions=False`, which every family takes)."""
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], all_positions=not logits_only)


def sequence_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of the [CLS] classifier: logits [batch, labels], labels [batch]."""
    logits = _forward(model, batch, logits_only=True).logits.float()  # [batch, labels]
    loss = F.cross_entropy(logits, batch["labels"])
    return loss, {"accuracy": (logits.argmax(-1) == batch["labels"]).float().mean()}


def regression_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Mean squared error of a one-output head (transformers' regression loss): logits [batch, 1], labels [batch]."""
    predicted = _forward(model, batch, logits_only=True).logits.float().squeeze(-1)  # [batch]
    return F.mse_loss(predicted, batch["labels"].float()), {}


def token_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Token cross-entropy over labelled pieces only (IGNORE_INDEX = -100 skipped): logits [batch, seq, labels]."""
    logits = _forward(model, batch).logits.float()  # [batch, seq, labels]
    labels = batch["labels"]  # [batch, seq]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    scored = labels != IGNORE_INDEX
    correct = (logits.argmax(-1) == labels) & scored
    return loss, {"accuracy": correct.sum() / scored.sum().clamp(min=1)}


def span_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Mean of the start and end cross-entropies over the tokens of each window (padding masked)."""
    out = _forward(model, batch)
    padding = batch["attention_mask"] == 0  # [batch, seq]
    start = out.start_logits.float().masked_fill(padding, torch.finfo(torch.float32).min)  # [batch, seq]
    end = out.end_logits.float().masked_fill(padding, torch.finfo(torch.float32).min)  # [batch, seq]
    loss = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
    hit = (start.argmax(-1) == batch["start_positions"]) & (end.argmax(-1) == batch["end_positions"])
    return loss, {"span_accuracy": hit.float().mean()}


LOSSES: dict[str, Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], tuple[torch.Tensor, dict]]] = {
    "sequence_classification": sequence_loss,
    "token_classification": token_loss,
    "question_answering": span_loss,
}


def loss_for(task: Task) -> Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], tuple[torch.Tensor, dict]]:
    """The training loss of `task`'s head: by head kind, a number's (MSE) for a regression task."""
    return regression_loss if task.regression else LOSSES[task.head]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def featurize(task: Task, examples: Sequence[Any], tokenizer: Tokenizer, max_length: int,
              id2label: Mapping[int, str] | None = None, doc_stride: int | None = None,
              label_all_pieces: bool = False) -> list[Any]:
    """Task features (ClassificationFeature / RegressionFeature / TokenFeature / QAFeature) of `examples`."""
    if task.regression:
        return featurize_regression(examples, tokenizer, max_length=max_length)
    if task.head == "sequence_classification":
        return featurize_classification(examples, tokenizer, max_length=max_length)
    if task.head == "token_classification":
        return featurize_ner(examples, tokenizer, max_length=max_length, id2label=id2label or task.id2label,
                             label_all_pieces=label_all_pieces)
    return featurize_qa(examples, tokenizer, max_length=max_length, doc_stride=doc_stride)


def read_split(task: Task, split: str, path: str | os.PathLike | None) -> list[Any]:
    """The examples of one split, from `path` or the copy under BERTLAB_DATA."""
    return task.read(split, path=path)


def task_labels(task: Task, train_examples: Sequence[Any]) -> dict[int, str]:
    """The task's labels; for NER with tags outside CoNLL's, the tag set of the training data."""
    if task.head != "token_classification":
        return dict(task.id2label)
    tags = {t for ex in train_examples for t in ex.tags}
    if tags <= set(CONLL_LABELS.values()):
        return dict(task.id2label)
    labels = ner_labels(train_examples)
    log.info("the training data uses its own tags: %s", ", ".join(labels.values()))
    return labels


# ---------------------------------------------------------------------------------------------
# Evaluation: the task's real metric
# ---------------------------------------------------------------------------------------------
@dataclass
class EvalSet:
    """Dev examples with their features, made once and scored at each evaluation."""

    task: Task
    examples: list[Any]
    features: list[Any]
    id2label: dict[int, str]
    batch_size: int = 64
    pad_token_id: int = 0

    @classmethod
    def build(cls, task: Task, examples: Sequence[Any], tokenizer: Tokenizer, max_length: int,
              id2label: Mapping[int, str] | None = None, doc_stride: int | None = None,
              batch_size: int = 64) -> EvalSet:
        id2label = dict(task.id2label if id2label is None else id2label)
        feats = featurize(task, examples, tokenizer, max_length, id2label, doc_stride)
        return cls(task, list(examples), feats, id2label, batch_size, tokenizer.pad_token_id)


def _batches(model: torch.nn.Module, features: Sequence[Any], pad_token_id: int,
             batch_size: int) -> Any:
    """(feature indices, ModelOutput) for batches of similar length, longest first."""
    device = model_device(model)
    order = sorted(range(len(features)), key=lambda i: -len(features[i]))
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        batch = collate([features[i] for i in idx], pad_token_id=pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        yield idx, _forward(model, batch, logits_only=True)  # the callers read logits alone


def require_task_head(model: Bert, task: Task) -> None:
    """A FinetuneError naming the head the model has when it lacks `task`'s head."""
    if model.config.task == task.head:
        return
    has = model.config.task.replace("_", " ") if model.config.task else "no task head (an encoder only)"
    raise FinetuneError(
        f"the task {task.name} needs a {task.head.replace('_', ' ')} head, but this model has {has}. "
        f"Fine-tune it for {task.name} first (bertlab finetune --task {task.name} ...), or load a model that was."
    )


@torch.inference_mode()
def evaluate_set(model: torch.nn.Module, data: EvalSet) -> dict[str, Any]:
    """The task's metric of `model` on `data` (accuracy + confusion matrix, entity P/R/F1, or
    SQuAD exact match + F1), plus "examples": how many were scored."""
    model = getattr(model, "module", model)  # a DDP wrapper's model
    require_task_head(model, data.task)
    with eval_mode(model):
        head = data.task.head
        if data.task.regression:
            scores = _eval_regression(model, data)
        elif head == "sequence_classification":
            scores = _eval_classification(model, data)
        elif head == "token_classification":
            scores = _eval_tokens(model, data)
        else:
            scores = _eval_spans(model, data)
    return {**scores, "examples": len(data.examples)}


def _eval_classification(model: Bert, data: EvalSet) -> dict[str, Any]:
    labels = model.config.id2label
    if dict(labels) != data.id2label:
        raise FinetuneError(
            f"this model predicts {', '.join(labels.values())}, but {data.task.name} has the labels "
            f"{', '.join(data.id2label.values())}: it was fine-tuned for another task."
        )
    preds = [0] * len(data.features)
    for idx, out in _batches(model, data.features, data.pad_token_id, data.batch_size):
        for i, p in zip(idx, out.logits.float().argmax(-1).tolist()):
            preds[i] = p
    return data.task.metric(preds, [f.label for f in data.features])


def _eval_regression(model: Bert, data: EvalSet) -> dict[str, Any]:
    if model.config.num_labels != 1:
        raise FinetuneError(
            f"this model predicts {model.config.num_labels} classes ({', '.join(model.config.id2label.values())}), "
            f"but {data.task.name} needs a head with one output (a number): it was fine-tuned for another task."
        )
    preds = [0.0] * len(data.features)
    # in fp32 also under the loop's bf16 autocast: bf16 keeps ~3 digits, so scores 2-4 would come in steps of
    # 1/64 (ties for Spearman), and the run's figure would differ from `bertlab evaluate`'s on the same model
    with torch.autocast(model_device(model).type, enabled=False):
        for idx, out in _batches(model, data.features, data.pad_token_id, data.batch_size):
            for i, p in zip(idx, out.logits.float()[:, 0].tolist()):
                preds[i] = p
    return data.task.metric(preds, [f.target for f in data.features])


def _eval_tokens(model: Bert, data: EvalSet) -> dict[str, Any]:
    labels = model.config.id2label
    if dict(labels) != data.id2label:
        raise FinetuneError(
            f"this model tags {', '.join(labels.values())}, but the data uses {', '.join(data.id2label.values())}."
        )
    tags: list[list[str]] = [[] for _ in data.features]
    for idx, out in _batches(model, data.features, data.pad_token_id, data.batch_size):
        best = out.logits.float().argmax(-1).tolist()  # [batch, seq]
        for i, row in zip(idx, best):
            f = data.features[i]
            tags[i] = word_predictions(row[: len(f)], f.word_ids, f.num_words, labels)
    return data.task.metric(tags, [ex.tags for ex in data.examples])


def _eval_spans(model: Bert, data: EvalSet) -> dict[str, Any]:
    starts: list[torch.Tensor] = [torch.empty(0)] * len(data.features)
    ends: list[torch.Tensor] = [torch.empty(0)] * len(data.features)
    for idx, out in _batches(model, data.features, data.pad_token_id, data.batch_size):
        s, e = out.start_logits.float().cpu(), out.end_logits.float().cpu()  # [batch, seq]
        for j, i in enumerate(idx):
            n = len(data.features[i])
            starts[i], ends[i] = s[j, :n], e[j, :n]
    spans = predict_spans(data.examples, data.features, starts, ends, top_k=1)
    return data.task.metric(best_answers(spans), data.examples)


def evaluate(model: Bert, tokenizer: Tokenizer, task: str | Task, examples: Sequence[Any],
             max_length: int | None = None, batch_size: int = 64, doc_stride: int | None = None) -> dict[str, Any]:
    """The task's metric of a fine-tuned `model` on `examples` (e.g. `get_task("sst2").read("dev")`)."""
    task = get_task(task) if isinstance(task, str) else task
    require_task_head(model, task)
    if not examples:
        raise FinetuneError(f"no {task.name} examples to evaluate on.")
    length = min(max_length or DEFAULT_MAX_LENGTH[task.head], max_tokens(model))
    id2label = model.config.id2label if task.head == "token_classification" else None
    data = EvalSet.build(task, examples, tokenizer, length, id2label, doc_stride, batch_size)
    return evaluate_set(model, data)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def _load_model(cfg: FinetuneConfig, tokenizer: Tokenizer | None) -> tuple[Bert, Tokenizer]:
    if isinstance(cfg.model, torch.nn.Module):  # a loaded model of any family, not a name or path
        if tokenizer is None:
            raise FinetuneError("cfg.model is a loaded model: pass its tokenizer too (finetune(cfg, tokenizer=tok)).")
        return cfg.model, tokenizer
    from bertlab.loading import load

    model, tok = load(cfg.model)
    return model, tokenizer or tok


def _examples(cfg: FinetuneConfig, task: Task, train_examples: Sequence[Any] | None,
              eval_examples: Sequence[Any] | None) -> tuple[list[Any], list[Any], str, bool]:
    """(train, dev, where they came from, whether dev was held out of the training data): given,
    or read from cfg.data / BERTLAB_DATA (see `read_train_dev`); subsets when asked."""
    note, held_out = "examples given by the caller", False
    if train_examples is None and eval_examples is None:
        split = read_train_dev(task, cfg.data, cfg.eval_data, cfg.seed)
        train_examples, eval_examples, note, held_out = split.train, split.dev, split.note, split.held_out
    if train_examples is None:
        train_examples = read_split(task, "train", cfg.data)
    if eval_examples is None:
        eval_examples = read_split(task, "dev", cfg.eval_data or cfg.data)
    if held_out:
        log.warning("dev examples held out of the training data: %s A dev file of your own (eval_data) is used "
                    "as it is.", note)
    else:
        log.info("data: %s", note)
    train_ex = subset(train_examples, cfg.max_train_examples, cfg.seed, "train")
    if not train_ex:
        raise FinetuneError(f"no {task.name} training examples: check the data ({cfg.data or 'BERTLAB_DATA'}).")
    return train_ex, subset(eval_examples, cfg.max_eval_examples, cfg.seed, "dev"), note, held_out


def _sequence_length(cfg: FinetuneConfig, task: Task, model: Bert) -> int:
    length, limit = cfg.sequence_length(task), max_tokens(model)
    if length > limit:
        log.warning("max_length %d is more than the model reads (%d): using %d.", length, limit, limit)
    return min(length, limit)


def _float_metrics(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "kind" and isinstance(v, (int, float))}


def finetune(
    cfg: FinetuneConfig,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    cancel: threading.Event | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    train_examples: Sequence[Any] | None = None,
    eval_examples: Sequence[Any] | None = None,
    resume_from: str | Path | None = None,
) -> FinetuneResult:
    """Fine-tune `cfg.model` on `cfg.task` and score it on the dev split (a config with `features` goes to
    `training.feature_head.run_finetune`, which also runs this one).

    Examples default to the task's train/dev splits (from `cfg.data`, else BERTLAB_DATA; dev from
    `cfg.eval_data` when given); data without a dev part gives up a seeded 10 % as dev, logged and
    in the result (`dev_held_out`, see `tasks.read_train_dev`). Pass your own lists to use other data.
    The model given is not changed: a copy gets the head.
    A failed run (e.g. out of GPU memory) returns with status "failed" and `error` set (see
    `result.train.raise_for_status()`); setup errors (no data, a bad config) raise at once.
    """
    if cfg.features is not None:
        raise FinetuneError(f"features {cfg.features!r} train a head on cached word features: call "
                            "training.feature_head.run_finetune (or finetune_features) for this config.")
    t0 = time.perf_counter()
    task = get_task(cfg.task)
    cfg = cfg.resolved()
    if not isinstance(cfg.model, torch.nn.Module) and cfg.model == cfg.recipe.model:
        log.info("starting from %s (this task's default start)", cfg.recipe.start_name)
    base, tok = _load_model(cfg, tokenizer)
    train_ex, dev_ex, data_note, held_out = _examples(cfg, task, train_examples, eval_examples)
    id2label = task_labels(task, train_ex)
    with torch.random.fork_rng(devices=[]):  # a new head starts from cfg.seed, whatever ran before
        torch.manual_seed(derive_seed(cfg.seed, "head"))
        model = with_task_head(base, task, id2label, cfg.adapter_size if cfg.mode == "adapter" else None)
    if task.regression and not (base.config.task == task.head and dict(base.config.id2label) == id2label):
        start_at_mean(model, [ex.score for ex in train_ex])  # a new head: it starts at the mean score
    trainable, total = set_trainable(model, cfg.mode)
    length = _sequence_length(cfg, task, model)
    features = featurize(task, train_ex, tok, length, id2label, cfg.doc_stride, cfg.label_all_pieces)
    eval_set = None
    if dev_ex:
        eval_set = EvalSet.build(task, dev_ex, tok, length, id2label, cfg.doc_stride, cfg.eval_batch_size)
    sampler = BucketBatchSampler([len(f) for f in features], cfg.batch_size, seed=cfg.seed)
    log.info("fine-tuning %s (%s mode): %d examples -> %d features, %d dev examples; %.2fM of %.2fM parameters "
             "train", task.name, cfg.mode, len(train_ex), len(features), len(dev_ex), trainable / 1e6, total / 1e6)
    train_cfg = cfg.train_config(len(sampler))
    result = train(
        model, loss_for(task), features, train_cfg,
        collate=functools.partial(collate, pad_token_id=tok.pad_token_id), batch_sampler=sampler,
        eval_fn=(lambda m: evaluate_set(m, eval_set)) if eval_set is not None else None,
        callbacks=callbacks, cancel=cancel, tokenizer=tok, resume_from=resume_from,
    )
    model.eval()
    history = [_float_metrics(h) for h in result.history if h.get("kind") == "eval"]
    out = FinetuneResult(
        model, tok, result, dict(result.eval_metrics), history, task.main_metric, time.perf_counter() - t0,
        str(next(model.parameters()).device), cfg.mode, trainable, total, len(train_ex), len(dev_ex),
        data_note=data_note, dev_held_out=held_out,
        precision=resolve_precision(train_cfg.precision, next(model.parameters()).device),
    )
    _finish(out, cfg)
    return out


def _finish(result: FinetuneResult, cfg: FinetuneConfig) -> None:
    """Save the model (completed runs only, atomically) and the summary, and log how the run ended.
    A full disk raises DiskFullError naming the folder."""
    if result.status == "failed":
        log.error("fine-tuning failed: %s", result.error)
    if cfg.out_dir is None or (dist.is_initialized() and dist.get_rank() != 0):
        return  # under torchrun, process 0 writes
    folder = Path(cfg.out_dir)
    disk: dict[str, Any] = {}
    if result.status == "completed":
        result.saved_to = save_model_atomically(result.model, result.tokenizer, folder)
        log.info("fine-tuned model saved to %s (load it with bertlab.load(%r))", folder, str(folder))
        disk = keep_what_a_finished_run_needs(folder)
    else:  # a failed or cancelled run writes no final model: its last checkpoint stays
        result.saved_to = result.train.last_checkpoint
        if result.saved_to is not None:
            log.info("run %s: the last checkpoint is %s", result.status, result.saved_to)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(e, folder) from e
    summary = {**result.summary(), **({"disk": disk} if disk else {}), "config": cfg.to_dict()}
    write_text_atomically(folder / RESULTS_FILE, json.dumps(summary, indent=2, default=str) + "\n")


def keep_what_a_finished_run_needs(folder: Path) -> dict[str, Any]:
    """A completed run's folder cut to what using and replaying it needs, and what was dropped (for its
    results file): its model (one weights file), its replay snapshots stored as what changed (see
    `training.snapshots.compact_snapshots`), no checkpoints (the last one is a second copy of the weights
    plus the optimizer state, 3x the model, which only resuming an unfinished run needs). A snapshot store
    that fails (a full disk) leaves the snapshots as they were, and says so."""
    from bertlab.training.snapshots import REPLAY_DIR, compact_snapshots

    disk: dict[str, Any] = {}
    checkpoints = folder / CHECKPOINTS
    if checkpoints.is_dir():
        names = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith("."))
        shutil.rmtree(checkpoints, ignore_errors=True)
        disk["dropped"] = (f"{CHECKPOINTS}/ ({', '.join(names) or 'empty'}): the weights again and the optimizer "
                           "state, which only resuming an unfinished run needs; the model is "
                           f"{WEIGHTS_FILE}")
    if (folder / REPLAY_DIR).is_dir():
        try:
            before, after = compact_snapshots(folder / REPLAY_DIR, folder / WEIGHTS_FILE)
            disk["replay"] = (f"{REPLAY_DIR}/: the snapshots stored as what changed, against the final weights "
                              f"({before / 1e6:.1f} MB -> {after / 1e6:.1f} MB)")
        except Exception as e:  # noqa: BLE001 - the run itself is saved; its snapshots stay as they were
            log.warning("the replay snapshots of %s stay as they were: %s", folder, e)
            disk["replay"] = f"{REPLAY_DIR}/: kept as written during the run ({e})"
    return disk


def read_results(folder: str | Path) -> dict[str, Any]:
    """The summary a fine-tuning run wrote into its out_dir ({} when there is none)."""
    path = Path(folder) / RESULTS_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


# -- the runs of a session (the Fine-tuning tab keeps one per run; the model itself goes to the picker) --
EVALS_PER_EPOCH = 4  # dev evaluations per epoch: enough points for a live curve


def with_schedule(cfg: FinetuneConfig, n_train: int) -> FinetuneConfig:
    """`cfg` set to evaluate a few times an epoch (EVALS_PER_EPOCH), log ~20 times an epoch and checkpoint
    once an epoch, keeping the last checkpoint only (with its optimizer state it is 3× the model's size)."""
    n = min(n_train, cfg.max_train_examples or n_train)
    steps = max(1, math.ceil(n / cfg.batch_size))
    return dataclasses.replace(cfg, eval_every=max(1, steps // EVALS_PER_EPOCH), checkpoint_every=steps,
                               log_every=max(1, min(10, steps // 20)), extra_train={"keep_last": 1})


def dev_loss(model: Bert, tok: Tokenizer, task: str, examples: Sequence[Any], max_length: int = 128,
             n: int = 32) -> Callable[[torch.nn.Module], torch.Tensor]:
    """The task's training loss on the first `n` of `examples` (one batch), as a function of the model."""
    spec = get_task(task)
    labels = model.config.id2label if spec.head == "token_classification" else None
    feats = featurize(spec, list(examples)[:n], tok, max_length, labels)
    if not feats:
        raise ValueError("no dev examples to measure the loss on.")
    device = model_device(model)
    batch = {k: v.to(device) for k, v in collate(feats[:n], pad_token_id=tok.pad_token_id).items()}
    loss_fn = loss_for(spec)
    return lambda m: loss_fn(m, batch)[0]


__all__ = [
    "DEFAULT_MAX_LENGTH", "MODES", "EvalSet", "dev_loss", "with_schedule",
    "FinetuneConfig", "FinetuneError", "FinetuneResult",
    "evaluate", "evaluate_set", "featurize", "finetune", "is_trainable", "loss_for", "read_results",
    "regression_loss", "regression_output", "require_task_head", "set_trainable", "sequence_loss", "start_at_mean",
    "span_loss", "subset", "token_loss", "with_task_head",
]
