"""Train and dev examples of a task from one source, with a seeded dev part held out when the
source has none of its own.

    split = read_train_dev(get_task("sst2"), "reviews.tsv", seed=0)
    split.train, split.dev, split.note     # note: "reviews.tsv: 27 training examples, 3 held out as dev ..."

Where the dev examples come from:

- a separate dev source (`eval_data`): its dev split;
- a folder (or BERTLAB_DATA's copy) with a dev file, a SICK file with a TRIAL part (nli and sts alike), SQuAD data of
  two articles or more (split by article): that dev part;
- otherwise (one SST-2 or CoNLL file, a folder without a dev file, a SICK file without a TRIAL
  part, one SQuAD article): a seeded DEV_SHARE of the examples is held out, never trained on,
  and `held_out` is True. A SICK TEST part is never used for either.

SST-2's rows are phrases of a few thousand sentences (a sentence and its parse's sub-phrases). A dev
part cut from such rows at random scores phrases of sentences the model was trained on, so SST-2 dev
is held out by whole sentences: a sentence goes to dev with every row that is a phrase of it
(`hold_out_sentences`). A dev file whose rows are phrases of the training rows (the GLUE train piece in
BERTLAB_DATA) is pooled with the training file and split that way; a dev file of its own sentences
is used as it is.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertlab.runtime import derive_seed
from bertlab.settings import DataNotFoundError
from bertlab.tasks.readers import DataFormatError, NoPartsError
from bertlab.tasks.squad import squad_article_split

log = logging.getLogger(__name__)

DEV_SHARE = 0.1  # held out as dev when the data has no dev part
LEAK_SHARE = 20  # a dev file of which 1 row in LEAK_SHARE or more is a phrase of training rows is re-split


@dataclass
class DataSplit:
    """Train and dev examples of one task, and a sentence saying where they came from."""

    train: list[Any]
    dev: list[Any]
    note: str
    held_out: bool = False  # dev was cut out of the training data (a seeded DEV_SHARE)


def subset(items: Sequence[Any], n: int | None, seed: int, what: str = "") -> list[Any]:
    """A seeded random `n` of `items`, kept in their original order (all of them when n is None)."""
    if n is None or n >= len(items):
        return list(items)
    g = torch.Generator().manual_seed(derive_seed(seed, "subset", what))
    keep = sorted(torch.randperm(len(items), generator=g)[:n].tolist())
    return [items[i] for i in keep]


def hold_out(examples: Sequence[Any], seed: int, where: str,
             group: Callable[[Any], Hashable] | None = None) -> DataSplit:
    """A seeded DEV_SHARE of `examples` (at least one) as dev, the rest as train. With `group`,
    whole groups move together (e.g. the questions about one paragraph), so none is on both sides."""
    keys = [group(e) for e in examples] if group is not None else list(range(len(examples)))
    unique = list(dict.fromkeys(keys))
    what = "examples" if group is None else "groups (e.g. paragraphs)"
    if len(unique) < 2:
        raise DataFormatError(
            f"{where}: {len(unique)} {what}; at least 2 are needed to hold one out as dev. "
            f"Add data, or give a separate dev file of your own."
        )
    target = max(1, round(DEV_SHARE * len(examples)))
    if group is None:
        held = set(subset(unique, target, seed, "held-out dev"))
    else:
        g = torch.Generator().manual_seed(derive_seed(seed, "subset", "held-out dev"))
        sizes: dict[Hashable, int] = {}
        for k in keys:
            sizes[k] = sizes.get(k, 0) + 1
        held, n = set(), 0
        for i in torch.randperm(len(unique), generator=g).tolist()[: len(unique) - 1]:
            if n >= target:
                break
            held.add(unique[i])
            n += sizes[unique[i]]
    train = [e for e, k in zip(examples, keys) if k not in held]
    dev = [e for e, k in zip(examples, keys) if k in held]
    note = (f"{where}: {len(train):,} training examples, {len(dev):,} held out as dev "
            f"({DEV_SHARE:.0%}, seed {seed}).")
    return DataSplit(train, dev, note, held_out=True)


def _rarest_words(texts: Sequence[str]) -> list[str | None]:
    """Each text's rarest word (fewest texts hold it; ties by spelling), None for a text without words:
    a text can only be a phrase of a sentence that holds that word."""
    counts: collections.Counter[str] = collections.Counter(w for t in texts for w in set(t.split()))
    return [min(set(t.split()), key=lambda w: (counts[w], w)) if t.split() else None for t in texts]


def _sentence_roots(texts: Sequence[str]) -> list[str]:
    """The texts that are no phrase of a longer text (whole words compared), longest first."""
    unique = sorted({t for t in texts if t.split()}, key=lambda t: (-len(t), t))
    roots: list[str] = []
    by_word: dict[str, list[int]] = {}
    for t, rarest in zip(unique, _rarest_words(unique)):
        if any(_is_phrase_of(t, roots[i]) for i in by_word.get(rarest, ())):
            continue
        for w in set(t.split()):
            by_word.setdefault(w, []).append(len(roots))
        roots.append(t)
    return roots


def _is_phrase_of(phrase: str, sentence: str) -> bool:
    return f" {phrase} " in f" {sentence} "


class _PhraseIndex:
    """Which texts are phrases of a sentence: each text filed under its rarest word."""

    def __init__(self, texts: Sequence[str]):
        self.by_rarest: dict[str, list[int]] = {}
        for i, rarest in enumerate(_rarest_words(texts)):
            if rarest is not None:
                self.by_rarest.setdefault(rarest, []).append(i)
        self.texts = texts

    def phrases_of(self, sentence: str) -> set[int]:
        """Indices of the texts that are phrases of `sentence` (itself included)."""
        found: set[int] = set()
        for w in set(sentence.split()):
            found.update(i for i in self.by_rarest.get(w, ()) if _is_phrase_of(self.texts[i], sentence))
        return found


def hold_out_sentences(examples: Sequence[Any], seed: int, where: str) -> DataSplit:
    """A seeded DEV_SHARE of `examples` (rows with `text_a`) as dev, held out by whole sentences: a
    sentence (a row that is no phrase of a longer row) goes to dev with every row that is a phrase of
    it, so no phrase of a dev sentence is trained on."""
    texts = [e.text_a for e in examples]
    roots = _sentence_roots(texts)
    if len(roots) < 2:
        raise DataFormatError(
            f"{where}: {len(roots)} sentences; at least 2 are needed to hold one out as dev. "
            f"Add data, or give a separate dev file of your own."
        )
    index = _PhraseIndex(texts)
    target = max(1, round(DEV_SHARE * len(examples)))
    g = torch.Generator().manual_seed(derive_seed(seed, "subset", "held-out dev sentences"))
    dev_rows: set[int] = set()
    sentences = 0
    for i in torch.randperm(len(roots), generator=g).tolist()[: len(roots) - 1]:
        if len(dev_rows) >= target:
            break
        dev_rows |= index.phrases_of(roots[i])
        sentences += 1
    train = [e for i, e in enumerate(examples) if i not in dev_rows]
    dev = [e for i, e in enumerate(examples) if i in dev_rows]
    note = (f"{where}: {len(train):,} training examples, {len(dev):,} held out as dev ({DEV_SHARE:.0%}, seed {seed}): "
            f"{sentences:,} whole sentence{'s' if sentences != 1 else ''} of {len(roots):,}, each with every phrase "
            f"of it.")
    return DataSplit(train, dev, note, held_out=True)


def phrase_leak(train: Sequence[Any], dev: Sequence[Any]) -> int:
    """How many `dev` rows are phrases of a training row (whole words compared)."""
    train_texts = _sentence_roots([e.text_a for e in train])
    dev_texts = [e.text_a for e in dev]
    index = _PhraseIndex(dev_texts)
    leaked: set[int] = set()
    for t in train_texts:
        leaked |= index.phrases_of(t)
    return len(leaked)


def read_train_dev(task: Any, data: str | os.PathLike | None = None,
                   eval_data: str | os.PathLike | None = None, seed: int = 0) -> DataSplit:
    """The task's train and dev examples from BERTLAB_DATA (data None), a folder or one file,
    with dev from `eval_data` when given, else holding out a seeded dev part (module docstring)."""
    where = str(data) if data is not None else "BERTLAB_DATA"
    if eval_data is not None:
        train, dev = task.read("train", path=data), task.read("dev", path=eval_data)
        return DataSplit(train, dev, f"{len(train):,} training examples from {where}, "
                                     f"{len(dev):,} dev examples from {eval_data}.")
    file = Path(data).expanduser() if data is not None else None
    if file is not None and file.is_file():
        where = file.name
    else:
        file = None
    if task.name == "qa":
        return _squad(task, data, where, seed)
    if task.name in ("nli", "sts"):  # SICK: its TRAIN and TRIAL parts
        try:
            train, dev = task.read("train", path=data), task.read("dev", path=data)
        except NoPartsError:  # a SICK-like file without TRAIN/TRIAL/TEST parts
            return hold_out(task.read("all", path=data), seed, f"{where}: no SemEval_set parts")
        if train and dev:
            return DataSplit(train, dev, f"{len(train):,} training and {len(dev):,} dev pairs "
                                         f"(the TRAIN and TRIAL parts) from {where}.")
        return hold_out(train + dev, seed, f"{where}: no {'TRIAL' if train else 'TRAIN'} part")
    by_sentence = task.name == "sst2"  # rows that are phrases of sentences (module docstring)
    split_off = hold_out_sentences if by_sentence else hold_out
    train = task.read("train", path=data)
    if file is not None:  # one SST-2 or CoNLL file: read whole, it has no dev part
        return split_off(train, seed, where)
    try:
        dev = task.read("dev", path=data)
    except DataNotFoundError:  # a folder with a train file only
        return split_off(train, seed, f"{where}: no dev file")
    if by_sentence:
        leaked = phrase_leak(train, dev)
        if leaked * LEAK_SHARE >= len(dev):
            return hold_out_sentences(
                train + dev, seed,
                f"{where}: {leaked:,} of the dev file's {len(dev):,} rows are phrases of training sentences, "
                f"so train and dev were pooled and split again by sentence")
    return DataSplit(train, dev, f"{len(train):,} training and {len(dev):,} dev examples from {where}.")


def _squad(task: Any, data: str | os.PathLike | None, where: str, seed: int) -> DataSplit:
    """SQuAD: split by article (see read_squad); one article: whole paragraphs held out."""
    everything = task.read("all", path=data)
    articles = len({e.title for e in everything})
    if articles < 2:
        return hold_out(everything, seed, f"{where}: one article", group=lambda e: e.context)
    train, dev = squad_article_split(everything, "train", where=where), squad_article_split(everything, "dev",
                                                                                            where=where)
    return DataSplit(train, dev, f"{len(train):,} training and {len(dev):,} dev questions "
                                 f"({len({e.title for e in dev})} of {articles} articles held out) from {where}.")


__all__ = ["DEV_SHARE", "DataSplit", "hold_out", "hold_out_sentences", "phrase_leak", "read_train_dev", "subset"]
