"""Readers for the fine-tuning data sets: SST-2, SICK, CoNLL-2003 and SQuAD v1.1.

Each reader takes a split and one of three sources: the local copies under
`bertlab.settings.data_dir()` (the default); your own file or folder in the same format
(`path=`: a file is read whole for SST-2 and CoNLL, for SICK the split picks the part, for
SQuAD the article split); or a Hugging Face hub data set (`hub="name"` or
`hub="name:config"`, needs the `datasets` package and a network). Malformed files raise
`DataFormatError` naming the file and the line (or, for JSON, the place inside it)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from bertlab.settings import DataNotFoundError, data_dir, data_path

log = logging.getLogger(__name__)

SST2_LABELS: dict[int, str] = {0: "negative", 1: "positive"}
NLI_LABELS: dict[int, str] = {0: "entailment", 1: "neutral", 2: "contradiction"}
# The order of the hub's conll2003 `ner_tags`, so that ids agree with models trained there.
CONLL_LABELS: dict[int, str] = dict(
    enumerate(("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"))
)
SPLITS = ("train", "dev")
_HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


class DataFormatError(ValueError):
    """A data file that does not follow its format; the message names the file and line."""


class DataSourceError(RuntimeError):
    """A data source that cannot be reached (e.g. the hub without `datasets` or offline)."""


# -- examples ------------------------------------------------------------------------------


@dataclass
class ClassificationExample:
    """One sentence (or pair) with a class id."""

    guid: str
    text_a: str
    text_b: str | None
    label: int


@dataclass
class TokenExample:
    """One sentence as words, with one tag per word (IOB2, e.g. B-PER)."""

    guid: str
    words: list[str]
    tags: list[str]


@dataclass
class QAAnswer:
    """A gold answer: its text and its first character in the context."""

    text: str
    start: int

    @property
    def end(self) -> int:
        """One past the last character of the answer in the context."""
        return self.start + len(self.text)


@dataclass
class QAExample:
    """One SQuAD question about one paragraph, with its gold answers."""

    id: str
    title: str
    question: str
    context: str
    answers: list[QAAnswer] = field(default_factory=list)


# -- paths ---------------------------------------------------------------------------------


def _display(path: Path) -> str:
    """The path as a student would look for it: relative to BERTLAB_DATA when inside it."""
    try:
        return str(path.resolve().relative_to(data_dir().resolve()))
    except ValueError:
        return str(path)


def _check_split(split: str, allowed: Sequence[str]) -> None:
    if split not in allowed:
        raise ValueError(f"split {split!r} is not one of {tuple(allowed)}.")


def _resolve(path: str | Path | None, folder: str, pattern: str) -> list[Path]:
    """Files matching `pattern`: in `path` (a file or a folder) or in data_dir()/folder."""
    base = data_path(folder) if path is None else Path(path).expanduser()
    if base.is_file():
        return [base]
    if not base.is_dir():
        raise DataNotFoundError(f"{base} does not exist; give a {pattern} file or a folder that holds one.")
    found = sorted(base.glob(pattern))
    if not found:
        raise DataNotFoundError(f"{base} holds no file matching {pattern}.")
    return found


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); a BOM is dropped."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(
                    f"{_display(path)} line {n}: not UTF-8 text ({e.reason}); save the file as UTF-8."
                ) from None
            yield n, line.rstrip("\r\n")


# -- SST-2 ---------------------------------------------------------------------------------


def read_sst2(
    split: str = "train", path: str | Path | None = None, hub: str | None = None
) -> list[ClassificationExample]:
    """SST-2 sentences with labels 0 = negative, 1 = positive, from `sentence<TAB>label`
    TSV (an optional header line) or the hub (e.g. hub="stanfordnlp/sst2")."""
    _check_split(split, SPLITS)
    if hub is not None:
        return [_sst2_row(row, i, hub) for i, row in enumerate(_hub_rows(hub, split))]
    file = _resolve(path, "sst2", f"{split}.tsv")[0]
    name = _display(file)
    out: list[ClassificationExample] = []
    for n, line in _lines(file):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataFormatError(
                f"{name} line {n}: expected 2 tab-separated fields (sentence, label), got {len(fields)}."
            )
        text, label = fields[0].strip(), fields[1].strip()
        if n == 1 and label == "label":
            continue  # header
        if label not in ("0", "1"):
            raise DataFormatError(f"{name} line {n}: the label must be 0 or 1, got {label!r}.")
        out.append(ClassificationExample(f"{split}-{len(out)}", text, None, int(label)))
    log.info("read %d SST-2 sentences from %s", len(out), name)
    return out


def _sst2_row(row: dict, i: int, hub: str) -> ClassificationExample:
    label = row.get("label")
    if label not in (0, 1):
        raise DataFormatError(f"hub {hub} row {i}: label must be 0 or 1, got {label!r} (the test split has no labels).")
    return ClassificationExample(str(row.get("idx", i)), row["sentence"].strip(), None, int(label))


# -- SICK (NLI) ----------------------------------------------------------------------------

_SICK_PARTS = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}
_SICK_COLUMNS = ("pair_ID", "sentence_A", "sentence_B", "entailment_label", "SemEval_set")


def read_sick(
    split: str = "train", path: str | Path | None = None, hub: str | None = None
) -> list[ClassificationExample]:
    """SICK sentence pairs (A = premise, B = hypothesis) with NLI_LABELS ids. Local files are
    the SICK TSV with a header; split "train" is the TRAIN part, "dev" TRIAL, "test" TEST.
    From the hub, columns sentence_A/sentence_B or premise/hypothesis are read."""
    _check_split(split, tuple(_SICK_PARTS))
    if hub is not None:
        return _nli_hub(hub, split)
    label_ids = {v.upper(): k for k, v in NLI_LABELS.items()}
    out: list[ClassificationExample] = []
    for file in _resolve(path, "sick", "SICK*.txt"):
        name = _display(file)
        lines = _lines(file)
        header = next(lines, (1, ""))[1].split("\t")
        missing = [c for c in _SICK_COLUMNS if c not in header]
        if missing:
            raise DataFormatError(f"{name} line 1: the header lacks the column(s) {missing}; found {header}.")
        col = {c: header.index(c) for c in _SICK_COLUMNS}
        for n, line in lines:
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != len(header):
                raise DataFormatError(
                    f"{name} line {n}: expected {len(header)} tab-separated fields like the header, got {len(fields)}."
                )
            if fields[col["SemEval_set"]].strip().upper() != _SICK_PARTS[split]:
                continue
            label = fields[col["entailment_label"]].strip().upper()
            if label not in label_ids:
                raise DataFormatError(
                    f"{name} line {n}: entailment_label must be one of {list(label_ids)}, got {label!r}."
                )
            a, b = fields[col["sentence_A"]].strip(), fields[col["sentence_B"]].strip()
            out.append(ClassificationExample(fields[col["pair_ID"]].strip(), a, b, label_ids[label]))
    if not out:
        log.warning("no SICK pairs in the %s part (%s)", _SICK_PARTS[split], split)
    log.info("read %d SICK pairs (%s)", len(out), _SICK_PARTS[split])
    return out


def _nli_hub(hub: str, split: str) -> list[ClassificationExample]:
    rows = _hub_rows(hub, split)
    names = _class_names(rows, "label")
    label_ids = {v: k for k, v in NLI_LABELS.items()}
    out: list[ClassificationExample] = []
    skipped = 0
    for i, row in enumerate(rows):
        a = row.get("sentence_A", row.get("premise"))
        b = row.get("sentence_B", row.get("hypothesis"))
        if a is None or b is None:
            raise DataFormatError(
                f"hub {hub} row {i}: expected columns sentence_A/sentence_B or premise/hypothesis, got {sorted(row)}."
            )
        label = row["label"]
        if isinstance(label, int) and label < 0:
            skipped += 1  # SNLI marks pairs without a gold label with -1
            continue
        name = (names[label] if names and isinstance(label, int) else str(label)).lower()
        if name not in label_ids:
            raise DataFormatError(f"hub {hub} row {i}: label {label!r} is not one of {list(label_ids)}.")
        out.append(ClassificationExample(str(row.get("pair_ID", row.get("id", i))), a, b, label_ids[name]))
    if skipped:
        log.info("skipped %d pairs without a gold label", skipped)
    return out


# -- CoNLL-2003 (NER) ----------------------------------------------------------------------


def _check_tag(tag: str) -> bool:
    return tag == "O" or (len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-")


def read_conll(split: str = "train", path: str | Path | None = None, hub: str | None = None) -> list[TokenExample]:
    """CoNLL-2003 sentences: one `word ... TAG` line a token (the tag is the last column,
    e.g. `word POS chunk NER`), blank lines between sentences, `-DOCSTART-` lines skipped.
    From the hub (e.g. hub="eriktks/conll2003") `tokens` and `ner_tags` are read."""
    _check_split(split, SPLITS)
    if hub is not None:
        return _conll_hub(hub, split)
    file = _resolve(path, "conll2003", f"{split}.txt")[0]
    name = _display(file)
    out: list[TokenExample] = []
    words: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if words:
            out.append(TokenExample(f"{split}-{len(out)}", list(words), list(tags)))
            words.clear()
            tags.clear()

    for n, line in _lines(file):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if len(fields) < 2:
            raise DataFormatError(
                f"{name} line {n}: expected `word ... TAG` (at least 2 space-separated fields), got 1."
            )
        if not _check_tag(fields[-1]):
            raise DataFormatError(f"{name} line {n}: {fields[-1]!r} is not a tag like O, B-PER or I-LOC.")
        words.append(fields[0])
        tags.append(fields[-1])
    flush()
    log.info("read %d CoNLL sentences from %s", len(out), name)
    return out


def _conll_hub(hub: str, split: str) -> list[TokenExample]:
    rows = _hub_rows(hub, split)
    names = _class_names(rows, "ner_tags") or [CONLL_LABELS[i] for i in range(len(CONLL_LABELS))]
    out: list[TokenExample] = []
    for i, row in enumerate(rows):
        words, tags = list(row["tokens"]), [names[t] if isinstance(t, int) else t for t in row["ner_tags"]]
        if len(words) != len(tags):
            raise DataFormatError(f"hub {hub} row {i}: {len(words)} tokens but {len(tags)} tags.")
        if words and words[0] != "-DOCSTART-":
            out.append(TokenExample(str(row.get("id", i)), words, tags))
    return out


# -- SQuAD v1.1 ----------------------------------------------------------------------------


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
    ARTICLE into train/dev with `split_articles(dev_articles, seed)`; split "all" keeps
    every question. From the hub (e.g. hub="rajpurkar/squad") the hub's own splits are used."""
    _check_split(split, ("train", "dev", "all"))
    if hub is not None:
        if split == "all":
            raise ValueError("split='all' is for local files; the hub has its own train/dev splits.")
        return _squad_hub(hub, split)
    examples: list[QAExample] = []
    for file in _resolve(path, "squad", "*.json"):
        examples.extend(_read_squad_file(file))
    if split == "all":
        return examples
    train, dev = split_articles((e.title for e in examples), dev_articles, seed)
    keep = set(train if split == "train" else dev)
    out = [e for e in examples if e.title in keep]
    log.info("SQuAD %s: %d questions in %d articles", split, len(out), len(keep))
    return out


def _read_squad_file(file: Path) -> list[QAExample]:
    name = _display(file)
    try:
        doc = json.loads(file.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{name} line {e.lineno} column {e.colno}: not valid JSON ({e.msg}).") from e
    out: list[QAExample] = []
    for a, article in enumerate(_get(doc, "data", list, name, "")):
        where = f"data[{a}]"
        title = _get(article, "title", str, name, where)
        for p, para in enumerate(_get(article, "paragraphs", list, name, where)):
            pwhere = f"{where}.paragraphs[{p}]"
            context = _get(para, "context", str, name, pwhere)
            for q, qa in enumerate(_get(para, "qas", list, name, pwhere)):
                qwhere = f"{pwhere}.qas[{q}]"
                answers = [
                    _squad_answer(ans, context, name, f"{qwhere}.answers[{k}]")
                    for k, ans in enumerate(_get(qa, "answers", list, name, qwhere))
                ]
                qid, question = _get(qa, "id", str, name, qwhere), _get(qa, "question", str, name, qwhere)
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


def _squad_answer(ans: Any, context: str, name: str, where: str) -> QAAnswer:
    text = _get(ans, "text", str, name, where)
    start = _get(ans, "answer_start", int, name, where)
    if context[start : start + len(text)] != text:
        raise DataFormatError(
            f"{name}: {where}: answer_start {start} does not point at the answer text {text!r} in its context."
        )
    return QAAnswer(text, start)


def _squad_hub(hub: str, split: str) -> list[QAExample]:
    out: list[QAExample] = []
    for row in _hub_rows(hub, split):
        answers = row["answers"]
        gold = [QAAnswer(t, int(s)) for t, s in zip(answers["text"], answers["answer_start"])]
        out.append(QAExample(str(row["id"]), row.get("title", ""), row["question"], row["context"], gold))
    return out


# -- Hugging Face hub ----------------------------------------------------------------------


def _hub_rows(hub: str, split: str) -> Any:
    """A hub data set split (`name` or `name:config`), as loaded by `datasets`."""
    try:
        import datasets  # lazy: an optional dependency that needs a network
    except ImportError as e:
        raise DataSourceError(
            f"reading {hub!r} from the Hugging Face hub needs the `datasets` package "
            "(pip install datasets) and a network; offline, use the local copies "
            "(BERTLAB_DATA) or pass path= to your own files."
        ) from e
    name, _, config = hub.partition(":")
    try:
        return datasets.load_dataset(name, config or None, split=_HUB_SPLITS[split])
    except Exception as e:  # network, unknown name, missing split: all surface the same way
        raise DataSourceError(
            f"could not load {hub!r} (split {_HUB_SPLITS[split]!r}) from the Hugging Face hub: "
            f"{type(e).__name__}: {e}. Offline? Use the local copies (BERTLAB_DATA) or pass path=."
        ) from e


def _class_names(rows: Any, column: str) -> list[str] | None:
    """Names of a ClassLabel column (or a sequence of them), when the data set has them."""
    feature = (getattr(rows, "features", None) or {}).get(column)
    feature = getattr(feature, "feature", feature)  # Sequence(ClassLabel) -> ClassLabel
    names = getattr(feature, "names", None)
    return list(names) if names else None
