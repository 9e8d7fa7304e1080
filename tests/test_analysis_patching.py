"""Activation patching: the corners any correct implementation gets exactly, batching, the messages."""

from __future__ import annotations

import pytest
import torch

from bertlab.analysis.patching import (
    Patch,
    component_grid,
    head_grid,
    logit_diff_metric,
    patch_runs,
    patching_input,
    residual_grid,
)
from bertlab.inputs import InputError

CLEAN = "When John and Mary went to the store, Mary gave a drink to [MASK]."
CORRUPT = "When John and Mary went to the store, John gave a drink to [MASK]."


@pytest.fixture(scope="module")
def pair(default_model):
    model, tok = default_model
    return model, patching_input(model, tok, CLEAN, CORRUPT, "john", "mary")


@pytest.fixture(scope="module")
def grid(pair):
    model, inp = pair
    return residual_grid(model, inp)


def test_the_pair_differs_in_one_word(pair):
    _, inp = pair
    assert inp.differing == [inp.tokens.index("mary", 5)]
    assert inp.tokens[inp.position] == "[MASK]"


def test_corners_of_the_residual_grid(pair, grid):
    model, inp = pair
    assert grid.recovery.shape == (model.config.num_hidden_layers + 1, len(inp.tokens))
    assert abs(grid.clean_diff - grid.corrupt_diff) > 0.1  # something to recover
    (word,) = inp.differing
    assert grid.recovery[0, word].item() == pytest.approx(1.0, abs=1e-4)  # the differing word at the embeddings
    assert grid.recovery[-1, inp.position].item() == pytest.approx(1.0, abs=1e-4)  # the [MASK] after the last layer
    shared = inp.tokens.index("john")  # in both sentences
    assert grid.recovery[0, shared].item() == pytest.approx(0.0, abs=1e-4)
    others = [p for p in range(len(inp.tokens)) if p != inp.position]
    assert grid.recovery[-1, others].abs().max().item() < 1e-4  # the MLM head reads the [MASK] only
    assert 0.2 < abs(grid.recovery[1:-1, word]).max().item()  # in between, the word's effect is spread out


def test_batches_give_what_single_runs_give(pair, grid):
    model, inp = pair
    one = residual_grid(model, inp, batch_size=1)
    torch.testing.assert_close(one.recovery, grid.recovery, atol=1e-4, rtol=0)


def test_a_metric_is_passed_in(pair):
    model, inp = pair
    calls = []

    def answer_logit(out):
        calls.append(out.mlm_logits.shape[0])
        return out.mlm_logits[:, inp.answer_id]

    name = model.family.embedding_hook
    values = patch_runs(model, inp, [Patch(name, (p,)) for p in inp.differing], answer_logit)
    diff = patch_runs(model, inp, [Patch(name, (p,)) for p in inp.differing], logit_diff_metric(inp))
    assert calls and values.shape == diff.shape == (1,)
    assert not torch.allclose(values, diff)


def test_components_and_heads(pair):
    model, inp = pair
    layers, heads, seq = model.config.num_hidden_layers, model.config.num_attention_heads, len(inp.tokens)
    for kind in ("attention", "mlp"):
        g = component_grid(model, inp, kind)
        assert g.recovery.shape == (layers, seq) and g.rows[0] == "layer 0"
        assert torch.isfinite(g.recovery).all()
    h = head_grid(model, inp, layers - 1)
    assert h.recovery.shape == (heads, seq) and h.extra["all positions"].shape == (heads,)
    # heads of the last layer act on later stages only through their own position: off the [MASK], nothing
    others = [p for p in range(seq) if p != inp.position]
    assert h.recovery[:, others].abs().max().item() < 1e-4
    with pytest.raises(IndexError, match="layers"):
        head_grid(model, inp, layers)
    with pytest.raises(ValueError, match="residual, attention, mlp"):
        component_grid(model, inp, "neurons")


def test_json_has_the_cli_fields(grid):
    out = grid.as_json()
    assert set(out) >= {"tokens", "layers", "recovery", "clean_diff", "corrupt_diff"}
    assert len(out["recovery"]) == len(out["layers"]) and len(out["recovery"][0]) == len(out["tokens"])


@pytest.mark.parametrize("clean, corrupt, match", [
    (CLEAN, "When John and Mary went to the supermarket, Johnathan gave a drink to [MASK].", "same number of pieces"),
    ("Mary gave a drink to [MASK].", "Mary gave a [MASK] to John.", "same place"),
    ("Mary gave a drink to John.", "John gave a drink to Mary.", "exactly one"),
    ("", CORRUPT, "empty"),
])
def test_messages_say_what_to_change(default_model, clean, corrupt, match):
    model, tok = default_model
    with pytest.raises(InputError, match=match):
        patching_input(model, tok, clean, corrupt, "john", "mary")


def test_words_must_be_single_pieces(default_model):
    model, tok = default_model
    with pytest.raises(InputError, match="pieces"):
        patching_input(model, tok, CLEAN, CORRUPT, "johnathanson", "mary")
    with pytest.raises(InputError, match="two different"):
        patching_input(model, tok, CLEAN, CORRUPT, "mary", "Mary")
