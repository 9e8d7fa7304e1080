"""Tokenizer ids, segment ids, offsets and word ids equal transformers' BertTokenizerFast."""

from __future__ import annotations

import logging

import pytest

from bertlab.tokenizer import Tokenizer, TokenizerError

TEXTS = [
    "The man went to the store.",
    "Café déjà vu: naïve résumé, Ångström and façade!",
    "东京是日本的首都。北京大学成立于1898年。",
    "I love it 😍🔥 — really 👍🏽!",
    "See https://example.org/path?q=bert&lang=en or mail me@example.com.",
    "unbelievable unaffordable tokenization of ##hash and [MASK] tokens",
    "   leading spaces,\ttabs\nand newlines   ",
    "Привет, мир! مرحبا بالعالم",
]
PAIRS = [("How old is the university?", "北京大学成立于1898年。"), ("A dog runs.", "")]
LONG = " ".join(["The quick brown fox jumps over the lazy dog near the riverbank."] * 60)  # ~780 tokens


@pytest.fixture(scope="module")
def both(minilm_folder):
    from transformers import BertTokenizerFast

    return Tokenizer.from_folder(minilm_folder), BertTokenizerFast.from_pretrained(minilm_folder)


def _hf(hf, a, b=None, **kw):
    return hf(a, b, return_offsets_mapping=True, return_token_type_ids=True, **kw)


@pytest.mark.parametrize("text", TEXTS)
def test_single_sentences_equal_hf(both, text):
    ours, hf = both
    e, r = ours.encode(text), _hf(hf, text)
    assert e.ids == r["input_ids"]
    assert e.type_ids == r["token_type_ids"]
    assert e.offsets == [tuple(o) for o in r["offset_mapping"]]
    assert e.word_ids == r.word_ids()
    assert not e.truncated and e.warning is None


@pytest.mark.parametrize("a,b", PAIRS)
def test_pairs_equal_hf(both, a, b):
    ours, hf = both
    e, r = ours.encode(a, b), _hf(hf, a, b)
    assert e.ids == r["input_ids"]
    assert e.type_ids == r["token_type_ids"]
    assert e.offsets == [tuple(o) for o in r["offset_mapping"]]
    assert e.sequence_ids == r.sequence_ids()
    assert e.type_ids[: e.ids.index(ours.sep_token_id) + 1] == [0] * (e.ids.index(ours.sep_token_id) + 1)


def test_long_text_is_cut_with_a_warning_like_hf_truncation(both, caplog):
    ours, hf = both
    with caplog.at_level(logging.WARNING):
        e = ours.encode(LONG)
    r = _hf(hf, LONG, truncation=True, max_length=512)
    assert len(e) == 512 and e.ids == r["input_ids"]
    assert e.truncated and "cut" in e.warning and "512" in e.warning
    assert any("cut" in rec.message for rec in caplog.records)
    pair = ours.encode(LONG, "a short second sentence")
    rp = _hf(hf, LONG, "a short second sentence", truncation="longest_first", max_length=512)
    assert pair.ids == rp["input_ids"] and pair.type_ids == rp["token_type_ids"]


def test_no_padding_surprise(both):
    ours, _ = both  # MiniLM's tokenizer.json turns on padding to 128: it must be off
    assert len(ours.encode("hi")) == 3
    batch = ours.encode_batch(["hi", "a longer sentence here"])
    assert batch.input_ids.shape == (2, 6)
    assert batch.attention_mask.tolist()[0] == [1, 1, 1, 0, 0, 0]


def test_vocab_txt_only_folder_equals_hf(tmp_path, minilm_folder):
    from transformers import BertTokenizerFast

    (tmp_path / "vocab.txt").write_text((minilm_folder / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
    ours = Tokenizer.from_folder(tmp_path)
    hf = BertTokenizerFast.from_pretrained(tmp_path)
    for text in TEXTS:
        e, r = ours.encode(text), _hf(hf, text)
        assert e.ids == r["input_ids"] and e.offsets == [tuple(o) for o in r["offset_mapping"]]


def test_word_spans_group_wordpieces(both):
    ours, _ = both
    e = ours.encode("unaffordable tea", "ok")
    spans = e.word_spans()
    pieces = [e.tokens[s:t] for _, s, t in spans]
    assert pieces[0] == ours.tokenize("unaffordable") and len(pieces[0]) > 1
    assert [sid for sid, _, _ in spans] == [0, 0, 1]


def test_save_round_trip_and_errors(tmp_path, both):
    ours, _ = both
    ours.save(tmp_path)
    again = Tokenizer.from_folder(tmp_path)
    assert again.encode(TEXTS[1]).ids == ours.encode(TEXTS[1]).ids
    with pytest.raises(TokenizerError, match="neither tokenizer.json nor vocab.txt"):
        Tokenizer.from_folder(tmp_path / "nothing")
    with pytest.raises(TokenizerError, match="takes text"):
        ours.encode(None)  # type: ignore[arg-type]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="special tokens"):
        Tokenizer.from_folder(tmp_path / "bad")
