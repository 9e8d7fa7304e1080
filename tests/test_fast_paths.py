"""Work skipped where nothing reads it: captures of a few layers/heads, and the last layer computed for the rows
the heads read alone (`bertlab.fast.asked_rows`). Both give the numbers of the full computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import bertlab.families  # noqa: F401  (registers the families: a model can be built from its class)
from bertlab.config import BertConfig
from bertlab.families.bert import Bert

PATTERN = "hook_pattern"


def _model(**kw) -> Bert:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=96, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, **kw)
    return Bert(cfg).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 21), generator=g)
    types = torch.zeros_like(ids)
    types[:, 11:] = 1
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    mask[2, 6:] = 0
    return ids, types, mask


def _patterns(n: str) -> bool:
    return n.endswith(PATTERN)


def test_capture_of_some_heads_equals_the_full_capture_and_leaves_outputs_alone():
    model = _model()
    ids, types, mask = _batch()
    with torch.no_grad():
        plain = model(ids, types, mask)
        _, full = model.run_with_cache(ids, types, mask, names=_patterns)
        out, some = model.run_with_cache(ids, types, mask, names=_patterns, layers=[0, -1], heads=[3, 1])
    assert sorted(some) == [model.family.hook_name(i, PATTERN) for i in (0, 2)]
    for name, pattern in some.items():
        assert pattern.shape == (3, 2, 21, 21)
        assert torch.allclose(pattern, full[name][:, [3, 1]], atol=1e-6, rtol=0)
    assert torch.allclose(out.last_hidden_state, plain.last_hidden_state, atol=1e-5)  # eager = sdpa


def test_a_captured_pattern_equals_the_softmax_of_the_captured_scores():
    model, (ids, types, mask) = _model(), _batch()
    scores_and_patterns = lambda n: n.endswith(("hook_pattern", "hook_scores"))  # noqa: E731
    with torch.inference_mode():
        _, alone = model.run_with_cache(ids, types, mask, names=_patterns)
        _, both = model.run_with_cache(ids, types, mask, names=scores_and_patterns)
    for name in alone:
        torch.testing.assert_close(alone[name], both[name], atol=0, rtol=0)
        scores = both[name.replace("hook_pattern", "hook_scores")]
        torch.testing.assert_close(scores.softmax(-1), both[name], atol=0, rtol=0)


def test_capture_stores_only_the_heads_asked_compactly():
    model = _model()
    ids, types, mask = _batch()
    seen = []
    name = model.family.hook_name(1, PATTERN)
    with torch.no_grad(), model.hooks([(name, lambda x, n: seen.append(x.shape[1]))]):
        model.run_with_cache(ids, types, mask, names=[name], heads=[2])
    assert seen == [4]  # a hook gets every head
    assert not model.hook_points[name].active
    with torch.no_grad():
        _, half = model.run_with_cache(ids, types, mask, names=[name], heads=[2], dtype=torch.float16)
        _, full = model.run_with_cache(ids, types, mask, names=[name])
    assert half[name].dtype == torch.float16 and half[name].shape == (3, 1, 21, 21)
    assert torch.allclose(half[name].float(), full[name][:, [2]], atol=1e-3, rtol=0)


def test_a_hook_that_edits_the_pattern_still_acts_under_a_head_capture():
    model = _model()
    ids, types, mask = _batch()
    name = model.family.hook_name(0, PATTERN)

    def uniform(x: torch.Tensor, n: str) -> torch.Tensor:
        return torch.full_like(x, 1.0 / x.shape[-1])

    with torch.no_grad():
        plain = model(ids, types, mask).last_hidden_state
        with model.hooks([(name, uniform)]):
            edited = model(ids, types, mask).last_hidden_state
            both, cache = model.run_with_cache(ids, types, mask, names=[name], heads=[0])
    assert not torch.allclose(edited, plain, atol=1e-4)
    assert torch.allclose(both.last_hidden_state, edited, atol=1e-6)


def test_capture_names_wrong_layers_and_heads():
    model = _model()
    ids, types, mask = _batch()
    with pytest.raises(IndexError, match="head 4 does not exist"):
        model.run_with_cache(ids, types, mask, names=_patterns, heads=[4])
    with pytest.raises(IndexError, match="layer 3 does not exist"):
        model.run_with_cache(ids, types, mask, names=_patterns, layers=[3])
    assert not any(p.active for p in model.hook_points.values())


def _classifier() -> Bert:
    return _model(task="sequence_classification", id2label={0: "a", 1: "b", 2: "c"})


def test_classifier_on_cls_alone_equals_the_full_last_layer_logits_and_gradients():
    model = _classifier()
    ids, types, mask = _batch()
    labels = torch.tensor([0, 2, 1])
    grads = []
    for all_positions in (True, False):
        model.zero_grad()
        out = model(ids, types, mask, all_positions=all_positions)
        F.cross_entropy(out.logits, labels).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if all_positions:
            full = out
    assert out.last_hidden_state.shape == (3, 1, 48)
    assert (out.logits - full.logits).abs().max() <= 1e-5
    assert torch.allclose(out.last_hidden_state[:, 0], full.last_hidden_state[:, 0], atol=1e-5, rtol=0)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4), n


def test_a_hook_on_the_last_layer_sees_every_position():
    model = _classifier()
    ids, types, mask = _batch()
    last = model.family.hook_name(2, "hook_resid_post")
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, types, mask, names=[last], all_positions=False)
        earlier, _ = model.run_with_cache(ids, types, mask, names=[model.family.hook_name(1, "hook_resid_post")],
                                          all_positions=False)
    assert cache[last].shape == (3, 21, 48) and out.last_hidden_state.shape == (3, 21, 48)
    assert earlier.last_hidden_state.shape == (3, 1, 48)  # a hook elsewhere leaves the shortcut on


def test_models_that_read_every_position_keep_them():
    for kw in ({"pretraining_heads": ("mlm", "nsp")}, {"task": "token_classification", "id2label": {0: "x"}}):
        model = _model(**kw)
        ids, types, mask = _batch()
        with torch.no_grad():
            assert model(ids, types, mask, all_positions=False).last_hidden_state.shape == (3, 21, 48)


@pytest.mark.parametrize("training", [False, True])  # training packs the real tokens (dropout is 0 here)
def test_pretraining_on_the_masked_rows_alone_equals_the_full_last_layer(training):
    """With all_positions=False (the pre-training loss's call), an MLM + NSP model computes its last layer for
    [CLS] and the masked positions only: the same MLM and NSP logits, and the same gradients, as the full layer;
    sequences with different numbers of masked positions (none, in one) and padding included."""
    model = _model(pretraining_heads=("mlm", "nsp")).train(training)
    ids, types, mask = _batch()
    picked = torch.zeros_like(ids, dtype=torch.bool)
    picked[0, [3, 7, 8, 15, 20]] = True
    picked[2, [1, 4]] = True  # sequence 1 has no masked position
    targets, nsp = ids[picked], torch.tensor([0, 1, 1])
    runs = []
    for all_positions in (True, False):
        model.zero_grad()
        out = model(ids, types, mask, mlm_positions=picked, all_positions=all_positions)
        (F.cross_entropy(out.mlm_logits, targets) + F.cross_entropy(out.nsp_logits, nsp)).backward()
        runs.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (full, full_grads), (rows, row_grads) = runs
    assert rows.last_hidden_state.shape == (3, 1 + 5, 48)  # [CLS] + the most masked positions of a sequence
    assert (rows.mlm_logits - full.mlm_logits).abs().max() <= 1e-5
    assert (rows.nsp_logits - full.nsp_logits).abs().max() <= 1e-5
    assert row_grads.keys() == full_grads.keys()
    for n in full_grads:
        assert torch.allclose(row_grads[n], full_grads[n], atol=1e-5, rtol=1e-4), n
    last = model.family.hook_name(2, "hook_resid_post")
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, types, mask, names=[last], mlm_positions=picked, all_positions=False)
    assert cache[last].shape == (3, 21, 48) and out.last_hidden_state.shape == (3, 21, 48)  # a hook sees all
    assert (out.mlm_logits - full.mlm_logits).abs().max() <= 1e-5


def test_the_pretraining_loss_asks_for_the_masked_rows_alone():
    from bertlab.training.masking import MLMBatch
    from bertlab.training.pretrain import mlm_nsp_loss

    model = _model(pretraining_heads=("mlm", "nsp"))
    ids, types, mask = _batch()
    labels = torch.full_like(ids, -100)
    labels[0, 4], labels[2, 2] = 17, 23
    batch = MLMBatch(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                     kind=torch.zeros_like(ids, dtype=torch.int8), unit_ids=torch.zeros_like(ids),
                     next_sentence_label=torch.tensor([0, 1, 0]))
    shapes = []
    with torch.no_grad(), model.hooks([(model.family.hook_name(1, "hook_resid_post"), lambda x, n: None)]):
        handle = model.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.last_hidden_state.shape)))
        loss, metrics = mlm_nsp_loss(model, batch)
        handle.remove()
    assert shapes == [(3, 2, 48)] and torch.isfinite(loss) and "nsp_loss" in metrics
