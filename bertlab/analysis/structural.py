"""The structural probe (Hewitt & Manning 2019): a low-rank linear map B under which the squared distance
between two word vectors, ‖B(h_i − h_j)‖², approximates their distance in the dependency tree.

Metrics (pure, on distance matrices and head lists): UUAS — the share of gold edges that the minimum
spanning tree of the predicted distances finds — and the distance Spearman correlation (each word's row of
predicted distances against its gold row, averaged over words of sentences of 5 to 50 words). As in the
paper, punctuation words are left out of both (when the sentences have UPOS tags).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from bertlab.analysis.probe_data import TaggedSentence, read_conll2003, read_conllu, split_sentences
from bertlab.analysis.probes import Cancelled, ProbeResult, Progress, ScalarMix, _num, probe_property, word_features
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.settings import data_path
from bertlab.tokenizer import Tokenizer

RANK = 64
EPOCHS = 10
BATCH = 20  # sentences per step
LR = 0.005
PUNCT = "PUNCT"


# ---------------------------------------------------------------------------------------------
# Trees and metrics (pure)
# ---------------------------------------------------------------------------------------------
def tree_distances(heads: Sequence[int]) -> torch.Tensor:
    """Path lengths between every two words of a tree given by heads (-1 = root): [n, n]."""
    n = len(heads)
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if h >= 0:
            adj[i].append(h)
            adj[h].append(i)
    out = torch.full((n, n), -1.0)
    for s in range(n):
        out[s, s], frontier = 0.0, [s]
        while frontier:
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if out[s, v] < 0:
                        out[s, v] = out[s, u] + 1
                        nxt.append(v)
            frontier = nxt
    if (out < 0).any():
        raise ValueError("the heads do not form one tree (some words are not connected).")
    return out


def min_spanning_tree(dist: torch.Tensor) -> list[tuple[int, int]]:
    """Edges (i < j) of the minimum spanning tree of a symmetric distance matrix [n, n] (Prim)."""
    n = dist.shape[0]
    if n < 2:
        return []
    inside = [0]
    best = dist[0].clone().tolist()
    parent = [0] * n
    left = set(range(1, n))
    edges = []
    while left:
        j = min(left, key=lambda k: best[k])
        left.remove(j)
        edges.append((min(j, parent[j]), max(j, parent[j])))
        inside.append(j)
        for k in left:
            if dist[j, k] < best[k]:
                best[k], parent[k] = float(dist[j, k]), j
    return sorted(edges)


def gold_edges(heads: Sequence[int], keep: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Undirected edges (i < j) of the tree, among the kept words."""
    keep = keep or [True] * len(heads)
    return sorted((min(i, h), max(i, h)) for i, h in enumerate(heads) if h >= 0 and keep[i] and keep[h])


def uuas(pred: torch.Tensor, heads: Sequence[int], keep: Sequence[bool] | None = None) -> tuple[int, int]:
    """(gold edges found by the MST of `pred` over the kept words, gold edges among them)."""
    keep = list(keep or [True] * len(heads))
    idx = [i for i, k in enumerate(keep) if k]
    gold = set(gold_edges(heads, keep))
    sub = pred[idx][:, idx]
    found = {(idx[a], idx[b]) for a, b in min_spanning_tree(sub)}
    return len(found & gold), len(gold)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two vectors (ties get their mean rank); NaN when one is constant."""
    ra, rb = _ranks(a.float()), _ranks(b.float())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den > 0 else float("nan")


def _ranks(x: torch.Tensor) -> torch.Tensor:
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for v in x.unique():  # ties: the mean rank
        same = x == v
        if int(same.sum()) > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def distance_spearman(pred: torch.Tensor, gold: torch.Tensor, keep: Sequence[bool] | None = None) -> list[float]:
    """Per kept word, Spearman of its predicted distances to the other kept words against the gold ones."""
    keep = list(keep or [True] * gold.shape[0])
    idx = [i for i, k in enumerate(keep) if k]
    out = []
    for i in idx:
        others = [j for j in idx if j != i]
        if len(others) >= 2:
            out.append(spearman(pred[i, others], gold[i, others]))
    return [v for v in out if v == v]


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------
class StructuralProbe(nn.Module):
    """One low-rank map per stage, B [stage, rank, d]: squared distances [batch, stage, n, n] of word vectors
    [batch, stage, n, d]."""

    def __init__(self, stages: int, d: int, rank: int = RANK, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.B = nn.Parameter(torch.empty(stages, rank, d).uniform_(-0.05, 0.05, generator=g))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        t = torch.einsum("bsnd,srd->bsnr", h, self.B)
        sq = (t * t).sum(-1)
        return (sq[..., :, None] + sq[..., None, :] - 2 * t @ t.transpose(-1, -2)).clamp(min=0)


class MixStructuralProbe(nn.Module):
    """ELMo's scalar mix of the stages, then one structural probe: word vectors [batch, stage, n, d] ->
    squared distances [batch, 1, n, n]. `fixed` weights (a probability per stage) are used as given."""

    def __init__(self, stages: int, d: int, rank: int = RANK, seed: int = 0, fixed: torch.Tensor | None = None):
        super().__init__()
        self.mix = ScalarMix(stages, fixed)
        self.probe = StructuralProbe(1, d, rank, seed)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, n, d = h.shape
        mixed = self.mix(h.permute(0, 2, 1, 3).reshape(b * n, s, d)).reshape(b, n, d)
        return self.probe(mixed[:, None])


def _pad(features: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[stage, n_i, d] each -> ([batch, stage, n, d], lengths [batch])."""
    n = max(f.shape[1] for f in features)
    out = torch.zeros(len(features), features[0].shape[0], n, features[0].shape[2])
    for i, f in enumerate(features):
        out[i, :, : f.shape[1]] = f
    return out, torch.tensor([f.shape[1] for f in features])


def train_structural(features: Sequence[torch.Tensor], trees: Sequence[torch.Tensor], rank: int = RANK,
                     epochs: int = EPOCHS, seed: int = 0, progress: Progress | None = None,
                     cancelled: Callable[[], bool] | None = None, probe: nn.Module | None = None) -> nn.Module:
    """Fit B per stage: L1 between predicted squared distances and tree distances, each sentence's loss divided
    by its squared length (as in the paper); Adam, BATCH sentences a step, order from `seed`. `probe`: another
    module to fit the same way (the scalar mix's); default one StructuralProbe over every stage."""
    probe = probe if probe is not None else StructuralProbe(features[0].shape[0], features[0].shape[2], rank, seed)
    opt = torch.optim.Adam(probe.parameters(), lr=LR)
    g = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        for rows in torch.randperm(len(features), generator=g).split(BATCH):
            if cancelled is not None and cancelled():
                raise Cancelled("stopped while training the structural probe")
            h, lengths = _pad([features[i] for i in rows])
            gold = torch.zeros(len(rows), h.shape[2], h.shape[2])
            for k, i in enumerate(rows):
                gold[k, : lengths[k], : lengths[k]] = trees[i]
            valid = torch.arange(h.shape[2])[None, :] < lengths[:, None]  # [batch, n]
            pair = (valid[:, :, None] & valid[:, None, :]).float()[:, None]  # [batch, 1, n, n]
            err = (probe(h) - gold[:, None]).abs() * pair / (lengths.float() ** 2)[:, None, None, None]
            loss = err.sum() / len(rows)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if progress is not None:
            progress(epoch + 1, epochs)
    return probe.eval()


@dataclass
class StructuralResult:
    """UUAS and distance Spearman per stage on the evaluation sentences."""

    stages: list[str]
    uuas: list[float]
    spearman: list[float]
    train_sentences: int
    eval_sentences: int
    rank: int
    probe: StructuralProbe
    pool: str
    mix_weights: list[float] | None = None  # the scalar mix's softmax weight per stage (None: not fitted)
    mix_gamma: float = float("nan")
    mix_uuas: float = float("nan")
    mix_spearman: float = float("nan")

    def as_json(self) -> dict:
        r = lambda v: [_num(a) for a in v]  # noqa: E731
        mix = None if self.mix_weights is None else {
            "weights": r(self.mix_weights), "gamma": _num(self.mix_gamma), "accuracy": _num(self.mix_uuas),
            "uuas": _num(self.mix_uuas), "spearman": _num(self.mix_spearman)}
        return {"property": "tree", "layers": self.stages, "accuracy": r(self.uuas), "uuas": r(self.uuas),
                "spearman": r(self.spearman), "control_accuracy": None, "selectivity": None, "mix": mix,
                "rank": self.rank, "pool": self.pool, "train_sentences": self.train_sentences,
                "eval_sentences": self.eval_sentences}


def _keep(s: TaggedSentence, n: int) -> list[bool]:
    upos = s.tags.get("upos")
    return [upos is None or upos[i] != PUNCT for i in range(n)]


def _usable(features: list[torch.Tensor], sentences: Sequence[TaggedSentence]):
    """Sentences whose every word has a feature (none cut by the length limit), with their tree distances."""
    out = [(f, s, tree_distances(s.heads)) for f, s in zip(features, sentences)
           if s.heads is not None and f.shape[1] == len(s.words) and len(s.words) >= 2]
    if not out:
        raise InputError("none of these sentences has a dependency tree (heads): give a CoNLL-U file.")
    return out


def probe_tree(model: Bert, tok: Tokenizer, train: Sequence[TaggedSentence], evaluate: Sequence[TaggedSentence],
               rank: int = RANK, epochs: int = EPOCHS, pool: str = "first", seed: int = 0, cache_dir=None,
               progress: Callable[[str, int, int], None] | None = None,
               cancelled: Callable[[], bool] | None = None, mix: bool = True) -> StructuralResult:
    """Fit the structural probe on `train` at every stage (and, with `mix`, one on the scalar mix of all
    stages); UUAS and distance Spearman on `evaluate`."""
    from bertlab.analysis.similarity import stage_names

    def step(what: str) -> Progress | None:
        return None if progress is None else (lambda d, t: progress(what, d, t))

    tr = _usable(word_features(model, tok, train, pool, cache_dir, step("features"), cancelled), train)
    ev = _usable(word_features(model, tok, evaluate, pool, cache_dir, step("features"), cancelled), evaluate)
    features, trees = [f for f, _, _ in tr], [d for _, _, d in tr]
    probe = train_structural(features, trees, rank, epochs, seed, step("tree"), cancelled)
    stages = tr[0][0].shape[0]
    found, rhos = _scores(probe, ev)
    result = StructuralResult(stage_names(stages - 1), found, rhos, len(tr), len(ev), rank, probe, pool)
    if mix:
        mixed = MixStructuralProbe(stages, features[0].shape[2], rank, seed)
        train_structural(features, trees, rank, epochs, seed, step("mix"), cancelled, probe=mixed)
        (result.mix_uuas,), (result.mix_spearman,) = _scores(mixed, ev)
        result.mix_weights, result.mix_gamma = mixed.mix.weights.detach().tolist(), float(mixed.mix.gamma.detach())
    return result


def _scores(probe: nn.Module, ev) -> tuple[list[float], list[float]]:
    """(UUAS, mean distance Spearman) per output stage of `probe` on the evaluation sentences."""
    found, total, rhos = None, 0, None
    with torch.no_grad():
        for f, s, gold in ev:
            pred = probe(f[None])[0]  # [stage, n, n]
            if found is None:
                found, rhos = torch.zeros(pred.shape[0]), [[] for _ in range(pred.shape[0])]
            keep = _keep(s, f.shape[1])
            for st in range(pred.shape[0]):
                got, n = uuas(pred[st], s.heads, keep)
                found[st] += got
                if 5 <= sum(keep) <= 50:
                    rhos[st] += distance_spearman(pred[st], gold, keep)
            total += n
    return (found / max(total, 1)).tolist(), [sum(r) / len(r) if r else float("nan") for r in rhos]


@dataclass
class TreePrediction:
    """The probe's tree for one sentence at one stage, with the gold tree where the sentence has one."""

    words: list[str]
    stage: int
    distances: torch.Tensor  # [n, n] predicted squared distances
    edges: list[tuple[int, int]]  # predicted (MST), i < j
    gold: list[tuple[int, int]] | None


def predict_tree(model: Bert, tok: Tokenizer, probe: StructuralProbe, sentence: TaggedSentence | str, stage: int,
                 pool: str = "first") -> TreePrediction:
    """The minimum spanning tree of the probe's distances for a sentence (a TaggedSentence, or text split at
    spaces) at `stage`; gold edges when the sentence has heads."""
    if isinstance(sentence, str):
        words = sentence.split()
        if len(words) < 2:
            raise InputError("Type a sentence of at least two words (words are split at spaces).")
        sentence = TaggedSentence(words)
    if not 0 <= stage < probe.B.shape[0]:
        raise IndexError(f"stage {stage} does not exist: stages are 0..{probe.B.shape[0] - 1}.")
    (f,) = word_features(model, tok, [sentence], pool, use_cache=False)
    with torch.no_grad():
        dist = probe(f[None])[0, stage]
    n = f.shape[1]
    gold = gold_edges(sentence.heads[:n]) if sentence.heads is not None and n == len(sentence.words) else None
    return TreePrediction(sentence.words[:n], stage, dist, min_spanning_tree(dist), gold)


UD_FILE = ("ud_ewt", "en_ewt-ud-dev.conllu")  # under BERTLAB_DATA: upos, deprel and the tree
CONLL_FILES = (("conll2003", "train.txt"), ("conll2003", "dev.txt"))  # pos, chunk and ner
UD_PROPERTIES = ("upos", "deprel", "tree")


def probe_each(model: Bert, tok: Tokenizer, props: Sequence[str], n_train: int, n_eval: int, pool: str = "first",
               progress: Callable[[str, int, int], None] | None = None, cancelled: Callable[[], bool] | None = None,
               ) -> Iterator[tuple[str, ProbeResult | StructuralResult, list[TaggedSentence]]]:
    """Probe each property of `props` in turn (the structural probe for "tree"), trained on the first `n_train`
    training sentences and scored on the first `n_eval` held-out ones; yields (property, result, those
    held-out sentences) as each ends. Each data file is read once, when first needed. `progress(what, done,
    total)` hears the property's name in `what`."""
    conll = ud = None
    for prop in props:
        def told(what: str, done: int, total: int, prop: str = prop) -> None:
            if progress is not None:
                progress(f"{prop}: {what}", done, total)

        if prop in UD_PROPERTIES:
            if ud is None:
                tr, ev = split_sentences(read_conllu(data_path(*UD_FILE)))
                ud = tr[:n_train], ev[:n_eval]
            train, ev = ud
        else:
            if conll is None:
                conll = (read_conll2003(data_path(*CONLL_FILES[0]))[:n_train],
                         read_conll2003(data_path(*CONLL_FILES[1]))[:n_eval])
            train, ev = conll
        if prop == "tree":
            result = probe_tree(model, tok, train, ev, pool=pool, progress=told, cancelled=cancelled)
        else:
            result = probe_property(model, tok, train, ev, prop, pool=pool, progress=told, cancelled=cancelled)
        yield prop, result, ev
