"""Next-sentence prediction: P(IsNext) against transformers on the tiny pre-training checkpoint,
attention mass against a hand-made pattern and against HF's attentions, random sentences,
figures against results, clear errors for bad input. Random tiny weights: mechanics only."""

from __future__ import annotations

import pytest
import torch

from bertlab.analysis.nsp import (
    CLS,
    GROUPS,
    SEP,
    A,
    AttentionMass,
    B,
    attention_mass,
    next_sentence,
    random_sentence,
    token_groups,
)
from bertlab.inputs import InputError
from bertlab.loading import load
from bertlab.model import MissingHeadError
from bertlab.viz.nsp import plot_attention_mass, plot_nsp_probability

SENT_A, SENT_B = "! ! !", "!! !"  # the tiny vocab spells little else than "!"; lengths 3 and 3


@pytest.fixture(scope="module")
def pretraining(tiny_checkpoints):
    """(bertlab model, tokenizer, transformers model) of the tiny BertForPreTraining."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_checkpoints["BertForPreTraining"]
    model, tok = load(folder)
    hf = transformers.BertForPreTraining.from_pretrained(folder, attn_implementation="eager").eval()
    return model, tok, hf


def test_probability_matches_transformers(pretraining):
    model, tok, hf = pretraining
    result = next_sentence(model, tok, "The cat sat!", "It was tired!")
    enc = tok.encode("The cat sat!", "It was tired!")
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]))
    logits = ref.seq_relationship_logits[0]
    assert result.logits == pytest.approx(logits.tolist(), abs=1e-5)
    assert result.is_next_probability == pytest.approx(float(logits.softmax(-1)[0]), abs=1e-6)  # 0 = IsNext
    assert result.not_next_probability == pytest.approx(float(logits.softmax(-1)[1]), abs=1e-6)
    assert result.is_next == (result.is_next_probability >= 0.5)
    assert result.tokens == enc.tokens and result.sentence_b_start == enc.sequence_ids.index(1)
    assert result.warning is None


def test_attention_mass_matches_hf_attentions(pretraining):
    model, tok, hf = pretraining
    result = next_sentence(model, tok, SENT_A, SENT_B)
    enc = tok.encode(SENT_A, SENT_B)
    groups = token_groups(enc)
    assert groups == [CLS, A, A, A, SEP, B, B, B, SEP]
    with torch.no_grad():
        atts = hf(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]),
                  output_attentions=True).attentions
    mass = result.attention
    assert mass.groups == GROUPS and mass.sizes == (3, 3, 1, 2)
    for layer, att in enumerate(atts):
        mean = att[0].mean(dim=0)  # [query, key]
        a, b, sep = [1, 2, 3], [5, 6, 7], [4, 8]
        assert float(mass.share(A, B)[layer]) == pytest.approx(float(mean[a][:, b].sum(1).mean()), abs=1e-5)
        assert float(mass.share(A, A)[layer]) == pytest.approx(float(mean[a][:, a].sum(1).mean()), abs=1e-5)
        assert float(mass.share(B, A)[layer]) == pytest.approx(float(mean[b][:, a].sum(1).mean()), abs=1e-5)
        assert float(mass.share(CLS, SEP)[layer]) == pytest.approx(float(mean[0, sep].sum()), abs=1e-5)
        assert float(mass.share(SEP, CLS)[layer]) == pytest.approx(float(mean[sep, 0].mean()), abs=1e-5)
    assert torch.allclose(mass.mass.sum(-1), torch.ones(mass.num_layers, 4), atol=1e-5)


def test_attention_mass_on_a_hand_made_pattern():
    """Tokens [CLS] a1 [SEP] b1 b2 [SEP]; 1 layer, 2 heads; numbers worked out by hand."""
    groups = [CLS, A, SEP, B, B, SEP]
    head0 = torch.tensor([
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # [CLS] -> [CLS]
        [0.0, 0.5, 0.0, 0.5, 0.0, 0.0],  # a1 -> a1, b1
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # b1 -> a1
        [0.0, 0.0, 0.0, 0.5, 0.5, 0.0],  # b2 -> b1, b2
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    ])
    head1 = torch.tensor([
        [0.0, 0.5, 0.0, 0.5, 0.0, 0.0],  # [CLS] -> a1, b1
        [0.0, 0.0, 0.5, 0.0, 0.0, 0.5],  # a1 -> both [SEP]s
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # b1 -> b2
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # b2 -> [CLS]
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    ])
    mass = attention_mass(torch.stack([head0, head1])[None], groups)  # [1 layer, 2 heads, 6, 6]
    assert mass.groups == (A, B, CLS, SEP) and mass.sizes == (1, 2, 1, 2)
    # a1: head0 gives A .5, B .5; head1 gives [SEP] 1 -> mean A .25, B .25, [SEP] .5
    assert mass.mass[0, 0].tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5])
    # b1: (A 1) and (B 1) -> A .5, B .5; b2: (B 1) and ([CLS] 1) -> B .5, [CLS] .5; mean over b1, b2
    assert mass.mass[0, 1].tolist() == pytest.approx([0.25, 0.5, 0.25, 0.0])
    # [CLS]: ([CLS] 1) and (A .5, B .5) -> A .25, B .25, [CLS] .5
    assert mass.mass[0, 2].tolist() == pytest.approx([0.25, 0.25, 0.5, 0.0])
    assert float(mass.share(SEP, SEP)[0]) == pytest.approx(1.0)
    with pytest.raises(KeyError, match="no token group"):
        mass.share("C", A)


def test_attention_mass_single_sentence_and_bad_shapes():
    pattern = torch.full((2, 1, 3, 3), 1 / 3)
    mass = attention_mass(pattern, [CLS, A, SEP])
    assert mass.groups == (A, CLS, SEP)  # no B: left out
    assert torch.allclose(mass.mass[1], torch.full((3, 3), 1 / 3))
    with pytest.raises(ValueError, match="layers, heads, query, key"):
        attention_mass(torch.ones(3, 3), [A, A, A])
    with pytest.raises(ValueError, match="2 group labels for 3 tokens"):
        attention_mass(pattern, [A, A])


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        ("The cat sat.", "", InputError, "second sentence \\(B\\) is empty"),
        ("The cat sat.", "   ", InputError, "second sentence \\(B\\) is empty"),
        ("The cat sat.", None, InputError, "second sentence \\(B\\) is empty"),
        ("", "It was tired.", InputError, "first sentence \\(A\\) is empty"),
        ("\u200b", "It was tired.", InputError, "first sentence \\(A\\) has only invisible characters"),
        ("The cat sat.", "It was \ud83d tired.", InputError, "second sentence \\(B\\) holds a broken character"),
    ],
)
def test_bad_input(pretraining, a, b, error, match):
    model, tok, _ = pretraining
    with pytest.raises(error, match=match):
        next_sentence(model, tok, a, b)


def test_missing_nsp_head(tiny_checkpoints, bare_default):
    model, tok = load(tiny_checkpoints["BertForMaskedLM"])
    with pytest.raises(MissingHeadError, match="no NSP head"):
        next_sentence(model, tok, "The cat sat.", "It was tired.")
    with pytest.raises(MissingHeadError, match="no NSP head"):
        next_sentence(*bare_default, "The cat sat.", "It was tired.")


def test_long_pair_is_cut_with_a_warning(pretraining):
    model, tok, _ = pretraining
    result = next_sentence(model, tok, "! " * 80, "! " * 10)
    assert len(result.tokens) == model.config.max_position_embeddings
    assert result.warning and "cut" in result.warning
    assert result.attention.sizes[1] == 10  # longest-first: B keeps its 10 tokens


def test_random_sentence_is_seeded_and_skips():
    corpus = ["One.", "  ", "Two.", "Three.", ""]
    draws = [random_sentence(corpus, torch.Generator().manual_seed(s)) for s in range(40)]
    assert set(draws) == {"One.", "Two.", "Three."}  # blank lines never come out
    again = [random_sentence(corpus, torch.Generator().manual_seed(s)) for s in range(40)]
    assert draws == again
    g = torch.Generator().manual_seed(0)
    assert {random_sentence(corpus, g, exclude=["One.", " Two. "]) for _ in range(10)} == {"Three."}
    with pytest.raises(InputError, match="no other sentence"):
        random_sentence(["One."], g, exclude=["One."])
    with pytest.raises(InputError, match="no other sentence"):
        random_sentence([], g)


def test_figures_match_the_result(pretraining):
    model, tok, _ = pretraining
    result = next_sentence(model, tok, SENT_A, SENT_B)
    fig = plot_nsp_probability(result)
    assert [list(t.x) for t in fig.data] == [[result.is_next_probability], [result.not_next_probability]]
    assert f"{100 * result.is_next_probability:.1f}%" in fig.layout.title.text
    fig = plot_attention_mass(result.attention)
    assert len(fig.data) == 3 * 4  # from A, B, [CLS] × to A, B, [CLS], [SEP]
    by_name = {(t.xaxis, t.name): list(t.y) for t in fig.data}
    assert by_name[("x", "to sentence B")] == pytest.approx(result.attention.share(A, B).tolist(), abs=1e-4)
    assert by_name[("x3", "to [SEP]")] == pytest.approx(result.attention.share(CLS, SEP).tolist(), abs=1e-4)
    assert [list(t.x) for t in fig.data][0] == list(range(model.config.num_hidden_layers))
    assert sum(t.showlegend for t in fig.data) == 4  # one legend entry per target group
    assert len(plot_attention_mass(result.attention, sources=[B]).data) == 4
    with pytest.raises(ValueError, match="none of the groups"):
        plot_attention_mass(AttentionMass((A,), torch.ones(1, 1, 1), (1,)), sources=[B])
