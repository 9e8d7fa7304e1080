"""Extractive QA features and post-processing: [CLS] question [SEP] context-window [SEP]
with a sliding window over long contexts, answer token positions from character offsets,
and the way back from start/end logits to answer text."""

from __future__ import annotations

import bisect
import logging
import math
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from bertlab.tasks.features import FeatureError
from bertlab.tasks.readers import QAExample
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class QAFeature:
    """One window of one question: ids, where each token sits in the context, the answer."""

    example_id: str
    window: int  # index of this window among its example's windows
    input_ids: list[int]
    token_type_ids: list[int]  # 0 for [CLS] question [SEP], 1 for the context window [SEP]
    offsets: list[tuple[int, int] | None]  # character span in the context; None outside it
    start_position: int  # token of the answer's first piece; 0 ([CLS]) when not in this window
    end_position: int  # token of the answer's last piece; 0 ([CLS]) when not in this window

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def has_answer(self) -> bool:
        return self.start_position > 0


def window_starts(num_tokens: int, window_length: int, doc_stride: int) -> list[int]:
    """First context token of each window; consecutive windows share `doc_stride` tokens
    (the meaning of `stride` in HF tokenizers), the last one ends at the context's end."""
    if window_length <= doc_stride:
        raise FeatureError(
            f"a context window of {window_length} tokens cannot overlap by doc_stride={doc_stride}: "
            "raise max_length, or lower doc_stride or max_question_length."
        )
    starts = [0]
    while starts[-1] + window_length < num_tokens:
        starts.append(starts[-1] + window_length - doc_stride)
    return starts


def answer_token_span(offsets: Sequence[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int]:
    """(first, last) context token covering characters [start_char, end_char): the last token
    starting at or before start_char, the first token ending at or after end_char."""
    first = bisect.bisect_right([o[0] for o in offsets], start_char) - 1
    last = bisect.bisect_left([o[1] for o in offsets], end_char)
    return max(first, 0), min(last, len(offsets) - 1)


def featurize_qa(
    examples: Sequence[QAExample],
    tokenizer: Tokenizer,
    max_length: int = 384,
    doc_stride: int | None = None,
    max_question_length: int = 64,
) -> list[QAFeature]:
    """Features for each question: the question as segment A (cut to `max_question_length`
    tokens), the context as segment B in windows of at most `max_length` tokens in all,
    overlapping by `doc_stride` tokens (default: a third of max_length, 128 for 384, and
    at most half a window). The first gold answer gives the positions."""
    out: list[QAFeature] = []
    contexts: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    for ex in examples:
        if ex.context not in contexts:
            enc = tokenizer.encode(ex.context, max_length=sys.maxsize)  # whole context, no cut
            contexts[ex.context] = (enc.ids[1:-1], enc.offsets[1:-1])
        out.extend(_example_features(ex, tokenizer, contexts[ex.context], max_length, doc_stride, max_question_length))
    return out


def _example_features(
    ex: QAExample,
    tokenizer: Tokenizer,
    context: tuple[list[int], list[tuple[int, int]]],
    max_length: int,
    doc_stride: int | None,
    max_question_length: int,
) -> list[QAFeature]:
    c_ids, c_offsets = context
    q_ids = tokenizer.encode(ex.question).ids[1:-1][:max_question_length]
    window_length = max_length - len(q_ids) - 3
    if window_length < 2:  # [CLS] question [SEP] context [SEP]: the context needs room too
        raise FeatureError(
            f"a question of {len(q_ids)} tokens leaves {max(window_length, 0)} of the {max_length} tokens an input may "
            f"have for its context: raise max_length (up to what the model reads) or lower max_question_length.")
    if doc_stride is None:
        doc_stride = min(max_length // 3, window_length // 2)
    span = None
    if ex.answers and c_ids:
        span = answer_token_span(c_offsets, ex.answers[0].start, ex.answers[0].end)
    prefix = [tokenizer.cls_token_id, *q_ids, tokenizer.sep_token_id]
    out = []
    for w, start in enumerate(window_starts(len(c_ids), window_length, doc_stride)):
        stop = min(start + window_length, len(c_ids))
        ids = prefix + c_ids[start:stop] + [tokenizer.sep_token_id]
        offsets: list[tuple[int, int] | None] = [None] * len(prefix) + list(c_offsets[start:stop]) + [None]
        s_pos = e_pos = 0
        if span is not None and start <= span[0] and span[1] < stop:
            s_pos, e_pos = span[0] - start + len(prefix), span[1] - start + len(prefix)
        types = [0] * len(prefix) + [1] * (len(ids) - len(prefix))
        out.append(QAFeature(ex.id, w, ids, types, offsets, s_pos, e_pos))
    return out


# -- post-processing ------------------------------------------------------------------------


@dataclass
class SpanPrediction:
    """A candidate answer: its text, characters [start_char, end_char) in the context, the
    score start_logit + end_logit, and its softmax probability among the n-best spans."""

    text: str
    start_char: int
    end_char: int
    score: float
    probability: float = 0.0


def feature_spans(
    feature: QAFeature,
    start_logits: torch.Tensor,  # [seq] (padding beyond the feature is ignored)
    end_logits: torch.Tensor,  # [seq]
    n_best: int = 20,
    max_answer_length: int = 30,
) -> list[tuple[int, int, float]]:
    """The n_best best valid (start token, end token, score) spans of one window, best first,
    from its top-n start and top-n end tokens: both in the context, start <= end, at most
    max_answer_length tokens; score = start logit + end logit."""
    n = len(feature)
    if start_logits.shape[-1] < n or end_logits.shape[-1] < n:
        raise FeatureError(
            f"feature {feature.example_id}/{feature.window} has {n} tokens but only "
            f"{start_logits.shape[-1]}/{end_logits.shape[-1]} start/end logits."
        )
    in_context = torch.tensor([o is not None for o in feature.offsets])
    if not in_context.any():
        return []
    starts = start_logits[:n].float().masked_fill(~in_context, -math.inf)
    ends = end_logits[:n].float().masked_fill(~in_context, -math.inf)
    k = min(n_best, int(in_context.sum()))
    top_s, top_e = torch.topk(starts, k).indices, torch.topk(ends, k).indices  # [k], [k]
    scores = starts[top_s][:, None] + ends[top_e][None, :]  # [k start, k end]
    length = top_e[None, :] - top_s[:, None] + 1  # [k start, k end], in tokens
    scores = scores.masked_fill((length < 1) | (length > max_answer_length), -math.inf)
    best = torch.topk(scores.flatten(), min(n_best, int(torch.isfinite(scores).sum())))
    s_tok, e_tok = top_s[best.indices // k].tolist(), top_e[best.indices % k].tolist()
    return list(zip(s_tok, e_tok, best.values.tolist()))


def predict_spans(
    examples: Sequence[QAExample],
    features: Sequence[QAFeature],
    start_logits: torch.Tensor | Sequence[torch.Tensor],  # [n_features, seq] or one [seq] each
    end_logits: torch.Tensor | Sequence[torch.Tensor],
    n_best: int = 20,
    max_answer_length: int = 30,
    top_k: int = 5,
) -> dict[str, list[SpanPrediction]]:
    """The `top_k` best distinct answer spans of each question over all its windows, best
    first (an empty list when no window has a valid span)."""
    if not len(features) == len(start_logits) == len(end_logits):
        raise FeatureError(f"{len(features)} features but {len(start_logits)}/{len(end_logits)} start/end logit rows.")
    by_example: dict[str, list[int]] = {}
    for i, f in enumerate(features):
        by_example.setdefault(f.example_id, []).append(i)
    out: dict[str, list[SpanPrediction]] = {}
    for ex in examples:
        best: dict[tuple[int, int], float] = {}  # (start_char, end_char) -> best score
        for i in by_example.get(ex.id, []):
            f = features[i]
            for s, e, score in feature_spans(f, start_logits[i], end_logits[i], n_best, max_answer_length):
                chars = (f.offsets[s][0], f.offsets[e][1])  # type: ignore[index]
                best[chars] = max(score, best.get(chars, -math.inf))
        out[ex.id] = _ranked(ex.context, best, n_best)[:top_k]
    return out


def _ranked(context: str, scores: Mapping[tuple[int, int], float], n_best: int) -> list[SpanPrediction]:
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:n_best]
    if not ranked:
        return []
    probs = torch.softmax(torch.tensor([s for _, s in ranked], dtype=torch.float64), dim=0).tolist()
    return [SpanPrediction(context[a:b], a, b, s, p) for ((a, b), s), p in zip(ranked, probs)]


def best_answers(predictions: Mapping[str, Sequence[SpanPrediction]]) -> dict[str, str]:
    """Question id -> text of its best span ("" when there is none), for the SQuAD metric."""
    return {qid: spans[0].text if spans else "" for qid, spans in predictions.items()}
