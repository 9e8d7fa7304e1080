"""Corpus neighbours (exBERT's search): the tokens of a corpus whose contextual vectors at one stage are
nearest (cosine) to a chosen word's, with their sentences.

An index holds one stage's unit-length token vectors (float16) for every word piece of the corpus
(special tokens left out); a query is a plain matrix product, in chunks. Indexes are saved to disk per model,
corpus and stage (`index_path`) and built once, with progress.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bertlab.analysis.probes import Cancelled, feature_cache_dir, model_fingerprint
from bertlab.analysis.similarity import encode_input, find_word_forms, word_forms
from bertlab.families.bert import Bert
from bertlab.inputs import InputError, echo
from bertlab.runtime import eval_mode, max_tokens, model_device
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SENTENCES_PER_BATCH = 32
RERANK = 4  # a query re-scores RERANK × k candidates in float32 (the float16 product finds them)


@dataclass
class NeighbourIndex:
    """Unit vectors of every corpus token at one stage, and where each token stands."""

    stage: int  # 0 = embeddings, s = after layer s - 1
    vectors: torch.Tensor  # [tokens, d] float16, unit length
    sentence_of: torch.Tensor  # [tokens] int: index into `sentences`
    position: torch.Tensor  # [tokens] int: token index in its sentence's encoding
    pieces: list[str]  # [tokens] the word piece
    sentences: list[str]

    def __len__(self) -> int:
        return self.vectors.shape[0]


@dataclass
class Neighbour:
    piece: str
    score: float  # cosine
    sentence: str
    sentence_index: int
    position: int
    context: list[str]  # the sentence's tokens (special tokens included), the neighbour at `position`


def _stage_hook(model: Bert, stage: int) -> str:
    fam = model.family
    if not 0 <= stage <= fam.num_layers:
        raise IndexError(f"stage {stage} does not exist: stages are 0 (embeddings) .. {fam.num_layers}.")
    return fam.embedding_hook if stage == 0 else fam.hook_name(stage - 1, "hook_resid_post")


def index_path(model: Bert, sentences: Sequence[str], stage: int, folder: Path | None = None) -> Path:
    key = hashlib.sha256("\n".join(sentences).encode()).hexdigest()[:16]
    return (folder or feature_cache_dir().parent / "neighbours") / f"{model_fingerprint(model)}-{key}-{stage}.pt"


def build_index(model: Bert, tok: Tokenizer, sentences: Sequence[str], stage: int, folder: Path | None = None,
                use_cache: bool = True, progress: Callable[[int, int], None] | None = None,
                cancelled: Callable[[], bool] | None = None) -> NeighbourIndex:
    """The index of `sentences` at `stage` (read from disk when built before)."""
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise InputError("The corpus is empty: give it some sentences.")
    hook = _stage_hook(model, stage)
    path = index_path(model, sentences, stage, folder) if use_cache else None
    if path is not None and path.is_file():
        try:
            saved = torch.load(path, weights_only=True)
            return NeighbourIndex(stage, saved["vectors"], saved["sentence_of"], saved["position"],
                                  tok.convert_ids_to_tokens(saved["ids"].tolist()), sentences)
        except Exception:  # a damaged file: build again
            log.warning("ignoring unreadable neighbour index %s", path)
    limit = max_tokens(model)
    device = model_device(model)
    vecs, sent_of, pos, ids = [], [], [], []
    for start in range(0, len(sentences), SENTENCES_PER_BATCH):
        if cancelled is not None and cancelled():
            raise Cancelled("stopped while building the index")
        encs = [tok.encode(s, max_length=limit) for s in sentences[start : start + SENTENCES_PER_BATCH]]
        batch = tok.pad(encs)
        with eval_mode(model), torch.inference_mode():
            _, cache = model.run_with_cache(
                batch.input_ids.to(device), token_type_ids=batch.token_type_ids.to(device),
                attention_mask=batch.attention_mask.to(device), names=[hook],
                mlm_positions=torch.zeros_like(batch.input_ids, dtype=torch.bool, device=device)
                if model.has_mlm else None)
        states = cache[hook].float().cpu()  # [batch, seq, d]
        for i, e in enumerate(encs):
            keep = [t for t in range(len(e)) if not e.special_tokens_mask[t]]
            vecs.append(F.normalize(states[i, keep], dim=-1).half())
            sent_of += [start + i] * len(keep)
            pos += keep
            ids += [e.ids[t] for t in keep]
        if progress is not None:
            progress(min(start + SENTENCES_PER_BATCH, len(sentences)), len(sentences))
    index = NeighbourIndex(stage, torch.cat(vecs), torch.tensor(sent_of), torch.tensor(pos),
                           tok.convert_ids_to_tokens(ids), sentences)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"vectors": index.vectors, "sentence_of": index.sentence_of, "position": index.position,
                    "ids": torch.tensor(ids)}, tmp)
        tmp.replace(path)
    return index


def nearest(index: NeighbourIndex, vector: torch.Tensor, k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(cosines [k], rows [k]) of the k index rows nearest to `vector` [d], best first: one float16
    matrix-vector product over the index, then the best RERANK × k rows scored again in float32."""
    if k < 1:
        raise InputError(f"k must be at least 1; got {k}.")
    q = F.normalize(vector.float(), dim=-1)
    rough = index.vectors @ q.to(index.vectors.dtype)  # [tokens]
    candidates = rough.topk(min(RERANK * k, len(rough))).indices
    exact = index.vectors[candidates].float() @ q
    values, order = exact.topk(min(k, len(exact)))
    return values, candidates[order]


def word_vector(model: Bert, tok: Tokenizer, text: str, word: str, stage: int, occurrence: int = 0
                ) -> tuple[torch.Tensor, list[str], int]:
    """(vector [d] of the word's first piece at `stage`, the text's tokens, its token index)."""
    forms = word_forms(tok, word)
    enc = encode_input(model, tok, text)
    spans = find_word_forms(enc, forms, tok)
    if not spans:
        raise InputError(f"{echo(word)} does not occur as a whole word in the text: type a word of the sentence.")
    if not 0 <= occurrence < len(spans):
        raise IndexError(f"{echo(word)} occurs {len(spans)} time(s); occurrence {occurrence} does not exist.")
    position = spans[occurrence][0]
    hook = _stage_hook(model, stage)
    ids = torch.tensor([enc.ids], device=model_device(model))
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(ids, token_type_ids=torch.tensor([enc.type_ids], device=ids.device),
                                        names=[hook], mlm_positions=torch.zeros_like(ids, dtype=torch.bool)
                                        if model.has_mlm else None)
    return cache[hook][0, position].float().cpu(), list(enc.tokens), position


def corpus_neighbours(model: Bert, tok: Tokenizer, index: NeighbourIndex, text: str, word: str, k: int = 10,
                      occurrence: int = 0) -> list[Neighbour]:
    """The k corpus tokens nearest to `word` in `text` at the index's stage, with their sentences."""
    vector, _, _ = word_vector(model, tok, text, word, index.stage, occurrence)
    values, rows = nearest(index, vector, k)
    limit = max_tokens(model)
    out = []
    for v, r in zip(values.tolist(), rows.tolist()):
        s = int(index.sentence_of[r])
        out.append(Neighbour(index.pieces[r], v, index.sentences[s], s, int(index.position[r]),
                             tok.encode(index.sentences[s], max_length=limit).tokens))
    return out
