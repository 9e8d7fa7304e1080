"""Fine-tuning tasks: data -> features -> (head) -> metric, for sentiment (SST-2), NLI
(SICK), relatedness (SICK, a number), NER (CoNLL-2003) and extractive QA (SQuAD v1.1).

    task = get_task("ner")
    examples = task.read("train")                      # or task.read("dev", path=...) / hub=...
    features = task.featurize(examples, tokenizer)     # -> dataclasses, `collate` pads them
    scores = task.metric(predictions, references)      # scores[task.main_metric]
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from bertlab.tasks.batching import BucketBatchSampler, collate
from bertlab.tasks.features import (
    IGNORE_INDEX,
    ClassificationFeature,
    EntitySpan,
    FeatureError,
    RegressionFeature,
    TokenFeature,
    WordPieces,
    align_labels,
    encode_words,
    entity_spans,
    featurize_classification,
    featurize_ner,
    featurize_regression,
    ner_labels,
    word_predictions,
)
from bertlab.tasks.metrics import classification_metrics, entity_metrics, regression_metrics, squad_metrics
from bertlab.tasks.qa import (
    QAFeature,
    SpanPrediction,
    best_answers,
    featurize_qa,
    predict_spans,
    window_starts,
)
from bertlab.tasks.readers import (
    CONLL_LABELS,
    NLI_LABELS,
    SST2_LABELS,
    ClassificationExample,
    DataFormatError,
    DataSourceError,
    NoPartsError,
    QAAnswer,
    QAExample,
    ScoredExample,
    TokenExample,
    read_conll,
    read_sick,
    read_sick_relatedness,
    read_sst2,
)
from bertlab.tasks.splits import DEV_SHARE, DataSplit, hold_out, read_train_dev, subset
from bertlab.tasks.squad import read_squad, split_articles, squad_article_split


@dataclass(frozen=True)
class Task:
    """What a fine-tuning task needs: its head kind (BertConfig.task), labels, and the
    reader, featurizer and metric, with the name of the metric to rank models by."""

    name: str
    head: str  # "sequence_classification" | "token_classification" | "question_answering"
    id2label: Mapping[int, str]  # empty for QA
    read: Callable[..., list]  # (split="train", path=None, hub=None) -> examples
    featurize: Callable[..., list]  # (examples, tokenizer, max_length=...) -> features
    metric: Callable[[Any, Any], dict[str, Any]]  # (predictions, references) -> scores
    main_metric: str
    hub: str  # a hub data set in the same format, for read(hub=task.hub)
    description: str
    # transformers' problem_type of a sequence head: "regression" = one number (num_labels 1, MSE loss)
    problem_type: str | None = None

    @property
    def regression(self) -> bool:
        """Whether the head predicts a number (one output, mean squared error) rather than a class."""
        return self.problem_type == "regression"


def _sst2_metric(predictions: Sequence[int], references: Sequence[int]) -> dict[str, Any]:
    """Accuracy (0-1) and confusion matrix of class ids."""
    return classification_metrics(predictions, references, len(SST2_LABELS))


def _nli_metric(predictions: Sequence[int], references: Sequence[int]) -> dict[str, Any]:
    """Accuracy (0-1) and 3x3 confusion matrix (rows = gold) of NLI_LABELS ids."""
    return classification_metrics(predictions, references, len(NLI_LABELS))


def squad_references(examples: Sequence[QAExample]) -> dict[str, list[str]]:
    """Question id -> gold answer texts, as squad_metrics takes them."""
    return {ex.id: [a.text for a in ex.answers] for ex in examples}


def _qa_metric(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]] | Sequence[QAExample]
) -> dict[str, Any]:
    """SQuAD v1.1 exact_match and f1 (0-100); references as examples or id -> answer texts."""
    if not isinstance(references, Mapping):
        references = squad_references(references)
    return squad_metrics(predictions, references)


STS_LABELS: dict[int, str] = {0: "relatedness"}  # one output: the predicted score

TASKS: Mapping[str, Task] = MappingProxyType(
    {
        "sst2": Task(
            "sst2", "sequence_classification", MappingProxyType(SST2_LABELS), read_sst2,
            featurize_classification, _sst2_metric, "accuracy", "stanfordnlp/sst2",
            "Sentiment of a movie-review phrase (SST-2): negative or positive.",
        ),
        "nli": Task(
            "nli", "sequence_classification", MappingProxyType(NLI_LABELS), read_sick,
            featurize_classification, _nli_metric, "accuracy", "RobZamp/sick",
            "Natural language inference on SICK pairs: does A entail, contradict, or say nothing about B?",
        ),
        "sts": Task(
            "sts", "sequence_classification", MappingProxyType(STS_LABELS), read_sick_relatedness,
            featurize_regression, regression_metrics, "pearson", "RobZamp/sick",
            "Text similarity on SICK pairs: how related are A and B, from 1 (unrelated) to 5?",
            problem_type="regression",
        ),
        "ner": Task(
            "ner", "token_classification", MappingProxyType(CONLL_LABELS), read_conll,
            featurize_ner, entity_metrics, "f1", "eriktks/conll2003",
            "Named entities in news (CoNLL-2003): persons, organisations, locations, misc.",
        ),
        "qa": Task(
            "qa", "question_answering", MappingProxyType({}), read_squad,
            featurize_qa, _qa_metric, "f1", "rajpurkar/squad",
            "Extractive question answering (SQuAD v1.1): find the answer span in a paragraph.",
        ),
    }
)  # fmt: skip


def get_task(name: str) -> Task:
    """The task called `name` (one of TASKS: sst2, nli, sts, ner, qa)."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}.")
    return TASKS[name]


__all__ = [
    "CONLL_LABELS", "DEV_SHARE", "IGNORE_INDEX", "NLI_LABELS", "SST2_LABELS", "STS_LABELS", "TASKS",
    "BucketBatchSampler", "ClassificationExample", "ClassificationFeature", "DataFormatError", "DataSplit",
    "DataSourceError", "EntitySpan", "FeatureError", "NoPartsError", "QAAnswer", "QAExample", "QAFeature",
    "RegressionFeature", "ScoredExample", "SpanPrediction", "Task", "TokenExample", "TokenFeature", "WordPieces",
    "align_labels", "best_answers", "collate", "encode_words", "entity_spans", "featurize_classification",
    "featurize_ner", "featurize_qa", "featurize_regression", "get_task", "hold_out", "ner_labels", "predict_spans",
    "read_conll", "read_sick", "read_sick_relatedness", "read_squad", "read_sst2", "read_train_dev",
    "regression_metrics", "split_articles", "squad_article_split", "squad_references", "subset", "window_starts",
    "word_predictions",
]  # fmt: skip
