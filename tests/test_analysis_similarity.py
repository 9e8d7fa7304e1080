"""Embeddings & similarity on the real MiniLM, each number recomputed independently from
run_with_cache activations with torch.nn.functional.cosine_similarity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertlab.analysis.similarity import (
    anisotropy_baseline,
    find_word,
    project_2d,
    token_similarity,
    word_in_contexts,
    word_projection,
)
from bertlab.inputs import InputError
from bertlab.viz.similarity import plot_token_similarity, plot_word_across_layers, plot_word_projection, word_lines

BANK = [
    "He sat on the bank of the river.",
    "The river bank was muddy after the rain.",
    "I deposited money at the bank.",
    "The bank approved my loan.",
]
SENSES = ["river", "river", "money", "money"]
BASELINE = ["A cat slept on the mat.", "Stocks fell on Monday.", "She plays the piano well."]
ATOL = 1e-4  # batched (padded) vs one sentence at a time


def _states(model, tok, text: str) -> tuple[list[str], torch.Tensor]:
    """Tokens and [stage, seq, d] for one sentence, straight from run_with_cache."""
    enc = tok.encode(text)
    names = lambda n: n == "bert.embeddings.hook_out" or n.endswith("hook_resid_post")  # noqa: E731
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]),
                                        names=names)
    layers = [cache["bert.embeddings.hook_out"]] + [
        cache[f"bert.encoder.layer.{i}.hook_resid_post"] for i in range(model.config.num_hidden_layers)
    ]
    return enc.tokens, torch.stack(layers)[:, 0]


@pytest.fixture(scope="module")
def bank(default_model):
    model, tok = default_model
    return word_in_contexts(model, tok, "bank", BANK, senses=SENSES, baseline_sentences=BASELINE, num_pairs=50)


def test_token_similarity_equals_cosine_of_cached_activations(default_model):
    model, tok = default_model
    sim = token_similarity(model, tok, "The bank of the river flooded.")
    tokens, states = _states(model, tok, "The bank of the river flooded.")
    assert sim.tokens == tokens and sim.matrices.shape == (7, 9, 9)
    assert sim.stage_names == ["embeddings"] + [f"layer {i}" for i in range(6)]
    for stage in (0, 3, 6):
        x = states[stage]
        ref = F.cosine_similarity(x[:, None, :], x[None, :, :], dim=-1)
        assert torch.allclose(sim.matrix(stage), ref, atol=1e-5)
    assert torch.allclose(sim.matrix(6).diagonal(), torch.ones(9), atol=1e-5)
    with pytest.raises(IndexError, match="0 \\(embeddings\\) to 6"):
        sim.matrix(7)


def test_word_vectors_and_cosines_across_contexts(default_model, bank):
    model, tok = default_model
    assert bank.pieces == ["bank"] and bank.vectors.shape == (4, 7, 384)
    for i, text in enumerate(BANK):
        tokens, states = _states(model, tok, text)
        pos = tokens.index("bank")
        assert bank.spans[i] == (pos, pos + 1)
        assert torch.allclose(bank.vectors[i], states[:, pos], atol=ATOL)
    for s in range(7):
        for i, j in itertools.combinations(range(4), 2):
            ref = F.cosine_similarity(bank.vectors[i, s], bank.vectors[j, s], dim=0)
            assert abs(float(bank.cosines[s, i, j]) - float(ref)) < 1e-5
    c = bank.cosines
    assert torch.allclose(bank.same_sense, (c[:, 0, 1] + c[:, 2, 3]) / 2, atol=1e-6)
    assert torch.allclose(bank.different_sense, (c[:, 0, 2] + c[:, 0, 3] + c[:, 1, 2] + c[:, 1, 3]) / 4, atol=1e-6)
    upper = [c[:, i, j] for i, j in itertools.combinations(range(4), 2)]
    assert torch.allclose(bank.all_pairs, torch.stack(upper).mean(0), atol=1e-6)
    # MiniLM's contextual layers separate the two senses of "bank"
    assert bool((bank.same_sense[1:] > bank.different_sense[1:]).all())


def test_multi_piece_word_is_the_mean_of_its_pieces(default_model):
    model, tok = default_model
    texts = ["Embeddings are vectors.", "We plot the embeddings here."]
    r = word_in_contexts(model, tok, "Embeddings", texts, baseline_sentences=BASELINE, num_pairs=10)
    assert r.pieces == ["em", "##bed", "##ding", "##s"] and r.senses is None
    assert r.same_sense is None and r.different_sense is None
    tokens, states = _states(model, tok, texts[1])
    start = tokens.index("em")
    assert r.spans[1] == (start, start + 4)
    assert torch.allclose(r.vectors[1], states[:, start : start + 4].mean(1), atol=ATOL)


def test_whole_words_only_and_first_occurrence(default_model):
    model, tok = default_model
    enc = tok.encode("Embeddings embed em dashes.")
    assert enc.tokens[1:8] == ["em", "##bed", "##ding", "##s", "em", "##bed", "em"]
    assert find_word(enc, ["em"]) == [(7, 8)]  # not the first piece of "embeddings" or "embed"
    assert find_word(enc, ["em", "##bed"]) == [(5, 7)]  # "embed", not the start of "embeddings"
    r = word_in_contexts(model, tok, "bank", ["The bank by the bank.", "A bank."], baseline_sentences=BASELINE,
                         num_pairs=5)
    assert r.spans[0] == (2, 3) and "occurs 2 times in context 1" in r.notes[0]


def test_anisotropy_baseline_is_seeded_and_matches_manual(default_model):
    model, tok = default_model
    base = anisotropy_baseline(model, tok, BASELINE, num_pairs=40, seed=3)
    again = anisotropy_baseline(model, tok, BASELINE, num_pairs=40, seed=3)
    other = anisotropy_baseline(model, tok, BASELINE, num_pairs=40, seed=4)
    assert torch.equal(base.pairs, again.pairs) and torch.equal(base.mean, again.mean)
    assert not torch.equal(base.pairs, other.pairs)
    assert base.pairs.shape == (40, 2, 2) and base.mean.shape == (7,)
    assert bool((base.pairs[:, 0, 0] != base.pairs[:, 1, 0]).all())  # two different sentences
    states = [_states(model, tok, s) for s in BASELINE]
    for s, t in base.pairs.reshape(-1, 2).tolist():  # never [CLS] or [SEP]
        assert 0 < t < len(states[s][0]) - 1
    cos = torch.stack([
        F.cosine_similarity(states[s1][1][:, t1], states[s2][1][:, t2], dim=-1)
        for (s1, t1), (s2, t2) in base.pairs.tolist()
    ])  # [pair, stage]
    assert torch.allclose(base.mean, cos.mean(0), atol=ATOL)
    reused = word_in_contexts(model, tok, "bank", BANK[:2], baseline=base)
    assert reused.baseline is base


def test_word_projection_is_centred_pca_per_stage(default_model):
    model, tok = default_model
    proj = word_projection(model, tok, ["bank", "river", "money"], BANK)
    assert proj.words == ["bank"] * 4 + ["river", "river", "money"]
    assert proj.sentence_index == [0, 1, 2, 3, 0, 1, 2]
    assert proj.points.shape == (7, 7, 2) and proj.explained.shape == (7, 2)
    for stage in (0, 6):
        x = proj.vectors[stage].double().numpy()
        x = x - x.mean(0)
        u, s, _ = np.linalg.svd(x, full_matrices=False)
        ours = proj.points[stage].double().numpy()
        assert np.allclose(np.abs(ours), np.abs(u[:, :2] * s[:2]), atol=1e-3)
        assert np.allclose(proj.explained[stage].numpy(), s[:2] ** 2 / (s**2).sum(), atol=1e-4)
    tokens, states = _states(model, tok, BANK[2])
    assert torch.allclose(proj.vectors[:, 6], states[:, tokens.index("money")], atol=ATOL)


def test_project_2d_sign_convention_is_deterministic():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 5, generator=g)
    p, _ = project_2d(x)
    q, _ = project_2d(-x)  # the same cloud mirrored: the same picture
    assert torch.allclose(p, q, atol=1e-5)
    for j in range(2):
        assert p[p[:, j].abs().argmax(), j] > 0


def test_bad_input_names_the_problem(default_model):
    model, tok = default_model
    kw = dict(baseline_sentences=BASELINE, num_pairs=5)
    with pytest.raises(InputError, match="does not occur in context 2 \\('I deposited money.'\\)"):
        word_in_contexts(model, tok, "bank", [BANK[0], "I deposited money.", BANK[3]], **kw)
    with pytest.raises(InputError, match="context 2 is empty"):
        word_in_contexts(model, tok, "bank", [BANK[0], "  "], **kw)
    with pytest.raises(InputError, match="word is empty"):
        word_in_contexts(model, tok, " ", BANK, **kw)
    with pytest.raises(InputError, match="at least two contexts"):
        word_in_contexts(model, tok, "bank", BANK[:1], **kw)
    with pytest.raises(InputError, match="one label per context"):
        word_in_contexts(model, tok, "bank", BANK, senses=["river"], **kw)
    with pytest.raises(InputError, match="vocabulary"):
        word_in_contexts(model, tok, "🙂", BANK, **kw)
    with pytest.raises(InputError, match="'loan' does not occur in any"):
        word_projection(model, tok, ["bank", "loan"], BANK[:2])
    with pytest.raises(InputError, match="text is empty"):
        token_similarity(model, tok, "")


def test_figures_carry_the_numbers(default_model, bank):
    model, tok = default_model
    sim = token_similarity(model, tok, "The bank of the river flooded.")
    fig = plot_token_similarity(sim, 2)
    assert np.allclose(fig.data[0].z, sim.matrix(2).numpy(), atol=1e-4)
    assert list(fig.layout.xaxis.ticktext) == sim.tokens and "after layer 1" in fig.layout.title.text
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-1.0, 1.0)

    lines = plot_word_across_layers(bank)
    assert [t.name for t in lines.data] == ["same sense", "different senses", "random token pairs (baseline)"]
    assert np.allclose(lines.data[0].y, bank.same_sense.numpy(), atol=1e-4)
    assert np.allclose(lines.data[2].y, bank.baseline.mean.numpy(), atol=1e-4)
    assert list(lines.data[0].x) == bank.stage_names
    assert set(word_lines(bank)) == {t.name for t in lines.data}

    proj = word_projection(model, tok, ["bank", "river"], BANK)
    scatter = plot_word_projection(proj, 4)
    assert [t.name for t in scatter.data] == ["bank", "river"]
    assert np.allclose(scatter.data[0].x, proj.points[4, :4, 0].numpy(), atol=1e-4)
    assert np.allclose(scatter.data[1].y, proj.points[4, 4:, 1].numpy(), atol=1e-4)
    with pytest.raises(IndexError):
        plot_word_projection(proj, 9)


def test_a_word_after_a_space_is_found_with_a_byte_level_tokenizer(tmp_path):
    """Byte-level BPE (RoBERTa, ModernBERT) marks a word that follows a space ("Ġbank" inside a sentence,
    "bank" at its start): the word is found in both places, and the other views that look words up too."""
    from tiny_models import family_folder

    from bertlab.analysis.neighbours import word_vector
    from bertlab.analysis.similarity import word_forms, word_projection
    from bertlab.loading import load

    model, tok = load(str(family_folder(tmp_path, "roberta")))
    forms = word_forms(tok, "bank")
    assert len(forms) == 2 and forms[1][0].startswith("Ġ") and not forms[0][0].startswith("Ġ")
    texts = ["bank of the river.", "We sat on the bank of the river.", "The bank lends money."]
    r = word_in_contexts(model, tok, "bank", texts, baseline_sentences=BASELINE, num_pairs=5)
    assert "".join(r.pieces) == "bank"  # as the first context (the word at its start) has it
    for (a, b), text in zip(r.spans, texts):
        assert "".join(tok.encode(text).tokens[a:b]).lstrip("Ġ") == "bank"
    _, tokens, at = word_vector(model, tok, texts[1], "bank", stage=1)
    assert tokens[at].startswith("Ġb")
    assert word_projection(model, tok, ["bank", "river"], texts) is not None


def test_punctuation_inside_a_sentencepiece_word_does_not_hide_the_word():
    """DeBERTa-v3's SentencePiece splits at spaces only, so "bank." is one word: "bank" is still found there,
    and still not inside "banks"."""
    from test_family_deberta import deberta_tokenizer

    hf = deberta_tokenizer()
    import tempfile

    from bertlab.analysis.similarity import find_word_forms, word_forms
    from bertlab.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        tok = Tokenizer.from_folder(d)
    forms = word_forms(tok, "bank")
    enc = tok.encode("The boat drifted toward the muddy bank.")
    (a, b), = find_word_forms(enc, forms, tok)
    assert "".join(enc.tokens[a:b]).lstrip("▁") == "bank" and enc.word_ids[b] == enc.word_ids[a]  # "." same word
    assert find_word_forms(tok.encode("Two banks."), forms, tok) == []


def test_a_lens_target_is_the_piece_a_mask_after_a_space_predicts(tmp_path):
    """Byte-level BPE: the target "the" is the piece "Ġthe" (a [MASK] after a space predicts that), not "the"."""
    from tiny_models import family_folder

    from bertlab.analysis.ablation import target_piece_id
    from bertlab.loading import load

    _, tok = load(str(family_folder(tmp_path, "roberta")))
    assert tok.id_to_token(target_piece_id(tok, "the")) == "Ġthe"
    assert tok.id_to_token(target_piece_id(tok, "Ġthe")) == "Ġthe"
