"""Knowledge distillation: a student with fewer layers learns a fine-tuned teacher's answers.

    cfg = DistillConfig(task="sst2", layers=3, temperature=2.0, max_train_examples=4000)
    result = distill(teacher, tok, cfg)       # result.student, result.metrics["accuracy"]

The student is the teacher with fewer layers, started from every other teacher layer (Sanh et al.
2019, DistilBERT: layers 0, 2, 4 of a 6-layer teacher), with the teacher's embeddings and heads.
Its loss (Hinton et al. 2015) is

    alpha · T² · KL(softmax(teacher / T) ‖ softmax(student / T)) + (1 − alpha) · CE(student, label)
    + hidden_weight · MSE(student layer j, teacher layer (j + 1)·L/n − 1)   (TinyBERT-style, optional)

and it trains with the shared loop (`bertlab.training.loop.train`) on the fine-tuning task's data
(readers, features and dev scoring of `bertlab.training.finetune`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.compressed.structure import CompressError, is_compressed
from bertlab.runtime import eval_mode, max_tokens, model_device, resolve_device
from bertlab.tasks import IGNORE_INDEX, BucketBatchSampler, collate, get_task, read_train_dev, subset
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically, write_text_atomically
from bertlab.training.finetune import DEFAULT_MAX_LENGTH, EvalSet, evaluate_set, featurize, require_task_head
from bertlab.training.loop import TrainConfig, TrainEvent, TrainResult, train

log = logging.getLogger(__name__)

RESULTS_FILE = "distill_results.json"
HEADS = ("sequence_classification", "token_classification")  # tasks whose logits a student can match


# ---------------------------------------------------------------------------------------------
# The student
# ---------------------------------------------------------------------------------------------
def student_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layers a student starts from: every other one for half the depth ([0, 2, 4] of 6),
    evenly spread otherwise."""
    if not 1 <= student_layers <= teacher_layers:
        raise CompressError(f"the student needs between 1 and {teacher_layers} layers (the teacher's); "
                            f"got {student_layers}.")
    return [i * teacher_layers // student_layers for i in range(student_layers)]


def hidden_targets(teacher_layers: int, student_layers: int) -> list[int]:
    """The teacher layer whose output student layer j imitates in the hidden-state loss: the last of
    the block it replaces ((j + 1)·L/n − 1, TinyBERT's uniform map)."""
    return [(j + 1) * teacher_layers // student_layers - 1 for j in range(student_layers)]


def make_student(teacher: nn.Module, layers: int) -> nn.Module:
    """A copy of `teacher` with `layers` layers, each initialised from the teacher layer
    `student_layers` names; embeddings, pooler and heads copied. In train mode."""
    if is_compressed(teacher):
        raise CompressError("distil from a float teacher: this one has pruned heads or int8 weights.")
    fam = teacher.family
    picks = student_layers(fam.num_layers, layers)
    extra = copy.deepcopy(teacher.config.extra)
    if isinstance(extra.get("layer_types"), list):  # transformers' one entry per layer: each student layer its pick's
        extra["layer_types"] = [extra["layer_types"][i] for i in picks]
    cfg = teacher.config.replace(num_hidden_layers=layers, extra=extra)
    if cfg.num_hidden_groups > 1:
        raise CompressError("this ALBERT shares its layer groups across depth: pick a model with one group.")
    student = type(teacher)(cfg).to(model_device(teacher))
    ours, theirs = student.state_dict(), teacher.state_dict()
    state = {}
    for key in ours:
        layer = student.family.layer_of(key)
        src = key if layer is None else fam.layer_prefix(picks[layer]) + key[len(student.family.layer_prefix(layer)):]
        state[key] = theirs[src].detach().clone()
    student.load_state_dict(state, strict=True)
    if hasattr(student, "tie_weights"):
        student.tie_weights()
    return student.train()


# ---------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------
def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · KL(softmax(teacher/T) ‖ softmax(student/T)), mean over rows ([n, labels] each)."""
    t = temperature
    return F.kl_div(F.log_softmax(student_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                    log_target=True, reduction="batchmean") * t * t


def _rows(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels as [n, labels] and [n]: token tasks keep their labelled pieces only."""
    if logits.dim() == 3:
        keep = labels != IGNORE_INDEX
        return logits[keep], labels[keep]
    return logits, labels


@dataclass
class DistillLoss:
    """`loss_fn(student, batch) -> (loss, metrics)` for the shared loop; the teacher runs without gradients."""

    teacher: nn.Module
    temperature: float = 2.0
    alpha: float = 0.5  # weight of the soft targets; 1 - alpha on the hard labels
    hidden_weight: float = 0.0  # weight of the hidden-state MSE (0: off)
    student_layers: int = 0

    def __call__(self, student: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        want_hidden = self.hidden_weight > 0
        fam = self.teacher.family
        targets = hidden_targets(fam.num_layers, self.student_layers) if want_hidden else []
        with torch.no_grad():
            if want_hidden:
                t_out, cache = self.teacher.run_with_cache(*inputs, names=[fam.hook_name(i, "hook_resid_post")
                                                                             for i in targets])
            else:
                t_out = self.teacher(*inputs)
        kept: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, name: str) -> None:
            kept[name] = x

        inner = getattr(student, "module", student)  # the loop may hand a DDP wrapper
        names = [inner.family.hook_name(j, "hook_resid_post") for j in range(len(targets))]
        with inner.hooks([(names, keep)] if want_hidden else []):
            s_out = student(*inputs)
        s_logits, labels = _rows(s_out.logits.float(), batch["labels"])
        t_logits, _ = _rows(t_out.logits.float(), batch["labels"])
        soft = soft_target_loss(s_logits, t_logits, self.temperature)
        hard = F.cross_entropy(s_logits, labels)
        loss = self.alpha * soft + (1 - self.alpha) * hard
        metrics = {"soft": soft.detach(), "hard": hard.detach(),
                   "accuracy": (s_logits.argmax(-1) == labels).float().mean()}
        if want_hidden:
            real = batch["attention_mask"].bool()  # [batch, seq]: padding left out
            mse = torch.stack([F.mse_loss(kept[n][real], cache[fam.hook_name(i, "hook_resid_post")][real])
                               for n, i in zip(names, targets)]).mean()
            loss = loss + self.hidden_weight * mse
            metrics["hidden_mse"] = mse.detach()
        return loss, metrics


@torch.no_grad()
def soft_loss_on(student: nn.Module, teacher: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]],
                 temperature: float = 2.0) -> float:
    """The soft-target loss (T²·KL) of `student` against `teacher` over `batches`, example-weighted."""
    total = n = 0.0
    with eval_mode(student), eval_mode(teacher):
        for batch in batches:
            inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            s, labels = _rows(student(*inputs).logits.float(), batch["labels"])
            t, _ = _rows(teacher(*inputs).logits.float(), batch["labels"])
            total += float(soft_target_loss(s, t, temperature)) * len(s)
            n += len(s)
    return total / max(n, 1)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
@dataclass
class DistillConfig:
    """One distillation run: task and data (as in fine-tuning), the student's depth, the loss, the loop."""

    task: str = "sst2"
    data: str | os.PathLike | None = None  # the task's data (None = BERTLAB_DATA's copy)
    eval_data: str | os.PathLike | None = None  # a separate dev file; None = data's dev part (or 10 % held out)
    layers: int = 3
    temperature: float = 2.0
    alpha: float = 0.5
    hidden_weight: float = 0.0
    epochs: int = 2
    lr: float = 1e-4
    batch_size: int = 32
    eval_batch_size: int = 64
    max_length: int | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 0
    out_dir: str | None = None
    eval_every: int | None = None  # steps between dev evaluations; None = once per epoch, 0 = at the end
    log_every: int = 10
    device: str = "auto"
    extra_train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        task = get_task(self.task)
        if task.head not in HEADS:
            head = task.head.replace("_", " ")
            raise CompressError(f"distillation here matches class logits: {self.task} has a {head} head. "
                                f"Pick sst2, nli or ner.")
        if self.temperature <= 0:
            raise CompressError(f"the temperature must be positive; got {self.temperature}.")
        if not 0 <= self.alpha <= 1:
            raise CompressError(f"alpha (the soft targets' weight) must be in [0, 1]; got {self.alpha}.")
        if self.hidden_weight < 0:
            raise CompressError(f"hidden_weight must be 0 or more; got {self.hidden_weight}.")
        for name in ("layers", "epochs", "batch_size", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise CompressError(f"{name} must be at least 1; got {getattr(self, name)}.")

    def train_config(self, batches_per_epoch: int) -> TrainConfig:
        eval_every = max(1, batches_per_epoch) if self.eval_every is None else self.eval_every
        return TrainConfig(lr=self.lr, weight_decay=self.weight_decay, warmup_ratio=self.warmup_ratio,
                           epochs=self.epochs, batch_size=self.batch_size, seed=self.seed, log_every=self.log_every,
                           eval_every=eval_every, device=self.device, **self.extra_train)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v, os.PathLike) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}


@dataclass
class DistillResult:
    student: nn.Module  # eval mode
    tokenizer: Tokenizer
    train: TrainResult
    metrics: dict[str, Any]  # the student's last dev evaluation
    teacher_metrics: dict[str, Any]  # the teacher on the same dev examples
    history: list[dict[str, Any]]
    main_metric: str
    wall_time_s: float
    train_examples: int
    eval_examples: int
    data_note: str = ""
    saved_to: Path | None = None

    @property
    def status(self) -> str:
        return self.train.status

    def summary(self) -> dict[str, Any]:
        m = self.main_metric
        return {"status": self.status, "error": self.train.error, "main_metric": m,
                "student": self.metrics.get(m), "teacher": self.teacher_metrics.get(m),
                "student_layers": self.student.config.num_hidden_layers, "steps": self.train.step,
                "history": self.history, "wall_time_s": round(self.wall_time_s, 2),
                "train_examples": self.train_examples, "eval_examples": self.eval_examples, "data": self.data_note,
                "saved_to": str(self.saved_to) if self.saved_to else None}


def distill(teacher: nn.Module, tokenizer: Tokenizer, cfg: DistillConfig,
            callbacks: Sequence[Callable[[TrainEvent], None]] = (), cancel: threading.Event | None = None, *,
            train_examples: Sequence[Any] | None = None, eval_examples: Sequence[Any] | None = None) -> DistillResult:
    """Distil `teacher` (fine-tuned for `cfg.task`) into a `cfg.layers`-layer student; score both on
    the dev examples (read like fine-tuning's: `cfg.data`'s dev part, or a seeded 10 % never trained on).
    The teacher is unchanged. Saves the student (HF layout) to `cfg.out_dir` when the run completes."""
    t0 = time.perf_counter()
    task = get_task(cfg.task)
    require_task_head(teacher, task)
    note = "examples given by the caller"
    if train_examples is None or eval_examples is None:
        split = read_train_dev(task, cfg.data, cfg.eval_data, cfg.seed)
        train_examples = split.train if train_examples is None else train_examples
        eval_examples = split.dev if eval_examples is None else eval_examples
        note = split.note
    train_ex = subset(train_examples, cfg.max_train_examples, cfg.seed, "train")
    dev_ex = subset(eval_examples, cfg.max_eval_examples, cfg.seed, "dev")
    if not train_ex:
        raise CompressError(f"no {task.name} training examples to distil on: check the data.")
    length = min(cfg.max_length or DEFAULT_MAX_LENGTH[task.head], max_tokens(teacher))
    id2label = dict(teacher.config.id2label)
    features = featurize(task, train_ex, tokenizer, length, id2label)
    eval_set = EvalSet.build(task, dev_ex, tokenizer, length, id2label, None, cfg.eval_batch_size) if dev_ex else None
    teacher_metrics = evaluate_set(teacher, eval_set) if eval_set is not None else {}
    student = make_student(teacher, cfg.layers)
    was_training, needs_grad = teacher.training, [p.requires_grad for p in teacher.parameters()]
    home = model_device(teacher)
    teacher.eval().to(resolve_device(cfg.device))
    for p in teacher.parameters():
        p.requires_grad_(False)
    loss_fn = DistillLoss(teacher, cfg.temperature, cfg.alpha, cfg.hidden_weight, cfg.layers)
    sampler = BucketBatchSampler([len(f) for f in features], cfg.batch_size, seed=cfg.seed)
    log.info("distilling %s: %d -> %d layers on %d examples (T=%g, alpha=%g)", task.name,
             teacher.family.num_layers, cfg.layers, len(features), cfg.temperature, cfg.alpha)
    try:
        result = train(student, loss_fn, features, cfg.train_config(len(sampler)),
                       collate=functools.partial(collate, pad_token_id=tokenizer.pad_token_id), batch_sampler=sampler,
                       eval_fn=(lambda m: evaluate_set(m, eval_set)) if eval_set is not None else None,
                       callbacks=callbacks, cancel=cancel, tokenizer=tokenizer)
    finally:
        for p, needs in zip(teacher.parameters(), needs_grad):
            p.requires_grad_(needs)
        teacher.train(was_training).to(home)  # given back as it came
    student.eval()
    history = [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in result.history]
    out = DistillResult(student, tokenizer, result, dict(result.eval_metrics), teacher_metrics, history,
                        task.main_metric, time.perf_counter() - t0, len(train_ex), len(dev_ex), note)
    if cfg.out_dir is not None and result.status == "completed":
        folder = Path(cfg.out_dir)
        out.saved_to = save_model_atomically(student, tokenizer, folder)
        write_text_atomically(folder / RESULTS_FILE, json.dumps({**out.summary(), "config": cfg.to_dict()},
                                                                indent=2, default=str) + "\n")
    return out


__all__ = ["DistillConfig", "DistillLoss", "DistillResult", "distill", "hidden_targets", "make_student",
           "soft_loss_on", "soft_target_loss", "student_layers"]
