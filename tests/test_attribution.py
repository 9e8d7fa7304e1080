"""Attributions (integrated gradients, gradient × input), the "does attention explain it?" check,
and the backward hooks they rest on: hand-made functions whose answer is known, tiny models, and
completeness on the offline default."""

from __future__ import annotations

import math

import pytest
import torch

from bertlab.analysis.attention_check import (
    check_attention,
    credited_heads,
    head_check,
    kendall,
    spearman,
)
from bertlab.analysis.attribution import (
    GAP_AIM,
    attribute,
    baseline_ids,
    integrated_gradients,
    path_gradients,
    quadrature,
    target_probability,
)
from bertlab.analysis.targets import class_target, mask_target, pair_target, span_target, tag_target
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# Hand-made functions: the answer is known
# ---------------------------------------------------------------------------------------------
def grad_fn_of(f):
    """grad_fn for integrated_gradients from a batched f: [n, ...] -> [n]."""

    def grad_fn(points):
        leaf = points.detach().requires_grad_()
        with torch.enable_grad():
            values = f(leaf)
            (g,) = torch.autograd.grad(values.sum(), leaf)
        return values.detach(), g

    return grad_fn


@pytest.mark.parametrize("rule", ["riemann", "gausslegendre"])
@pytest.mark.parametrize("steps", [1, 3, 16])
def test_ig_of_a_linear_function_is_gradient_times_input_exactly(rule, steps):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 7, generator=g, dtype=torch.float64)
    x = torch.randn(5, 7, generator=g, dtype=torch.float64)

    def f(points):  # linear: ∂f/∂x = w everywhere
        return (points * w).sum(dim=(1, 2))

    ig, fx, fb = integrated_gradients(grad_fn_of(f), x, torch.zeros_like(x), steps, rule)
    assert torch.allclose(ig, w * x, atol=1e-12)  # gradient × input, whatever the step count
    assert fx - fb == pytest.approx(float(ig.sum()), abs=1e-10)
    ends_apart = integrated_gradients(grad_fn_of(f), x, torch.zeros_like(x), steps, rule, value_fn=f)
    assert torch.equal(ends_apart[0], ig) and ends_apart[1:] == (fx, fb)  # f at the ends, without gradients
    base = torch.randn(5, 7, generator=g, dtype=torch.float64)  # another baseline: (x - x') · w
    ig2, _, _ = integrated_gradients(grad_fn_of(f), x, base, steps, rule)
    assert torch.allclose(ig2, w * (x - base), atol=1e-12)


def test_ig_of_a_nonlinear_function_is_complete_and_not_gradient_times_input():
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(6, 8, generator=g, dtype=torch.float64)
    w2 = torch.randn(8, 3, generator=g, dtype=torch.float64)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)

    def f(points):  # a small MLP and a softmax: p(class 2)
        return (torch.tanh(points @ w1) @ w2).sum(1).softmax(-1)[:, 2]

    gaps = []
    for steps in (16, 64, 256):
        ig, fx, fb = integrated_gradients(grad_fn_of(f), x, torch.zeros_like(x), steps, "riemann")
        gaps.append(abs(float(ig.sum()) - (fx - fb)) / abs(fx - fb))
    assert gaps[1] <= 0.01 and gaps[2] <= 1e-3 and gaps[2] < gaps[1] < gaps[0]  # it converges to completeness
    _, grad = grad_fn_of(f)(x[None])
    assert not torch.allclose(ig, grad[0] * x, atol=1e-3)  # saturation: the local gradient alone differs


def test_gauss_legendre_is_exact_for_polynomials_of_degree_2n_minus_1():
    x = torch.tensor([[0.5, -1.25, 2.0]], dtype=torch.float64)

    def f(points):  # degree 3 along the path: 2 Gauss-Legendre points integrate ∂f/∂α exactly
        return (points**3 + points**2).sum(dim=(1, 2))

    ig, fx, fb = integrated_gradients(grad_fn_of(f), x, torch.zeros_like(x), 2, "gausslegendre")
    assert torch.allclose(ig, x**3 + x**2, atol=1e-12)  # per element too: f is a sum of one-element terms
    assert float(ig.sum()) == pytest.approx(fx - fb, abs=1e-12)


def test_quadrature_weights_sum_to_one_inside_the_interval():
    for rule in ("riemann", "gausslegendre"):
        alphas, weights = quadrature(9, rule)
        assert float(weights.sum()) == pytest.approx(1.0)
        assert 0 < float(alphas.min()) and float(alphas.max()) < 1
    with pytest.raises(ValueError, match="steps"):
        quadrature(0)
    with pytest.raises(ValueError, match="quadrature"):
        quadrature(4, "simpson")


# ---------------------------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------------------------
def tiny(tok: Tokenizer, task: str | None = None, heads=("mlm", "nsp"), labels: int = 3, seed: int = 0) -> Bert:
    torch.manual_seed(seed)
    id2label = {i: f"L{i}" for i in range(labels)} if task in ("sequence_classification", "token_classification") \
        else {}
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, initializer_range=0.3,
                     pretraining_heads=tuple(heads) if task is None else (),
                     task=task, id2label=id2label)
    model = Bert(cfg).eval()
    with torch.no_grad():  # a random tiny model is nearly uniform: sharpen its heads so probabilities move
        for name, module in model.named_modules():
            if name.startswith(("cls", "classifier", "qa_outputs")) and isinstance(module, torch.nn.Linear):
                module.weight *= 3
    return model


def test_baseline_keeps_special_tokens_and_swaps_words_for_pad_or_mask(tok):
    model = tiny(tok)
    ex, target = mask_target(model, tok, f"the cat sat on the {tok.mask_token} today")
    ids = ex.input_ids[0].tolist()
    for kind, swap in (("pad", tok.pad_token_id), ("mask", tok.mask_token_id)):
        base = baseline_ids(model, tok, ex, kind)[0].tolist()
        for i, b in zip(ids, base):
            assert b == (i if i in (tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) else swap)
    assert target.query == ids.index(tok.mask_token_id)


def test_ig_on_a_tiny_model_is_complete_batched_or_not_and_repeatable(tok):
    model = tiny(tok, task="sequence_classification")
    ex, target = class_target(model, tok, "the cat sat on the mat and slept", label=1)
    a = attribute(model, tok, ex, target, steps=64, baseline="mask")
    assert abs(a.value - a.baseline_value) > 0.1  # the prediction moves along the path
    assert a.completeness_gap <= 0.01
    assert a.total == pytest.approx(a.value - a.baseline_value, rel=0.01)
    again = attribute(model, tok, ex, target, steps=64, baseline="mask")
    assert again.scores == a.scores  # equal inputs, equal attributions
    # the same path split over many small passes gives the same numbers
    x = model.bert.embeddings.word_embeddings(ex.input_ids)[0].detach()
    points = torch.stack([x * s for s in (0.2, 0.5, 1.0)])
    v1, g1 = path_gradients(model, ex, target, points)
    v2, g2 = path_gradients(model, ex, target, points, tokens_per_pass=1)
    assert torch.allclose(v1, v2, atol=1e-6) and torch.allclose(g1, g2, atol=1e-6)
    for kind in ("pad", "mask", "zero"):
        other = attribute(model, tok, ex, target, baseline=kind)  # default steps: refined until complete
        assert other.completeness_gap <= 0.01 and other.baseline == kind


def test_the_same_input_reached_two_ways_gets_the_same_attributions(tok):
    """Typed text (the command line) and the tokens a Mask-tab prediction holds (the panel) are one input."""
    from bertlab.analysis.targets import input_from_tokens, word_target

    model = tiny(tok, seed=3)
    ex, target = mask_target(model, tok, f"the dog sat on the {tok.mask_token} today", word="mat")
    again = input_from_tokens(model, tok, ex.tokens)
    assert torch.equal(again.input_ids, ex.input_ids) and again.keep == ex.keep
    same = word_target(tok, again, target.position, target.index)
    for method in ("ig", "grad-x-input"):
        a = attribute(model, tok, ex, target, method=method, steps=20)
        b = attribute(model, tok, again, same, method=method, steps=20)
        assert a.scores == b.scores and a.value == b.value


def test_gradient_times_input_matches_finite_differences(tok):
    """x_t · ∂f/∂x_t ≈ (f(x_t scaled by 1 + ε) - f(x_t scaled by 1 - ε)) / 2ε, by forward passes only."""
    model = tiny(tok, task="sequence_classification", seed=2)
    ex, target = class_target(model, tok, "a gripping funny film", label=1)
    a = attribute(model, tok, ex, target, method="grad-x-input")
    x = model.bert.embeddings.word_embeddings(ex.input_ids).detach()  # [1, seq, d]
    eps = 1e-2  # central differences: error ~ε², float32 noise ~1e-7 / ε
    hook = model.family.embedding_part_hook("hook_word")

    def f_at(emb):
        with torch.no_grad(), model.hooks([(hook, lambda _x, _n: emb)]):
            return float(target.probability(model(ex.input_ids, token_type_ids=ex.token_type_ids))[0])

    for t in range(len(ex)):  # central differences
        up, down = x.clone(), x.clone()
        up[0, t] *= 1 + eps
        down[0, t] *= 1 - eps
        assert a.scores[t] == pytest.approx((f_at(up) - f_at(down)) / (2 * eps), rel=2e-2, abs=2e-5)
    assert a.completeness_gap is None and a.baseline_value is None


def test_every_target_kind_is_complete_on_tiny_task_models(tok):
    cls = tiny(tok, task="sequence_classification")
    ner = tiny(tok, task="token_classification", labels=5)
    ner.config.id2label = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    qa = tiny(tok, task="question_answering")
    pre = tiny(tok)
    cases = [
        class_target(cls, tok, "a film", "another film", label="L2"),
        tag_target(ner, tok, "Angela visited Paris", word="Paris", label="B-LOC"),
        span_target(qa, tok, "who went?", "the man went to the store"),
        span_target(qa, tok, "who went?", "the man went to the store", end=True),
        pair_target(pre, tok, "the man went to the store.", "he bought milk."),
    ]
    for model, (ex, target) in zip([cls, ner, qa, qa, pre], cases):
        a = attribute(model, tok, ex, target)
        assert a.completeness_gap <= GAP_AIM, target
        assert len(a.scores) == len(ex.tokens)
    ex, target = cases[1]
    assert ex.tokens[target.position] == "paris" and target.index == 3
    ex, target = cases[2]
    assert target.query >= ex.sentence_b_start and target.kind == "start"


def test_targets_refuse_what_the_model_cannot_answer(tok):
    encoder = tiny(tok, heads=())
    with pytest.raises(Exception, match="MLM"):
        mask_target(encoder, tok, f"a {tok.mask_token} b")
    with pytest.raises(InputError, match="no"):
        mask_target(tiny(tok), tok, "no mask here")
    with pytest.raises(InputError, match="sequence classification|sentence classification"):
        class_target(encoder, tok, "a film")
    with pytest.raises(InputError, match="labels"):
        class_target(tiny(tok, task="sequence_classification"), tok, "a film", label="nope")
    with pytest.raises(ValueError, match="method"):
        attribute(tiny(tok), tok, *mask_target(tiny(tok), tok, f"a {tok.mask_token} b"), method="lime")


# ---------------------------------------------------------------------------------------------
# Backward hooks
# ---------------------------------------------------------------------------------------------
def test_backward_hooks_see_the_gradient_and_leave_nothing_behind(tok):
    model = tiny(tok, task="sequence_classification")
    ids = torch.tensor([tok.encode("the cat sat").ids])
    name = model.family.hook_name(1, "hook_resid_pre")
    seen, kept = {}, {}

    def keep(x, n):
        x.retain_grad()
        kept[n] = x

    with model.hooks([(name, keep)], bwd_hooks=[(name, lambda g, n: seen.__setitem__(n, g))]):
        out = model(ids)
        out.logits[0, 1].backward()
    assert torch.equal(seen[name], kept[name].grad)
    assert not model.hook_points[name].active  # removed on exit
    with torch.no_grad(), model.hooks([], bwd_hooks=[(name, lambda g, n: seen.clear())]):
        model(ids)  # no gradient recorded: the tap does nothing
    assert seen


# ---------------------------------------------------------------------------------------------
# Does attention explain it?
# ---------------------------------------------------------------------------------------------
def test_rank_agreement_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(15, generator=g)
    b = a + 0.8 * torch.randn(15, generator=g)
    tied_a = torch.tensor([1.0, 2, 2, 3, 3, 3, 4, 5])
    tied_b = torch.tensor([2.0, 1, 2, 4, 3, 3, 6, 5])
    for x, y in ((a, b), (tied_a, tied_b)):
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-9)
        assert kendall(x, y) == pytest.approx(stats.kendalltau(x.numpy(), y.numpy()).statistic, abs=1e-9)
    assert spearman(a, a) == pytest.approx(1.0) and kendall(a, -a) == pytest.approx(-1.0)
    assert math.isnan(spearman(torch.ones(4), a[:4]))


def test_check_attention_rows_credited_heads_and_ablation_equal_head_mask(tok):
    model = tiny(tok, seed=4)
    ex, target = mask_target(model, tok, f"the man went to the {tok.mask_token} store", word="big")
    a = attribute(model, tok, ex, target, method="grad-x-input")
    check = check_attention(model, ex, target, a, heads_off=3, seed=1)
    _, cache = model.run_with_cache(ex.input_ids, names=model.family.layer_hook_names("hook_pattern"))
    patterns = cache.stack("hook_pattern")[:, 0]
    q = target.query
    assert check.raw == pytest.approx(patterns[:, :, q].mean(dim=(0, 1)).tolist(), abs=1e-6)
    words = [i for i, s in enumerate(check.scored) if s]
    assert ex.tokens[q] == tok.mask_token and q not in words
    assert check.top_attention == max(words, key=lambda i: check.raw[i])
    assert check.heads.heads_off == credited_heads(patterns, q, check.top_attention, 3)
    mask = torch.ones(2, 4)
    for la, h in check.heads.heads_off:
        mask[la, h] = 0
    with torch.no_grad():
        where = torch.zeros_like(ex.input_ids, dtype=torch.bool)
        where[0, q] = True
        expected = target.probability(model(ex.input_ids, head_mask=mask, mlm_positions=where))
    assert check.heads.ablated == pytest.approx(float(expected[0]), abs=1e-6)
    assert check.heads.base == pytest.approx(float(target_probability(model, ex, target)[0]), abs=1e-6)
    again = head_check(model, ex, target, check.heads.heads_off, seed=1)
    assert again.random_draws == check.heads.random_draws  # seeded
    one = check_attention(model, ex, target, a, layer=1, head=2, ablate=False)
    assert one.raw == pytest.approx(patterns[1, 2, q].tolist(), abs=1e-6) and one.heads is None
    with pytest.raises(IndexError, match="head 9"):
        check_attention(model, ex, target, a, layer=1, head=9)


# ---------------------------------------------------------------------------------------------
# The offline default
# ---------------------------------------------------------------------------------------------
def test_ig_is_complete_on_the_offline_default(default_model):
    model, tok = default_model
    cases = [
        mask_target(model, tok, f"The man went to the {tok.mask_token} store to buy a gallon of milk."),
        mask_target(model, tok, f"Paris is the capital of {tok.mask_token}."),
        pair_target(model, tok, "She opened the door.", "The stock market fell sharply."),
    ]
    for ex, target in cases:
        a = attribute(model, tok, ex, target)
        assert a.completeness_gap <= 0.01, (target.name, a.completeness_gap, a.steps)
        assert a.steps in (16, 48, 144, 432) and a.baseline == "pad"


# ---------------------------------------------------------------------------------------------
# bertlab explain
# ---------------------------------------------------------------------------------------------
def explain(capsys, *args: str) -> tuple[int, str, str]:
    from bertlab.cli import main

    rc = main(["explain", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_explain_prints_one_json_line_per_target_kind(tiny_checkpoints, capsys):
    import json

    rc, out, _ = explain(capsys, "--model", str(tiny_checkpoints["BertForSequenceClassification"]),
                         "--text", "a gripping film", "--target", "2", "--steps", "40")
    assert rc == 0 and out.count("\n") == 1
    d = json.loads(out)
    assert d["method"] == "ig" and d["steps"] == 40 and d["target"]["kind"] == "class" and d["target"]["index"] == 2
    assert len(d["tokens"]) == len(d["scores"]) and d["tokens"][0] == "[CLS]"
    assert d["sum"] == pytest.approx(d["target"]["probability"] - d["baseline_probability"], abs=1e-4)
    assert d["completeness_gap"] >= 0
    rc, out, _ = explain(capsys, "--model", str(tiny_checkpoints["BertForQuestionAnswering"]), "--text", "who went?",
                         "--text-b", "the man went home", "--target", "end", "--method", "grad-x-input")
    d = json.loads(out)
    assert rc == 0 and d["target"]["kind"] == "end" and "completeness_gap" not in d
    rc, out, _ = explain(capsys, "--model", str(tiny_checkpoints["BertForPreTraining"]), "--text", "the man went",
                         "--text-b", "he left", "--target", "NotNext", "--method", "grad-x-input")
    assert rc == 0 and json.loads(out)["target"]["index"] == 1


def test_explain_errors_are_one_line(tiny_checkpoints, capsys):
    rc, out, err = explain(capsys, "--model", str(tiny_checkpoints["BertModel"]), "--text", "a [MASK] b")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "MLM" in err
    rc, _, err = explain(capsys, "--model", str(tiny_checkpoints["BertForQuestionAnswering"]), "--text", "who?")
    assert rc == 1 and "--text-b" in err and err.count("\n") == 1
    rc, _, err = explain(capsys, "--model", str(tiny_checkpoints["BertForPreTraining"]), "--text", "no mask " * 30)
    assert rc == 1 and "Nothing to explain" in err and err.count("\n") == 1


def test_refining_the_grid_reuses_its_points_and_equals_the_fixed_grid():
    from bertlab.analysis.attribution import refined_integrated_gradients

    g = torch.Generator().manual_seed(2)
    w = torch.randn(6, 4, generator=g, dtype=torch.float64)
    x = 3 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    seen = []

    def f(points):  # sharp: a steep sigmoid of a tanh layer
        return torch.sigmoid(8 * torch.tanh(points @ w).sum(dim=(1, 2)))

    def counting(points):
        seen.append(points.shape[0])
        return grad_fn_of(f)(points)

    attr, fx, fb, n = refined_integrated_gradients(counting, x, torch.zeros_like(x), steps=4, aim=1e-4)
    assert n > 4 and seen == [4 + 2] + [2 * k for k in [4, 12, 36, 108, 324][: len(seen) - 1]]  # no point twice
    fixed, fx2, fb2 = integrated_gradients(grad_fn_of(f), x, torch.zeros_like(x), n, "riemann")
    assert torch.allclose(attr, fixed, atol=1e-10) and (fx, fb) == (fx2, fb2)
    assert abs(float(attr.sum()) - (fx - fb)) <= 1e-4 * abs(fx - fb)
    flat, fx, fb, n = refined_integrated_gradients(grad_fn_of(lambda p: torch.sigmoid(p.sum(dim=(1, 2)) * 0)), x,
                                                   torch.zeros_like(x), steps=4)
    assert n == 4 and fx == fb  # f(x) = f(x'): nothing to refine (the relative gap would mean nothing)
