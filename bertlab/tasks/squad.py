"""The SQuAD v1.1 reader: JSON files split into train and dev BY ARTICLE, or the hub's splits.

Malformed files raise `DataFormatError` naming the file and the place inside the JSON
(`data[0].paragraphs[2].qas[1].answers[0].answer_start`), never quoting the file's content."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from bertlab.tasks.readers import (
    SPLITS,
    DataFormatError,
    QAAnswer,
    QAExample,
    check_split,
    display_path,
    hub_rows,
    resolve_files,
)

log = logging.getLogger(__name__)


def split_articles(titles: Iterable[str], dev_articles: int = 7, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic split of article titles into (train, dev): a seeded shuffle of the
    sorted titles, the first `dev_articles` go to dev. Never split by question: questions
    about the same article would leak between train and dev."""
    unique = sorted(set(titles))
    if not 0 < dev_articles < len(unique):
        raise ValueError(
            f"dev_articles={dev_articles} must be between 1 and {len(unique) - 1} ({len(unique)} articles)."
        )
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(unique), generator=g).tolist()
    dev = sorted(unique[i] for i in order[:dev_articles])
    train = sorted(unique[i] for i in order[dev_articles:])
    return train, dev


def read_squad(
    split: str = "train",
    path: str | Path | None = None,
    hub: str | None = None,
    dev_articles: int = 7,
    seed: int = 0,
) -> list[QAExample]:
    """SQuAD v1.1 questions. Local JSON files (all *.json in the folder) are split BY
    ARTICLE into train/dev with `split_articles(dev_articles, seed)` (fewer dev articles when
    the files hold no more than `dev_articles`); split "all" keeps every question (a test
    file is scored whole this way). From the hub (e.g. hub="rajpurkar/squad") the hub's own
    splits are used."""
    if split == "test" and hub is None:
        raise ValueError(
            "SQuAD files have no test part (train and dev are cut from them by article): "
            "score a test file whole with split 'all' (bertlab evaluate --split all --data FILE)."
        )
    check_split(split, ("train", "dev", "all") if hub is None else SPLITS, hub)
    if hub is not None:
        return _squad_hub(hub, split)
    files = resolve_files(path, "squad", "*.json")
    examples: list[QAExample] = []
    for file in files:
        examples.extend(_read_squad_file(file))
    if split == "all":
        return examples
    return squad_article_split(examples, split, dev_articles, seed, ", ".join(display_path(f) for f in files))


def squad_article_split(examples: Sequence[QAExample], split: str, dev_articles: int = 7, seed: int = 0,
                        where: str = "the SQuAD data") -> list[QAExample]:
    """The questions of the train or dev articles (see `split_articles`). With no more than
    `dev_articles` articles, a fifth of them (at least 1) go to dev; one article cannot be split."""
    titles = {e.title for e in examples}
    if len(titles) < 2:
        raise DataFormatError(
            f"{where}: {len(titles)} article(s). SQuAD data is split into train and dev BY ARTICLE, so it needs at "
            f"least 2: score one file whole with split 'all' (bertlab evaluate --split all), or give a separate dev "
            f"file (bertlab finetune --eval-data)."
        )
    if dev_articles >= len(titles):
        fewer = max(1, len(titles) // 5)
        log.info("%s: only %d articles, so %d (not %d) go to dev", where, len(titles), fewer, dev_articles)
        dev_articles = fewer
    train, dev = split_articles(titles, dev_articles, seed)
    keep = set(train if split == "train" else dev)
    out = [e for e in examples if e.title in keep]
    log.info("SQuAD %s: %d questions in %d articles", split, len(out), len(keep))
    return out


# SQuAD's own nesting is 9 levels ({data: [{paragraphs: [{qas: [{answers: [{...}]}]}]}]}); a few
# more are allowed for extra fields some variants carry.
SQUAD_MAX_DEPTH = 12
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _too_deep(text: str, limit: int) -> int | None:
    """The line where JSON `text` first nests deeper than `limit` arrays/objects (None when it does not)."""
    skeleton = _JSON_STRING.sub('""', text)  # brackets inside strings do not nest; JSON strings hold no newline
    depth = 0
    for m in _JSON_BRACKET.finditer(skeleton):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return skeleton.count("\n", 0, m.start()) + 1
        else:
            depth -= 1
    return None


def _read_squad_file(file: Path) -> list[QAExample]:
    name = display_path(file)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{name}: not UTF-8 text ({e.reason}); save the file as UTF-8.") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{name} line {e.lineno} column {e.colno}: not valid JSON ({e.msg}).") from None
    except RecursionError:
        doc = None  # nested too deep for the parser: said below, with the line
    line = _too_deep(text, SQUAD_MAX_DEPTH)
    if line is not None or doc is None:
        where = f" line {line}" if line is not None else ""
        raise DataFormatError(
            f"{name}{where}: the JSON nests deeper than a SQuAD file does ({SQUAD_MAX_DEPTH} levels at most: "
            f"data, paragraphs, qas, answers); this is not a SQuAD v1.1 file."
        )
    out: list[QAExample] = []
    for a, article in enumerate(_get(doc, "data", list, name, "")):
        where = f"data[{a}]"
        title = _get(article, "title", str, name, where)
        for p, para in enumerate(_get(article, "paragraphs", list, name, where)):
            pwhere = f"{where}.paragraphs[{p}]"
            context = _get_text(para, "context", name, pwhere)
            for q, qa in enumerate(_get(para, "qas", list, name, pwhere)):
                qwhere = f"{pwhere}.qas[{q}]"
                qid, question = _get(qa, "id", str, name, qwhere), _get_text(qa, "question", name, qwhere)
                given = _get(qa, "answers", list, name, qwhere)
                if not given:
                    raise DataFormatError(
                        f"{name}: {qwhere}.answers is empty: every SQuAD v1.1 question has at least one answer "
                        f"(questions without one, as in SQuAD 2.0, are not supported)."
                    )
                answers = [_squad_answer(ans, context, name, f"{qwhere}.answers[{k}]") for k, ans in enumerate(given)]
                out.append(QAExample(qid, title, question, context, answers))
    return out


def _get(obj: Any, key: str, kind: type, name: str, where: str) -> Any:
    """obj[key], checked to be of `kind`; errors name the file and the JSON path."""
    here = f"{where}.{key}" if where else key
    if not isinstance(obj, dict):
        raise DataFormatError(f"{name}: {where or 'the top level'} should be an object, got {type(obj).__name__}.")
    if key not in obj:
        raise DataFormatError(f"{name}: {here} is missing.")
    if not isinstance(obj[key], kind):
        raise DataFormatError(f"{name}: {here} should be {kind.__name__}, got {type(obj[key]).__name__}.")
    return obj[key]


def _get_text(obj: Any, key: str, name: str, where: str) -> str:
    """A string field that must hold some text."""
    text = _get(obj, key, str, name, where)
    if not text.strip():
        raise DataFormatError(f"{name}: {where}.{key} is empty.")
    return text


def _squad_answer(ans: Any, context: str, name: str, where: str) -> QAAnswer:
    text = _get_text(ans, "text", name, where)
    start = _get(ans, "answer_start", int, name, where)
    if isinstance(start, bool):  # JSON true/false: Python counts them as ints
        raise DataFormatError(f"{name}: {where}.answer_start should be int, got a boolean.")
    if not 0 <= start <= len(context) - len(text) or context[start : start + len(text)] != text:
        raise DataFormatError(
            f"{name}: {where}.answer_start ({start}) does not point at the answer text in its context "
            f"(a character offset from 0 to {len(context) - 1}, where the answer's text begins)."
        )
    return QAAnswer(text, start)


def _squad_hub(hub: str, split: str) -> list[QAExample]:
    out: list[QAExample] = []
    for row in hub_rows(hub, split):
        answers = row["answers"]
        gold = [QAAnswer(t, int(s)) for t, s in zip(answers["text"], answers["answer_start"])]
        out.append(QAExample(str(row["id"]), row.get("title", ""), row["question"], row["context"], gold))
    return out
