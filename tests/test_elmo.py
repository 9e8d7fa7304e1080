"""The `elmo` objective: a forward and a backward causal BERT trained together. Its folder holds two models
transformers loads (BertLMHeadModel) with equal logits; the forward half of a token's feature never reads a later
token and the backward half never an earlier one (shallow bidirectionality); the middle-word guess reads neither
the word itself; a few steps lower the loss; bad input is refused in words."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tiny_models import _transformers, word_tokenizer

from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import Document
from bertlab.training.loop import train
from bertlab.training.objectives import ModelShape, ObjectiveError, get_objective
from bertlab.training.objectives.causal import NextTokenBatch
from bertlab.training.objectives.elmo import (
    BACKWARD_FOLDER,
    ELMO_FILE,
    ElmoPair,
    elmo_features,
    guess_middle_word,
    load_elmo,
    middle_word_log_probs,
    reverse_rows,
    reversed_batch,
)
from bertlab.training.pretrain import ObjectiveRun, PretrainConfig

WORDS = ["cat", "dog", "bird", "mat", "sofa", "tree", "red", "blue", "the", "sat", "on", "was", "happy", "a"]
SHAPE = ModelShape(layers=2, hidden=32, heads=2, max_len=64)
TOL = 1e-5


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return word_tokenizer(tmp_path_factory.mktemp("words"), WORDS)


@pytest.fixture(scope="module")
def documents() -> list[Document]:
    rng = random.Random(0)
    return [Document([f"the {rng.choice(WORDS[:6])} sat on the {rng.choice(WORDS[:6])}." for _ in range(6)])
            for _ in range(20)]


@pytest.fixture(scope="module")
def run(tok, documents, tmp_path_factory):
    """A short elmo run (its losses) saved to a folder."""
    objective = get_objective("elmo")
    cfg = PretrainConfig(objective="elmo", size="tiny", steps=16, seq_len=32, batch_size=8, lr=5e-3, log_every=2,
                         device="cpu", precision="fp32", seed=0)
    torch.manual_seed(0)
    module = objective.build(SHAPE, tok)
    examples = objective.examples(documents, tok, cfg.seq_len, cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small runs are faster and steadier so on a shared machine
    try:
        result = train(module, objective.loss, examples, cfg.train_config(), collate=objective.collate(tok, cfg.seed))
    finally:
        torch.set_num_threads(threads)
    run = ObjectiveRun(objective, module.eval(), tok, result, cfg)
    return run, run.save(tmp_path_factory.mktemp("elmo") / "model")


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return ids, mask


def test_a_few_steps_lower_both_directions_losses(run):
    result = run[0].result
    train_rows = [h for h in result.history if h["kind"] == "train"]
    assert result.status == "completed"
    for key in ("lm_loss", "forward_loss", "backward_loss"):
        assert train_rows[-1][key] < train_rows[0][key], (key, train_rows)
    last = train_rows[-1]
    assert abs(last["lm_loss"] - (last["forward_loss"] + last["backward_loss"]) / 2) < 1e-4


def test_both_saved_folders_load_in_transformers_with_equal_logits(run, tok):
    pair, folder = run[0].module, run[1]
    note = json.loads((folder / ELMO_FILE).read_text())
    assert note["backward"] == BACKWARD_FOLDER and note["class"] == "BertLMHeadModel"
    assert json.loads((folder / "pretraining_objective.json").read_text())["objective"] == "elmo"
    fwd, bwd, _ = load_elmo(folder)
    ids, mask = _batch(tok.vocab_size)
    rev = reverse_rows(ids, mask)
    T = _transformers()
    for sub, ours, trained, inputs in ((folder, fwd, pair.forward_lm, ids),
                                       (folder / BACKWARD_FOLDER, bwd, pair.backward_lm, rev)):
        config = json.loads((sub / "config.json").read_text())
        assert config["architectures"] == ["BertLMHeadModel"] and config["is_decoder"] is True
        hf, info = T.BertLMHeadModel.from_pretrained(sub, output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            ref = hf.eval()(input_ids=inputs, attention_mask=mask).logits
            got = ours(inputs, None, mask).mlm_logits
            again = trained(inputs, None, mask).mlm_logits
        real = mask.bool()
        assert (got - ref).abs()[real].max() <= TOL and (got - again).abs()[real].max() <= TOL


def test_the_backward_model_reads_each_row_reversed_padding_left_in_place():
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    batch = reversed_batch(NextTokenBatch(ids, torch.zeros_like(ids), mask))
    assert batch.input_ids.tolist() == [[3, 9, 8, 7, 2], [3, 7, 2, 0, 0]]
    assert torch.equal(reverse_rows(batch.input_ids, mask), ids)  # its own inverse


def test_features_are_shallow_forward_reads_the_left_backward_the_right(run, tok):
    fwd, bwd = run[0].module.forward_lm, run[0].module.backward_lm
    ids, mask = _batch(tok.vocab_size)
    i = 4
    later, earlier = ids.clone(), ids.clone()
    later[:, i + 1:] = 5 + (later[:, i + 1:] - 4) % (tok.vocab_size - 5)  # every token after i changed
    earlier[:, :i] = 5 + (earlier[:, :i] - 4) % (tok.vocab_size - 5)  # every token before i changed
    with torch.no_grad():
        base = elmo_features(fwd, bwd, ids, mask)
        after = elmo_features(fwd, bwd, later, mask)
        before = elmo_features(fwd, bwd, earlier, mask)
    h = fwd.config.hidden_size
    assert base.shape == (3, 12, 2 * h)
    rows = [0, 1]  # rows long enough to have tokens on both sides of i
    assert (base[rows, : i + 1, :h] - after[rows, : i + 1, :h]).abs().max() <= TOL  # forward: tokens <= i only
    assert (base[rows, i, h:] - after[rows, i, h:]).abs().max() > 1e-3  # backward does read the right
    assert (base[rows, i:9, h:] - before[rows, i:9, h:]).abs().max() <= TOL  # backward: tokens >= i only
    assert (base[rows, i, :h] - before[rows, i, :h]).abs().max() > 1e-3  # forward does read the left


def test_the_middle_word_guess_never_reads_the_word(run, tok):
    fwd, bwd = run[0].module.forward_lm, run[0].module.backward_lm
    ids, mask = _batch(tok.vocab_size)
    other = ids.clone()
    other[:, 4] = 5 + (ids[:, 4] - 4) % (tok.vocab_size - 5)
    with torch.no_grad():
        logp = middle_word_log_probs(fwd, bwd, ids, mask)
        again = middle_word_log_probs(fwd, bwd, other, mask)
    assert logp.shape == (3, 12, tok.vocab_size)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3, 12), atol=1e-4)
    assert (logp[:, 4] - again[:, 4]).abs().max() <= TOL  # token 4's guess reads tokens 0..3 and 5.. only
    with torch.no_grad():  # a product of experts: the two directions' log-probabilities summed, renormalised
        left = fwd(ids, None, mask).mlm_logits[0, 3].log_softmax(-1)
        right = bwd(reverse_rows(ids, mask), None, mask).mlm_logits[0, 12 - 1 - 5].log_softmax(-1)
    assert (logp[0, 4] - (left + right).log_softmax(-1)).abs().max() <= 1e-4


def test_bad_input_is_refused_in_words(run, tok, tmp_path):
    fwd, bwd = run[0].module.forward_lm, run[0].module.backward_lm
    ids, mask = _batch(tok.vocab_size)
    with pytest.raises(ObjectiveError, match="padding must be on the right"):
        elmo_features(fwd, bwd, ids, mask.flip(1))
    with pytest.raises(ObjectiveError, match="shape"):
        elmo_features(fwd, bwd, ids, mask[:, :5])
    with pytest.raises(ObjectiveError, match=r"\[batch, seq\]"):
        middle_word_log_probs(fwd, bwd, ids[0], None)
    with pytest.raises(ObjectiveError, match="not an ELMo run's folder"):
        load_elmo(tmp_path)
    encoder = get_objective("peek").build(SHAPE, tok)  # two-way attention: it would see what it predicts
    with pytest.raises(ObjectiveError, match="must read one way"):
        ElmoPair(fwd, encoder)


def test_a_middle_word_guess_from_text(run, tok):
    fwd, bwd = run[0].module.forward_lm, run[0].module.backward_lm
    text = "the cat sat on the mat."
    guesses = guess_middle_word(fwd, bwd, tok, text, 2, k=3)
    enc = tok.encode_batch([text])
    with torch.no_grad():
        best = middle_word_log_probs(fwd, bwd, enc.input_ids, enc.attention_mask)[0, 2].topk(3)
    assert [g for g, _ in guesses] == tok.convert_ids_to_tokens(best.indices.tolist())
    assert all(a[1] >= b[1] for a, b in zip(guesses, guesses[1:])) and 0 < guesses[0][1] <= 1
    with pytest.raises(ObjectiveError, match="both sides"):
        guess_middle_word(fwd, bwd, tok, text, 0)
    with pytest.raises(ObjectiveError, match="from 1 to"):
        guess_middle_word(fwd, bwd, tok, text, 50)
