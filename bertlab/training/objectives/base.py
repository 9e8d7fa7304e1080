"""What every pre-training objective shares: the `Objective` record, the model sizes, building a
family's model from scratch, full-sentence packing, and the MLM loss and probe.

An objective splits into data making (`examples` then `collate`: pure functions of the documents,
the tokenizer and a seed or `torch.Generator`) and the loss (`loss(model, batch)`), so the data can
be checked on fixed seeds without a model, and the loss on hand-made batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.config import PAIR_HEADS
from bertlab.families import FAMILIES, spec_from_hf
from bertlab.tokenizer import Tokenizer
from bertlab.training.masking import IGNORE_INDEX, MaskingConfig, MLMBatch, MLMCollator

# name -> (layers, hidden, heads); intermediate = 4 x hidden, vocabulary from the tokenizer
# (the same table as bertlab.training.pretrain.SIZES, which re-exports it).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}
OBJECTIVE_FILE = "pretraining_objective.json"  # what made the folder: objective, size, steps (for people)


class ObjectiveError(ValueError):
    """An objective asked for with settings it cannot use; the message says what to change."""


@dataclass(frozen=True)
class ModelShape:
    """The size of a new model: a SIZES entry plus the factorised embedding and layer sharing."""

    layers: int
    hidden: int
    heads: int
    embedding_size: int | None = None  # None: as wide as the hidden layers (no factorisation)
    shared_layers: bool = False  # ALBERT: one layer's weights serve every depth
    max_len: int = 512

    @classmethod
    def of(cls, size: str, embedding_size: int | None = None, shared_layers: bool = False,
           max_len: int = 512) -> "ModelShape":
        if size not in SIZES:
            raise ObjectiveError(f"size {size!r} is not one of {', '.join(SIZES)}.")
        layers, hidden, heads = SIZES[size]
        if embedding_size is not None and not 8 <= embedding_size <= hidden:
            raise ObjectiveError(f"embedding size {embedding_size} must be between 8 and the hidden size "
                                 f"({hidden} for {size}).")
        return cls(layers, hidden, heads, embedding_size, shared_layers, max_len)


def new_family_model(model_type: str, architecture: str, shape: ModelShape, tokenizer: Tokenizer,
                     **extra: Any) -> nn.Module:
    """A randomly initialised model of `model_type` with the heads of HF class `architecture`, built
    from the config.json transformers would read (so saving and loading round-trip exactly)."""
    family = FAMILIES[model_type]
    d = family.new_config(architecture, vocab_size=tokenizer.vocab_size, hidden_size=shape.hidden,
                          num_layers=shape.layers, num_heads=shape.heads, max_len=shape.max_len,
                          pad_token_id=tokenizer.pad_token_id, embedding_size=shape.embedding_size,
                          shared_layers=shape.shared_layers, **extra)
    _, spec = spec_from_hf(d)
    # transformers' MLM-only classes (BertForMaskedLM, RobertaForMaskedLM) have no pooler: none here either
    spec = spec.replace(add_pooler=any(h in spec.pretraining_heads for h in PAIR_HEADS))
    return family.model_class(spec)


# ---------------------------------------------------------------------------------------------
# Data: full-sentence packing (RoBERTa's FULL-SENTENCES, SpanBERT's single segments)
# ---------------------------------------------------------------------------------------------
def pack_full_sentences(documents: Sequence[Sequence[Sequence[int]]], body: int, sep_id: int,
                        cross_documents: bool = True) -> list[list[int]]:
    """Token ids of whole sentences packed in order into pieces of at most `body` tokens.

    `documents`: per document, the token ids of each sentence. A piece takes sentences while they fit;
    with `cross_documents` it runs on into the next document after one `sep_id` (RoBERTa's extra
    separator at a document boundary), otherwise a document's end closes the piece. A sentence longer
    than `body` is cut into `body`-sized parts. No [CLS]/[SEP] around the piece (see `wrap`)."""
    if body < 1:
        raise ObjectiveError(f"a packed piece needs room for at least one token; got {body}.")
    pieces: list[list[int]] = []
    current: list[int] = []

    def flush() -> None:
        nonlocal current
        while current and current[-1] == sep_id:  # never end a piece on a boundary mark
            current.pop()
        if current:
            pieces.append(current)
        current = []

    for doc in documents:
        sentences = [list(s) for s in doc if len(s)]
        if not sentences:
            continue
        if current and cross_documents:
            if len(current) + 1 < body:
                current.append(sep_id)
            else:
                flush()
        for sentence in sentences:
            for start in range(0, len(sentence), body):
                part = sentence[start : start + body]
                if len(current) + len(part) > body:
                    flush()
                current.extend(part)
        if not cross_documents:
            flush()
    flush()
    return pieces


def wrap(piece: Sequence[int], tokenizer: Tokenizer) -> list[int]:
    """[CLS] piece [SEP] (as the tokenizer spells them)."""
    return [tokenizer.cls_token_id, *piece, tokenizer.sep_token_id]


def token_documents(documents: Sequence[Any], tokenizer: Tokenizer) -> list[list[list[int]]]:
    """Per document, the token ids (no special tokens) of each sentence."""
    return [tokenizer.encode_ids(list(getattr(d, "sentences", d))) for d in documents]


def packed_examples(documents: Sequence[Any], tokenizer: Tokenizer, seq_len: int,
                    cross_documents: bool = True) -> list[dict[str, Any]]:
    """Single-segment examples `{"input_ids", "index"}` of at most `seq_len` tokens, [CLS] ... [SEP]."""
    pieces = pack_full_sentences(token_documents(documents, tokenizer), seq_len - 2, tokenizer.sep_token_id,
                                 cross_documents)
    return [{"input_ids": wrap(p, tokenizer), "index": i} for i, p in enumerate(pieces) if len(p) >= 4]


# ---------------------------------------------------------------------------------------------
# Losses and readings shared by the objectives
# ---------------------------------------------------------------------------------------------
def mlm_loss(out_logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy and accuracy of MLM logits [n, vocab] against targets [n]."""
    loss = F.cross_entropy(out_logits.float(), targets)
    return loss, {"mlm_loss": loss.detach(), "mlm_acc": (out_logits.argmax(-1) == targets).float().mean()}


def mlm_forward(model: nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
    """MLM loss of `model` on `batch` (+ the model output, for the sentence heads)."""
    picked = batch.labels != IGNORE_INDEX  # [batch, seq]
    out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked)
    loss, metrics = mlm_loss(out.mlm_logits, batch.labels[picked])
    return loss, metrics, out


@torch.inference_mode()
def probe_probability(model: nn.Module, tokenizer: Tokenizer, text: str, target: str) -> float:
    """P(target word's first piece) at the first mask token of `text` under an MLM model."""
    enc = tokenizer.encode_batch([text])
    where = (enc.input_ids[0] == tokenizer.mask_token_id).nonzero()
    pieces = tokenizer.encode(target).ids[1:-1]
    if not len(where) or not pieces:
        raise ObjectiveError(f"the probe needs a {tokenizer.mask_token} and a target word.")
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    logits = model(enc.input_ids.to(device), enc.token_type_ids.to(device), enc.attention_mask.to(device)).mlm_logits
    model.train(was)
    return float(logits[0, int(where[0, 0])].float().softmax(-1)[pieces[0]])


def collator(tokenizer: Tokenizer, seed: int, **masking: Any) -> MLMCollator:
    """Dynamic masking (a fresh mask each time an example comes round; the loop passes the generator)."""
    return MLMCollator(tokenizer, MaskingConfig(**masking), seed=seed, static=False)


def write_objective_file(folder: Path, info: dict[str, Any]) -> None:
    (Path(folder) / OBJECTIVE_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# The record each objective module fills in
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Objective:
    """One pre-training objective: how its model is built, its data made, its loss computed, and
    what is kept and saved.

    build(shape, tokenizer) -> the module the loop trains (may hold several models);
    examples(documents, tokenizer, seq_len, seed) -> the examples (fixed by the seed);
    collate(tokenizer, seed) -> batch maker `(examples, generator=None) -> batch` (masking);
    loss(model, batch) -> (loss, metrics); kept(module) -> the model kept (a family model);
    mlm_model(module) -> the part that predicts masked words (the probe), or None;
    save(module, tokenizer, folder) writes the folder that bertlab and transformers load;
    continue_with(model) -> the module the loop trains around a given model of `model_type` (continued
    training, the model already carrying `heads`), or None when the objective only builds from scratch
    (`builds` says what it builds then); teaches: one sentence on what it shows; ended: what a run's end adds."""

    name: str
    title: str  # for people: "RoBERTa: dynamic MLM, no NSP, full-sentence packing"
    model_type: str  # family of the kept model
    hf_class: str  # the transformers class that loads the saved folder with no missing/unexpected keys
    own_loss: str  # the metric that is this objective's own loss in the curves
    build: Callable[[ModelShape, Tokenizer], nn.Module]
    examples: Callable[[Sequence[Any], Tokenizer, int, int], list[Any]]
    collate: Callable[[Tokenizer, int], Callable[..., Any]]
    loss: Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    kept: Callable[[nn.Module], nn.Module]
    mlm_model: Callable[[nn.Module], nn.Module | None]
    save: Callable[[nn.Module, Tokenizer, Path], Path]
    size_options: tuple[str, ...] = ()  # which of "embedding_size", "shared_layers" it takes
    pair_task: str | None = None  # "nsp" / "sop" when the model has a sentence-pair head
    loss_name: str = "MLM"  # its own loss in words, for the curves' legend ("MLM + NSP")
    mlm_acc_key: str = "mlm_acc"  # the metric that is its MLM accuracy in the curves
    masking: str = "token"  # the masking strategy its collator uses (MaskingConfig.strategy)
    continue_with: Callable[[nn.Module], nn.Module] | None = lambda model: model
    builds: str = ""  # what it builds from scratch, when it cannot continue a given model
    teaches: str = ""  # one sentence for the Pre-training tab: what this objective shows a student
    ended: str = ""  # what the Pre-training tab adds when a run of it ends ("" for nothing)
    # the settings the Pre-training tab puts in when it is picked, for a lesson-length run that shows what it
    # teaches (PretrainConfig fields: steps, batch_size, seq_len, lr); {} keeps the tab's own
    lesson: dict[str, Any] = field(default_factory=dict)

    @property
    def predicts_next(self) -> bool:
        """Whether its model predicts the next token (its HF class is the family's decoder class), not masked ones."""
        return self.hf_class == FAMILIES[self.model_type].decoder_architecture

    @property
    def heads(self) -> tuple[str, ...]:
        """The pre-training heads of the kept model: those of its HF class in the family's table."""
        return FAMILIES[self.model_type].architectures[self.hf_class][0]
