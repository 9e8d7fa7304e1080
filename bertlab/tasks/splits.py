"""Train and dev examples of a task from one source, with a seeded dev part held out when the
source has none of its own.

    split = read_train_dev(get_task("sst2"), "reviews.tsv", seed=0)
    split.train, split.dev, split.note     # note: "reviews.tsv: 27 training examples, 3 held out as dev ..."

Where the dev examples come from:

- a separate dev source (`eval_data`): its dev split;
- a folder (or BERTLAB_DATA's copy) with a dev file, a SICK file with a TRIAL part, SQuAD data of
  two articles or more (split by article): that dev part;
- otherwise (one SST-2 or CoNLL file, a folder without a dev file, a SICK file without a TRIAL
  part, one SQuAD article): a seeded DEV_SHARE of the examples is held out, never trained on,
  and `held_out` is True. A SICK TEST part is never used for either.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertlab.runtime import derive_seed
from bertlab.settings import DataNotFoundError, data_dir
from bertlab.tasks.readers import DataFormatError, NoPartsError
from bertlab.tasks.squad import squad_article_split

log = logging.getLogger(__name__)

DEV_SHARE = 0.1  # held out as dev when the data has no dev part


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
            f"Add data, or give a separate dev file (eval_data, bertlab finetune --eval-data)."
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


def read_train_dev(task: Any, data: str | os.PathLike | None = None,
                   eval_data: str | os.PathLike | None = None, seed: int = 0) -> DataSplit:
    """The task's train and dev examples from BERTLAB_DATA (data None), a folder or one file,
    with dev from `eval_data` when given, else holding out a seeded dev part (module docstring)."""
    where = str(data) if data is not None else f"BERTLAB_DATA ({data_dir()})"
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
    if task.name == "nli":
        try:
            train, dev = task.read("train", path=data), task.read("dev", path=data)
        except NoPartsError:  # a SICK-like file without TRAIN/TRIAL/TEST parts
            return hold_out(task.read("all", path=data), seed, f"{where}: no SemEval_set parts")
        if train and dev:
            return DataSplit(train, dev, f"{len(train):,} training and {len(dev):,} dev pairs "
                                         f"(the TRAIN and TRIAL parts) from {where}.")
        return hold_out(train + dev, seed, f"{where}: no {'TRIAL' if train else 'TRAIN'} part")
    train = task.read("train", path=data)
    if file is not None:  # one SST-2 or CoNLL file: read whole, it has no dev part
        return hold_out(train, seed, where)
    try:
        dev = task.read("dev", path=data)
    except DataNotFoundError:  # a folder with a train file only
        return hold_out(train, seed, f"{where}: no dev file")
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


__all__ = ["DEV_SHARE", "DataSplit", "hold_out", "read_train_dev", "subset"]
