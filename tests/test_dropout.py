"""Dropout while training on a CPU: the mask comes from the two 16-bit halves of 32-bit random integers
(`dropout_scale`), not from `bernoulli_` (dearer there), and attention with dropout trains through bertlab's eager
products on q, k and v laid out head by head (`_HeadMajor`), instead of SDPA's math path. Same probabilities (to
within 2**-16), same scaling, same outputs and gradients as the padded eager reference given the same masks."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import bertlab.families  # noqa: F401 (hands Bert its family record)
import bertlab.model as core
from bertlab.config import BertConfig
from bertlab.model import Bert, Dropout, dropout_scale


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_mask_drops_each_element_with_probability_p_and_scales_the_rest(p, dtype):
    n = 400_001  # odd: the last draw gives one half only
    torch.manual_seed(0)
    scale = dropout_scale(torch.empty(n, dtype=dtype), p)
    assert scale.dtype == dtype and scale.shape == (n,)
    kept = scale != 0
    assert set(scale[kept].unique().tolist()) == {torch.tensor(1 / (1 - p), dtype=dtype).item()}
    for part in (kept, kept[0::2], kept[1::2]):  # all, and each half of the draws (their ranges differ) alone
        dropped = 1 - part.double().mean().item()
        assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / len(part)), dropped  # five standard errors
    neighbours = (kept[0:-1:2] & kept[1::2]).double().mean().item()  # both halves of a draw: independent
    assert abs(neighbours - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / (n // 2)), neighbours
    assert dropout_scale(torch.empty(3, 5, 7), p).shape == (3, 5, 7)
    torch.manual_seed(0)
    assert torch.equal(dropout_scale(torch.empty(n, dtype=dtype), p), scale)  # the global seed decides it
    assert not torch.equal(dropout_scale(torch.empty(n, dtype=dtype), p), scale)  # and the next draw differs


def test_the_module_is_nn_dropout_on_a_cpu_with_the_new_mask():
    drop = Dropout(0.25)
    assert isinstance(drop, torch.nn.Dropout) and drop.state_dict() == {}
    x = torch.randn(64, 48, requires_grad=True)
    out = drop(x)
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] / 0.75)
    out.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.75)  # the gradient flows through the kept elements alone
    assert torch.equal(drop.eval()(x), x)  # evaluation: the identity
    drop.train()
    assert torch.equal(Dropout(0.0)(x), x) and torch.equal(Dropout(1.0)(x), torch.zeros_like(x))


def test_in_eval_mode_a_call_hands_its_input_back_unless_a_hook_is_to_run(monkeypatch):
    drop = Dropout(0.3).eval()
    calls = []
    monkeypatch.setattr(torch.nn.Module, "_call_impl", lambda self, *a, **k: calls.append(self) or a[0])
    x = torch.randn(4, 8)
    assert drop(x) is x and calls == []  # no nn.Module machinery in eval mode with nothing to run
    monkeypatch.undo()
    seen = []
    handle = drop.register_forward_hook(lambda module, args, out: seen.append(out) or out * 2)
    torch.testing.assert_close(drop(x), 2 * x)  # a hook on the module still runs, and may change the output
    handle.remove()
    from torch.nn.modules import module as torch_module

    handle = torch_module.register_module_forward_hook(lambda module, args, out: seen.append(module) and None)
    try:
        drop(x)  # a hook registered for every module sees it too
    finally:
        handle.remove()
    assert len(seen) == 2 and seen[-1] is drop
    drop.train()
    out = drop(torch.ones(1000))
    assert (out == 0).any() and not torch.equal(out, torch.ones(1000))  # training: dropout as before


def test_elsewhere_and_in_place_the_module_is_torchs(monkeypatch):
    def refuse(x, p):
        raise AssertionError("dropout_scale drew a mask off the CPU or in place")

    monkeypatch.setattr(core, "dropout_scale", refuse)
    assert Dropout(0.1)(torch.empty(8, 8, device="meta")).device.type == "meta"  # a GPU's: F.dropout's kernel
    x = torch.ones(8, 8)
    Dropout(0.1, inplace=True)(x)
    assert set(x.unique().tolist()) <= {0.0, torch.tensor(1 / 0.9).item()}


# -- attention with dropout, against the eager reference given the same masks ---------------------
def _model(task="token_classification"):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, task=task,
                     id2label={0: "a", 1: "b", 2: "c"})
    return Bert(cfg).train()


def _batch(padded: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 7:] = mask[2, 3:] = mask[3, 11:] = 0
    return ids, torch.zeros_like(ids), mask


class _Masks:
    """A stand-in for `dropout_scale`: the attention patterns ([batch, head, q, k]) get masks from their own seeded
    stream, in call order; every other tensor keeps all (scaled), so that packed and padded layouts agree."""

    def __init__(self):
        self.g = torch.Generator().manual_seed(7)
        self.pattern_calls = 0

    def __call__(self, x, p):
        if x.dim() != 4:
            return torch.full(x.shape, 1 / (1 - p), dtype=x.dtype)
        self.pattern_calls += 1
        return (torch.rand(x.shape, generator=self.g) >= p).to(x.dtype) / (1 - p)


def _reference(model):
    ref = copy.deepcopy(model)
    ref.bert.packing = False
    for m in ref.modules():
        if isinstance(m, core.AttentionHooks):
            m.path = "eager"  # the pattern materialised, dropped out by the module (`Dropout`)
    return ref


@pytest.mark.parametrize("padded", [True, False], ids=["padded-batch", "full-batch"])
def test_training_attention_with_dropout_equals_the_eager_path_given_the_same_masks(padded, monkeypatch):
    model = _model()
    ref = _reference(model)
    ids, types, mask = _batch(padded)
    used = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: (used.append(k), sdpa(*a, **k))[1])
    masks = _Masks()
    monkeypatch.setattr(core, "dropout_scale", masks)
    layouts = []
    for layout in (core._HeadMajor, core._PaddedHeadMajor):
        monkeypatch.setattr(layout, "apply", lambda *a, f=layout.apply, name=layout.__name__: (layouts.append(name),
                                                                                                f(*a))[1])
    out = model(ids, types, mask).logits
    assert masks.pattern_calls == 3 and not used  # bertlab's own attention in each layer, not SDPA's math path
    # packed: q, k and v from one matmul, padded and laid out at once; unpadded: each of three laid out alone
    assert layouts == ["_PaddedHeadMajor"] * 3 if padded else layouts == ["_HeadMajor"] * 9
    masks.__init__()
    expected = ref(ids, types, mask).logits
    assert masks.pattern_calls == 3
    keep = mask.bool()
    assert (out[keep] - expected[keep]).abs().max() <= 1e-5
    out[keep].square().sum().backward()
    expected[keep].square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_watched_patterns_and_evaluation_keep_their_paths(monkeypatch):
    """A hook on the pattern sees it from the eager path; evaluation has no dropout and takes SDPA."""
    model = _model()
    ids, types, mask = _batch(True)
    calls = []
    for layout in (core._HeadMajor, core._PaddedHeadMajor):
        monkeypatch.setattr(layout, "apply", lambda *a: calls.append(a) or pytest.fail("training's layout"))
    with torch.no_grad():
        model(ids, types, mask)  # no gradient: nothing to train, no reason to leave SDPA
    _, cache = model.run_with_cache(ids, token_type_ids=types, attention_mask=mask,
                                    names=model.family.layer_hook_names("hook_pattern"))
    assert len(cache) == 3 and not calls
    model.eval()(ids, types, mask)
    assert not calls


def test_the_dropout_drops_about_p_of_the_attention_weights():
    """With the real masks, the mean of many dropped-out attentions (a training layer's, on a CPU) is the plain
    attention of evaluation (the scaling is right: unscaled, it would be 0.9 of it), and each draw differs from it
    (weights are really dropped)."""
    layer = _model().bert.encoder.layer[0].attention.self  # attention dropout 0.1, nothing else dropped here
    torch.manual_seed(3)
    for lin in (layer.query, layer.key, layer.value):  # q, k and v of unit scale, as plain random ones
        torch.nn.init.normal_(lin.weight, std=32**-0.5)
    x = torch.randn(8, 16, 32)
    with torch.no_grad():
        plain = layer.eval()(x, None, None)
    layer.train()
    zs = torch.stack([layer(x, None, None).detach() for _ in range(400)])
    error = (zs.mean(0) - plain).abs().mean().item()
    unscaled = (0.1 * plain).abs().mean().item()  # how far the mean would be without the 1 / (1 - p)
    assert error < unscaled / 4, (error, unscaled)
    assert (zs[0] - plain).abs().max() > 0.05
