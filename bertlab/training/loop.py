"""The one training loop, shared by pre-training (MLM + NSP) and fine-tuning (any task head).

    result = train(model, loss_fn, examples, TrainConfig(lr=5e-5, max_steps=1000), collate=collate)

`loss_fn(model, batch) -> (loss, metrics)` keeps the loop task-agnostic. The loop owns
everything else: seeded data order (a `torch.Generator` per epoch), AdamW without decay on
biases and LayerNorm, warm-up then linear/cosine decay, gradient accumulation and clipping,
bf16 autocast where the device computes in bf16 natively, checkpoints (atomic, resumable),
cancellation from another thread, and DistributedDataParallel when started by `torchrun`. It never
prints: it reports through callbacks (`TrainEvent`) and `logging`, so a widget can run it in a
background thread.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertlab.runtime import (
    derive_seed,
    out_of_memory_text,
    release_free_memory,
    resolve_device,
)
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import (
    DiskFullError,
    TrainerState,
    list_checkpoints,
    load_checkpoint,
    remove_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

log = logging.getLogger(__name__)

SCHEDULES = ("linear", "cosine", "constant")
PRECISIONS = ("auto", "bf16", "fp32")

LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, Mapping[str, Any]] | torch.Tensor"]
Collate = Callable[..., Any]  # (examples) or (examples, generator=...) -> batch
EvalFn = Callable[[nn.Module], Mapping[str, float]]
Callback = Callable[["TrainEvent"], None]


class TrainingError(RuntimeError):
    """A training run that stopped on an error; the message says what to change."""


# -- configuration ---------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Hyper-parameters and bookkeeping of one run. Steps are optimizer steps."""

    lr: float = 5e-5
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights (any 1-d parameter)
    warmup_steps: int = 0  # give warmup_steps or warmup_ratio (fraction of all steps), not both
    warmup_ratio: float = 0.0
    schedule: str = "linear"  # after warm-up: "linear" or "cosine" decay to 0, or "constant"
    max_steps: int | None = None  # when set, wins over epochs
    epochs: int = 1
    batch_size: int = 32  # examples per micro-batch and per process
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    max_grad_norm: float | None = 1.0  # clip the global gradient norm; None = no clipping
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    seed: int = 0
    shuffle: bool = True
    precision: str = "auto"  # "auto": bf16 autocast where the device has native bf16 (`native_bf16`), else fp32
    device: str = "auto"  # "auto": cuda (this process's LOCAL_RANK) when available, else cpu
    log_every: int = 10  # steps between "step" events (loss averaged over them)
    eval_every: int = 0  # steps between evaluations; 0 = only at the end
    checkpoint_every: int = 0  # steps between checkpoints; 0 = only at the end (needs out_dir)
    out_dir: str | None = None  # where checkpoint-<step> folders go; None = no checkpoints
    keep_last: int | None = 2  # checkpoints kept; None = all
    overwrite: bool = False  # start afresh in an out_dir that already holds checkpoints
    ddp_find_unused_parameters: bool = True  # needed when a head (e.g. the pooler) gets no gradient

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig: {msg}")

        need(self.lr > 0, f"lr must be positive (got {self.lr}).")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0 (got {self.weight_decay}).")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps}).")
        need(0 <= self.warmup_ratio < 1, f"warmup_ratio must be in [0, 1) (got {self.warmup_ratio}).")
        need(
            not (self.warmup_steps and self.warmup_ratio),
            "give warmup_steps or warmup_ratio, not both.",
        )
        need(self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES} (got {self.schedule!r}).")
        need(self.max_steps is None or self.max_steps >= 1, f"max_steps must be >= 1 (got {self.max_steps}).")
        need(self.epochs >= 1, f"epochs must be >= 1 (got {self.epochs}).")
        need(self.batch_size >= 1, f"batch_size must be >= 1 (got {self.batch_size}).")
        need(self.grad_accum_steps >= 1, f"grad_accum_steps must be >= 1 (got {self.grad_accum_steps}).")
        need(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"max_grad_norm must be positive or None (got {self.max_grad_norm}).",
        )
        need(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS} (got {self.precision!r}).")
        need(self.log_every >= 1, f"log_every must be >= 1 (got {self.log_every}).")
        need(self.eval_every >= 0, f"eval_every must be >= 0 (got {self.eval_every}).")
        need(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0 (got {self.checkpoint_every}).")
        need(self.keep_last is None or self.keep_last >= 1, f"keep_last must be >= 1 or None (got {self.keep_last}).")
        self.adam_betas = (float(self.adam_betas[0]), float(self.adam_betas[1]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str = "linear") -> float:
    """Multiplier of the peak lr used by optimizer step `step` (0-based).

    Warm-up: (step + 1) / warmup_steps, reaching 1 on the last warm-up step. Then "linear" goes
    from 1 to 0 at `total_steps`, "cosine" follows half a cosine to 0, "constant" stays at 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule must be one of {SCHEDULES} (got {schedule!r}).")


# -- events and results ----------------------------------------------------------------------
@dataclass
class TrainEvent:
    """What the loop reports to callbacks (only on rank 0 under DDP)."""

    kind: str  # "start", "step", "eval", "checkpoint", "end", "error"
    step: int  # optimizer steps done
    total_steps: int
    epoch: float  # steps done / steps per epoch
    loss: float | None = None  # mean training loss since the last "step" event
    lr: float | None = None  # lr of the last step
    grad_norm: float | None = None  # mean global gradient norm before clipping
    metrics: dict[str, Any] = field(default_factory=dict)  # loss_fn's metrics (floats), or eval results
    tokens_per_s: float | None = None  # non-padding tokens (all processes)
    examples_per_s: float | None = None
    elapsed_s: float = 0.0
    path: str | None = None  # the checkpoint folder ("checkpoint" events)
    message: str | None = None  # status or error text ("start", "end", "error")
    model: nn.Module | None = field(default=None, repr=False, compare=False)  # the model trained ("start" only)
    precision: str | None = None  # "bf16" (autocast) or "fp32": what the products run in ("start" only)

    def history_entry(self) -> dict[str, Any] | None:
        """What a live curve keeps of this event: a "step"'s training loss, an "eval"'s numeric scores;
        None for the other kinds."""
        if self.kind == "step":
            return {"kind": "train", "step": self.step, "epoch": self.epoch, "loss": self.loss}
        if self.kind == "eval":
            scores = {k: v for k, v in self.metrics.items() if isinstance(v, (int, float))}
            return {"kind": "eval", "step": self.step, "epoch": self.epoch, **scores}
        return None


@dataclass
class TrainResult:
    """How a run ended: status "completed", "cancelled" or "failed"."""

    status: str
    step: int
    total_steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_metrics: dict[str, Any] = field(default_factory=dict)  # the last evaluation
    last_checkpoint: Path | None = None
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def raise_for_status(self) -> None:
        """Raise `TrainingError` (chained to the original exception) when the run failed."""
        if self.status == "failed":
            raise TrainingError(self.error or "training failed") from self.exception


class ScoredRun:
    """What a task run's result reads off its `train` (a TrainResult) and its dev `metrics`: status, error
    and the main metric's score. Fine-tuning's and the feature head's results share it."""

    train: TrainResult
    metrics: dict[str, Any]
    main_metric: str

    @property
    def status(self) -> str:
        return self.train.status

    @property
    def error(self) -> str | None:
        return self.train.error

    @property
    def score(self) -> float | None:
        """The main metric of the last dev evaluation (None before any)."""
        value = self.metrics.get(self.main_metric)
        return float(value) if value is not None else None


# -- helpers: seeds, devices, batches --------------------------------------------------------
def move_to_device(batch: Any, device: torch.device) -> Any:
    """Tensors in (nested) dicts, lists, tuples and dataclasses moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: move_to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    return batch


def attention_mask_of(batch: Any) -> torch.Tensor | None:
    """A batch's `attention_mask` (a dict's key or an object's field), or None."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else getattr(batch, "attention_mask", None)
    return mask if isinstance(mask, torch.Tensor) else None


def stack_collate(examples: list[Any]) -> Any:
    """Default collate: stack same-shaped tensors (or numbers) field by field.

    Examples may be tensors, dicts or tuples of them. Variable-length examples need their
    own collate (e.g. `bertlab.tasks.batching.collate`, which pads).
    """
    first = examples[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.stack(examples)
        except RuntimeError as e:
            raise TypeError(
                f"stack_collate cannot stack examples of different shapes ({e}); pass a collate "
                f"that pads them."
            ) from e
    if isinstance(first, (int, float, bool)):
        return torch.tensor(examples)
    if isinstance(first, Mapping):
        return {k: stack_collate([e[k] for e in examples]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(stack_collate(list(col)) for col in zip(*examples))
    raise TypeError(f"stack_collate does not know how to batch {type(first).__name__}; pass collate=...")


def _get(batch: Any, name: str) -> Any:
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


def batch_shape(batch: Any) -> tuple[int, int] | None:
    """(batch size, sequence length) of a batch that has `input_ids` [b, s], else None."""
    ids = _get(batch, "input_ids")
    if isinstance(ids, torch.Tensor) and ids.ndim >= 2:
        return int(ids.shape[0]), int(ids.shape[1])
    return None


def _count_tokens(batch: Any) -> torch.Tensor | int:
    mask = _get(batch, "attention_mask")
    if isinstance(mask, torch.Tensor):
        return mask.sum()
    ids = _get(batch, "input_ids")
    return ids.numel() if isinstance(ids, torch.Tensor) else 0


def _plain(v: Any) -> Any:
    """A metric as JSON-friendly data: numbers and 1-element tensors -> float, tensors -> lists."""
    if isinstance(v, torch.Tensor):
        return float(v.detach().float()) if v.numel() == 1 else v.detach().cpu().tolist()
    if isinstance(v, (bool, int, float)):
        return float(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, str) else str(v)


# -- distributed -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DistInfo:
    """This process's place in a (possibly 1-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed(device: torch.device) -> DistInfo:
    """Join the process group that `torchrun` describes (WORLD_SIZE, RANK, LOCAL_RANK env).

    nccl on CUDA, gloo on CPU. Without WORLD_SIZE > 1 this is a plain single process. The
    group stays up for later `train` calls in the same process (re-creating the default group
    under torchrun can pick up stale rendezvous keys) and is destroyed at exit.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(_destroy_process_group)
        log.info("joined the %s process group as rank %d of %d", backend, dist.get_rank(), dist.get_world_size())
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices natively, so that bf16 autocast speeds training up:
    a CUDA GPU with bf16 support, or a CPU with AVX-512 BF16 or AMX instructions (oneDNN's bf16 kernels;
    on other CPUs bf16 is emulated and slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return False


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo's `flags`); empty where they cannot be read
    (another system: bf16 then counts as emulated, the safe, exact choice)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def resolve_precision(precision: str, device: torch.device) -> str:
    """"bf16" or "fp32": what `precision` ("auto", "bf16", "fp32") means on `device`."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for "bf16" (and "auto" on a device with native bf16); nothing for fp32. The
    weights, gradients and optimizer state stay fp32: only the matrix products run in bf16."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# -- optimizer and schedule ------------------------------------------------------------------
def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (no decay on biases and LayerNorm weights)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False).")
    groups = [
        {"params": ps, "weight_decay": wd}
        for ps, wd in ((decay, cfg.weight_decay), (no_decay, 0.0))
        if ps
    ]
    # The fused kernel (one pass over all parameters) exists on CUDA and CPU: fewer passes over the weights.
    fused = device.type in ("cuda", "cpu") and all(p.dtype.is_floating_point for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=fused)


def clip_and_step(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], max_norm: float | None
) -> torch.Tensor:
    """Clip the gradients' global 2-norm to `max_norm` (none, 0 or inf: no clipping) and take the optimizer's
    step; returns the norm before clipping (`torch.nn.utils.clip_grad_norm_`)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
    optimizer.step()
    return norm


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = warmup_steps(cfg, total_steps)

    def factor(step: int) -> float:
        return lr_factor(step, total_steps, warmup, cfg.schedule)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    return cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total_steps)


# -- the data plan ---------------------------------------------------------------------------
class DataPlan:
    """Which examples each micro-batch of each process takes: a pure function of the step.

    An epoch is a list of micro-batches (lists of example indices): by default a seeded
    permutation of the data cut into `batch_size` pieces (the remainder is skipped; a new
    permutation each epoch), or what `batch_sampler` yields after `set_epoch(epoch)` (e.g. a
    length-bucketing sampler). Global micro-batch k of an epoch goes to process k % W;
    an optimizer step takes `grad_accum_steps` of them per process.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        world_size: int,
        grad_accum_steps: int,
        seed: int,
        shuffle: bool,
        batch_sampler: Iterable[Sequence[int]] | None = None,
    ) -> None:
        self.num_examples, self.batch_size, self.world_size = num_examples, batch_size, world_size
        self.grad_accum_steps, self.seed, self.shuffle = grad_accum_steps, seed, shuffle
        self.batch_sampler = batch_sampler
        self._cache: tuple[int, list[list[int]]] = (-1, [])
        self.steps_per_epoch = len(self.epoch_batches(0)) // world_size // grad_accum_steps

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All micro-batches (example indices) of `epoch`, for all processes."""
        if self._cache[0] == epoch:
            return self._cache[1]
        if self.batch_sampler is not None:
            if hasattr(self.batch_sampler, "set_epoch"):
                self.batch_sampler.set_epoch(epoch)
            batches = [[int(i) for i in b] for b in self.batch_sampler]
        else:
            if self.shuffle:
                g = torch.Generator().manual_seed(derive_seed(self.seed, "order", epoch))
                order = torch.randperm(self.num_examples, generator=g).tolist()
            else:
                order = list(range(self.num_examples))
            b = self.batch_size
            batches = [order[i * b : (i + 1) * b] for i in range(self.num_examples // b)]
        self._cache = (epoch, batches)
        return batches

    def indices(self, epoch: int, step_in_epoch: int, micro: int, rank: int) -> list[int]:
        """Example indices of micro-batch `micro` of a step, for process `rank`."""
        k = step_in_epoch * self.grad_accum_steps + micro
        return self.epoch_batches(epoch)[k * self.world_size + rank]

    def collate_generator(self, epoch: int, step_in_epoch: int, micro: int, rank: int) -> torch.Generator:
        """The generator a collate draws from (MLM masking): fixed by position, so resumable."""
        return torch.Generator().manual_seed(derive_seed(self.seed, "collate", epoch, step_in_epoch, micro, rank))


def _takes_generator(collate: Callable[..., Any]) -> bool:
    try:
        return "generator" in inspect.signature(collate).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


# -- the loop --------------------------------------------------------------------------------
def train(
    model: nn.Module,
    loss_fn: LossFn,
    data: Sequence[Any],
    cfg: TrainConfig,
    *,
    collate: Collate = stack_collate,
    batch_sampler: Iterable[Sequence[int]] | None = None,
    eval_fn: EvalFn | None = None,
    callbacks: Sequence[Callback] = (),
    cancel: threading.Event | None = None,
    tokenizer: Tokenizer | None = None,
    resume_from: str | Path | None = None,
) -> TrainResult:
    """Train `model` in place on `data` (a sequence of examples) and say how the run ended.

    `collate(examples) -> batch` makes one micro-batch (when it has a `generator` parameter,
    it gets a torch.Generator fixed by the batch's position, for MLM masking); the loop moves
    it to the device and calls `loss_fn(model, batch) -> (loss, metrics)` (under DDP `model` is the DDP
    wrapper: call it, do not read its attributes). `eval_fn(model) -> metrics` runs in eval
    mode without gradients. `batch_sampler` (optional: an iterable of index lists with
    `set_epoch`, e.g. `BucketBatchSampler`) replaces the default seeded shuffle and
    `cfg.batch_size`. `cancel.set()` from any thread stops at the next step boundary
    and keeps a checkpoint. An error inside a step ends the run with status "failed" and a
    message (see `TrainResult.raise_for_status`); the last checkpoint stays. Setup errors
    (bad config, too little data, an out_dir in use) raise at once.

    train() seeds torch's global RNG (dropout) from cfg.seed and the process rank.
    """
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is not None:  # plain "cuda": the current device, as it is
        torch.cuda.set_device(device)
    info = setup_distributed(device)
    run = _Run(model, loss_fn, data, cfg, collate, batch_sampler, eval_fn, callbacks, cancel, tokenizer, device, info)
    run.prepare(resume_from)
    result = run.loop()
    if info.distributed and result.ok:
        dist.barrier()  # the other processes wait for rank 0's last checkpoint
    return result


class _Run:
    """The state of one call to `train` (not public: use `train`)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        data: Sequence[Any],
        cfg: TrainConfig,
        collate: Collate,
        batch_sampler: Iterable[Sequence[int]] | None,
        eval_fn: EvalFn | None,
        callbacks: Sequence[Callback],
        cancel: threading.Event | None,
        tokenizer: Tokenizer | None,
        device: torch.device,
        info: DistInfo,
    ) -> None:
        if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
            raise TypeError(
                f"data must be a sequence of examples (len() and [i]), got {type(data).__name__}; "
                f"wrap an iterable with list(...)."
            )
        self.model, self.loss_fn, self.data, self.cfg = model, loss_fn, data, cfg
        self.collate, self.eval_fn, self.callbacks, self.cancel = collate, eval_fn, list(callbacks), cancel
        self.tokenizer, self.device, self.info = tokenizer, device, info
        self.plan = DataPlan(len(data), cfg.batch_size, info.world_size, cfg.grad_accum_steps, cfg.seed,
                             cfg.shuffle, batch_sampler)
        if self.plan.steps_per_epoch == 0:
            raise ValueError(
                f"{len(data)} training examples ({len(self.plan.epoch_batches(0))} batches) do not fill one "
                f"optimizer step of grad_accum_steps {cfg.grad_accum_steps} x {info.world_size} process(es) "
                f"batches of batch_size {cfg.batch_size}: lower batch_size or grad_accum_steps, or add data."
            )
        self.pass_generator = _takes_generator(collate)
        self.total_steps = cfg.max_steps or cfg.epochs * self.plan.steps_per_epoch
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.eval_metrics: dict[str, Any] = {}
        self.last_checkpoint: Path | None = None
        self.saved_step = -1
        self.evaluated_step = -1
        self.t_start = time.perf_counter()
        self._last_batch: tuple[int, tuple[int, int] | None] = (cfg.batch_size, None)
        self._reset_window()

    # -- setup ---------------------------------------------------------------------------
    def prepare(self, resume_from: str | Path | None) -> None:
        torch.manual_seed(derive_seed(self.cfg.seed, "torch", self.info.rank))
        self.was_training = self.model.training
        self.model.to(self.device)
        self.optimizer = make_optimizer(self.model, self.cfg, self.device)
        self.scheduler = make_scheduler(self.optimizer, self.cfg, self.total_steps)
        if resume_from is not None:
            self._resume(Path(resume_from))
        self._check_out_dir(resume_from)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.wrapped: nn.Module = self.model
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = DDP(
                self.model, device_ids=ids, find_unused_parameters=self.cfg.ddp_find_unused_parameters
            )
        self.model.train()

    def _resume(self, folder: Path) -> None:
        state = load_checkpoint(folder, self.model, self.optimizer, self.scheduler)
        self._warn_if_changed(state)
        self.step, self.history = state.step, list(state.history)
        self.saved_step = self.evaluated_step = state.step
        self.last_checkpoint = folder
        evals = [h for h in self.history if h.get("kind") == "eval"]
        self.eval_metrics = {k: v for k, v in evals[-1].items() if k not in ("kind", "step", "epoch")} if evals else {}
        if len(state.rng) == self.info.world_size:
            set_rng_state(state.rng[self.info.rank])
        else:
            log.warning("the checkpoint was written by %d processes, this run has %d: dropout will "
                        "not repeat the interrupted run exactly.", len(state.rng), self.info.world_size)
        log.info("resumed from %s at step %d of %d", folder, self.step, self.total_steps)

    def _warn_if_changed(self, state: TrainerState) -> None:
        old = state.config
        now = self.cfg.to_dict()
        changed = [k for k in ("seed", "batch_size", "grad_accum_steps", "max_steps", "epochs", "lr", "schedule")
                   if k in old and old[k] != now[k]]
        if state.num_examples != self.plan.num_examples:
            changed.append(f"data size {state.num_examples} -> {self.plan.num_examples}")
        if state.world_size != self.info.world_size:
            changed.append(f"processes {state.world_size} -> {self.info.world_size}")
        if changed:
            log.warning("resuming with changed settings (%s): the run will not match an uninterrupted one.",
                        ", ".join(changed))
        if state.step >= self.total_steps:
            log.warning("the checkpoint is already at step %d of %d: nothing left to train.",
                        state.step, self.total_steps)

    def _check_out_dir(self, resume_from: str | Path | None) -> None:
        out = self.cfg.out_dir
        if out is None or not self.info.is_main:
            return
        existing = list_checkpoints(out)
        if not existing:
            return
        resuming_here = resume_from is not None and Path(resume_from).resolve().parent == Path(out).resolve()
        if not resuming_here:
            if not self.cfg.overwrite:
                raise ValueError(
                    f"{out} already holds checkpoints (latest: {existing[-1].name}). Continue that run "
                    f"with resume_from=latest_checkpoint({out!r}), pick another out_dir, or set "
                    f"overwrite=True to delete them."
                )
            log.warning("overwrite=True: deleting the checkpoints in %s", out)
            for p in existing:
                remove_checkpoint(p)
            return
        later = [p for p in existing if int(p.name.split("-")[-1]) > self.step]
        if later:
            log.warning("resuming from step %d: removing later checkpoints of the abandoned run: %s",
                        self.step, ", ".join(p.name for p in later))
            for p in later:
                remove_checkpoint(p)

    # -- the loop ------------------------------------------------------------------------
    def loop(self) -> TrainResult:
        status, error, exc = "completed", None, None
        try:
            precision = resolve_precision(self.cfg.precision, self.device)
            on = f"{self.device}, bf16 autocast" if precision == "bf16" else f"{self.device}, fp32"
            self._emit("start", message=f"training {self.total_steps} steps on {on}", model=self.model,
                       precision=precision)
            while self.step < self.total_steps:
                if self._should_stop():
                    status = "cancelled"
                    break
                self._train_step()
                self.step += 1
                self._after_step()
            if status == "completed":
                self._maybe_eval()
            if status in ("completed", "cancelled") and self.step > 0:
                self._save(final=True)
        except torch.cuda.OutOfMemoryError as e:
            status, exc = "failed", e
            error = self._oom_message()
            self._free_memory()
        except Exception as e:  # noqa: BLE001 - reported in the result, never swallowed silently
            status, exc = "failed", e
            error = e.args[0] if isinstance(e, (TrainingError, DiskFullError)) else (
                f"{type(e).__name__} at step {self.step + 1}: {e}"
            )
        if isinstance(exc, DiskFullError):  # one line; the traceback only with debug logging
            log.error("training failed: %s", error)
            log.debug("the error in full:", exc_info=exc)
        elif exc is not None:
            log.error("training failed: %s", error, exc_info=exc)
        if exc is not None:
            self._emit_safely("error", message=error)
        self.model.train(self.was_training)
        if self.device.type == "cpu":
            release_free_memory()  # the kernel that trained goes on living (a notebook, a class): hand back the heap
        msg = {"completed": "training finished", "cancelled": "training cancelled"}.get(status, error)
        self._emit_safely("end", message=msg)
        return TrainResult(status, self.step, self.total_steps, self.history, dict(self.eval_metrics),
                           self.last_checkpoint, error, exc)

    def _position(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of optimizer step `step` (0-based)."""
        return divmod(step, self.plan.steps_per_epoch)

    def _train_step(self) -> None:
        epoch, in_epoch = self._position(self.step)
        accum = self.cfg.grad_accum_steps
        for micro in range(accum):
            idx = self.plan.indices(epoch, in_epoch, micro, self.info.rank)
            examples = [self.data[i] for i in idx]
            if self.pass_generator:
                gen = self.plan.collate_generator(epoch, in_epoch, micro, self.info.rank)
                batch = self.collate(examples, generator=gen)
            else:
                batch = self.collate(examples)
            batch = move_to_device(batch, self.device)
            self._last_batch = (len(idx), batch_shape(batch))
            sync = self.wrapped.no_sync() if self.info.distributed and micro < accum - 1 else contextlib.nullcontext()
            with sync:
                with autocast_context(self.cfg.precision, self.device):
                    loss, metrics = self._call_loss(batch)
                (loss / accum).backward()
            self._record_micro(loss, metrics, len(idx), _count_tokens(batch))
        norm = clip_and_step(self.optimizer, self.params, self.cfg.max_grad_norm)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.window["grad_norm"] += norm.detach().float()
        self.window["steps"] += 1

    def _call_loss(self, batch: Any) -> tuple[torch.Tensor, Mapping[str, Any]]:
        out = self.loss_fn(self.wrapped, batch)
        loss, metrics = (out, {}) if isinstance(out, torch.Tensor) else out
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
            raise TrainingError(
                f"loss_fn must return (loss, metrics) with loss a scalar tensor; got "
                f"{type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else list(loss.shape)}."
            )
        if not loss.requires_grad:
            raise TrainingError("the loss does not depend on any trainable parameter: check loss_fn.")
        return loss, metrics

    def _after_step(self) -> None:
        cfg = self.cfg
        if self.step % cfg.log_every == 0 or self.step == self.total_steps:
            self._log_window()
        if cfg.eval_every and self.step % cfg.eval_every == 0:
            self._maybe_eval()
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self._save()

    # -- logging -------------------------------------------------------------------------
    def _reset_window(self) -> None:
        zero = torch.zeros((), device=self.device)
        self.window: dict[str, Any] = {
            "loss": zero.clone(), "micro": 0, "tokens": zero.clone(), "examples": 0,
            "grad_norm": zero.clone(), "steps": 0, "metrics": {}, "t0": time.perf_counter(),
        }

    def _record_micro(self, loss: torch.Tensor, metrics: Mapping[str, Any], n: int, tokens: Any) -> None:
        w = self.window
        w["loss"] += loss.detach().float()
        w["micro"] += 1
        w["examples"] += n
        w["tokens"] += tokens
        for k, v in metrics.items():
            v = v.detach().float().mean() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
            w["metrics"][k] = w["metrics"].get(k, 0.0) + v.to(self.device)

    def _log_window(self) -> None:
        w = self.window
        if w["steps"] == 0:
            return
        keys = sorted(w["metrics"])
        sums = torch.stack([w["loss"], torch.tensor(float(w["micro"]), device=self.device),
                            w["tokens"].float(), torch.tensor(float(w["examples"]), device=self.device),
                            *[w["metrics"][k] for k in keys]])
        if self.info.distributed:
            dist.all_reduce(sums)
        vals = sums.tolist()
        loss, micro, tokens, examples = vals[0] / vals[1], vals[1], vals[2], vals[3]
        metrics = {k: v / micro for k, v in zip(keys, vals[4:])}
        dt = max(time.perf_counter() - w["t0"], 1e-9)
        grad_norm = float(w["grad_norm"]) / w["steps"]
        lr = self._lr_of(self.step - 1)
        self._reset_window()
        if not math.isfinite(loss):
            raise TrainingError(
                f"the loss became {loss} at step {self.step}: training diverged. Lower the learning "
                f"rate (now {self.cfg.lr:g}) or add warm-up, and check the data for empty examples."
            )
        entry = {"kind": "train", "step": self.step, "epoch": self._epoch(), "loss": loss, "lr": lr,
                 "grad_norm": grad_norm, "tokens_per_s": (tokens / dt) if tokens else None,
                 "examples_per_s": examples / dt, **metrics}
        self.history.append(entry)
        log.info("step %d/%d loss %.4f lr %.3g", self.step, self.total_steps, loss, lr)
        self._emit("step", loss=loss, lr=lr, grad_norm=grad_norm, metrics=metrics,
                   tokens_per_s=entry["tokens_per_s"], examples_per_s=entry["examples_per_s"])

    def _lr_of(self, step: int) -> float:
        """The lr optimizer step `step` (0-based) used, for the first parameter group."""
        warmup = warmup_steps(self.cfg, self.total_steps)
        return self.scheduler.base_lrs[0] * lr_factor(step, self.total_steps, warmup, self.cfg.schedule)

    def _epoch(self) -> float:
        return self.step / self.plan.steps_per_epoch

    def _emit(self, kind: str, **fields: Any) -> None:
        if not self.info.is_main:
            return
        event = TrainEvent(kind, self.step, self.total_steps, self._epoch(),
                           elapsed_s=time.perf_counter() - self.t_start, **fields)
        for cb in self.callbacks:
            cb(event)

    def _emit_safely(self, kind: str, **fields: Any) -> None:
        try:
            self._emit(kind, **fields)
        except Exception:  # noqa: BLE001 - a broken callback must not hide how the run ended
            log.exception("a training callback failed on the %r event", kind)

    # -- eval, checkpoints, cancel -------------------------------------------------------
    def _maybe_eval(self) -> None:
        if self.eval_fn is None or self.evaluated_step == self.step or not self.info.is_main:
            return
        self.model.eval()
        try:
            with torch.no_grad(), autocast_context(self.cfg.precision, self.device):
                metrics = {str(k): _plain(v) for k, v in self.eval_fn(self.model).items()}
        finally:
            self.model.train()
        self.evaluated_step = self.step
        self.eval_metrics = metrics
        self.history.append({"kind": "eval", "step": self.step, "epoch": self._epoch(), **metrics})
        shown = {k: v for k, v in metrics.items() if isinstance(v, float)}
        log.info("eval at step %d: %s", self.step, ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        self._emit("eval", metrics=metrics)

    def _save(self, final: bool = False) -> None:
        if self.cfg.out_dir is None or self.saved_step == self.step:
            return
        rngs = [rng_state()]
        if self.info.distributed:
            rngs = [None] * self.info.world_size
            dist.all_gather_object(rngs, rng_state())
        if not self.info.is_main:
            self.saved_step = self.step
            return
        epoch, _ = self._position(self.step)
        status = "running" if not final else ("completed" if self.step >= self.total_steps else "cancelled")
        state = TrainerState(self.step, epoch, self.total_steps, self.plan.num_examples, self.info.world_size,
                             list(self.history), rngs, self.cfg.to_dict(), status)
        path = save_checkpoint(self.cfg.out_dir, self.model, self.tokenizer, self.optimizer, self.scheduler,
                               state, self.cfg.keep_last)
        self.saved_step, self.last_checkpoint = self.step, path
        self._emit("checkpoint", path=str(path))

    def _should_stop(self) -> bool:
        local = self.cancel is not None and self.cancel.is_set()
        if not self.info.distributed:
            return local
        # All processes must stop together; asking costs a collective, so only at log steps.
        if self.step % self.cfg.log_every:
            return False
        flag = torch.tensor([float(local)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _oom_message(self) -> str:
        n, shape = self._last_batch
        return out_of_memory_text(n, shape[1] if shape else None, step=self.step + 1)

    def _free_memory(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# -- CLI progress ----------------------------------------------------------------------------
class TqdmCallback:
    """A tqdm progress bar over optimizer steps, with loss and lr, for the command line."""

    def __init__(self, **tqdm_kwargs: Any) -> None:
        self.kwargs = tqdm_kwargs
        self.bar = None

    def __call__(self, event: TrainEvent) -> None:
        from tqdm.auto import tqdm

        if event.kind == "start":
            self.bar = tqdm(total=event.total_steps, initial=event.step, unit="step", **self.kwargs)
        if self.bar is None:
            return
        if event.kind == "step":
            self.bar.update(event.step - self.bar.n)
            self.bar.set_postfix(loss=f"{event.loss:.4f}", lr=f"{event.lr:.2e}")
        elif event.kind == "eval":
            shown = [(k, v) for k, v in event.metrics.items() if isinstance(v, float)][:3]
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown})
        elif event.kind in ("end", "error"):
            self.bar.update(event.step - self.bar.n)
            self.bar.close()
            self.bar = None
