"""Attention rollout: a 2-layer example worked out by hand, Abnar & Zuidema's own recipe in
numpy, the model path (pairs included) against transformers' attentions, and the figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlab.analysis.attention import attention_patterns
from bertlab.analysis.rollout import (
    RolloutResult,
    attention_rollout,
    compute_rollout,
    mix_residual,
    rollout_from_attention,
)
from bertlab.loading import load
from bertlab.viz.rollout import plot_rollout, rollout_z


def _hand_made() -> torch.Tensor:
    """[2 layers, 2 heads, 2 tokens, 2 tokens]."""
    layer0 = [[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]]  # mean: all 0.5
    layer1 = [[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]]  # mean: everyone reads token 0
    return torch.tensor([layer0, layer1])


def test_two_layers_by_hand():
    # layer 0: mean [[.5, .5], [.5, .5]]; + I -> [[1.5, .5], [.5, 1.5]]; rows / 2 -> [[.75, .25], [.25, .75]]
    # layer 1: mean [[1, 0], [1, 0]]; + I -> [[2, 0], [1, 1]]; rows / 2 -> [[1, 0], [.5, .5]]
    # rollout 1 = [[1, 0], [.5, .5]] @ [[.75, .25], [.25, .75]] = [[.75, .25], [.5, .5]]
    r = attention_rollout(_hand_made())
    assert r.shape == (2, 2, 2)
    assert torch.allclose(r[0], torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    assert torch.allclose(r[1], torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    # without the residual: [[1, 0], [1, 0]] @ [[.5, .5], [.5, .5]] = all 0.5
    plain = attention_rollout(_hand_made(), residual=False)
    assert torch.allclose(plain[1], torch.full((2, 2), 0.5))


def _abnar_numpy(att: np.ndarray) -> np.ndarray:
    """The recipe of Abnar & Zuidema's notebook: 0.5 * A + 0.5 * I, renormalise, chain."""
    n = att.shape[-1]
    aug = 0.5 * att.mean(axis=1) + 0.5 * np.eye(n)[None]
    aug = aug / aug.sum(axis=-1, keepdims=True)
    joint = np.zeros_like(aug)
    joint[0] = aug[0]
    for i in range(1, len(aug)):
        joint[i] = aug[i] @ joint[i - 1]
    return joint


def test_matches_the_papers_recipe_on_random_patterns():
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(4, 3, 7, 7, generator=g, dtype=torch.float64).softmax(-1)
    r = attention_rollout(patterns)
    assert np.allclose(r.numpy(), _abnar_numpy(patterns.numpy()), atol=1e-12)
    assert torch.allclose(r.sum(-1), torch.ones(4, 7, dtype=torch.float64))  # rows stay distributions
    half = 0.5 * patterns.mean(1) + 0.5 * torch.eye(7, dtype=torch.float64)
    assert torch.allclose(mix_residual(patterns.mean(1)), half)


def test_bad_shapes():
    with pytest.raises(ValueError, match="layers, heads, query, key"):
        attention_rollout(torch.ones(2, 3, 3))
    with pytest.raises(ValueError, match="query = key"):
        attention_rollout(torch.ones(1, 1, 2, 3))


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    transformers = pytest.importorskip("transformers")
    folder = tiny_checkpoints["BertModel"]
    model, tok = load(folder)
    hf = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    return model, tok, hf


def test_model_pair_against_transformers(tiny):
    model, tok, hf = tiny
    result = compute_rollout(model, tok, "! ! !", "!! !")
    enc = tok.encode("! ! !", "!! !")
    assert result.tokens == enc.tokens and result.sentence_b_start == 5
    with torch.no_grad():
        atts = hf(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]),
                  output_attentions=True).attentions
    ref = torch.stack([a[0] for a in atts])  # [layers, heads, q, k]
    assert torch.allclose(result.raw, ref.mean(1), atol=1e-5)
    assert np.allclose(result.rollout.numpy(), _abnar_numpy(ref.double().numpy()), atol=1e-5)
    assert result.warning is None and result.residual


def test_from_attention_reuses_patterns(tiny):
    model, tok, _ = tiny
    att = attention_patterns(model, tok, "! ! ! !")
    result = rollout_from_attention(att, residual=False)
    assert torch.equal(result.raw, att.patterns.mean(1))
    assert torch.allclose(result.rollout[-1], result.raw[1] @ result.raw[0], atol=1e-6)
    assert result.sentence_b_start is None and not result.residual


def test_figure_shows_raw_and_rollout_side_by_side(tiny):
    model, tok, _ = tiny
    result = compute_rollout(model, tok, "! ! !", "!! !")
    fig = plot_rollout(result, 1)
    raw, roll = fig.data
    assert np.array_equal(np.asarray(raw.z), rollout_z(result.raw[1]))
    assert np.array_equal(np.asarray(roll.z), rollout_z(result.rollout[1]))
    assert np.allclose(np.asarray(roll.z, dtype=float), result.rollout[1].numpy(), atol=6e-5)
    assert (raw.xaxis, roll.xaxis) == ("x", "x2")
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["Raw attention, layer 1 (mean of heads)", "Rollout through layers 0–1"]
    assert len(fig.layout.shapes) == 4  # the A|B divide on both heatmaps
    assert {s.x0 for s in fig.layout.shapes if s.x0 == s.x1} == {4.5}
    assert list(fig.layout.xaxis.ticktext) == result.tokens
    single = compute_rollout(model, tok, "! ! !")
    assert plot_rollout(single, 0).layout.shapes == ()
    assert "Rollout through layer 0" in [a.text for a in plot_rollout(single, 0).layout.annotations]
    with pytest.raises(IndexError, match="layers 0..1"):
        plot_rollout(single, 2)


def test_result_layer_check():
    r = RolloutResult(tokens=["a"], sentence_b_start=None, raw=torch.ones(3, 1, 1), rollout=torch.ones(3, 1, 1))
    assert r.num_layers == 3 and r.check_layer(2) == 2
    with pytest.raises(IndexError, match="layer -1 does not exist"):
        r.check_layer(-1)
