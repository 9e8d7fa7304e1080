"""Word features from a frozen encoder's stages (0 = embeddings, s = after layer s − 1), and the ways to
make one vector per word from them: the BERT paper's Table 7 choices and ELMo's scalar mix.

    states = hidden_states(model, ids, types, mask)           # [stage, batch, seq, d]
    feats = word_features(model, tok, sentences)              # per sentence [stage, words, d], cached to disk
    head = LayerFeatures("sum-last-4", stages=7)              # [n, stage, d] -> [n, d]

Here, below training and analysis, because both use them: the probes (analysis) and the feature-based
task heads (training). A word's feature is its first piece's vector (`pool="first"`) or the mean of its
pieces (`pool="mean"`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from bertlab.families.bert import Bert
from bertlab.runtime import eval_mode, input_limit, model_device
from bertlab.tasks.features import encode_words
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

POOLS = ("first", "mean")
SENTENCES_PER_BATCH = 16
# The BERT paper's Table 7 rows (feature-based NER), and ELMo's learned mix of all stages.
FEATURES = ("embeddings", "last", "second-to-last", "sum-last-4", "concat-last-4", "mix")
FEATURE_TEXT = {
    "embeddings": "the embeddings (stage 0)",
    "last": "the last layer's output",
    "second-to-last": "the second-to-last layer's output",
    "sum-last-4": "the sum of the last four layers' outputs",
    "concat-last-4": "the last four layers' outputs side by side (4 × the width)",
    "mix": "a scalar mix of all stages (softmax weights and a scale, learned with the head)",
}
Progress = Callable[[int, int], None]


class Cancelled(Exception):
    """A run stopped by its cancel check."""


class Worded(Protocol):
    """A sentence given as words (a probe's TaggedSentence, a task's TokenExample)."""

    words: list[str]


def stage_names(num_layers: int) -> list[str]:
    """["embeddings", "layer 0", ..., "layer {num_layers-1}"]: the name of each stage."""
    return ["embeddings"] + [f"layer {i}" for i in range(num_layers)]


def hidden_states(
    model: Bert,
    input_ids: torch.Tensor,  # [batch, seq]
    token_type_ids: torch.Tensor | None = None,  # [batch, seq]
    attention_mask: torch.Tensor | None = None,  # [batch, seq]
) -> torch.Tensor:
    """Every stage's output, [stage, batch, seq, d_model] float32 on CPU (stage 0 = embeddings)."""
    names = [model.family.embedding_hook, *model.family.layer_hook_names("hook_resid_post")]
    device = model_device(model)
    nowhere = torch.zeros(input_ids.shape, dtype=torch.bool, device=device)  # skip the MLM decoder
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(
            input_ids.to(device),
            token_type_ids=None if token_type_ids is None else token_type_ids.to(device),
            attention_mask=None if attention_mask is None else attention_mask.to(device),
            mlm_positions=nowhere if model.has_mlm else None,
            names=names,
        )
    return torch.stack([cache[n] for n in names]).to("cpu", torch.float32)


# ---------------------------------------------------------------------------------------------
# Word features, cached
# ---------------------------------------------------------------------------------------------
def feature_cache_dir() -> Path:
    """Where word features are cached (`BERTLAB_CACHE`/features, default `~/.cache/bertlab/features`)."""
    root = os.environ.get("BERTLAB_CACHE") or Path.home() / ".cache" / "bertlab"
    return Path(root).expanduser() / "features"


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of a model's weights (names, shapes and two sums per tensor): the cache key's model part."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if p.is_floating_point():
                h.update(f"{name}{tuple(p.shape)}{float(p.double().sum()):.6e}{float(p.double().abs().sum()):.6e}"
                         .encode())
    return h.hexdigest()[:16]


def word_features(model: Bert, tok: Tokenizer, sentences: Sequence[Worded], pool: str = "first",
                  cache_dir: Path | None = None, progress: Progress | None = None,
                  cancelled: Callable[[], bool] | None = None, use_cache: bool = True,
                  max_length: int | None = None) -> list[torch.Tensor]:
    """Each sentence's word vectors at every stage: a list of [stage, words, d_model] float32 (a sentence cut at
    `max_length` tokens, default the model's limit, keeps the words that fit), stored as float16. Cached under
    `cache_dir` (default feature_cache_dir()) unless `use_cache` is False."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}; got {pool!r}.")
    limit = input_limit(model, tok)
    cut = "" if max_length is None else f"-max{max_length}"
    limit = limit if max_length is None else min(limit, max_length)
    key = hashlib.sha256("\x1f".join(" ".join(s.words) for s in sentences).encode()).hexdigest()[:16]
    folder = feature_cache_dir() if cache_dir is None else cache_dir
    file = folder / f"{model_fingerprint(model)}-{key}-{pool}{cut}.pt" if use_cache else None
    if file is not None and file.is_file():
        try:
            return [t.float() for t in torch.load(file, weights_only=True)]
        except Exception:  # a damaged cache file: compute again
            log.warning("ignoring unreadable feature cache %s", file)
    out: list[torch.Tensor] = []
    for start in range(0, len(sentences), SENTENCES_PER_BATCH):
        if cancelled is not None and cancelled():
            raise Cancelled("stopped while reading the sentences")
        chunk = sentences[start : start + SENTENCES_PER_BATCH]
        encoded = [encode_words(s.words, tok, max_length=limit) for s in chunk]
        n = max(len(ids) for ids, _ in encoded)
        ids = torch.full((len(chunk), n), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), n), dtype=torch.long)
        for i, (row, _) in enumerate(encoded):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        states = hidden_states(model, ids, torch.zeros_like(ids), mask)  # [stage, batch, seq, d]
        for i, (_, word_ids) in enumerate(encoded):
            out.append(pool_words(states[:, i], word_ids, pool))
        if progress is not None:
            progress(len(out), len(sentences))
    out = [t.half().float() for t in out]  # what a later run reads back from the cache: the same numbers
    if file is not None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        torch.save([t.half() for t in out], tmp)
        tmp.replace(file)
    return out


def pool_words(states: torch.Tensor, word_ids: Sequence[int | None], pool: str = "first") -> torch.Tensor:
    """[stage, seq, d] token vectors -> [stage, words, d]: each word's first piece, or the mean of its pieces."""
    words = max((w for w in word_ids if w is not None), default=-1) + 1
    out = torch.zeros(states.shape[0], words, states.shape[-1])
    counts = torch.zeros(words)
    for t, w in enumerate(word_ids):
        if w is None or (pool == "first" and counts[w] > 0):
            continue
        out[:, w] += states[:, t]
        counts[w] += 1
    return out / counts.clamp(min=1)[None, :, None]


# ---------------------------------------------------------------------------------------------
# One vector per word from the stages
# ---------------------------------------------------------------------------------------------
class ScalarMix(nn.Module):
    """ELMo's scalar mix: gamma · Σ_s softmax(w)_s x_s over stages; [words, stage, d] -> [words, d].
    `fixed` weights (a probability per stage) are used as given, with gamma 1 (nothing learned)."""

    def __init__(self, stages: int, fixed: torch.Tensor | None = None):
        super().__init__()
        self.fixed = fixed
        self.logits = nn.Parameter(torch.zeros(stages), requires_grad=fixed is None)
        self.gamma = nn.Parameter(torch.ones(()), requires_grad=fixed is None)

    @property
    def weights(self) -> torch.Tensor:
        return self.fixed if self.fixed is not None else self.logits.softmax(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * torch.einsum("nsd,s->nd", x, self.weights.to(x.dtype))


def feature_width(features: str, d_model: int) -> int:
    """How wide a word's vector is under `features`: 4 × d_model for concat-last-4, else d_model."""
    _check(features)
    return 4 * d_model if features == "concat-last-4" else d_model


def _check(features: str, stages: int | None = None) -> None:
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}; got {features!r}.")
    if stages is None:
        return
    layers = stages - 1
    need = 4 if features.endswith("-last-4") else 2 if features == "second-to-last" else 1
    if layers < need:
        raise ValueError(f"features {features!r} need a model of at least {need} layers; this one has {layers}. "
                         f"Choose another of {', '.join(FEATURES)}.")


class LayerFeatures(nn.Module):
    """One vector per word from its vectors at every stage, as `features` says (FEATURE_TEXT):
    [words, stage, d] -> [words, width]. Only "mix" learns (its ScalarMix; `fixed` weights fix it)."""

    def __init__(self, features: str, stages: int, fixed: torch.Tensor | None = None):
        super().__init__()
        _check(features, stages)
        self.features, self.stages = features, stages
        self.mix = ScalarMix(stages, fixed) if features == "mix" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.stages:
            raise ValueError(f"expected features of {self.stages} stages, got {x.shape[1]}.")
        if self.mix is not None:
            return self.mix(x)
        if self.features == "embeddings":
            return x[:, 0]
        if self.features == "last":
            return x[:, -1]
        if self.features == "second-to-last":
            return x[:, -2]
        if self.features == "sum-last-4":
            return x[:, -4:].sum(1)
        return x[:, -4:].flatten(1)  # concat-last-4: [words, 4 · d], the earliest of the four first


__all__ = [
    "FEATURES", "FEATURE_TEXT", "POOLS", "Cancelled", "LayerFeatures", "ScalarMix", "feature_cache_dir",
    "feature_width", "hidden_states", "model_fingerprint", "pool_words", "stage_names", "word_features",
]
