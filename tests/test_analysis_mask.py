"""Masked-word prediction: numbers against a manual softmax of the MLM logits (and against
transformers on a tiny checkpoint), batched mask-each-word against one word at a time, figures against results,
and clear errors for bad input. Random tiny weights: mechanics, not quality."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from bertlab.analysis.mask import (
    Candidate,
    MaskPrediction,
    WordScore,
    fill_mask,
    join_pieces,
    mask_each_word,
    text_words,
)
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.loading import load
from bertlab.model import MissingHeadError
from bertlab.tokenizer import Tokenizer
from bertlab.viz.mask import LOG10_FLOOR, TRUE_BAR, plot_fill_mask, plot_word_predictability

SENTENCE = "Tokenization makes the cat sat on the mat."  # "tokenization" -> token ##ization


@pytest.fixture(scope="module")
def mlm(minilm_folder):
    """A tiny random Bert with MLM + NSP heads over MiniLM's real 30k vocabulary: (model, tok).
    (The comparison with transformers uses the tiny checkpoints, below.)"""
    tok = Tokenizer.from_folder(minilm_folder, model_max_length=64)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, pretraining_heads=("mlm", "nsp"),
    )
    model = Bert(cfg).eval()
    with torch.no_grad():  # wide embeddings spread the guesses, so ranks have no near-ties
        model.bert.embeddings.word_embeddings.weight.normal_(std=1.0)
    return model, tok


def _probs(model, ids: list[int], types: list[int] | None = None) -> torch.Tensor:
    """Softmax of the full [seq, vocab] MLM logits, no mlm_positions: the manual reference."""
    types = types or [0] * len(ids)
    with torch.no_grad():
        out = model(torch.tensor([ids]), token_type_ids=torch.tensor([types]))
    return out.mlm_logits[0].softmax(dim=-1)  # [seq, vocab]


def _ordinary_ids(tok) -> torch.Tensor:
    """[vocab] bool, written independently: anything spelled [LIKE_THIS] is not a guess."""
    keep = torch.ones(tok.vocab_size, dtype=torch.bool)
    for token, i in tok.get_vocab().items():
        if token.startswith("[") and token.endswith("]") and len(token) > 2:
            keep[i] = False
    return keep


def _manual_rank(p: torch.Tensor, token_id: int, keep: torch.Tensor) -> int:
    return 1 + int(((p > p[token_id]) & keep).sum())


# ---------------------------------------------------------------------------------------------
# fill_mask
# ---------------------------------------------------------------------------------------------
def test_typed_masks_match_manual_softmax(mlm):
    model, tok = mlm
    preds = fill_mask(model, tok, "The cat [MASK] on the [mask].", k=5)  # any case of [mask] works
    enc = tok.encode("The cat [MASK] on the [MASK].")
    masks = [i for i, t in enumerate(enc.ids) if t == tok.mask_token_id]
    assert [p.position for p in preds] == masks and len(masks) == 2
    probs = _probs(model, enc.ids)
    keep = _ordinary_ids(tok)
    for pred in preds:
        p = probs[pred.position]
        expected = p.masked_fill(~keep, -1).topk(5)
        assert [c.token_id for c in pred.candidates] == expected.indices.tolist()
        assert [c.probability for c in pred.candidates] == pytest.approx(expected.values.tolist(), rel=1e-5)
        assert [c.token for c in pred.candidates] == tok.convert_ids_to_tokens(expected.indices.tolist())
        assert pred.original_token is None and pred.original_rank is None
        assert pred.tokens == enc.tokens and pred.warning is None
        assert pred.word_index == enc.word_ids[pred.position]


def test_special_tokens_never_guessed_but_count_in_the_softmax(mlm):
    model, tok = mlm
    boosted = copy.deepcopy(model)
    loud = [tok.cls_token_id, tok.unk_token_id, tok.token_to_id("[unused0]")]
    with torch.no_grad():
        boosted.cls.predictions.bias[loud] += 30.0  # these would win every position
    (pred,) = fill_mask(boosted, tok, "The cat sat on the [MASK].", k=5)
    assert not {c.token_id for c in pred.candidates} & set(loud)
    p = _probs(boosted, tok.encode("The cat sat on the [MASK].").ids)[pred.position]
    assert float(p[loud].sum()) > 0.99  # the softmax is over the whole vocabulary
    assert sum(c.probability for c in pred.candidates) < 0.01


def test_chosen_word_masks_first_piece_only(mlm):
    model, tok = mlm
    enc = tok.encode(SENTENCE)
    assert enc.tokens[1:3] == ["token", "##ization"]
    (pred,) = fill_mask(model, tok, SENTENCE, k=3, masked_words=[0])
    assert pred.position == 1 and pred.word_index == 0 and pred.piece == 0
    assert pred.tokens[1:3] == ["[MASK]", "##ization"]  # the rest of the word stays visible
    ids = list(enc.ids)
    ids[1] = tok.mask_token_id
    p = _probs(model, ids)[1]
    assert pred.original_token == "token" and pred.original_id == enc.ids[1]
    assert pred.original_probability == pytest.approx(float(p[enc.ids[1]]), rel=1e-5)
    assert pred.original_rank == _manual_rank(p, enc.ids[1], _ordinary_ids(tok))


def test_chosen_word_whole_word_masks_every_piece(mlm):
    model, tok = mlm
    enc = tok.encode(SENTENCE)
    preds = fill_mask(model, tok, SENTENCE, k=3, masked_words=[0, 3, 3], whole_word=True)  # repeats ignored
    assert [(p.position, p.word_index, p.piece) for p in preds] == [(1, 0, 0), (2, 0, 1), (5, 3, 0)]
    ids = list(enc.ids)
    for i in (1, 2, 5):
        ids[i] = tok.mask_token_id
    probs = _probs(model, ids)
    keep = _ordinary_ids(tok)
    for pred in preds:
        true_id = enc.ids[pred.position]
        assert pred.tokens[pred.position] == "[MASK]"
        assert pred.original_token == enc.tokens[pred.position]
        assert pred.original_probability == pytest.approx(float(probs[pred.position, true_id]), rel=1e-5)
        assert pred.original_rank == _manual_rank(probs[pred.position], true_id, keep)


def test_text_words_are_the_indices_fill_mask_uses(mlm):
    model, tok = mlm
    words = text_words(tok, "Don't [mask] the cat!")
    assert words == ["Don", "'", "t", "[MASK]", "the", "cat", "!"]
    (pred,) = fill_mask(model, tok, "Don't hug the cat!", masked_words=[5], k=1)
    assert pred.original_token == "cat" and pred.word_index == 5


def test_cjk_and_emoji_are_fine(mlm):
    model, tok = mlm
    preds = fill_mask(model, tok, "I love 京 😀 and [MASK].", k=2)
    assert len(preds) == 1 and len(preds[0].candidates) == 2
    scores = mask_each_word(model, tok, "I love 京 😀 .")
    assert [s.word for s in scores] == ["I", "love", "京", "😀", "."]
    # an [UNK] word is reported as unknown, not scored (the model cannot guess it back)
    assert scores[3].pieces == ["[UNK]"] and scores[3].skipped == "unknown" and scores[3].rank is None
    assert math.isnan(scores[3].probability) and not scores[3].correct
    assert all(s.scored for i, s in enumerate(scores) if i != 3)


def test_long_text_is_cut_with_the_tokenizers_warning(mlm, caplog):
    model, tok = mlm
    text = "The [MASK] sat. " + "word " * 100
    with caplog.at_level(logging.WARNING, logger="bertlab.tokenizer"):
        (pred,) = fill_mask(model, tok, text, k=2)
    assert pred.warning and "cut" in pred.warning
    assert pred.warning in caplog.text
    assert len(pred.tokens) == model.config.max_position_embeddings
    with pytest.raises(InputError, match="part of the text that was cut"):
        fill_mask(model, tok, "word " * 100 + "[MASK]")


@pytest.mark.parametrize(
    "text, kwargs, match",
    [
        ("", {}, "empty"),
        ("   \n", {}, "empty"),
        ("The cat sat on the mat.", {}, "nothing to guess"),
        ("[MASK]", {}, "only \\[MASK\\]s"),
        ("[MASK] [mask]", {}, "only \\[MASK\\]s"),
        ("cat", {"masked_words": [0]}, "only \\[MASK\\]s"),
        ("The cat sat.", {"masked_words": [4]}, "no word 4.*0 to 3"),
        ("The cat sat.", {"masked_words": [-1]}, "no word -1"),
        ("The cat sat.", {"masked_words": ["cat"]}, "by their index"),
        ("The [MASK] sat.", {"k": 0}, "1 or more"),
    ],
)
def test_bad_input_raises_a_clear_input_error(mlm, text, kwargs, match):
    model, tok = mlm
    with pytest.raises(InputError, match=match):
        fill_mask(model, tok, text, **kwargs)


def test_missing_mlm_head(bare_default):
    model, tok = bare_default  # MiniLM as its package ships it: encoder only
    with pytest.raises(MissingHeadError, match="no MLM head"):
        fill_mask(model, tok, "The [MASK] sat.")
    with pytest.raises(MissingHeadError, match="no MLM head"):
        mask_each_word(model, tok, "The cat sat.")


def test_tiny_checkpoint_masked_lm_matches_transformers(tiny_checkpoints):
    """The fixture checkpoint (1000-piece vocab, almost all [unusedN]): the same numbers as HF."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_checkpoints["BertForMaskedLM"]
    model, tok = load(folder)
    hf = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    typed, chosen = fill_mask(model, tok, "! [MASK] !", k=5, masked_words=[2])
    enc = tok.encode("! [MASK] !")
    ids = list(enc.ids)
    ids[3] = tok.mask_token_id
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0].softmax(-1)  # [seq, vocab]
    bang = tok.token_to_id("!")
    assert (typed.position, chosen.position) == (2, 3)
    for pred in (typed, chosen):
        assert [c.token for c in pred.candidates] == ["!"]  # the only ordinary piece in that vocab
        assert pred.candidates[0].probability == pytest.approx(float(ref[pred.position, bang]), rel=1e-4)
    assert chosen.original_probability == pytest.approx(float(ref[3, bang]), rel=1e-4)
    assert chosen.original_rank == 1


# ---------------------------------------------------------------------------------------------
# mask_each_word
# ---------------------------------------------------------------------------------------------
def test_mask_each_word_batched_equals_one_by_one(mlm):
    model, tok = mlm
    text = "Tokenization makes the unbelievable cat [MASK] on the mat."
    calls = []
    scores = mask_each_word(model, tok, text, batch_size=3, progress=lambda d, n: calls.append((d, n)))
    words = text_words(tok, text)
    assert [s.word_index for s in scores] == [i for i, w in enumerate(words) if w != "[MASK]"]
    assert [s.word for s in scores] == [w for w in words if w != "[MASK]"]
    assert calls[-1] == (len(scores), len(scores)) and len(calls) == math.ceil(len(scores) / 3)
    for s in scores:
        preds = fill_mask(model, tok, text, k=1, masked_words=[s.word_index], whole_word=True)
        mine = [p for p in preds if p.original_token is not None]  # the typed [MASK] is not scored
        assert s.pieces == [p.original_token for p in mine]
        assert s.piece_probabilities == pytest.approx([p.original_probability for p in mine], rel=1e-4)
        assert s.piece_ranks == [p.original_rank for p in mine]
        assert s.guess_pieces == [p.top.token for p in mine]
        assert s.probability == pytest.approx(math.prod(p.original_probability for p in mine), rel=1e-4)
    single = mask_each_word(model, tok, text, batch_size=1)
    assert [s.piece_ranks for s in single] == [s.piece_ranks for s in scores]
    assert [s.log_probability for s in single] == pytest.approx([s.log_probability for s in scores], abs=1e-4)


def test_mask_each_word_multi_piece_word(mlm):
    model, tok = mlm
    scores = mask_each_word(model, tok, SENTENCE)
    first = scores[0]
    assert first.word == "Tokenization" and first.pieces == ["token", "##ization"]
    assert first.log_probability == pytest.approx(sum(math.log(p) for p in first.piece_probabilities))
    assert first.rank == max(first.piece_ranks)
    assert first.correct == (first.rank == 1) or "[UNK]" in first.pieces


def test_mask_each_word_bad_input(mlm):
    model, tok = mlm
    for text, match in [("", "empty"), ("[MASK] [MASK]", "only \\[MASK\\]s"), ("cat", "single word"),
                        ("cat [MASK]", "single word")]:
        with pytest.raises(InputError, match=match):
            mask_each_word(model, tok, text)
    with pytest.raises(InputError, match="batch_size"):
        mask_each_word(model, tok, "The cat sat.", batch_size=0)


def test_join_pieces():
    assert join_pieces(["play", "##ing"]) == "playing"
    assert join_pieces(["##ing"]) == "##ing"
    assert join_pieces([]) == ""


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def _pred(position: int, original: int | None) -> MaskPrediction:
    cands = [Candidate("cat", 10, 0.5), Candidate("dog", 11, 0.3), Candidate("fox", 12, 0.1)]
    return MaskPrediction(
        position=position, word_index=position - 1, candidates=cands, tokens=["[CLS]", "[MASK]", "[SEP]"],
        original_token=None if original is None else "dog", original_id=original,
        original_probability=None if original is None else 0.3, original_rank=None if original is None else 2,
    )


def test_fill_mask_figure_matches_predictions(mlm):
    preds = [_pred(1, None), _pred(2, 11)]
    fig = plot_fill_mask(preds)
    assert len(fig.data) == 2
    for trace, pred in zip(fig.data, preds):
        assert list(trace.x) == [c.probability for c in pred.candidates]
        assert list(trace.y) == [c.token for c in pred.candidates]
    assert TRUE_BAR not in fig.data[0].marker.color
    assert list(fig.data[1].marker.color).index(TRUE_BAR) == 1  # "dog" was really there
    titles = [a.text for a in fig.layout.annotations]
    assert "rank 2" in titles[1] and "30.0%" in titles[1]
    model, tok = mlm
    real = fill_mask(model, tok, "The [MASK] sat on the [MASK].", k=4)
    fig = plot_fill_mask(real)
    assert [list(t.x) for t in fig.data] == [[c.probability for c in p.candidates] for p in real]
    assert plot_fill_mask([]).layout.annotations[0].text.startswith("Put [MASK]")


def _score(i: int, word: str, p: float) -> WordScore:
    return WordScore(i, word, [word], [p], [i + 1], ["x"], math.log(p))


def test_heat_strip_matches_scores():
    scores = [_score(i, w, p) for i, (w, p) in enumerate(zip("abcde", [0.9, 0.5, 1e-9, 0.01, 0.2]))]
    fig = plot_word_predictability(scores, per_row=2)
    z, text = fig.data[0].z, fig.data[0].text
    assert [list(r) for r in text] == [["a", "b"], ["c", "d"], ["e", ""]]
    assert [v for row in z for v in row if v is not None] == pytest.approx([0.9, 0.5, 1e-9, 0.01, 0.2])
    assert z[2][1] is None
    assert fig.data[0].customdata[1][1][1] == "4"  # rank of "d"
    logz = plot_word_predictability(scores, per_row=5, scale="log10").data[0].z[0]
    assert list(logz) == pytest.approx([math.log10(0.9), math.log10(0.5), LOG10_FLOOR, -2.0, math.log10(0.2)])
    with pytest.raises(ValueError, match="scale"):
        plot_word_predictability(scores, scale="linear")
    assert plot_word_predictability([]).layout.annotations


# -- the ordinary-token mask: built once per tokenizer -------------------------------------------
def test_ordinary_tokens_are_read_off_the_vocabulary_once_per_tokenizer(minilm_folder, mlm, monkeypatch):
    """fill_mask used to rebuild the set of guessable tokens from get_vocab() on every call (most of its
    time on a small model); now once per tokenizer, with the same mask."""
    import gc
    import re

    from bertlab.analysis import mask as mask_module

    model, _ = mlm
    tok = Tokenizer.from_folder(minilm_folder, model_max_length=64)  # fresh: nothing cached yet
    vocab = tok.get_vocab()
    calls = []
    monkeypatch.setattr(tok, "get_vocab", lambda: calls.append(1) or dict(vocab))
    for text in ("The cat sat on the [MASK].", "A [MASK] day.", "The cat sat on the [MASK]."):
        fill_mask(model, tok, text, k=3)
    mask_each_word(model, tok, "The cat sat on the mat.")
    assert len(calls) == 1
    ordinary = mask_module._ordinary(tok, model.config.vocab_size, torch.device("cpu"))
    assert mask_module._ordinary(tok, model.config.vocab_size, torch.device("cpu")) is ordinary
    # the same mask as before: every bracketed token ([PAD], [unused0..993], [UNK], [CLS], [SEP], [MASK])
    # is out, every other token in; in bert-base-uncased's vocabulary those are exactly ids 0..998
    bracketed = {i for t, i in vocab.items() if re.fullmatch(r"\[[A-Za-z0-9_]+\]", t)}
    assert bracketed == set(range(999))
    assert not ordinary[:999].any() and ordinary[999:].all() and ordinary.shape == (len(vocab),)
    # ids past the tokenizer's vocabulary (a padded embedding matrix) are never offered
    wider = mask_module._ordinary(tok, len(vocab) + 6, torch.device("cpu"))
    assert torch.equal(wider[: len(vocab)], ordinary) and not wider[len(vocab):].any()
    assert len(calls) == 1
    # the cache goes with its tokenizer
    monkeypatch.undo()
    held = len(mask_module._ORDINARY)
    del tok
    gc.collect()
    assert len(mask_module._ORDINARY) == held - 1
