"""bertlab's Tokenizer reads byte-level BPE (RoBERTa) and Unigram (ALBERT) tokenizer.json files and
equals the Hugging Face fast tokenizers: ids, tokens, special tokens, segment ids, word ids, offsets,
on accents, CJK, emoji, URLs and a 600-token text. The tokenizers are trained here with `tokenizers`
(no real family tokenizer installs offline)."""

from __future__ import annotations

import pytest
from tiny_models import CORPUS
from tiny_models import byte_level_bpe as _byte_level_bpe
from tiny_models import unigram as _unigram

import bertlab.families  # noqa: F401  (the family modules register their tokenizer pipelines)
from bertlab.tokenizer import Tokenizer

TEXTS = [
    "Hello world!",
    "Crème brûlée à la française — déjà vu.",
    "自然语言处理很有趣 and mixed with English.",
    "I ❤️ transformers 🤖🚀 (really).",
    "Visit https://huggingface.co/roberta-base or mail me@example.com.",
    "  spaces   everywhere\tand\ttabs  ",
    "unseenwordsxyz qwv zzz",
]
PAIRS = [("Where is the fox?", "It jumps over the dog."), ("東京", "Tokyo 🇯🇵")]
LONG = " ".join(CORPUS[:8] * 12)  # well over 600 tokens


def _hf():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module", params=["bpe", "bpe-prefix-space", "unigram"])
def pair_of_tokenizers(request, tmp_path_factory):
    """(kind, HF tokenizer read back from its folder, bertlab's from the same folder, specials, folder).
    bpe-prefix-space: the config says add_prefix_space, which the file's pre-tokenizer does not."""
    if request.param == "unigram":
        hf, specials = _unigram()
    else:
        hf, specials = _byte_level_bpe(add_prefix_space=request.param == "bpe-prefix-space")
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    hf = _hf().AutoTokenizer.from_pretrained(folder)  # as a student's folder is read
    return request.param, hf, Tokenizer.from_folder(folder), specials, folder


def _same(ours, hf_enc, tag):
    assert ours.ids == hf_enc["input_ids"], tag
    assert ours.tokens == hf_enc.tokens(), tag
    assert [tuple(o) for o in ours.offsets] == [tuple(o) for o in hf_enc["offset_mapping"]], tag
    assert ours.word_ids == hf_enc.word_ids(), tag
    assert ours.sequence_ids == hf_enc.sequence_ids(), tag
    if "token_type_ids" in hf_enc:
        assert ours.type_ids == hf_enc["token_type_ids"], tag


def test_special_tokens_are_read_from_the_folder(pair_of_tokenizers):
    kind, hf, ours, specials, _ = pair_of_tokenizers
    assert ours.special_tokens == specials
    assert ours.mask_token == hf.mask_token and ours.mask_token_id == hf.mask_token_id
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.unk_token_id) == (
        hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.unk_token_id)
    assert ours.vocab_size == len(hf)
    assert ours.is_wordpiece is False


@pytest.mark.parametrize("text", TEXTS)
def test_single_texts_equal_hf(pair_of_tokenizers, text):
    kind, hf, ours, _, _ = pair_of_tokenizers
    _same(ours.encode(text), hf(text, return_offsets_mapping=True), (kind, text))


@pytest.mark.parametrize("a,b", PAIRS)
def test_pairs_equal_hf(pair_of_tokenizers, a, b):
    kind, hf, ours, _, _ = pair_of_tokenizers
    _same(ours.encode(a, b), hf(a, b, return_offsets_mapping=True), (kind, a, b))


def test_mask_token_in_text(pair_of_tokenizers):
    kind, hf, ours, _, _ = pair_of_tokenizers
    text = f"The capital of France is {ours.mask_token}."
    enc = ours.encode(text)
    assert enc.ids == hf(text)["input_ids"]
    assert enc.ids.count(ours.mask_token_id) == 1


def test_600_tokens_and_truncation(pair_of_tokenizers):
    kind, hf, ours, _, _ = pair_of_tokenizers
    full = hf(LONG, return_offsets_mapping=True)
    assert len(full["input_ids"]) > 600
    _same(ours.encode(LONG, max_length=10_000), full, (kind, "long"))
    cut = ours.encode(LONG, max_length=512)
    ref = hf(LONG, truncation=True, max_length=512, return_offsets_mapping=True)
    assert cut.truncated and len(cut) == 512
    _same(cut, ref, (kind, "cut"))


def test_save_round_trip_reads_back_in_hf(pair_of_tokenizers, tmp_path):
    kind, hf, ours, specials, _ = pair_of_tokenizers
    ours.save(tmp_path)
    again = Tokenizer.from_folder(tmp_path)
    assert again.special_tokens == specials
    assert not (tmp_path / "vocab.txt").exists()  # a WordPiece-only file
    back = _hf().AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS[:4]:
        assert back(text)["input_ids"] == ours.encode(text).ids == again.encode(text).ids
    assert back.mask_token == ours.mask_token


def test_checkpoint_loads_with_its_tokenizer(pair_of_tokenizers, tmp_path):
    """load() gives a RoBERTa (byte-level BPE) or ALBERT (Unigram) model with its tokenizer; mask
    predictions equal transformers end to end."""
    import torch

    from bertlab.loading import load

    kind, hf, ours, specials, folder = pair_of_tokenizers
    T = _hf()
    torch.manual_seed(0)
    size = dict(vocab_size=len(hf), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=80)
    if kind == "unigram":
        arch, cfg, offset = "AlbertForMaskedLM", T.AlbertConfig(**size, embedding_size=16), 0
    else:
        arch, cfg, offset = "RobertaForMaskedLM", T.RobertaConfig(**size, type_vocab_size=1), 2
    getattr(T, arch)(cfg).save_pretrained(tmp_path / "m")
    hf.save_pretrained(tmp_path / "m")
    model, tok = load(tmp_path / "m")
    assert model.family.special_tokens(tok)["mask"] == (specials["mask"], hf.mask_token_id)
    assert tok.model_max_length == 80 - offset  # RoBERTa's positions start after padding_idx
    enc = tok.encode(f"Hello {tok.mask_token} world", "and a second sentence")
    ids, types = torch.tensor([enc.ids]), torch.tensor([enc.type_ids])
    assert enc.ids == hf("Hello " + tok.mask_token + " world", "and a second sentence")["input_ids"]
    with torch.no_grad():
        out = model(ids, types, torch.ones_like(ids))
        ref = getattr(T, arch).from_pretrained(tmp_path / "m").eval()(input_ids=ids, token_type_ids=types).logits
    assert float((out.mlm_logits - ref).abs().max()) <= 1e-5
