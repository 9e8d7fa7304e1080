"""SpanBERT (Joshi et al. 2019): mask contiguous spans of whole words (lengths from a geometric
distribution, p = 0.2, clipped at 10; 15 % of the tokens; 80/10/10 per span) in single segments (no
NSP), and add the span-boundary objective (SBO): predict each token of a span from the encoder's
outputs at the two tokens just outside it plus a relative-position embedding, through a 2-layer
GeLU + LayerNorm network. Loss = MLM + SBO.

Kept: the BERT with its MLM head (`BertForMaskedLM`, no missing or unexpected keys); the SBO head
lives in its own file beside it, `span_boundary_head.safetensors` (transformers never reads it,
`load_sbo_head` does), because no transformers class has a place for it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.masking import IGNORE_INDEX, MLMBatch
from bertlab.training.objectives.base import ModelShape, Objective, collator, mlm_loss, new_family_model
from bertlab.training.objectives.roberta import full_sentences

SBO_FILE = "span_boundary_head.safetensors"
MAX_SPAN_TOKENS = 32  # relative positions past this share the last embedding (a 10-word span rarely has more)


@dataclass
class SpanTargets:
    """Where each masked token sits in its span: all tensors [n], n = masked tokens in row-major order."""

    row: torch.Tensor  # batch row
    position: torch.Tensor  # the token's position
    left: torch.Tensor  # position of the token just before its span (x_{s-1})
    right: torch.Tensor  # position of the token just after its span (x_{e+1})
    relative: torch.Tensor  # 0-based place of the token in its span


def span_targets(unit_ids: torch.Tensor) -> SpanTargets:
    """SBO targets from the masking's span ids [batch, seq] (-1 = not masked; a span = equal ids, contiguous)."""
    b, s = unit_ids.shape
    picked = unit_ids >= 0
    row, position = picked.nonzero(as_tuple=True)
    spans = unit_ids[row, position]
    n_units = int(unit_ids.max()) + 1 if picked.any() else 1
    key = row * n_units + spans  # one key per (row, span)
    first = torch.full((b * n_units,), s, dtype=torch.long, device=unit_ids.device)
    last = torch.full((b * n_units,), -1, dtype=torch.long, device=unit_ids.device)
    first.scatter_reduce_(0, key, position, reduce="amin")
    last.scatter_reduce_(0, key, position, reduce="amax")
    start, end = first[key], last[key]
    return SpanTargets(row, position, (start - 1).clamp(min=0), (end + 1).clamp(max=s - 1), position - start)


class SpanBoundaryHead(nn.Module):
    """y_i = f(x_{s-1}, x_{e+1}, p_{i-s}): 2 layers of Linear, GeLU, LayerNorm; logits over the vocabulary
    through the (tied) word embeddings plus its own bias."""

    def __init__(self, hidden: int, vocab_size: int, emb_width: int, eps: float = 1e-12):
        super().__init__()
        self.position_embeddings = nn.Embedding(MAX_SPAN_TOKENS, hidden)
        self.layer1 = nn.Linear(3 * hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.layer2 = nn.Linear(hidden, emb_width)
        self.norm2 = nn.LayerNorm(emb_width, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        for m in (self.layer1, self.layer2):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def forward(self, seq: torch.Tensor, t: SpanTargets, word_embeddings: torch.Tensor) -> torch.Tensor:
        rel = self.position_embeddings(t.relative.clamp(max=MAX_SPAN_TOKENS - 1))  # [n, hidden]
        h = torch.cat([seq[t.row, t.left], seq[t.row, t.right], rel], dim=-1)  # [n, 3 hidden]
        h = self.norm1(F.gelu(self.layer1(h)))
        h = self.norm2(F.gelu(self.layer2(h)))
        return F.linear(h, word_embeddings, self.bias)  # [n, vocab]


class SpanBert(nn.Module):
    """A BERT with its MLM head and the SBO head; `forward(batch)` -> (loss, metrics)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model  # the BERT with its MLM head (the kept model)
        cfg = model.config
        self.sbo = SpanBoundaryHead(cfg.hidden_size, cfg.vocab_size, cfg.embedding_size or cfg.hidden_size,
                                    cfg.layer_norm_eps)

    def forward(self, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        picked = batch.labels != IGNORE_INDEX
        out = self.model(batch.input_ids, batch.token_type_ids, batch.attention_mask, mlm_positions=picked)
        targets = batch.labels[picked]
        loss, metrics = mlm_loss(out.mlm_logits, targets)
        spans = span_targets(batch.unit_ids)
        words = self.model.family.embeddings(self.model).word_embeddings.weight
        sbo_logits = self.sbo(out.last_hidden_state, spans, words)
        sbo_loss = F.cross_entropy(sbo_logits.float(), targets)  # same row-major order as the MLM targets
        metrics["sbo_loss"] = sbo_loss.detach()
        metrics["sbo_acc"] = (sbo_logits.argmax(-1) == targets).float().mean()
        return loss + sbo_loss, metrics


def build(shape: ModelShape, tokenizer: Tokenizer) -> SpanBert:
    return SpanBert(new_family_model("bert", "BertForMaskedLM", shape, tokenizer))


def spanbert_loss(model: nn.Module, batch: MLMBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return model(batch)


def save(model: nn.Module, tokenizer: Tokenizer, folder: Path) -> Path:
    """BertForMaskedLM in `folder`, the SBO head in `folder/span_boundary_head.safetensors`."""
    folder = save_model_atomically(model.model, tokenizer, folder)
    state = {k: v.detach().contiguous().cpu() for k, v in model.sbo.state_dict().items()}
    save_file(state, str(Path(folder) / SBO_FILE), metadata={"format": "pt", "objective": "spanbert"})
    return folder


def load_sbo_head(folder: str | Path, model: nn.Module) -> SpanBert:
    """The SpanBert of a saved folder: `model` (loaded by bertlab.load) with the SBO head read back."""
    model = SpanBert(model)
    model.sbo.load_state_dict(load_file(str(Path(folder) / SBO_FILE)), strict=True)
    return model.eval()


OBJECTIVE = Objective(
    name="spanbert",
    title="SpanBERT: geometric whole-word spans + span-boundary objective, no NSP",
    teaches=("Hiding whole spans of words, and guessing each hidden token from the two words just outside its "
             "span."),
    model_type="bert",
    hf_class="BertForMaskedLM",
    own_loss="sbo_loss",
    build=build,
    examples=full_sentences,
    collate=lambda tok, seed: collator(tok, seed, strategy="span", span_p=0.2, max_span=10),
    loss=spanbert_loss,
    kept=lambda m: m.model,
    mlm_model=lambda m: m.model,
    save=save,
    masking="span",
    loss_name="span boundary",
    continue_with=SpanBert,
)
