"""Head ablation and the logit lens, checked against independent computations: the model's own
head_mask argument, zeroing a head's attention pattern through a hook, and out.mlm_logits.
MLM numbers use the tiny random BertForPreTraining checkpoint (its vocabulary is mostly
[unusedN] pieces, so its texts read as [UNK] and "!"); MiniLM covers the real vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlab.analysis.ablation import (
    head_ablation,
    logit_lens,
    masked_log_probs,
    masked_query,
    single_head_effects,
)
from bertlab.inputs import InputError
from bertlab.loading import load
from bertlab.model import MissingHeadError
from bertlab.viz.ablation import lens_row_labels, plot_head_effects, plot_logit_lens

TEXT = "one ! two [MASK] three ! !"
TOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    return load(tiny_checkpoints["BertForPreTraining"])


@pytest.fixture(scope="module")
def minilm_mlm(default_model):
    """MiniLM's encoder with a fresh (random) MLM head: real vocabulary, meaningless predictions."""
    model, tok = default_model
    torch.manual_seed(0)
    return model.with_heads(("mlm",)).eval(), tok


def _reference_log_probs(model, query, head_mask=None) -> torch.Tensor:
    """[vocab] log-probs at the [MASK] through the model's own head_mask argument."""
    with torch.no_grad():
        out = model(query.input_ids, token_type_ids=query.token_type_ids, head_mask=head_mask)
    return out.mlm_logits[0, query.position].log_softmax(-1)


def test_masked_query_finds_the_mask_and_defaults_to_the_top_prediction(tiny):
    model, tok = tiny
    q = masked_query(model, tok, TEXT)
    assert q.tokens == ["[CLS]", "[UNK]", "!", "[UNK]", "[MASK]", "[UNK]", "!", "!", "[SEP]"]
    assert q.position == 4 and q.original is None
    assert q.target_id == int(_reference_log_probs(model, q).argmax())
    assert q.target == tok.id_to_token(q.target_id)
    assert masked_query(model, tok, TEXT, target="!").target_id == tok.token_to_id("!")


def test_masked_log_probs_equal_the_models_head_mask(tiny):
    model, tok = tiny
    q = masked_query(model, tok, TEXT, target="!")
    g = torch.Generator().manual_seed(0)
    masks = (torch.rand(5, 2, 4, generator=g) > 0.4).float()  # [n, layer, head]
    masks[0] = 1.0
    ours = masked_log_probs(model, q, masks, batch_size=2)  # three batches
    assert ours.shape == (5, model.config.vocab_size)
    for mask, row in zip(masks, ours):
        assert torch.allclose(row, _reference_log_probs(model, q, mask), atol=TOL)
    assert not any(p.active for p in model.hook_points.values())  # hooks removed


def test_switching_a_head_off_equals_zeroing_its_pattern(tiny):
    model, tok = tiny
    q = masked_query(model, tok, TEXT, target="!")
    layer, head = 1, 2

    def zero_pattern(pattern, name):  # [batch, head, query, key]
        pattern = pattern.clone()
        pattern[:, head] = 0.0
        return pattern

    with torch.no_grad(), model.hooks([(f"bert.encoder.layer.{layer}.attention.self.hook_pattern", zero_pattern)]):
        ref = model(q.input_ids, token_type_ids=q.token_type_ids).mlm_logits[0, q.position].log_softmax(-1)
    r = head_ablation(model, tok, TEXT, [(layer, head)], target="!")
    assert abs(r.ablated_log_prob - float(ref[q.target_id])) < TOL
    assert abs(r.base_log_prob - float(_reference_log_probs(model, q)[q.target_id])) < TOL
    assert r.change == pytest.approx(r.ablated_log_prob - r.base_log_prob)
    assert r.head_mask[layer, head] == 0 and int(r.head_mask.sum()) == 7
    assert r.base_rank == 1 + int((_reference_log_probs(model, q) > r.base_log_prob).sum())
    assert len(r.base_top) == 5 and r.base_top[0][1] >= r.base_top[-1][1]


def test_single_head_effects_equal_one_forward_per_head(tiny):
    model, tok = tiny
    e = single_head_effects(model, tok, TEXT, target="!")
    q = e.query
    base = _reference_log_probs(model, q)
    assert e.base_log_prob == pytest.approx(float(base[q.target_id]), abs=TOL)
    assert e.log_probs.shape == (2, 4) and e.ranks.shape == (2, 4)
    for layer in range(2):
        for head in range(4):
            mask = torch.ones(2, 4)
            mask[layer, head] = 0
            ref = _reference_log_probs(model, q, mask)
            assert abs(float(e.log_probs[layer, head]) - float(ref[q.target_id])) < TOL
            assert int(e.ranks[layer, head]) == 1 + int((ref > ref[q.target_id]).sum())
    assert torch.allclose(e.effects, e.log_probs - e.base_log_prob)
    ranked = e.ranked()
    assert len(ranked) == 8 and ranked[0][2] == pytest.approx(float(e.effects.min()))
    assert ranked[0][2] <= ranked[-1][2]


def test_logit_lens_ends_at_the_mlm_logits_and_starts_at_the_embeddings(tiny):
    model, tok = tiny
    lens = logit_lens(model, tok, TEXT, target="!", k=3)
    q = lens.query
    assert lens.stage_names == ["embeddings", "layer 0", "layer 1"]
    assert lens.top_ids.shape == (3, 3) and len(lens.top_tokens) == 3
    final = _reference_log_probs(model, q)
    assert abs(float(lens.target_log_probs[-1]) - float(final[q.target_id])) < TOL
    assert torch.equal(lens.top_ids[-1], final.topk(3).indices)
    assert torch.allclose(lens.top_probs[-1], final.topk(3).values.exp(), atol=TOL)
    with torch.no_grad():
        _, cache = model.run_with_cache(q.input_ids, token_type_ids=q.token_type_ids,
                                        names=["bert.embeddings.hook_out", "bert.encoder.layer.0.hook_resid_post"])
        for stage, name in ((0, "bert.embeddings.hook_out"), (1, "bert.encoder.layer.0.hook_resid_post")):
            ref = model.cls.predictions(cache[name][0, q.position]).log_softmax(-1)
            assert abs(float(lens.target_log_probs[stage]) - float(ref[q.target_id])) < TOL
            assert int(lens.target_ranks[stage]) == 1 + int((ref > ref[q.target_id]).sum())
            assert lens.top_tokens[stage] == tok.convert_ids_to_tokens(ref.topk(3).indices.tolist())


def test_chosen_position_masks_that_token_and_follows_it(minilm_mlm):
    model, tok = minilm_mlm
    q = masked_query(model, tok, "Paris is the capital of France.", position=4)
    assert q.original == "capital" and q.target == "capital" and q.tokens[4] == "[MASK]"
    assert int(q.input_ids[0, 4]) == tok.mask_token_id
    assert masked_query(model, tok, "Paris is the [MASK] of France.", target="Capital").target == "capital"
    assert masked_query(model, tok, "Paris is the [MASK] of France.", target="##ing").target == "##ing"


def test_single_head_effects_on_minilm_cover_every_head(minilm_mlm):
    model, tok = minilm_mlm
    e = single_head_effects(model, tok, "Paris is the [MASK] of France.", target="capital")
    assert e.log_probs.shape == (6, 12)
    q = e.query
    for layer, head in ((0, 0), (3, 7), (5, 11)):  # spot checks against the model's head_mask
        mask = torch.ones(6, 12)
        mask[layer, head] = 0
        ref = _reference_log_probs(model, q, mask)[q.target_id]
        assert abs(float(e.log_probs[layer, head]) - float(ref)) < 1e-4


def test_missing_mlm_head_is_reported(bare_default):
    model, tok = bare_default  # MiniLM as its package ships it: encoder only
    for fn in (masked_query, single_head_effects, logit_lens):
        with pytest.raises(MissingHeadError, match="no MLM head"):
            fn(model, tok, "Paris is the [MASK] of France.")
    with pytest.raises(MissingHeadError):
        head_ablation(model, tok, "Paris is the [MASK] of France.", [(0, 0)])


def test_bad_input_gives_clear_errors(minilm_mlm):
    model, tok = minilm_mlm
    with pytest.raises(InputError, match="no \\[MASK\\]"):
        masked_query(model, tok, "Paris is the capital of France.")
    with pytest.raises(InputError, match="2 \\[MASK\\] tokens"):
        masked_query(model, tok, "[MASK] is the [MASK] of France.")
    with pytest.raises(InputError, match="split into 4 pieces \\(em ##bed ##ding ##s\\)"):
        masked_query(model, tok, "Paris is the [MASK] of France.", target="embeddings")
    with pytest.raises(InputError, match="not in the model's vocabulary"):
        masked_query(model, tok, "Paris is the [MASK] of France.", target="🙂")
    with pytest.raises(InputError, match="empty"):
        masked_query(model, tok, "  ")
    with pytest.raises(IndexError, match="not a word piece"):
        masked_query(model, tok, "Paris is nice.", position=0)  # [CLS]
    with pytest.raises(IndexError, match="not a word piece"):
        masked_query(model, tok, "Paris is nice.", position=40)
    with pytest.raises(IndexError, match="no head \\(6, 0\\)"):
        head_ablation(model, tok, "Paris is the [MASK] of France.", [(6, 0)])
    with pytest.raises(ValueError, match="head_masks must be"):
        masked_log_probs(model, masked_query(model, tok, "A [MASK].", target="cat"), torch.ones(2, 12, 6))


def test_figures_carry_the_numbers(tiny):
    model, tok = tiny
    e = single_head_effects(model, tok, TEXT, target="!")
    fig = plot_head_effects(e)
    heat = fig.data[0]
    assert np.allclose(heat.z, e.effects.numpy(), atol=1e-4)
    assert heat.zmid == 0 and heat.zmin == -heat.zmax
    assert list(heat.x) == [0, 1, 2, 3] and list(heat.y) == [0, 1]

    lens = logit_lens(model, tok, TEXT, target="!", k=4)
    fig = plot_logit_lens(lens)
    heat = fig.data[0]
    assert np.allclose(heat.z, lens.top_probs.numpy(), atol=1e-4)
    assert [list(row) for row in heat.text] == lens.top_tokens
    assert list(heat.x) == ["#1", "#2", "#3", "#4"]
    labels = lens_row_labels(lens)
    assert list(fig.layout.yaxis.ticktext) == labels
    assert labels[0].startswith("embeddings") and f"#{int(lens.target_ranks[0])}" in labels[0]
