"""Linear probes on frozen features, one per stage (0 = embeddings, s = after layer s − 1), a control task
(Hewitt & Liang 2019: a random but consistent label per word type) and the selectivity (probe accuracy −
control accuracy), and a scalar mix (ELMo: softmax weights over the stages and a scale, learned with the probe).

Most properties are scored by accuracy; named entities by macro accuracy (each gold label's accuracy, averaged
over the labels): about 85 % of CoNLL-2003 words are "O", so plain accuracy rewards a probe, and a control
task, for saying "O" and can put the control above the probe. The result says which measure it used.

A word's feature is its first piece's vector (`pool="first"`), or the mean of its pieces (`pool="mean"`).
Features are computed once per model, sentences and pooling, and cached to disk (`feature_cache_dir()`).
The probes of all stages train together as one batched linear map (each stage's loss is its own: the same
as training them one by one); weights start at zero, so a run depends only on the data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.analysis.probe_data import TaggedSentence
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.tasks.layer_features import (  # noqa: F401 (Cancelled, feature_cache_dir, ...: this module's API)
    POOLS,
    SENTENCES_PER_BATCH,
    Cancelled,
    Progress,
    ScalarMix,
    feature_cache_dir,
    model_fingerprint,
    pool_words,
    word_features,
)
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

EPOCHS = 8  # passes over the training words
BATCH = 256  # words per step
LR = 0.01
WEIGHT_DECAY = 1e-4
MEASURES = ("accuracy", "macro accuracy")
MEASURE = {"ner": "macro accuracy"}  # property -> its measure where it is not plain accuracy (see above)


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------
def labelled_words(features: Sequence[torch.Tensor], sentences: Sequence[TaggedSentence], prop: str,
                   labels: dict[str, int] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, list[str], dict[str, int]]:
    """(x [words, stage, d], y [words], word forms, label -> id) of every word that has a feature. With
    `labels` given (from training), words whose tag it lacks get -1 (counted wrong, never trained on)."""
    if not sentences or prop not in sentences[0].tags:
        have = ", ".join(sentences[0].tags) if sentences else "nothing"
        raise InputError(f"these sentences have no {prop!r} tags (they have {have}); give a file with them.")
    labels = dict(labels) if labels is not None else {t: i for i, t in enumerate(sorted({t for s in sentences
                                                                                       for t in s.tags[prop]}))}
    xs, ys, forms = [], [], []
    for f, s in zip(features, sentences):
        n = f.shape[1]
        xs.append(f.transpose(0, 1))  # [words, stage, d]
        ys += [labels.get(t, -1) for t in s.tags[prop][:n]]
        forms += s.words[:n]
    return torch.cat(xs), torch.tensor(ys), forms, labels


def control_labels(forms: Sequence[str], y_train: torch.Tensor, n_labels: int, seed: int = 0,
                   table: dict[str, int] | None = None) -> tuple[torch.Tensor, dict[str, int]]:
    """Hewitt & Liang's control task: each word type (lower-cased form) gets one random label, drawn from the
    real labels' distribution in `y_train`; `table` (type -> label) carries the choices from train to eval."""
    table = dict(table or {})
    counts = torch.bincount(y_train[y_train >= 0], minlength=n_labels).float()
    g = torch.Generator().manual_seed(seed)
    out = []
    for form in forms:
        key = form.lower()
        if key not in table:
            table[key] = int(torch.multinomial(counts, 1, generator=g))
        out.append(table[key])
    return torch.tensor(out), table


# ---------------------------------------------------------------------------------------------
# The probes
# ---------------------------------------------------------------------------------------------
class StageProbes(nn.Module):
    """One linear probe per stage, trained at once: [words, stage, d] -> logits [words, stage, labels]."""

    def __init__(self, stages: int, d: int, n_labels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(stages, d, n_labels))
        self.bias = nn.Parameter(torch.zeros(stages, n_labels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("nsd,sdc->nsc", x, self.weight) + self.bias


class MixProbe(nn.Module):
    """A scalar mix of the stages, then one linear probe: [words, stage, d] -> logits [words, 1, labels]."""

    def __init__(self, stages: int, d: int, n_labels: int, fixed: torch.Tensor | None = None):
        super().__init__()
        self.mix = ScalarMix(stages, fixed)
        self.probe = StageProbes(1, d, n_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.probe(self.mix(x)[:, None])


def train_probe(module: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = EPOCHS, lr: float = LR,
                weight_decay: float = WEIGHT_DECAY, seed: int = 0, progress: Progress | None = None,
                cancelled: Callable[[], bool] | None = None) -> nn.Module:
    """Adam on the cross-entropy of module(x) [words, stage, labels] against y [words] (at every stage; -1 =
    ignore), in shuffled batches of BATCH words (the order from `seed`). Returns the module, trained."""
    keep = y >= 0
    x, y = x[keep], y[keep]
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(seed)
    module.train()
    for epoch in range(epochs):
        for rows in torch.randperm(len(y), generator=g).split(BATCH):
            if cancelled is not None and cancelled():
                raise Cancelled("stopped while training the probe")
            logits = module(x[rows])  # [n, stage, c]
            loss = F.cross_entropy(logits.transpose(1, 2), y[rows, None].expand(-1, logits.shape[1]),
                                   reduction="sum") / len(rows)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if progress is not None:
            progress(epoch + 1, epochs)
    return module.eval()


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Share of words whose top label is right, per stage: logits [words, stage, labels], y [words] -> [stage]."""
    return score(logits.argmax(-1), y, "accuracy")


def score(predicted: torch.Tensor, y: torch.Tensor, measure: str) -> torch.Tensor:
    """Per stage, the `measure` of the predicted labels [words, stage] against the gold labels y [words]:
    "accuracy" (share right) or "macro accuracy" (each gold label's share right, averaged over the gold labels
    present) -> [stage]; NaN with no words."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, not {measure!r}.")
    if len(y) == 0:
        return torch.full((predicted.shape[1],), float("nan"))
    right = (predicted == y[:, None]).float()  # [words, stage]
    if measure == "accuracy":
        return right.mean(0)
    return torch.stack([right[y == label].mean(0) for label in y.unique()]).mean(0)


@dataclass
class ProbeResult:
    """Per-stage probe accuracy on the evaluation words, with the control task and the scalar mix."""

    prop: str
    stages: list[str]  # "embeddings", "layer 0", ...
    accuracy: list[float]  # per stage
    control_accuracy: list[float] | None
    mix_weights: list[float]  # softmax weights over the stages
    mix_gamma: float
    mix_accuracy: float
    majority: float  # accuracy of always saying the most common training label
    train_words: int
    eval_words: int
    train_sentences: int
    eval_sentences: int
    labels: list[str]
    pool: str
    measure: str = "accuracy"  # what `accuracy` (and the control, the mix, the majority) hold: see MEASURES

    @property
    def selectivity(self) -> list[float] | None:
        """Probe accuracy − control accuracy, per stage."""
        if self.control_accuracy is None:
            return None
        return [a - c for a, c in zip(self.accuracy, self.control_accuracy)]

    def as_json(self) -> dict:
        r = lambda v: None if v is None else [_num(a) for a in v]  # noqa: E731
        return {"property": self.prop, "layers": self.stages, "accuracy": r(self.accuracy),
                "control_accuracy": r(self.control_accuracy), "selectivity": r(self.selectivity),
                "mix": {"weights": r(self.mix_weights), "gamma": _num(self.mix_gamma),
                        "accuracy": _num(self.mix_accuracy)},
                "majority_baseline": _num(self.majority), "pool": self.pool, "measure": self.measure,
                "train_sentences": self.train_sentences, "eval_sentences": self.eval_sentences,
                "train_words": self.train_words, "eval_words": self.eval_words}


def _num(v: float) -> float | None:
    """Rounded for JSON; None for NaN (JSON has no NaN)."""
    return None if v != v else round(float(v), 4)


def probe_property(
    model: Bert, tok: Tokenizer, train: Sequence[TaggedSentence], evaluate: Sequence[TaggedSentence], prop: str,
    control: bool = True, mix: bool = True, pool: str = "first", seed: int = 0, epochs: int = EPOCHS,
    cache_dir: Path | None = None, progress: Callable[[str, int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ProbeResult:
    """Fit the per-stage probes (and the control task, and the scalar mix) on `train`; report on `evaluate`.
    progress(what, done, total) names the step ("features", "probes", "control", "mix"). Scored by the
    property's measure (MEASURE: macro accuracy for named entities, else accuracy)."""
    from bertlab.analysis.similarity import stage_names

    def step(what: str) -> Progress | None:
        return None if progress is None else (lambda d, t: progress(what, d, t))

    if not train or not evaluate:
        raise InputError("a probe needs training and evaluation sentences: one of the two sets is empty.")
    f_train = word_features(model, tok, train, pool, cache_dir, step("features"), cancelled)
    f_eval = word_features(model, tok, evaluate, pool, cache_dir, step("features"), cancelled)
    x, y, forms, labels = labelled_words(f_train, train, prop)
    xe, ye, forms_e, _ = labelled_words(f_eval, evaluate, prop, labels)
    stages, d, c = x.shape[1], x.shape[2], len(labels)
    measure = MEASURE.get(prop, "accuracy")
    torch.manual_seed(seed)
    probes = train_probe(StageProbes(stages, d, c), x, y, epochs, seed=seed, progress=step("probes"),
                         cancelled=cancelled)
    with torch.no_grad():
        acc = score(probes(xe).argmax(-1), ye, measure)
    control_acc = None
    if control:
        yc, table = control_labels(forms, y, c, seed)
        yce, _ = control_labels(forms_e, y, c, seed, table)
        ctrl = train_probe(StageProbes(stages, d, c), x, yc, epochs, seed=seed, progress=step("control"),
                           cancelled=cancelled)
        with torch.no_grad():
            control_acc = score(ctrl(xe).argmax(-1), yce, measure).tolist()
    weights, gamma, mix_acc = [float("nan")] * stages, float("nan"), float("nan")
    if mix:
        mixed = train_probe(MixProbe(stages, d, c), x, y, epochs, seed=seed, progress=step("mix"),
                            cancelled=cancelled)
        with torch.no_grad():
            mix_acc = float(score(mixed(xe).argmax(-1), ye, measure)[0])
            weights, gamma = mixed.mix.weights.tolist(), float(mixed.mix.gamma)
    always = torch.full((len(ye), 1), int(torch.bincount(y[y >= 0]).argmax()))  # the most common training label
    majority = float(score(always, ye, measure)[0])
    return ProbeResult(prop, stage_names(stages - 1), acc.tolist(), control_acc, weights, gamma, mix_acc, majority,
                       int((y >= 0).sum()), len(ye), len(train), len(evaluate), list(labels), pool, measure)
