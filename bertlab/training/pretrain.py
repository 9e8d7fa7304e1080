"""Pre-training: MLM (+ NSP or SOP) on a corpus with the shared loop, and the MLM/NSP evaluations.

    cfg = PretrainConfig(size="mini", corpus="wiki-offline", steps=500)
    model, tok, result = pretrain(cfg)

The same code trains a mini BERT from scratch (the pre-training tab, `bertlab pretrain`) and
the heads of an existing encoder (the offline default's MLM/NSP heads: `freeze_encoder=True`).
With `objective=` ("bert", "roberta", "albert", "electra", "spanbert", "causal", …: training.objectives) a
family member's own objective runs instead: `pretrain_objective(cfg)` -> an `ObjectiveRun` whose
`save(folder)` writes the model that objective keeps.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.tasks.batching import pad_inputs
from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import Document, load_corpus
from bertlab.training.loop import TrainConfig, TrainEvent, TrainResult, train
from bertlab.training.masking import (
    IGNORE_INDEX,
    TAGGED_STRATEGIES,
    MaskingConfig,
    MaskingError,
    MLMBatch,
    MLMCollator,
    tagged_text_needed,
)
from bertlab.training.objectives import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    ModelShape,
    Objective,
    ObjectiveError,
    get_objective,
)
from bertlab.training.objectives.base import SIZES, write_objective_file  # SIZES: re-exported here
from bertlab.training.pairs import PairExample, build_pairs

log = logging.getLogger(__name__)

PAIR_TASKS = ("nsp", "sop", "none")


@dataclass
class PretrainConfig:
    """One pre-training run: model size, data, masking, and the loop's settings."""

    size: str = "mini"  # a key of SIZES; ignored when a model is given
    corpus: str = "wiki-offline"  # a corpora.load_corpus name, a text file or folder
    steps: int = 300
    seq_len: int = 128
    batch_size: int = 32
    lr: float = 5e-4
    warmup_ratio: float = 0.06
    masking: str = "token"  # a masking.STRATEGIES name; "entity" and "phrase" need tagged text (conll2003)
    pair_task: str = "nsp"  # "nsp", "sop", or "none" (MLM only, RoBERTa-style)
    static_masking: bool = False  # True: one fixed mask per example (original BERT); False: dynamic
    objective: str | None = None  # a bertlab.training.objectives name; None = the MLM/NSP settings above
    embedding_size: int | None = None  # ALBERT/ELECTRA: factorised embedding width (None: the objective's)
    shared_layers: bool | None = None  # ALBERT: one layer shared across depth (None: the objective's, yes)
    max_documents: int | None = None  # use only the first N documents (quick demos)
    dupe_factor: int = 1
    sentence_pair_prob: float = 0.0  # share of pairs made of one sentence + one sentence (see pairs.py)
    freeze_encoder: bool = False  # train the heads only (the offline default's recipe)
    train_layernorms: bool = False  # with freeze_encoder: also adapt every LayerNorm (few parameters)
    train_top_layers: int = 0  # with freeze_encoder: also train the last N encoder layers
    out_dir: str | None = None
    checkpoint_every: int = 0
    log_every: int = 10
    eval_every: int = 0
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # "auto" (bf16 autocast where the device has native bf16), "bf16" or "fp32"
    extra_train: dict[str, Any] = field(default_factory=dict)  # any other TrainConfig field

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size {self.size!r} is not one of {', '.join(SIZES)}.")
        if self.pair_task not in PAIR_TASKS:
            raise ValueError(f"pair_task must be one of {PAIR_TASKS}; got {self.pair_task!r}.")
        if self.seq_len < 16:
            raise ValueError(f"seq_len must be at least 16 tokens; got {self.seq_len}.")
        if self.objective is not None:
            objective = get_objective(self.objective)
            for option in ("embedding_size", "shared_layers"):
                if getattr(self, option) is not None and option not in objective.size_options:
                    takes = [o.name for o in OBJECTIVES.values() if option in o.size_options]
                    raise ObjectiveError(f"{option.replace('_', ' ')} is a size option of {' and '.join(takes)}, "
                                         f"not of {objective.name}: leave it out or pick {takes[0]}.")
            ModelShape.of(self.size, self.embedding_size)  # checks the embedding size against the width
        elif self.embedding_size is not None or self.shared_layers is not None:
            raise ObjectiveError("embedding size and shared layers are ALBERT's size options: set objective='albert'.")

    def shape(self) -> ModelShape:
        """The new model's size (the objective's defaults for the options left out)."""
        objective = get_objective(self.objective or DEFAULT_OBJECTIVE)
        shared = self.shared_layers if self.shared_layers is not None else "shared_layers" in objective.size_options
        return ModelShape.of(self.size, self.embedding_size, shared, max_len=max(512, self.seq_len))

    def train_config(self) -> TrainConfig:
        settings = dict(
            lr=self.lr, warmup_ratio=self.warmup_ratio, max_steps=self.steps, batch_size=self.batch_size,
            seed=self.seed, log_every=self.log_every, eval_every=self.eval_every, out_dir=self.out_dir,
            checkpoint_every=self.checkpoint_every, device=self.device, precision=self.precision,
        )
        return TrainConfig(**{**settings, **self.extra_train})


def new_model(size: str, tokenizer: Tokenizer, pair_task: str = "nsp", max_len: int = 512) -> Bert:
    """A randomly initialised BERT of a named size with an MLM head (and an NSP/SOP head)."""
    layers, hidden, heads = SIZES[size]
    cfg = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, max_position_embeddings=max_len, pad_token_id=tokenizer.pad_token_id,
        pretraining_heads=("mlm", "nsp") if pair_task != "none" else ("mlm",),
    )
    return Bert(cfg)


def pretraining_examples(documents: Sequence[Document], tokenizer: Tokenizer, cfg: PretrainConfig) -> list[PairExample]:
    """[CLS] A [SEP] B [SEP] examples with NSP/SOP labels (for "none" the NSP label is simply unused)."""
    task = "sop" if cfg.pair_task == "sop" else "nsp"
    return build_pairs(documents, tokenizer, task=task, max_seq_length=cfg.seq_len, seed=cfg.seed,
                       dupe_factor=cfg.dupe_factor, sentence_pair_prob=cfg.sentence_pair_prob)


def mlm_nsp_loss(model: torch.nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MLM cross-entropy on the chosen positions only (+ NSP/SOP cross-entropy when the model has the head).
    Metrics stay tensors: the loop reads them at log time, so a step never waits for the GPU."""
    picked = batch.labels != IGNORE_INDEX  # [batch, seq]
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked,
                all_positions=False)  # a BERT-layout model's last layer on [CLS] and `picked` alone
    targets = batch.labels[picked]  # [n]
    mlm_loss = F.cross_entropy(out.mlm_logits.float(), targets)
    metrics = {"mlm_loss": mlm_loss.detach(), "mlm_acc": (out.mlm_logits.argmax(-1) == targets).float().mean()}
    loss = mlm_loss
    if out.nsp_logits is not None and batch.next_sentence_label is not None:
        nsp_loss = F.cross_entropy(out.nsp_logits.float(), batch.next_sentence_label)
        loss = loss + nsp_loss
        metrics["nsp_loss"] = nsp_loss.detach()
        metrics["nsp_acc"] = (out.nsp_logits.argmax(-1) == batch.next_sentence_label).float().mean()
    return loss, metrics


def trainable_prefixes(model: Bert, top_layers: int = 0) -> tuple[str, ...]:
    """Parameter-name prefixes that learn when the encoder is frozen: heads, pooler, the last `top_layers` layers."""
    family = model.family
    n = family.num_layers
    if not 0 <= top_layers <= n:
        raise ValueError(f"train_top_layers must be between 0 and {n}; got {top_layers}.")
    pooler = (family.pooler_prefix,) if family.pooler_prefix else ()
    return family.head_prefixes + pooler + tuple(family.layer_prefix(i) for i in range(n - top_layers, n))


def freeze_for_heads(model: Bert, train_layernorms: bool = False, top_layers: int = 0) -> int:
    """Freeze the encoder so that only the MLM/NSP heads (and the pooler, and the last `top_layers` layers)
    learn; returns the trainable count. The word embeddings stay frozen, so the tied MLM decoder keeps the
    encoder's vocabulary, and gradients stop at the first trainable layer (cheap on a CPU)."""
    keep = trainable_prefixes(model, top_layers)
    encoder = model.family.prefix + "."
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith(keep) or (
            train_layernorms and "LayerNorm" in name and name.startswith(encoder))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def pretrain(
    cfg: PretrainConfig,
    model: Bert | None = None,
    tokenizer: Tokenizer | None = None,
    documents: Sequence[Document] | None = None,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    cancel: threading.Event | None = None,
    eval_documents: Sequence[Document] | None = None,
    resume_from: str | None = None,
) -> tuple[Bert, Tokenizer, TrainResult]:
    """Pre-train `model` (default: a new `cfg.size` BERT with the offline default's vocabulary).

    Returns the trained model (in eval mode), its tokenizer and how the run ended. With `cfg.objective`
    set, the objective's run (see `pretrain_objective`) and the model it keeps."""
    if cfg.objective is not None:
        run = pretrain_objective(cfg, model, tokenizer, documents, callbacks, cancel, eval_documents, resume_from)
        return run.kept, run.tokenizer, run.result
    if tokenizer is None:
        from bertlab.loading import default_model_folder

        tokenizer = Tokenizer.from_folder(default_model_folder())
    if model is None:
        model = new_model(cfg.size, tokenizer, cfg.pair_task)
    if not model.has_mlm or (cfg.pair_task != "none" and not model.has_nsp):
        heads = ("mlm",) if cfg.pair_task == "none" else ("mlm", "nsp")
        model = model.with_heads(heads)
    if cfg.freeze_encoder:
        n = freeze_for_heads(model, cfg.train_layernorms, cfg.train_top_layers)
        log.info("encoder frozen: %d trainable parameters", n)
    docs = list(documents) if documents is not None else load_corpus(cfg.corpus, split="train")
    if cfg.max_documents:
        docs = docs[: cfg.max_documents]
    require_tags(docs, cfg.masking, cfg.corpus if documents is None else "")
    examples = pretraining_examples(docs, tokenizer, cfg)
    if not examples:
        raise ValueError(
            f"the corpus gave no training pairs ({len(docs)} documents): BERT's examples need documents of at "
            "least two sentences (a sentence ends with . ! or ? followed by a capital letter)."
        )
    collate = MLMCollator(tokenizer, MaskingConfig(strategy=cfg.masking), seed=cfg.seed, static=cfg.static_masking)
    eval_fn = None
    if eval_documents is not None:
        eval_fn = lambda m: evaluate_pretraining(m, tokenizer, eval_documents, cfg)  # noqa: E731
    result = train(model, mlm_nsp_loss, examples, cfg.train_config(), collate=collate, eval_fn=eval_fn,
                   callbacks=callbacks, cancel=cancel, tokenizer=tokenizer, resume_from=resume_from)
    model.eval()
    return model, tokenizer, result


def require_tags(documents: Sequence[Document], masking: str, corpus: str = "") -> None:
    """Refuse (MaskingError, in words a student can act on) entity / phrase masking of untagged documents."""
    if masking in TAGGED_STRATEGIES and not any(masking in d.tagged for d in documents):
        raise MaskingError(tagged_text_needed(masking, str(corpus)[:80]))


@dataclass
class ObjectiveRun:
    """What `pretrain_objective` made: the trained module (ELECTRA's generator + discriminator, SpanBERT's
    BERT + SBO head, else the model itself), the objective, the tokenizer and how the run ended."""

    objective: Objective
    module: torch.nn.Module
    tokenizer: Tokenizer
    result: TrainResult
    config: PretrainConfig

    @property
    def kept(self) -> torch.nn.Module:
        """The model the objective keeps (a bertlab family model, in eval mode)."""
        return self.objective.kept(self.module).eval()

    @property
    def mlm_model(self) -> torch.nn.Module | None:
        """The part that predicts masked words (ELECTRA: the generator), for probes."""
        return self.objective.mlm_model(self.module)

    def save(self, folder: str | Path) -> Path:
        """Write the kept model (HF layout, `objective.hf_class`), the objective's extra parts and a note of
        the run (`pretraining_objective.json`) into `folder`."""
        folder = self.objective.save(self.module, self.tokenizer, Path(folder))
        cfg = self.config
        write_objective_file(folder, {
            "objective": self.objective.name, "title": self.objective.title, "hf_class": self.objective.hf_class,
            "size": cfg.size, "embedding_size": cfg.embedding_size, "shared_layers": cfg.shared_layers,
            "steps": self.result.step, "status": self.result.status, "corpus": str(cfg.corpus)[:200],
            "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": cfg.seed,
        })
        return folder


def check_continuable(objective: Objective, model: torch.nn.Module) -> None:
    """Refuse (ObjectiveError) to continue `model` with an objective of another family, or with one that
    only builds from scratch (ELECTRA's generator + discriminator)."""
    if model.config.model_type != objective.model_type or objective.continue_with is None:
        what = (f"{objective.builds or 'its own models'} from scratch" if objective.continue_with is None
                else f"a {objective.model_type} model")
        raise ObjectiveError(f"the {objective.name} objective trains {what}; the model given is a "
                             f"{model.config.model_type} model. Leave out the model, or pick an objective "
                             f"of its family.")


def objective_module(objective: Objective, cfg: PretrainConfig, tokenizer: Tokenizer,
                     model: torch.nn.Module | None = None) -> torch.nn.Module:
    """The module an objective trains: new at `cfg.shape()`, or built around `model` (continued training)
    when the objective can take one."""
    if model is None:
        return objective.build(cfg.shape(), tokenizer)
    check_continuable(objective, model)
    heads = objective.heads
    model = model.with_heads(heads) if model.config.pretraining_heads != heads else model
    return objective.continue_with(model)


def pretrain_objective(
    cfg: PretrainConfig,
    model: torch.nn.Module | None = None,
    tokenizer: Tokenizer | None = None,
    documents: Sequence[Document] | None = None,
    callbacks: Sequence[Callable[[TrainEvent], None]] = (),
    cancel: threading.Event | None = None,
    eval_documents: Sequence[Document] | None = None,
    resume_from: str | None = None,
    module: torch.nn.Module | None = None,
) -> ObjectiveRun:
    """Pre-train with `cfg.objective` (default: DEFAULT_OBJECTIVE) on the shared loop: its model, its data, its loss.
    `module`: what `objective_module` built already (so a callback can hold it); else built here."""
    objective = get_objective(cfg.objective or DEFAULT_OBJECTIVE)
    if tokenizer is None:
        from bertlab.loading import default_model_folder

        tokenizer = Tokenizer.from_folder(default_model_folder())
    if module is None:
        module = objective_module(objective, cfg, tokenizer, model)
    docs = list(documents) if documents is not None else load_corpus(cfg.corpus, split="train")
    if cfg.max_documents:
        docs = docs[: cfg.max_documents]
    examples = objective.examples(docs, tokenizer, cfg.seq_len, cfg.seed)
    if not examples:
        raise ValueError(f"the corpus gave no {objective.name} training examples ({len(docs)} documents): give "
                         "more text (documents of several sentences).")
    eval_fn = None
    if eval_documents is not None:
        eval_fn = lambda m: evaluate_objective(m, objective, tokenizer, eval_documents, cfg)  # noqa: E731
    result = train(module, objective.loss, examples, cfg.train_config(), collate=objective.collate(tokenizer, cfg.seed),
                   eval_fn=eval_fn, callbacks=callbacks, cancel=cancel, tokenizer=tokenizer, resume_from=resume_from)
    module.eval()
    return ObjectiveRun(objective, module, tokenizer, result, cfg)


def evaluate_objective(module: torch.nn.Module, objective: Objective, tokenizer: Tokenizer,
                       documents: Sequence[Document], cfg: PretrainConfig) -> dict[str, float]:
    """Held-out MLM top-1/top-5 of the objective's masked-word predictor (ELECTRA: its generator), and the
    pair head's accuracy for BERT (NSP) and ALBERT (SOP)."""
    module = _unwrap(module)
    out: dict[str, float] = {}
    predictor = objective.mlm_model(module)
    if predictor is not None:
        figures = evaluate_mlm(predictor, tokenizer, documents, cfg.seed, cfg.seq_len, max_tokens=20_000)
        out.update({f"mlm_{k}": v for k, v in figures.items() if k in ("top1", "top5")})
    if objective.pair_task is not None:
        out["pair_accuracy"] = evaluate_nsp(objective.kept(module), tokenizer, documents, cfg.seed, cfg.seq_len,
                                            task=objective.pair_task, max_pairs=256)["accuracy"]
    return out


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def _unwrap(model: torch.nn.Module) -> Bert:
    return getattr(model, "module", model)


@torch.inference_mode()
def evaluate_mlm(
    model: Bert,
    tokenizer: Tokenizer,
    documents: Sequence[Document],
    seed: int = 0,
    seq_len: int = 128,
    batch_size: int = 32,
    max_tokens: int | None = None,
) -> dict[str, float]:
    """Masked-token top-1 / top-5 accuracy: documents cut into [CLS] chunk [SEP] pieces of `seq_len`,
    15 % of the tokens chosen with a fixed seed, every chosen token replaced by [MASK]; [UNK] targets
    are not scored."""
    model = _unwrap(model)
    model.require("mlm")
    chunks = _chunks(documents, tokenizer, seq_len, max_tokens)
    if not chunks:
        raise ValueError("no text to evaluate on: the documents are empty.")
    collate = MLMCollator(tokenizer, MaskingConfig(mask_prob=1.0, random_prob=0.0), seed=seed, static=True)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    top1 = top5 = n = 0
    for i in range(0, len(chunks), batch_size):
        batch = collate([{"input_ids": c, "index": i + j} for j, c in enumerate(chunks[i : i + batch_size])])
        picked = (batch.labels != IGNORE_INDEX).to(device)
        logits = model(batch.input_ids.to(device), batch.token_type_ids.to(device), batch.attention_mask.to(device),
                       mlm_positions=picked).mlm_logits
        targets = batch.labels.to(device)[picked]
        scored = targets != tokenizer.unk_token_id  # WikiText's <unk> ([UNK]) is not a word to guess
        best = logits.topk(5, dim=-1).indices  # [n, 5]
        top1 += int(((best[:, 0] == targets) & scored).sum())
        top5 += int(((best == targets[:, None]).any(-1) & scored).sum())
        n += int(scored.sum())
    model.train(was_training)
    return {"top1": top1 / n, "top5": top5 / n, "masked_tokens": n, "sequences": len(chunks)}


@torch.inference_mode()
def evaluate_nsp(
    model: Bert, tokenizer: Tokenizer, documents: Sequence[Document], seed: int = 0, seq_len: int = 128,
    batch_size: int = 32, task: str = "nsp", max_pairs: int | None = None, sentence_pair_prob: float = 0.0,
) -> dict[str, float]:
    """NSP (or SOP) accuracy on pairs made from `documents` with a fixed seed
    (`sentence_pair_prob=1`: only one-sentence + one-sentence pairs)."""
    model = _unwrap(model)
    model.require("nsp")
    pairs = build_pairs(documents, tokenizer, task=task, max_seq_length=seq_len, seed=seed,
                        sentence_pair_prob=sentence_pair_prob)[:max_pairs]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for i in range(0, len(pairs), batch_size):
        part = pairs[i : i + batch_size]
        ids, types, mask = pad_inputs([p.input_ids for p in part], [p.token_type_ids for p in part],
                                      tokenizer.pad_token_id)
        logits = model(ids.to(device), types.to(device), mask.to(device)).nsp_logits
        labels = torch.tensor([p.label for p in part], device=device)
        correct += int((logits.argmax(-1) == labels).sum())
    model.train(was_training)
    return {"accuracy": correct / max(len(pairs), 1), "pairs": len(pairs)}


def evaluate_pretraining(model: Bert, tokenizer: Tokenizer, documents: Sequence[Document],
                         cfg: PretrainConfig) -> dict[str, float]:
    """The loop's eval_fn: MLM top-1/top-5 (+ NSP accuracy) on held-out documents."""
    out = {f"mlm_{k}": v for k, v in evaluate_mlm(model, tokenizer, documents, cfg.seed, cfg.seq_len,
                                                 max_tokens=20_000).items() if k in ("top1", "top5")}
    if _unwrap(model).has_nsp and cfg.pair_task != "none":
        out["nsp_accuracy"] = evaluate_nsp(model, tokenizer, documents, cfg.seed, cfg.seq_len,
                                           task=cfg.pair_task, max_pairs=256)["accuracy"]
    return out


def _chunks(
    documents: Sequence[Document], tokenizer: Tokenizer, seq_len: int, max_tokens: int | None
) -> list[list[int]]:
    """Each document's tokens cut into pieces of seq_len - 2, wrapped in [CLS] ... [SEP]."""
    body = seq_len - 2
    out: list[list[int]] = []
    total = 0
    for doc in documents:
        ids = [i for sentence in tokenizer.encode_ids(doc.sentences) for i in sentence]
        for start in range(0, len(ids), body):
            piece = ids[start : start + body]
            if len(piece) < 8:  # a few trailing tokens give too little context to judge
                continue
            out.append([tokenizer.cls_token_id, *piece, tokenizer.sep_token_id])
            total += len(piece)
            if max_tokens and total >= max_tokens:
                return out
    return out


def curve_point(event: TrainEvent) -> dict[str, Any]:
    """The point a "step" event adds to the pre-training curves: MLM loss and accuracy (ELECTRA's are its
    generator's; a next-token objective's, its next-token loss and accuracy) and the pair task's accuracy (an
    objective's pair head reports pair_acc)."""
    m = event.metrics
    return {"step": event.step, "mlm_loss": m.get("mlm_loss", m.get("gen_mlm_loss", m.get("lm_loss"))),
            "mlm_acc": m.get("mlm_acc", m.get("gen_mlm_acc", m.get("lm_acc"))),
            "nsp_acc": m.get("nsp_acc", m.get("pair_acc"))}
