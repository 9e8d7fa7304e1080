"""Every objective under one budget: the same documents, steps, size and seed; the curves each run
records (its own loss, MLM accuracy where it applies, a probe sentence's P(target)); then the same
small SST-2 fine-tuning for each kept model, scored on sentences it never trained on; and a linear
probe of its frozen features on the same sentences (cheap; nothing in the model learns, so it reads what
pre-training put there, where fine-tuning can learn the task from the SST-2 sentences alone).

    curves = CurveRecorder(run_module, objective, tok, probe, target)   # a loop callback
    score = sst2_score(folder, train_examples, dev_examples)             # {"accuracy": ...}
    probe = sst2_probe(folder, train_examples, dev_examples)             # {"accuracy": ...}

The Pre-training tab's comparison uses these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from bertlab.loading import load
from bertlab.settings import data_dir
from bertlab.tasks import get_task
from bertlab.tasks.splits import subset
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.loop import TrainEvent
from bertlab.training.objectives.base import Objective, ObjectiveError, probe_probability

log = logging.getLogger(__name__)

PROBE_TEMPLATE = "Paris is the capital of {mask}."
PROBE_TARGET = "france"
# 3 epochs at 3e-4: a mini model fine-tuned for one epoch (94 steps of 32) at 1e-4 never leaves the loss plateau
# at ln 2 and says the majority label, pre-trained or not
SST2_SETTINGS = {"mode": "full", "epochs": 3, "lr": 3e-4, "batch_size": 32, "max_length": 64, "warmup_ratio": 0.1}
PROBE_SETTINGS = {"max_length": 64, "l2": 1e-3, "max_iter": 500}


@dataclass
class CurvePoint:
    step: int
    own_loss: float | None
    mlm_acc: float | None
    probe_p: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "own_loss": self.own_loss, "mlm_acc": self.mlm_acc, "probe_p": self.probe_p}


class CurveRecorder:
    """A loop callback: at every "step" event, the objective's own loss and MLM accuracy (from the loss's
    metrics) and the probe's P(target) under the objective's masked-word predictor."""

    def __init__(self, module: nn.Module, objective: Objective, tokenizer: Tokenizer,
                 probe: str | None = None, target: str = PROBE_TARGET) -> None:
        self.module, self.objective, self.tokenizer = module, objective, tokenizer
        self.probe = probe if probe is not None else tokenizer.spell(PROBE_TEMPLATE)
        self.target = target
        self.points: list[CurvePoint] = []

    def read_probe(self) -> float | None:
        predictor = self.objective.mlm_model(self.module)
        if predictor is None or not self.probe:
            return None
        try:
            return probe_probability(predictor, self.tokenizer, self.probe, self.target)
        except ObjectiveError as e:
            log.info("no probe reading: %s", e)
            self.probe = ""
            return None

    def __call__(self, event: TrainEvent) -> None:
        if event.kind == "start" and event.step == 0:
            self.points.append(CurvePoint(0, None, None, self.read_probe()))
        if event.kind != "step":
            return
        m = event.metrics
        own = event.loss if self.objective.own_loss == "loss" else m.get(self.objective.own_loss)
        acc = m.get(self.objective.mlm_acc_key)
        self.points.append(CurvePoint(event.step, own, acc, self.read_probe()))

    def as_dicts(self) -> list[dict[str, Any]]:
        return [p.as_dict() for p in self.points]


@dataclass
class ComparedRun:
    """One pre-training run of the session, as the comparison shows it."""

    name: str
    objective: str
    points: list[dict[str, Any]]
    folder: Path
    steps: int
    score: dict[str, Any] | None = field(default=None)  # SST-2 fine-tuned: {"accuracy", ...}
    probe: dict[str, Any] | None = field(default=None)  # SST-2 linear probe of the frozen features

    def row(self) -> dict[str, Any]:
        """Its row of the comparison's table ("not yet" for a score not measured yet)."""
        return {"run": self.name, "objective": self.objective, "steps": self.steps,
                "accuracy": (self.score or {}).get("accuracy", "not yet"),
                "probe": (self.probe or {}).get("accuracy", "not yet")}

    def floor(self) -> ComparedRun:
        """The comparison's floor: a model of this run's shape with fresh weights (`write_untrained`), beside
        this run's model folder (not inside it: its download stays as it was)."""
        return ComparedRun(f"untrained (shape of {self.name})", "none", [], self.folder.parent / "untrained", 0)


def write_untrained(folder: Path, like: Path) -> None:
    """Write a model of the shape of the one saved in `like`, with fresh weights, into `folder` (once)."""
    if not (folder / "config.json").is_file():
        model, tok = load(str(like))
        save_model_atomically(untrained_like(model), tok, folder)


def sst2_splits(folder: str | Path | None, n_train: int, n_dev: int) -> tuple[list[Any], list[Any]]:
    """The SST-2 sentences every model of a comparison fine-tunes and is probed on (`n_train`) and is scored
    on (`n_dev`, never trained on), drawn with seed 0 from `folder` (None: BERTLAB_DATA's sst2/)."""
    task, folder = get_task("sst2"), Path(folder) if folder is not None else data_dir() / "sst2"
    if not folder.is_dir():
        raise FileNotFoundError("SST-2 is not here: set BERTLAB_DATA to the folder that holds sst2/ "
                                "(train.tsv, dev.tsv).")
    return (subset(task.read("train", path=folder), n_train, 0, "train"),
            subset(task.read("dev", path=folder), n_dev, 0, "dev"))


def sst2_score(model_folder: str | Path, train_examples: Sequence[Any], dev_examples: Sequence[Any],
               seed: int = 0, device: str = "cpu", **overrides: Any) -> dict[str, Any]:
    """Fine-tune the model saved in `model_folder` on `train_examples` (SST-2, the same settings for every
    model: SST2_SETTINGS) and score it on `dev_examples`, which it never trains on."""
    from bertlab.training.finetune import FinetuneConfig, finetune

    settings = {**SST2_SETTINGS, **overrides}
    cfg = FinetuneConfig(task="sst2", model=str(model_folder), seed=seed, device=device, eval_every=0,
                         log_every=10, **settings)
    result = finetune(cfg, train_examples=list(train_examples), eval_examples=list(dev_examples))
    result.train.raise_for_status()
    return {"accuracy": float(result.metrics["accuracy"]), "train_examples": result.train_examples,
            "dev_examples": result.eval_examples, "seconds": result.wall_time_s, "steps": result.train.step}


def untrained_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """A model of the same family, shape and heads as `model` with freshly initialised (seeded) weights:
    the floor that shows what pre-training bought. The global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = type(model)(model.config)
    return fresh.eval()


# ---------------------------------------------------------------------------------------------
# The linear probe: frozen mean-pooled features -> logistic regression trained to convergence
# ---------------------------------------------------------------------------------------------
@torch.inference_mode()
def mean_pooled_features(model: nn.Module, tokenizer: Tokenizer, texts: Sequence[str], max_length: int = 64,
                         batch_size: int = 64, pairs: Sequence[str | None] | None = None) -> torch.Tensor:
    """The last layer's hidden states averaged over each text's tokens (padding left out): [n, hidden], in
    the order of `texts`. Batches of similar length; no MLM head is run (mlm_positions all False)."""
    pairs = list(pairs) if pairs is not None else [None] * len(texts)
    encs = [tokenizer.encode(a, b, max_length) for a, b in zip(texts, pairs)]
    order = sorted(range(len(encs)), key=lambda i: len(encs[i]))
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    feats: list[torch.Tensor] = [torch.empty(0)] * len(encs)
    try:
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            enc = tokenizer.pad([encs[i] for i in idx])
            mask = enc.attention_mask.to(device)  # [batch, seq]
            none = torch.zeros_like(mask, dtype=torch.bool)  # no MLM logits: only the hidden states are read
            seq = model(enc.input_ids.to(device), enc.token_type_ids.to(device), mask,
                        mlm_positions=none).last_hidden_state  # [batch, seq, hidden]
            keep = mask.unsqueeze(-1).to(seq.dtype)  # [batch, seq, 1]
            pooled = ((seq * keep).sum(1) / keep.sum(1).clamp(min=1)).float().cpu()  # [batch, hidden]
            for j, i in enumerate(idx):
                feats[i] = pooled[j]
    finally:
        model.train(was)
    return torch.stack(feats) if feats else torch.empty(0)


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 l2: float = 1e-3, max_iter: int = 500) -> dict[str, float]:
    """Logistic regression (multinomial; features standardised on the training set; mean cross-entropy +
    l2 * |W|^2) fitted to convergence by full-batch L-BFGS from zero, so the same features always give the
    same probe. Returns train and test accuracy and the final training loss."""
    train_x, test_x = train_x.double(), test_x.double()
    train_y, test_y = train_y.long(), test_y.long()
    if len(train_x) == 0 or len(test_x) == 0:
        raise ObjectiveError("the probe needs training and test examples.")
    mean, std = train_x.mean(0), train_x.std(0, unbiased=False).clamp(min=1e-8)
    a, b = (train_x - mean) / std, (test_x - mean) / std
    classes = int(max(train_y.max(), test_y.max())) + 1
    w = torch.zeros(a.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, bias], lr=1, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(a @ w + bias, train_y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(a @ w + bias, train_y) + l2 * (w * w).sum())
        train_acc = float(((a @ w + bias).argmax(-1) == train_y).double().mean())
        test_acc = float(((b @ w + bias).argmax(-1) == test_y).double().mean())
    return {"accuracy": test_acc, "train_accuracy": train_acc, "train_loss": loss}


def sst2_probe(model_folder: str | Path | nn.Module, train_examples: Sequence[Any], dev_examples: Sequence[Any],
               tokenizer: Tokenizer | None = None, **overrides: Any) -> dict[str, Any]:
    """A linear probe of the frozen model in `model_folder` (or a model given with its tokenizer): mean-pooled
    last-layer features of the SST-2 `train_examples` -> logistic regression, scored on `dev_examples`
    (settings: PROBE_SETTINGS). Nothing in the model learns: this reads what pre-training put in it."""
    import time

    settings = {**PROBE_SETTINGS, **overrides}
    t0 = time.perf_counter()
    if isinstance(model_folder, nn.Module):
        if tokenizer is None:
            raise ObjectiveError("a model given as a module needs its tokenizer too.")
        model = model_folder
    else:
        from bertlab.loading import load

        model, tok = load(str(model_folder))
        tokenizer = tokenizer or tok
    length = settings["max_length"]
    train_x = mean_pooled_features(model, tokenizer, [e.text_a for e in train_examples], length,
                                   pairs=[e.text_b for e in train_examples])
    dev_x = mean_pooled_features(model, tokenizer, [e.text_a for e in dev_examples], length,
                                 pairs=[e.text_b for e in dev_examples])
    scores = linear_probe(train_x, torch.tensor([e.label for e in train_examples]), dev_x,
                          torch.tensor([e.label for e in dev_examples]), settings["l2"], settings["max_iter"])
    return {**scores, "train_examples": len(train_examples), "dev_examples": len(dev_examples),
            "seconds": time.perf_counter() - t0}
