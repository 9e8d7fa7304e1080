"""The sentences a probe reads: words with tags per property, and dependency heads.

Two formats, read without the fine-tuning readers (which keep only the NER column):
- CoNLL-2003 (`word POS chunk NER` a line, blank lines between sentences, `-DOCSTART-` lines skipped):
  properties "pos", "chunk", "ner";
- CoNLL-U (Universal Dependencies, e.g. the EWT dev file): "upos", "deprel" and the tree ("tree");
  multiword-token lines (`3-4`) and empty nodes (`5.1`) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bertlab.tasks.readers import DataFormatError, display_path

PROPERTIES = ("pos", "chunk", "ner", "upos", "deprel", "tree")
CONLL_COLUMNS = {"pos": 1, "chunk": 2, "ner": 3}
UD_PROPERTIES = ("upos", "deprel", "tree")
EVAL_EVERY = 5  # a file split by sentence: every 5th sentence (index % 5 == 4) is for evaluation


@dataclass
class TaggedSentence:
    """One sentence as words, with one tag per word for each property it has; `heads` (UD): the index of
    each word's head, -1 for the root."""

    words: list[str]
    tags: dict[str, list[str]] = field(default_factory=dict)
    heads: list[int] | None = None


def read_conll2003(path: str | Path) -> list[TaggedSentence]:
    """CoNLL-2003 sentences with "pos", "chunk" and "ner" tags."""
    path = Path(path)
    out: list[TaggedSentence] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            tags = {k: [r[c] for r in rows] for k, c in CONLL_COLUMNS.items()}
            out.append(TaggedSentence([r[0] for r in rows], tags))
            rows.clear()

    for n, line in _lines(path):
        if not line.strip():
            flush()
            continue
        fields = line.split()
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if len(fields) != 4:
            raise DataFormatError(f"{display_path(path)} line {n}: expected 4 columns (word POS chunk NER), "
                                  f"got {len(fields)}. Is it a CoNLL-2003 file?")
        rows.append(fields)
    flush()
    return _nonempty(out, path)


def read_conllu(path: str | Path) -> list[TaggedSentence]:
    """CoNLL-U sentences with "upos" and "deprel" tags and their heads."""
    path = Path(path)
    out: list[TaggedSentence] = []
    rows: list[tuple[int, list[str]]] = []

    def flush() -> None:
        if not rows:
            return
        words = [f[1] for _, f in rows]
        heads = []
        for n, f in rows:
            if not f[6].isdigit() or int(f[6]) > len(rows):
                raise DataFormatError(f"{display_path(path)} line {n}: the head (7th column) must be a word number "
                                      f"of the sentence (0 = root).")
            heads.append(int(f[6]) - 1)
        out.append(TaggedSentence(words, {"upos": [f[3] for _, f in rows], "deprel": [f[7].split(":")[0]
                                                                                      for _, f in rows]}, heads))
        rows.clear()

    for n, line in _lines(path):
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise DataFormatError(f"{display_path(path)} line {n}: expected 10 tab-separated columns, got "
                                  f"{len(fields)}. Is it a CoNLL-U file?")
        if not fields[0].isdigit():  # a multiword token (3-4) or an empty node (5.1)
            continue
        rows.append((n, fields))
    flush()
    return _nonempty(out, path)


def read_for(prop: str, path: str | Path) -> list[TaggedSentence]:
    """The sentences of `path` in the format `prop` needs (CoNLL-2003 or CoNLL-U)."""
    if prop not in PROPERTIES:
        raise ValueError(f"property {prop!r} is not one of {', '.join(PROPERTIES)}.")
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file: give a {'CoNLL-U' if prop in UD_PROPERTIES else 'CoNLL-2003'}"
                                f" file for {prop}.")
    return read_conllu(path) if prop in UD_PROPERTIES else read_conll2003(path)


def split_sentences(sentences: Sequence[TaggedSentence], every: int = EVAL_EVERY
                    ) -> tuple[list[TaggedSentence], list[TaggedSentence]]:
    """(train, eval) of one file split by sentence: every `every`-th sentence is for evaluation."""
    train = [s for i, s in enumerate(sentences) if i % every != every - 1]
    return train, [s for i, s in enumerate(sentences) if i % every == every - 1]


def _lines(path: Path):
    with path.open(encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            yield n, line.rstrip("\n").rstrip("\r")


def _nonempty(out: list[TaggedSentence], path: Path) -> list[TaggedSentence]:
    if not out:
        raise DataFormatError(f"{display_path(path)} holds no sentences.")
    return out
