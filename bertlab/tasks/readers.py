"""Readers for the fine-tuning data sets: SST-2, SICK (entailment and relatedness) and CoNLL-2003
(SQuAD v1.1: squad.py), and the example types and helpers all readers share.

Each reader takes a split ("train", "dev", "test", or "all": every example of the data) and
one of three sources: the local copies under `bertlab.settings.data_dir()` (the default); your
own file or folder in the same format (`path=`: a file is read whole for SST-2 and CoNLL, for
SICK the split picks the part, for SQuAD the article split); or a Hugging Face hub data set
(`hub="name"` or `hub="name:config"`, needs the `datasets` package and a network).

Malformed files raise `DataFormatError` naming the file and the line (or, for JSON, the place
inside it). The messages never quote the file's content: a path may point at any file the
reader can open, and an error must not show what is in it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from bertlab.settings import DataNotFoundError, data_dir, data_path

log = logging.getLogger(__name__)

SST2_LABELS: dict[int, str] = {0: "negative", 1: "positive"}
NLI_LABELS: dict[int, str] = {0: "entailment", 1: "neutral", 2: "contradiction"}
# The order of the hub's conll2003 `ner_tags`, so that ids agree with models trained there.
CONLL_LABELS: dict[int, str] = dict(
    enumerate(("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"))
)
SPLITS = ("train", "dev", "test", "all")  # "all": every example of a file (or of every file of a folder)
_HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


class DataFormatError(ValueError):
    """A data file that does not follow its format; the message names the file and line."""


class NoPartsError(DataFormatError):
    """A file asked for one of its parts (e.g. SICK's TRAIN) that has no parts: read it whole (split "all")."""


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
class ScoredExample:
    """A sentence pair with a number to predict (regression), e.g. SICK's relatedness 1-5."""

    guid: str
    text_a: str
    text_b: str | None
    score: float


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


def display_path(path: Path) -> str:
    """The path as a student would look for it: relative to BERTLAB_DATA when inside it."""
    try:
        return str(path.resolve().relative_to(data_dir().resolve()))
    except ValueError:
        return str(path)


def check_split(split: str, allowed: Sequence[str], hub: str | None = None) -> None:
    """A ValueError for a split the reader does not know ("all" is for local files only)."""
    if hub is not None and split == "all":
        raise ValueError("split 'all' is for local files; the hub has its own train/dev/test splits.")
    if split not in allowed:
        raise ValueError(f"split {split!r} is not one of {tuple(allowed)}.")


def _split_files(path: str | Path | None, folder: str, split: str, suffix: str) -> list[Path]:
    """The files of `split` (a file given as `path` is read whole, whatever the split): in a
    folder `<split><suffix>`, or for "all" every one of train/dev/test that is there."""
    if split != "all":
        return resolve_files(path, folder, f"{split}{suffix}")[:1]
    base = data_path(folder) if path is None else Path(path).expanduser()
    if base.is_file():
        return [base]
    found = [base / f"{s}{suffix}" for s in ("train", "dev", "test") if (base / f"{s}{suffix}").is_file()]
    return found or resolve_files(path, folder, f"train{suffix}")  # the error names what is missing


def _check_classes(examples: Sequence[ClassificationExample], labels: dict[int, str], name: str) -> None:
    """A classification file must hold at least two classes (one class gives nothing to learn or to tell apart)."""
    found = {e.label for e in examples}
    if len(found) == 1:
        (only,) = found
        raise DataFormatError(
            f"{name}: all {len(examples)} examples are labelled {labels[only]}: a classifier needs at least two "
            f"classes ({', '.join(labels.values())}). Check the label column, or add examples of the other classes."
        )


def resolve_files(path: str | Path | None, folder: str, pattern: str) -> list[Path]:
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
                    f"{display_path(path)} line {n}: not UTF-8 text ({e.reason}); save the file as UTF-8."
                ) from None
            yield n, line.rstrip("\r\n")


# -- SST-2 ---------------------------------------------------------------------------------


def read_sst2(
    split: str = "train", path: str | Path | None = None, hub: str | None = None
) -> list[ClassificationExample]:
    """SST-2 sentences with labels 0 = negative, 1 = positive, from `sentence<TAB>label`
    TSV (an optional header line) or the hub (e.g. hub="stanfordnlp/sst2"). A file must hold
    both labels and no empty sentence."""
    check_split(split, SPLITS, hub)
    if hub is not None:
        return [_sst2_row(row, i, hub) for i, row in enumerate(hub_rows(hub, split))]
    out: list[ClassificationExample] = []
    for file in _split_files(path, "sst2", split, ".tsv"):
        out.extend(_read_sst2_file(file, split, start=len(out)))
    return out


def _read_sst2_file(file: Path, split: str, start: int = 0) -> list[ClassificationExample]:
    name = display_path(file)
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
            raise DataFormatError(f"{name} line {n}: the label (the 2nd field) must be 0 or 1.")
        if not text:
            raise DataFormatError(f"{name} line {n}: the sentence (the 1st field) is empty.")
        out.append(ClassificationExample(f"{split}-{start + len(out)}", text, None, int(label)))
    _check_classes(out, SST2_LABELS, name)
    log.info("read %d SST-2 sentences from %s", len(out), name)
    return out


def _sst2_row(row: dict, i: int, hub: str) -> ClassificationExample:
    label = row.get("label")
    if label not in (0, 1):
        raise DataFormatError(f"hub {hub} row {i}: label must be 0 or 1, got {label!r} (the test split has no labels).")
    return ClassificationExample(str(row.get("idx", i)), row["sentence"].strip(), None, int(label))


# -- SICK (NLI and relatedness) -----------------------------------------------------------

_SICK_PARTS = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}
_SICK_PART_COLUMN = "SemEval_set"
_SICK_COLUMNS = ("pair_ID", "sentence_A", "sentence_B", "entailment_label")
_SICK_SCORE_COLUMNS = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score")
SICK_SCORE_RANGE = (1.0, 5.0)  # SICK's relatedness_score: 1 = unrelated ... 5 = the same meaning


def read_sick(
    split: str = "train", path: str | Path | None = None, hub: str | None = None
) -> list[ClassificationExample]:
    """SICK sentence pairs (A = premise, B = hypothesis) with NLI_LABELS ids. Local files are
    the SICK TSV with a header; split "train" is the TRAIN part, "dev" TRIAL, "test" TEST (of
    the SemEval_set column) and "all" every pair (a file without that column is read whole
    this way). From the hub, columns sentence_A/sentence_B or premise/hypothesis are read."""
    check_split(split, (*_SICK_PARTS, "all"), hub)
    if hub is not None:
        return _nli_hub(hub, split)
    return _read_sick(path, split, _SICK_COLUMNS, _entailment_example, "pairs")


def read_sick_relatedness(
    split: str = "train", path: str | Path | None = None, hub: str | None = None
) -> list[ScoredExample]:
    """SICK sentence pairs with their relatedness_score (1-5, the mean of ten people's ratings), from the
    same files and parts as `read_sick` (TRAIN = "train", TRIAL = "dev", TEST = "test", "all"). From the
    hub, columns sentence_A, sentence_B and relatedness_score are read."""
    check_split(split, (*_SICK_PARTS, "all"), hub)
    if hub is not None:
        return _relatedness_hub(hub, split)
    return _read_sick(path, split, _SICK_SCORE_COLUMNS, _relatedness_example, "scored pairs")


def _read_sick(path: str | Path | None, split: str, columns: Sequence[str], make: Any, what: str) -> list[Any]:
    out: list[Any] = []
    for file in resolve_files(path, "sick", "SICK*.txt"):
        out.extend(_read_sick_file(file, split, columns, make))
    part = "every part" if split == "all" else f"the {_SICK_PARTS[split]} part"
    if not out:
        log.warning("no SICK %s in %s (%s)", what, part, split)
    log.info("read %d SICK %s (%s)", len(out), what, part)
    return out


def _entailment_example(guid: str, a: str, b: str, fields: Sequence[str], col: dict[str, int], where: str
                        ) -> ClassificationExample:
    label_ids = {v.upper(): k for k, v in NLI_LABELS.items()}
    label = fields[col["entailment_label"]].strip().upper()
    if label not in label_ids:
        raise DataFormatError(f"{where}: entailment_label must be one of {', '.join(label_ids)}.")
    return ClassificationExample(guid, a, b, label_ids[label])


def _relatedness_example(guid: str, a: str, b: str, fields: Sequence[str], col: dict[str, int], where: str
                         ) -> ScoredExample:
    low, high = SICK_SCORE_RANGE
    try:
        score = float(fields[col["relatedness_score"]])
    except ValueError:
        raise DataFormatError(f"{where}: relatedness_score must be a number from {low:g} to {high:g}.") from None
    if not low <= score <= high:
        raise DataFormatError(f"{where}: relatedness_score {score:g} is outside {low:g}-{high:g}.")
    return ScoredExample(guid, a, b, score)


def _read_sick_file(file: Path, split: str, columns: Sequence[str] = _SICK_COLUMNS,
                    make: Any = _entailment_example) -> list[Any]:
    """The pairs of `split` in one SICK file, made by `make`; the whole file is checked (fields, labels, classes)."""
    name = display_path(file)
    lines = _lines(file)
    header = next(lines, (1, ""))[1].split("\t")
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataFormatError(
            f"{name} line 1: the header lacks the column(s) {', '.join(missing)}; a SICK file starts with a "
            f"tab-separated header naming {', '.join(columns)} and {_SICK_PART_COLUMN}."
        )
    if split != "all" and _SICK_PART_COLUMN not in header:
        raise NoPartsError(
            f"{name} line 1: there is no {_SICK_PART_COLUMN} column, so the file has no TRAIN/TRIAL/TEST parts: "
            f"read it whole (split 'all', bertlab evaluate --split all)."
        )
    col = {c: header.index(c) for c in (*columns, _SICK_PART_COLUMN) if c in header}
    every: list[Any] = []
    keep: list[Any] = []
    for n, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataFormatError(
                f"{name} line {n}: expected {len(header)} tab-separated fields like the header, got {len(fields)}."
            )
        a, b = fields[col["sentence_A"]].strip(), fields[col["sentence_B"]].strip()
        example = make(fields[col["pair_ID"]].strip(), a, b, fields, col, f"{name} line {n}")
        for column, text in (("sentence_A", a), ("sentence_B", b)):
            if not text:
                raise DataFormatError(f"{name} line {n}: {column} is empty.")
        every.append(example)
        if split == "all" or fields[col[_SICK_PART_COLUMN]].strip().upper() == _SICK_PARTS[split]:
            keep.append(example)
    if make is _entailment_example:
        _check_classes(every, NLI_LABELS, name)
    return keep


def _relatedness_hub(hub: str, split: str) -> list[ScoredExample]:
    out: list[ScoredExample] = []
    for i, row in enumerate(hub_rows(hub, split)):
        a, b, score = row.get("sentence_A"), row.get("sentence_B"), row.get("relatedness_score")
        if a is None or b is None or score is None:
            raise DataFormatError(
                f"hub {hub} row {i}: expected columns sentence_A, sentence_B and relatedness_score, got {sorted(row)}."
            )
        out.append(ScoredExample(str(row.get("pair_ID", row.get("id", i))), a, b, float(score)))
    return out


def _nli_hub(hub: str, split: str) -> list[ClassificationExample]:
    rows = hub_rows(hub, split)
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
    check_split(split, SPLITS, hub)
    if hub is not None:
        return _conll_hub(hub, split)
    out: list[TokenExample] = []
    for file in _split_files(path, "conll2003", split, ".txt"):
        out.extend(_read_conll_file(file, split, start=len(out)))
    return out


def _read_conll_file(file: Path, split: str, start: int = 0) -> list[TokenExample]:
    name = display_path(file)
    out: list[TokenExample] = []
    words: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if words:
            out.append(TokenExample(f"{split}-{start + len(out)}", list(words), list(tags)))
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
            raise DataFormatError(f"{name} line {n}: the last field is not a tag like O, B-PER or I-LOC.")
        words.append(fields[0])
        tags.append(fields[-1])
    flush()
    log.info("read %d CoNLL sentences from %s", len(out), name)
    return out


def _conll_hub(hub: str, split: str) -> list[TokenExample]:
    rows = hub_rows(hub, split)
    names = _class_names(rows, "ner_tags") or [CONLL_LABELS[i] for i in range(len(CONLL_LABELS))]
    out: list[TokenExample] = []
    for i, row in enumerate(rows):
        words, tags = list(row["tokens"]), [names[t] if isinstance(t, int) else t for t in row["ner_tags"]]
        if len(words) != len(tags):
            raise DataFormatError(f"hub {hub} row {i}: {len(words)} tokens but {len(tags)} tags.")
        if words and words[0] != "-DOCSTART-":
            out.append(TokenExample(str(row.get("id", i)), words, tags))
    return out


# -- Hugging Face hub ----------------------------------------------------------------------


def hub_rows(hub: str, split: str) -> Any:
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
