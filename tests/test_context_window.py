"""How much context does BERT use: attention cut to a window of ±w positions (bertlab.analysis.context_window)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_bert

from bertlab.analysis.context_window import (
    context_curve,
    layer_groups,
    score_points,
    window_allowed,
    windowed,
)
from bertlab.training.corpora import Document
from bertlab.training.pretrain import evaluate_mlm


@pytest.fixture
def model(tok):
    return tiny_bert(tok, layers=3).with_heads(("mlm",)).eval()


def _hidden(model, ids):
    with torch.inference_mode():
        return model(ids, all_positions=True).last_hidden_state[0]


def test_the_window_is_a_band_around_the_diagonal():
    allowed = window_allowed(6, 1)
    assert allowed.diagonal().all() and allowed[0, 1] and allowed[1, 0] and not allowed[0, 2] and not allowed[5, 3]
    assert window_allowed(4, 0).equal(torch.eye(4, dtype=torch.bool))


def test_a_window_limits_what_each_position_can_read_to_layers_times_w(model, tok):
    """Three layers with a window of 1: position 0 reads at most 3 positions away (each layer one more)."""
    ids = torch.tensor([tok.encode("the cat sat on the mat and the dog ate its food today").ids])
    changed = ids.clone()
    changed[0, 4] = tok.token_to_id("house")  # 4 positions from position 0: one more than 3 layers reach
    near = ids.clone()
    near[0, 3] = tok.token_to_id("house")  # 3 away: within 3 layers x 1
    with windowed(model, range(3), 1):
        base, far, close = _hidden(model, ids), _hidden(model, changed), _hidden(model, near)
    assert torch.equal(base[0], far[0]), "position 0 read a token 4 positions away"
    assert not torch.equal(base[0], close[0]), "position 0 did not read 3 positions away"  # (a small effect)
    assert not torch.allclose(_hidden(model, ids)[0], _hidden(model, changed)[0], atol=1e-4)  # full attention reads it


def test_no_window_or_one_wider_than_the_text_is_full_attention(model, tok):
    ids = torch.tensor([tok.encode("a short sentence of words").ids])
    full = _hidden(model, ids)
    with windowed(model, range(3), None):
        assert torch.equal(_hidden(model, ids), full)
    with windowed(model, range(3), 100):
        assert torch.allclose(_hidden(model, ids), full, atol=1e-5)
    with pytest.raises(ValueError, match="0 or more tokens"), windowed(model, [0], -1):
        pass


def test_the_pattern_sums_to_one_inside_the_window_and_is_zero_outside(model, tok):
    ids = torch.tensor([tok.encode("one two three four five six seven").ids])
    seen = {}
    pattern = score_points(model)[1].replace("hook_scores", "hook_pattern")
    with windowed(model, [1], 2), model.hooks([(pattern, lambda x, _n: seen.setdefault("p", x.detach()))]):
        _hidden(model, ids)
    p = seen["p"][0]  # [head, query, key]
    outside = ~window_allowed(p.shape[-1], 2)
    assert p[:, outside].abs().max() == 0 and torch.allclose(p.sum(-1), torch.ones(p.shape[:2]), atol=1e-5)


def test_the_curve_scores_the_same_masked_words_in_every_row(model, tok):
    docs = [Document(["the man went to the store to buy milk.", "he paid and went home again."])] * 6
    rows = context_curve(model, lambda m: evaluate_mlm(m, tok, docs), windows=(0, 2, None))
    assert [(r.layers, r.window) for r in rows] == [("all layers", None)] + [
        (g, w) for g in layer_groups(model) for w in (0, 2)]
    assert len({r.masked_tokens for r in rows}) == 1 and rows[0].masked_tokens > 0
    assert all(0 <= r.top1 <= r.top5 <= 1 for r in rows)
    assert layer_groups(model) == {"all layers": [0, 1, 2], "lower half": [0], "upper half": [1, 2]}
