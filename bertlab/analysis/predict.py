""""Use it": what a fine-tuned model says about your own text.

    classify(model, tok, "a gripping, funny film")        -> label probabilities (SST-2)
    entail(model, tok, "A man is cooking", "A person cooks") -> entailment / neutral / contradiction
    relatedness(model, tok, "A man is cooking", "A person cooks") -> a number (SICK's scale: 1-5)
    entities(model, tok, "Angela Merkel visited Paris")    -> [(start_char, end_char, type, text, score)]
    answer(model, tok, question, paragraph, k=5)           -> best span, top-k spans, start/end probabilities
    cls_vectors(model, tok, texts) + pca_2d(vectors)       -> the [CLS] picture before and after fine-tuning
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from bertlab.analysis.similarity import project_2d
from bertlab.families.bert import Bert
from bertlab.inputs import InputError, optional_text, require_text
from bertlab.runtime import eval_mode, input_limit, max_tokens, model_device
from bertlab.tasks import (
    FeatureError,
    QAExample,
    SpanPrediction,
    encode_words,
    featurize_qa,
    predict_spans,
)
from bertlab.tasks.metrics import get_entities
from bertlab.tokenizer import Tokenizer

TASK_NAMES = {
    "sequence_classification": "sentence classification",
    "token_classification": "token classification (NER)",
    "question_answering": "question answering",
}
NLI_NAMES = ("entailment", "neutral", "contradiction")
QA_MAX_LENGTH = 384  # tokens per window, as SQuAD fine-tuning uses
# A word, roughly as CoNLL-2003 splits them: abbreviations (U.S., U.K.), letters and digits joined
# by - . & (Rolls-Royce, AT&T, 3.5), the clitic 's on its own, any other punctuation mark on its own.
_WORD = re.compile(r"(?:[^\W\d_]\.){2,}|\w+(?:[-.&]\w+)*|['’]s\b|[^\w\s]")


def require_head(model: Bert, head: str, use: str) -> None:
    """InputError naming the head the model has when it lacks `head` (a BertConfig.task)."""
    has = model.config.task
    if has == head:
        return
    what = f"a {TASK_NAMES[has]} head" if has else "no task head (it is an encoder only)"
    raise InputError(
        f"{use} needs a model fine-tuned for {TASK_NAMES[head]}, but this one has {what}. "
        f"Fine-tune one in the fine-tuning lab (or `bertlab finetune`), or load a fine-tuned model."
    )


# ---------------------------------------------------------------------------------------------
# Sentence (pair) classification
# ---------------------------------------------------------------------------------------------
@dataclass
class ClassPrediction:
    """The classifier's probabilities for one sentence (or pair), in label-id order."""

    text_a: str
    text_b: str | None
    labels: list[str]  # id2label in id order
    probabilities: list[float]  # softmax of the logits; sums to 1
    tokens: list[str]
    warning: str | None = None  # set when the text was cut to fit the model

    @property
    def label(self) -> str:
        """The most probable label."""
        return self.labels[max(range(len(self.labels)), key=self.probabilities.__getitem__)]

    @property
    def probability(self) -> float:
        return max(self.probabilities)

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.labels, self.probabilities))


def classify(model: Bert, tok: Tokenizer, text: str, text_b: str | None = None) -> ClassPrediction:
    """Label probabilities of a sentence-classification model (e.g. SST-2) for `text` (and `text_b`)."""
    require_head(model, "sequence_classification", "Classifying a sentence")
    text = require_text(text)
    text_b = optional_text(text_b, "second sentence (B)")
    enc = tok.encode(text, text_b, max_length=input_limit(model, tok))
    device = model_device(model)
    with eval_mode(model), torch.inference_mode():
        logits = model(torch.tensor([enc.ids], device=device),
                       token_type_ids=torch.tensor([enc.type_ids], device=device)).logits[0]  # [labels]
    probs = logits.float().softmax(-1).cpu().tolist()
    labels = [model.config.id2label[i] for i in range(len(probs))]
    return ClassPrediction(text, text_b or None, labels, probs, list(enc.tokens), enc.warning)


def entail(model: Bert, tok: Tokenizer, a: str, b: str) -> ClassPrediction:
    """Entailment / neutral / contradiction probabilities of an NLI model for premise `a`, hypothesis `b`."""
    require_head(model, "sequence_classification", "Natural language inference")
    labels = [v.lower() for v in model.config.id2label.values()]
    if sorted(labels) != sorted(NLI_NAMES):
        raise InputError(
            f"this model classifies into {', '.join(model.config.id2label.values())}, not "
            f"{', '.join(NLI_NAMES)}: fine-tune it on the NLI task (SICK) first."
        )
    a = require_text(a, "premise (sentence A)")
    b = require_text(b, "hypothesis (sentence B)")
    return classify(model, tok, a, b)


@dataclass
class Relatedness:
    """A regression head's number for a sentence pair (for a model fine-tuned on SICK: 1-5)."""

    text_a: str
    text_b: str
    score: float  # the head's one output, in the units it was trained on
    tokens: list[str]
    warning: str | None = None  # set when the pair was cut to fit the model


def relatedness(model: Bert, tok: Tokenizer, a: str, b: str) -> Relatedness:
    """The predicted relatedness of sentences `a` and `b` from a model with a one-output head (`--task sts`)."""
    require_head(model, "sequence_classification", "Rating how related two sentences are")
    if model.config.num_labels != 1:
        raise InputError(
            f"this model classifies into {', '.join(model.config.id2label.values())}; a relatedness score needs a "
            "head with one output: fine-tune it on the sts task (SICK relatedness) first."
        )
    a = require_text(a, "sentence A")
    b = require_text(b, "sentence B")
    enc = tok.encode(a, b, max_length=input_limit(model, tok))
    device = model_device(model)
    with eval_mode(model), torch.inference_mode():
        logits = model(torch.tensor([enc.ids], device=device),
                       token_type_ids=torch.tensor([enc.type_ids], device=device)).logits[0]  # [1]
    return Relatedness(a, b, float(logits.float()[0]), list(enc.tokens), enc.warning)


# ---------------------------------------------------------------------------------------------
# Named entities
# ---------------------------------------------------------------------------------------------
class EntityPrediction(NamedTuple):
    """One entity found in the text: text[start_char:end_char] is `text`; score 0-1."""

    start_char: int
    end_char: int
    type: str  # e.g. PER, ORG, LOC, MISC
    text: str
    score: float  # mean probability of the predicted tag over the entity's words


def split_words(text: str) -> list[tuple[str, int, int]]:
    """(word, start_char, end_char) of each word, split as CoNLL-2003 does (see _WORD)."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


@dataclass
class TaggedText:
    """Word-level tags of a text: what `entities` decodes."""

    text: str
    words: list[tuple[str, int, int]]  # (word, start_char, end_char)
    tags: list[str]  # one per word (IOB2), "O" for words cut to fit the model
    scores: list[float]  # probability of each word's tag (1.0 for cut words)


def tag_words(model: Bert, tok: Tokenizer, text: str) -> TaggedText:
    """Tag each word of `text` with the prediction on its first WordPiece (as in training)."""
    require_head(model, "token_classification", "Finding named entities")
    text = require_text(text)
    words = split_words(text)
    ids, word_ids = encode_words([w for w, _, _ in words], tok, max_length=input_limit(model, tok))
    device = model_device(model)
    with eval_mode(model), torch.inference_mode():
        logits = model(torch.tensor([ids], device=device)).logits[0]  # [seq, labels]
    probs = logits.float().softmax(-1).cpu()  # [seq, labels]
    best = probs.max(-1)  # values, indices: [seq]
    tags, scores = ["O"] * len(words), [1.0] * len(words)
    prev = None
    for i, w in enumerate(word_ids):
        if w is not None and w != prev:
            tags[w] = model.config.id2label[int(best.indices[i])]
            scores[w] = float(best.values[i])
        prev = w
    return TaggedText(text, words, tags, scores)


def entities(model: Bert, tok: Tokenizer, text: str) -> list[EntityPrediction]:
    """Entities in `text` from a token-classification model: word tags decoded as the entity
    metric decodes them (conlleval rules), with character offsets into `text`."""
    tagged = tag_words(model, tok, text)
    out = []
    for e in get_entities(tagged.tags):
        start, end = tagged.words[e.start][1], tagged.words[e.end][2]
        score = sum(tagged.scores[e.start : e.end + 1]) / (e.end - e.start + 1)
        out.append(EntityPrediction(start, end, e.type, text[start:end], score))
    return out


# ---------------------------------------------------------------------------------------------
# Question answering
# ---------------------------------------------------------------------------------------------
@dataclass
class AnswerResult:
    """The model's answer to a question about a paragraph, and where it looked."""

    question: str
    context: str
    text: str  # the best span ("" when no window has a valid span)
    start_char: int  # context[start_char:end_char] == text
    end_char: int
    probability: float  # softmax of span scores among the n-best spans
    top_k: list[SpanPrediction]  # best first
    tokens: list[str]  # the context's WordPiece tokens
    offsets: list[tuple[int, int]]  # character span of each token in the context
    start_probs: list[float]  # P(answer starts at token), per context token
    end_probs: list[float]  # P(answer ends at token), per context token
    windows: int  # how many windows the context needed


def answer(model: Bert, tok: Tokenizer, question: str, context: str, k: int = 5,
           max_length: int = QA_MAX_LENGTH, max_answer_length: int = 30) -> AnswerResult:
    """The best `k` answer spans of `question` in `context` (SQuAD post-processing), and the
    start/end probabilities of each context token (softmax over a window's context tokens;
    where windows overlap, the larger value)."""
    require_head(model, "question_answering", "Answering a question")
    question = require_text(question, "question")
    context = require_text(context, "paragraph")
    if k < 1:
        raise InputError(f"k must be at least 1; got {k}.")
    example = QAExample("question", "", question, context, [])
    try:
        features = featurize_qa([example], tok, max_length=min(max_length, max_tokens(model)))
    except FeatureError as e:  # a question that leaves no room for the paragraph
        raise InputError(f"The question is too long for this model's window: shorten it ({e}).") from e
    enc = tok.encode(context, max_length=sys.maxsize)  # the whole context, as featurize_qa reads it
    tokens, offsets = enc.tokens[1:-1], [tuple(o) for o in enc.offsets[1:-1]]
    if not tokens:
        raise InputError("The paragraph has no words the tokenizer can read: paste a paragraph.")
    device = model_device(model)
    starts, ends = [], []
    with eval_mode(model), torch.inference_mode():
        for f in features:
            out = model(torch.tensor([f.input_ids], device=device),
                        token_type_ids=torch.tensor([f.token_type_ids], device=device))
            starts.append(out.start_logits[0].float().cpu())  # [seq]
            ends.append(out.end_logits[0].float().cpu())  # [seq]
    spans = predict_spans([example], features, starts, ends, top_k=k,
                          max_answer_length=max_answer_length)["question"]
    start_probs, end_probs = _token_probabilities(features, starts, ends, offsets)
    best = spans[0] if spans else SpanPrediction("", 0, 0, float("-inf"), 0.0)
    return AnswerResult(question, context, best.text, best.start_char, best.end_char, best.probability, spans,
                        tokens, offsets, start_probs, end_probs, len(features))


def _token_probabilities(features, starts, ends, offsets) -> tuple[list[float], list[float]]:
    """Per context token: softmax over each window's context tokens, max over windows."""
    index = {o: i for i, o in reversed(list(enumerate(offsets)))}  # offsets -> first context token
    start_p, end_p = [0.0] * len(offsets), [0.0] * len(offsets)
    for f, s, e in zip(features, starts, ends):
        in_context = torch.tensor([o is not None for o in f.offsets])  # [seq]
        ps = s.masked_fill(~in_context, float("-inf")).softmax(-1).tolist()
        pe = e.masked_fill(~in_context, float("-inf")).softmax(-1).tolist()
        for t, o in enumerate(f.offsets):
            if o is not None:
                i = index[tuple(o)]
                start_p[i], end_p[i] = max(start_p[i], ps[t]), max(end_p[i], pe[t])
    return start_p, end_p


# ---------------------------------------------------------------------------------------------
# [CLS] vectors before and after fine-tuning
# ---------------------------------------------------------------------------------------------
def cls_vectors(model: Bert, tok: Tokenizer, texts: Sequence[str], texts_b: Sequence[str | None] | None = None,
                batch_size: int = 64) -> torch.Tensor:
    """The last layer's [CLS] vector of each text (or pair): [n, d_model], on the CPU.
    Any model works, with or without a head (the encoder's output is read)."""
    if not texts or any(not str(t).strip() for t in texts):
        raise InputError("cls_vectors needs a list of non-empty texts.")
    texts_b = list(texts_b) if texts_b is not None else [None] * len(texts)
    if len(texts_b) != len(texts):
        raise InputError(f"{len(texts)} texts but {len(texts_b)} second sentences.")
    limit = input_limit(model, tok)
    device = model_device(model)
    rows = []
    with eval_mode(model), torch.inference_mode():
        for lo in range(0, len(texts), batch_size):
            batch = tok.encode_batch(list(texts[lo : lo + batch_size]), texts_b[lo : lo + batch_size], limit)
            hidden = last_layer_output(model, batch.input_ids.to(device), batch.token_type_ids.to(device),
                                       batch.attention_mask.to(device))  # [batch, seq, d_model]
            rows.append(hidden[:, 0].float().cpu())
    return torch.cat(rows)  # [n, d_model]


class _Enough(Exception):
    """Raised by the hook that has what it needs: the heads after the encoder need not run."""


def last_hidden_hook(model: torch.nn.Module) -> str:
    """The hook holding the encoder's output in any family: the last logical layer's hook_resid_post."""
    return model.family.hook_name(model.family.num_layers - 1, "hook_resid_post")


def last_layer_output(model: torch.nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> torch.Tensor:
    """The encoder's output [batch, seq, d_model] for any family, without running its heads."""
    got: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, name: str) -> None:
        got[name] = x
        raise _Enough

    name = last_hidden_hook(model)
    try:
        with model.hooks([(name, grab)]):
            model(input_ids, token_type_ids, attention_mask)
    except _Enough:
        pass
    return got[name]


def pca_2d(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centred PCA of [n, d] vectors onto 2 axes: (points [n, 2], explained share [2]).
    Deterministic: SVD, signs fixed so the farthest point along each axis is positive."""
    return project_2d(vectors, center=True)


def cls_maps(models: Mapping[str, Bert], tok: Tokenizer, examples: Sequence[Any]
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each model's last-layer [CLS] vectors of `examples` (their text_a, text_b) on its own 2 PCA axes:
    (points [n, 2], explained share [2]) by the models' names, e.g. before and after fine-tuning."""
    texts, texts_b = [e.text_a for e in examples], [e.text_b for e in examples]
    maps = {name: pca_2d(cls_vectors(model, tok, texts, texts_b)) for name, model in models.items()}
    return {name: m[0] for name, m in maps.items()}, {name: m[1] for name, m in maps.items()}


__all__ = [
    "AnswerResult", "ClassPrediction", "EntityPrediction", "Relatedness", "TaggedText", "answer", "classify",
    "cls_maps", "cls_vectors", "entail", "entities", "pca_2d", "relatedness", "require_head", "split_words",
    "tag_words",
]
