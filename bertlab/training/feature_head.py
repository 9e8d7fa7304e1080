"""The BERT paper's feature-based approach (its Table 7, CoNLL-2003 NER): the encoder stays frozen, each
word's vectors at every stage (its first piece; stage 0 = the embeddings) are computed once and cached on disk
(`tasks.layer_features.word_features`), and a head learns on them: the chosen features
(`tasks.layer_features.FEATURES`: embeddings, last, second-to-last, sum-last-4, concat-last-4, or a scalar
mix of all stages learned with the head) and then one linear map to the tags. The paper put a two-layer
BiLSTM there; bertlab's head is linear (`HEAD`), the same for every choice, so the choices compare.

    cfg = FinetuneConfig(task="ner", mode="feature", features="mix", max_train_examples=2000)
    result = run_finetune(cfg)        # result.score (entity F1), result.mix (the learned weights per stage)

`run_finetune` is what the CLI and the Fine-tuning tab call: this module for a config with `features`,
`finetune.finetune` for any other.

Training runs in the shared loop (progress, cancel, the lr schedule), on batches of whole sentences.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.families.bert import Bert
from bertlab.runtime import model_device, resolve_device
from bertlab.tasks import IGNORE_INDEX, Task, get_task
from bertlab.tasks.layer_features import LayerFeatures, feature_width, stage_names, word_features
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import write_error, write_text_atomically
from bertlab.training.finetune import (
    RESULTS_FILE,
    FinetuneConfig,
    FinetuneError,
    FinetuneResult,
    _examples,
    _float_metrics,
    _load_model,
    _sequence_length,
    finetune,
    task_labels,
)
from bertlab.training.loop import ScoredRun, TrainEvent, TrainResult, resolve_precision, train

log = logging.getLogger(__name__)

HEAD = "linear"  # what sits on the features: one linear map (the BERT paper: a two-layer BiLSTM)
HEAD_FILE = "feature_head.pt"


class FeatureHead(nn.Module):
    """Word vectors at every stage -> tag logits: [words, stage, d] -> [words, labels]."""

    def __init__(self, features: str, stages: int, d_model: int, n_labels: int, fixed: torch.Tensor | None = None):
        super().__init__()
        self.layers = LayerFeatures(features, stages, fixed)
        self.classifier = nn.Linear(feature_width(features, d_model), n_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.layers(x))


def collate_words(items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Sentences -> one batch of their words: x [words, stage, d], labels [words]."""
    return {"x": torch.cat([i["x"] for i in items]), "labels": torch.cat([i["labels"] for i in items])}


def head_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of the word tags (IGNORE_INDEX skipped): logits [words, labels], labels [words]."""
    logits = model(batch["x"]).float()  # [words, labels]
    labels = batch["labels"]
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    scored = labels != IGNORE_INDEX
    correct = (logits.argmax(-1) == labels) & scored
    return loss, {"accuracy": correct.sum() / scored.sum().clamp(min=1)}


def word_items(features: Sequence[torch.Tensor], examples: Sequence[Any],
               label2id: Mapping[str, int]) -> list[dict[str, torch.Tensor]]:
    """One training item per sentence: x [words, stage, d] (the words that fit), labels [words]."""
    items = []
    for f, ex in zip(features, examples):
        n = f.shape[1]
        labels = torch.tensor([label2id.get(t, IGNORE_INDEX) for t in ex.tags[:n]], dtype=torch.long)
        items.append({"x": f.transpose(0, 1), "labels": labels})
    return items


@torch.inference_mode()
def evaluate_head(head: nn.Module, features: Sequence[torch.Tensor], examples: Sequence[Any],
                  id2label: Mapping[int, str], task: Task) -> dict[str, Any]:
    """The task's metric (entity P/R/F1) of `head` on the sentences' cached features; words cut from a long
    sentence get "O", as in `finetune.evaluate`."""
    device = model_device(head)
    tags = []
    for f, ex in zip(features, examples):
        best = head(f.transpose(0, 1).to(device)).argmax(-1).tolist() if f.shape[1] else []
        tags.append([id2label[i] for i in best] + ["O"] * (len(ex.words) - len(best)))
    return {**task.metric(tags, [ex.tags for ex in examples]), "examples": len(examples)}


@dataclass
class FeatureHeadResult(ScoredRun):
    """How a feature-based run went: the head, its dev metrics, the curves, the features it read."""

    head: FeatureHead
    tokenizer: Tokenizer
    train: TrainResult
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    main_metric: str
    features: str
    stages: list[str]  # "embeddings", "layer 0", ...
    model_name: str  # the frozen encoder in words
    wall_time_s: float
    features_s: float  # reading (or computing) the word features of train and dev
    device: str
    trainable_parameters: int
    total_parameters: int  # the head's and the frozen encoder's
    train_examples: int
    eval_examples: int
    train_words: int
    data_note: str = ""
    dev_held_out: bool = False
    precision: str = "fp32"
    saved_to: Path | None = None
    mode: str = "feature"

    @property
    def mix(self) -> dict[str, Any] | None:
        """For "mix": the learned softmax weight of each stage and the scale gamma; None otherwise."""
        mix = self.head.layers.mix
        if mix is None:
            return None
        return {"layers": self.stages, "weights": [round(float(w), 4) for w in mix.weights.detach().cpu()],
                "gamma": round(float(mix.gamma.detach()), 4)}

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (no head): what the CLI prints and out_dir/finetune_results.json holds."""
        return {
            "status": self.status, "error": self.error, "main_metric": self.main_metric, "score": self.score,
            "metrics": self.metrics, "history": self.history, "steps": self.train.step,
            "wall_time_s": round(self.wall_time_s, 2), "features_s": round(self.features_s, 2),
            "device": self.device, "mode": self.mode, "features": self.features, "head": HEAD,
            "word_feature": "first piece", "mix": self.mix, "model": self.model_name,
            "trainable_parameters": self.trainable_parameters, "total_parameters": self.total_parameters,
            "train_examples": self.train_examples, "eval_examples": self.eval_examples,
            "train_words": self.train_words, "data": self.data_note, "dev_held_out": self.dev_held_out,
            "precision": self.precision, "saved_to": str(self.saved_to) if self.saved_to else None,
        }


def finetune_features(
    cfg: FinetuneConfig,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    cancel: threading.Event | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    train_examples: Sequence[Any] | None = None,
    eval_examples: Sequence[Any] | None = None,
) -> FeatureHeadResult:
    """Train a linear head on `cfg.features` of the frozen `cfg.model` and score it on the dev split (the
    examples as `finetune` reads them). Word features of train and dev are computed once and cached."""
    t0 = time.perf_counter()
    task = get_task(cfg.task)
    cfg = cfg.resolved()
    if cfg.features is None:
        raise ValueError("finetune_features needs cfg.features (one of tasks.layer_features.FEATURES).")
    given = isinstance(cfg.model, torch.nn.Module)  # a loaded model of any family, not a name or path
    encoder, tok = _load_model(cfg, tokenizer)
    if not given:  # loaded here: compute the features on the run's device (a model given stays where it is)
        encoder.to(resolve_device(cfg.device))
    train_ex, dev_ex, data_note, held_out = _examples(cfg, task, train_examples, eval_examples)
    id2label = task_labels(task, train_ex)
    label2id = {t: i for i, t in id2label.items()}
    length = _sequence_length(cfg, task, encoder)
    log.info("word features of %d train and %d dev sentences (frozen encoder, cached)", len(train_ex), len(dev_ex))
    stop = None if cancel is None else cancel.is_set  # Cancel while reading raises tasks.layer_features.Cancelled
    f_train = word_features(encoder, tok, train_ex, max_length=length, cancelled=stop)
    f_dev = word_features(encoder, tok, dev_ex, max_length=length, cancelled=stop) if dev_ex else []
    features_s = time.perf_counter() - t0
    stages, d_model = f_train[0].shape[0], f_train[0].shape[-1]
    with torch.random.fork_rng(devices=[]):  # a new head starts from cfg.seed, whatever ran before
        torch.manual_seed(cfg.seed)
        head = FeatureHead(cfg.features, stages, d_model, len(id2label))
    items = word_items(f_train, train_ex, label2id)
    train_cfg = replace(cfg.train_config(max(1, len(items) // cfg.batch_size)), out_dir=None, checkpoint_every=0)
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    log.info("feature-based %s (%s, %s head): %d sentences, %d words, %d dev sentences; %d parameters train",
             task.name, cfg.features, HEAD, len(items), sum(len(i["labels"]) for i in items), len(dev_ex), trainable)
    result = train(head, head_loss, items, train_cfg, collate=collate_words,
                   eval_fn=(lambda m: evaluate_head(m, f_dev, dev_ex, id2label, task)) if dev_ex else None,
                   callbacks=callbacks, cancel=cancel)
    head.eval()
    device = next(head.parameters()).device
    out = FeatureHeadResult(
        head, tok, result, dict(result.eval_metrics), [_float_metrics(h) for h in result.history
                                                      if h.get("kind") == "eval"],
        task.main_metric, cfg.features, stage_names(stages - 1), _model_text(encoder), time.perf_counter() - t0,
        features_s, str(device), trainable, trainable + sum(p.numel() for p in encoder.parameters()),
        len(train_ex), len(dev_ex), sum(len(i["labels"]) for i in items), data_note, held_out,
        resolve_precision(train_cfg.precision, device),
    )
    _save(out, cfg, id2label)
    return out


def run_finetune(
    cfg: FinetuneConfig,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    cancel: threading.Event | None = None,
    **kwargs: Any,
) -> FinetuneResult | FeatureHeadResult:
    """`finetune_features` when `cfg.features` is set, else `finetune.finetune` (keyword arguments: theirs)."""
    if cfg.features is None:
        return finetune(cfg, callbacks, cancel, **kwargs)
    if kwargs.pop("resume_from", None) is not None:
        raise FinetuneError("a head on cached features keeps no checkpoints to resume from (it trains in "
                            "seconds once the features are cached): run it again without --resume.")
    return finetune_features(cfg, callbacks, cancel, **kwargs)


def _model_text(model: Bert) -> str:
    """Where the frozen encoder came from (when loaded) and its shape, in words."""
    source = getattr(getattr(model, "load_report", None), "source", None)
    return f"{source} ({model.describe()})" if source else model.describe()


def _save(result: FeatureHeadResult, cfg: FinetuneConfig, id2label: Mapping[int, str]) -> None:
    """The head (a completed run's) and the summary into cfg.out_dir, when given."""
    if result.status == "failed":
        log.error("feature-based training failed: %s", result.error)
    if cfg.out_dir is None:
        return
    folder = Path(cfg.out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if result.status == "completed":
            torch.save({"state_dict": result.head.state_dict(), "features": result.features, "head": HEAD,
                        "stages": result.stages, "id2label": dict(id2label), "model": result.model_name},
                       folder / HEAD_FILE)
            result.saved_to = folder / HEAD_FILE
    except OSError as e:
        raise write_error(e, folder) from e
    summary = {**result.summary(), "config": cfg.to_dict()}
    write_text_atomically(folder / RESULTS_FILE, json.dumps(summary, indent=2, default=str) + "\n")


__all__ = ["HEAD", "HEAD_FILE", "FeatureHead", "FeatureHeadResult", "collate_words", "evaluate_head",
           "finetune_features", "head_loss", "run_finetune", "word_items"]
