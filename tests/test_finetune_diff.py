"""Before and after fine-tuning. Jensen-Shannon divergence and linear CKA on hand-made
cases, a model against itself (no change at all), a change confined to one layer, and the filter-normalised
loss slice (Li et al. 2018)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tiny_models import tiny_bert

from bertlab.analysis.finetune_diff import (
    PROBE_SENTENCES,
    filter_normalised_direction,
    finetune_diff,
    js_divergence,
    linear_cka,
    loss_slice,
)
from bertlab.viz.finetune_diff import plot_attention_change, plot_loss_slices, plot_representation_change

pytestmark = pytest.mark.usefixtures("one_thread")


def test_js_divergence_on_hand_made_distributions():
    p = torch.tensor([0.5, 0.5])
    q = torch.tensor([1.0, 0.0])
    # by hand: m = (0.75, 0.25); KL(p||m) = 0.5 log2(0.5/0.75) + 0.5 log2(0.5/0.25); KL(q||m) = log2(1/0.75)
    by_hand = 0.5 * (0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(2.0)) + 0.5 * math.log2(4 / 3)
    assert float(js_divergence(p, q)) == pytest.approx(by_hand, abs=1e-6)
    assert float(js_divergence(q, p)) == pytest.approx(by_hand, abs=1e-6)  # symmetric
    assert float(js_divergence(p, p)) == 0.0
    assert float(js_divergence(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.3, 0.7]))) == pytest.approx(1.0)
    rows = torch.softmax(torch.randn(3, 4, 6), -1)
    assert js_divergence(rows, rows.flip(-1)).shape == (3, 4)


def _cka_by_hsic(x: torch.Tensor, y: torch.Tensor) -> float:
    """CKA written as Kornblith et al. do: HSIC of the Gram matrices with an explicit centring matrix."""
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n
    gx, gy = x.double() @ x.double().T, y.double() @ y.double().T
    hsic = lambda a, b: torch.trace(a @ h @ b @ h)  # noqa: E731
    return float(hsic(gx, gy) / torch.sqrt(hsic(gx, gx) * hsic(gy, gy)))


def test_linear_cka_on_hand_made_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 8, generator=g)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g))  # orthogonal
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-9)  # X vs XQ: a rotation changes nothing
    assert linear_cka(x, 3.0 * x + 2.0) == pytest.approx(1.0, abs=1e-9)  # nor does scale or a shift
    y = torch.randn(60, 5, generator=g)
    assert linear_cka(x, y) == pytest.approx(_cka_by_hsic(x, y), abs=1e-9)
    assert linear_cka(x, y) < 0.5
    mixed = torch.cat([x[:, :4], torch.randn(60, 4, generator=g)], 1)  # half the directions kept
    assert linear_cka(x, y) < linear_cka(x, mixed) < 1.0
    with pytest.raises(ValueError, match="same examples"):
        linear_cka(x, y[:10])


def test_a_model_against_itself_changed_nothing(tok):
    model = tiny_bert(tok)
    diff = finetune_diff(model, copy.deepcopy(model), tok)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert diff.attention_jsd.shape == (layers, heads) and diff.cka.shape == diff.cosine.shape == (layers + 1,)
    assert float(diff.attention_jsd.abs().max()) == 0.0
    torch.testing.assert_close(diff.cka, torch.ones(layers + 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(diff.cosine, torch.ones(layers + 1), atol=1e-6, rtol=0)
    assert diff.sentences == len(PROBE_SENTENCES) and diff.stage_names[0] == "embeddings"
    # padding left out: the tokens counted are the sentences' own
    assert diff.tokens == sum(len(tok.encode(s)) for s in PROBE_SENTENCES)


def test_a_change_in_the_last_layer_shows_there_only(tok):
    base = tiny_bert(tok)
    tuned = copy.deepcopy(base)
    last = tuned.family.layer_prefix(base.config.num_hidden_layers - 1)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if name.startswith(last):
                p.add_(0.5 * torch.randn_like(p))
    diff = finetune_diff(base, tuned, tok)
    assert float(diff.attention_jsd[:-1].abs().max()) == 0.0 and float(diff.attention_jsd[-1].min()) > 0
    torch.testing.assert_close(diff.cka[:-1], torch.ones(diff.cka.shape[0] - 1), atol=1e-6, rtol=0)
    assert diff.cka[-1] < 0.999 and diff.cosine[-1] < 0.999
    assert diff.layer_jsd.shape == (base.config.num_hidden_layers,)


def test_the_loss_slice_is_centred_on_the_model_and_leaves_it_alone(tok):
    model = tiny_bert(tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = tok.pad([tok.encode(s) for s in PROBE_SENTENCES[:4]])

    probe = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))

    def loss(m):  # a fixed read-out of the last layer (its LayerNorm makes the plain mean square constant)
        return (m(batch.input_ids, batch.token_type_ids, batch.attention_mask).last_hidden_state @ probe).pow(2).mean()

    s = loss_slice(model, loss, radius=0.5, points=5, seed=3)
    assert s.alphas == pytest.approx([-0.5, -0.25, 0.0, 0.25, 0.5])
    with torch.no_grad():  # the slice reads the model in eval mode (training packs the tokens: zeros at padding)
        assert s.centre == pytest.approx(float(loss(model.eval())), rel=1e-6)
    model.train()
    assert len(set(round(v, 6) for v in s.losses)) > 1  # the loss moves along the direction
    assert loss_slice(model, loss, radius=0.5, points=5, seed=3).losses == s.losses  # seeded
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])


def test_directions_are_filter_normalised(tok):
    model = tiny_bert(tok)
    d = filter_normalised_direction(model, torch.Generator().manual_seed(0))
    for name, p in model.named_parameters():
        if p.dim() <= 1:
            assert float(d[name].abs().max()) == 0.0  # biases and LayerNorm: no component
        else:
            torch.testing.assert_close(d[name].flatten(1).norm(dim=1), p.detach().flatten(1).norm(dim=1),
                                       rtol=1e-4, atol=1e-6)


def test_figures_put_the_runs_side_by_side(tok):
    base = tiny_bert(tok)
    diffs = {"sst2 · full": finetune_diff(base, tiny_bert(tok, seed=1), tok),
             "sst2 · feature": finetune_diff(base, base, tok)}
    att = plot_attention_change(diffs)
    assert len(att.data) == 2 and att.data[0].z.shape == (2, 4) and float(att.data[1].z.max()) == 0.0
    rep = plot_representation_change(diffs)
    assert [t.name for t in rep.data] == ["sst2 · full"] * 2 + ["sst2 · feature"] * 2
    assert list(rep.data[2].y) == [1.0, 1.0, 1.0]
    assert "Fine-tune" in plot_loss_slices({}).layout.annotations[0].text
