"""Attributions: how much each input token counts for one prediction.

Integrated gradients (Sundararajan et al. 2017) on the word embeddings. The prediction f (a
probability the tabs show: a masked word's, IsNext's, a class's, an entity tag's, an answer's start
or end) is followed along the straight path from a baseline input x' to the input x; token t gets

    IG_t = (x_t - x'_t) · ∫₀¹ ∂f/∂x_t (x' + α (x - x')) dα       (summed over the embedding's width)

The baseline swaps each word's embedding for the [PAD] token's (or the mask token's, or zeros); the
special tokens, the positions and the segments stay as they are. The scores add up to f(x) - f(x')
(completeness); the integral is a quadrature whose points run in one batch, and `completeness_gap`
says how far the sum is from f(x) - f(x'). The quadrature is the midpoint rule by default: a head's
probability can flip within a short stretch of the path (the pair heads do), and there
Gauss-Legendre (Captum's default), whose points crowd the ends, missed it more often at equal cost.
With the default step count the grid is refined until the gap is under GAP_AIM: each cell cut in
three, whose middle third's midpoint is the old point, so no gradient is computed twice (16, 48,
144, 432 points).

Gradient × input: x_t · ∂f/∂x_t at the input alone (one backward pass; no completeness).

    ex, target = mask_target(model, tok, "The man went to the [MASK] store.")   # bertlab.analysis.targets
    result = attribute(model, tok, ex, target, method="ig")   # Attribution: tokens, scores, gap
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import torch

from bertlab.analysis.predict import require_head
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

Method = Literal["ig", "grad-x-input"]
METHODS: tuple[str, ...] = ("ig", "grad-x-input")
METHOD_NAMES = {"ig": "integrated gradients", "grad-x-input": "gradient × input"}
BASELINES: tuple[str, ...] = ("pad", "mask", "zero")
QUADRATURES: tuple[str, ...] = ("gausslegendre", "riemann")
TargetKind = Literal["mlm", "pair", "class", "tag", "start", "end"]
TARGET_KINDS: tuple[str, ...] = ("mlm", "pair", "class", "tag", "start", "end")
DEFAULT_RULE = "riemann"
DEFAULT_STEPS = 16  # path points to start from; tripled while the gap exceeds GAP_AIM (default steps only)
GAP_AIM = 0.01  # completeness gap (relative) the default step count keeps under
GAP_FLOOR = 1e-5  # ...or this far off in probability: when f(x) ≈ f(x'), a relative gap means nothing
AUTO_MAX_STEPS = 432
MAX_STEPS = 512
TOKENS_PER_PASS = 4096  # path points per forward/backward pass: this many tokens' worth


# ---------------------------------------------------------------------------------------------
# What is explained: one input, one probability
# ---------------------------------------------------------------------------------------------
@dataclass
class ExplainInput:
    """One encoded input, as the model reads it."""

    input_ids: torch.Tensor  # [1, seq]
    token_type_ids: torch.Tensor  # [1, seq]
    tokens: list[str]
    keep: list[bool]  # tokens the baseline keeps: the special ones ([CLS], [SEP], [MASK], [PAD])
    sentence_b_start: int | None = None
    warning: str | None = None  # set when the text was cut to fit the model

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Target:
    """The probability explained. kind: "mlm" (vocabulary piece `index` at token `position`),
    "pair" (the NSP/SOP head's label `index`), "class" (a sentence classifier's label `index`),
    "tag" (a token classifier's label `index` at token `position`), "start" / "end" (a QA answer
    starting / ending at token `index`)."""

    kind: str
    index: int
    position: int | None = None
    name: str = ""  # what the student reads: "P('store' at [MASK], token 6)"

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; kinds are {', '.join(TARGET_KINDS)}.")
        if self.kind in ("mlm", "tag") and self.position is None:
            raise ValueError(f"a {self.kind} target needs the token position it is read at.")

    @property
    def query(self) -> int:
        """The token whose vector the head reads: the masked or tagged token, the answer's start/end,
        or the first token for the sentence heads."""
        if self.kind in ("mlm", "tag"):
            return int(self.position)
        if self.kind in ("start", "end"):
            return self.index
        return 0

    def probability(self, out) -> torch.Tensor:
        """f for each row of a batched ModelOutput: [batch] probabilities (float32)."""
        if self.kind == "mlm":
            logits = out.mlm_logits  # [batch, vocab]: the head ran at `position` only
        elif self.kind == "pair":
            logits = out.nsp_logits  # [batch, 2]
        elif self.kind == "class":
            logits = out.logits  # [batch, labels]
        elif self.kind == "tag":
            logits = out.logits[:, self.position]  # [batch, labels]
        else:
            logits = out.start_logits if self.kind == "start" else out.end_logits  # [batch, seq]
        return logits.float().softmax(-1)[:, self.index]


@dataclass
class Attribution:
    """Per-token scores for one prediction, in units of the probability explained."""

    tokens: list[str]
    scores: list[float]  # one per token; IG: they add up to value - baseline_value
    method: str  # "ig" or "grad-x-input"
    target: Target
    value: float  # f(x): the probability at the input
    baseline_value: float | None = None  # f(x'): at the baseline (IG)
    baseline: str | None = None  # "pad", "mask" or "zero" (IG)
    steps: int | None = None  # quadrature points (IG)
    quadrature: str | None = None
    keep: list[bool] = field(default_factory=list)  # tokens the baseline kept (special tokens)
    warning: str | None = None

    @property
    def total(self) -> float:
        return float(sum(self.scores))

    @property
    def completeness_gap(self) -> float | None:
        """|Σ scores - (f(x) - f(x'))| / |f(x) - f(x')| (IG; None for gradient × input).
        0 when both are 0."""
        if self.baseline_value is None:
            return None
        delta = self.value - self.baseline_value
        err = abs(self.total - delta)
        return 0.0 if err == 0 else err / max(abs(delta), 1e-12)

    def as_json(self, digits: int = 6) -> dict:
        """The result as plain JSON values (what `bertlab explain` prints)."""
        out = {
            "tokens": self.tokens,
            "scores": [round(s, digits) for s in self.scores],
            "method": self.method,
            "target": {"kind": self.target.kind, "index": self.target.index, "position": self.target.position,
                       "name": self.target.name, "probability": round(self.value, digits)},
        }
        if self.method == "ig":
            out.update(baseline=self.baseline, baseline_probability=round(self.baseline_value, digits),
                       steps=self.steps, quadrature=self.quadrature, sum=round(self.total, digits),
                       completeness_gap=round(self.completeness_gap, digits))
        if self.warning:
            out["warning"] = self.warning
        return out


# ---------------------------------------------------------------------------------------------
# The attributions
# ---------------------------------------------------------------------------------------------
def quadrature(steps: int, rule: str = DEFAULT_RULE) -> tuple[torch.Tensor, torch.Tensor]:
    """(alphas [steps], weights [steps]) on [0, 1]: Σ w·g(α) ≈ ∫₀¹ g. Gauss-Legendre (exact for
    polynomials up to degree 2·steps - 1) or the midpoint Riemann sum."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be 1..{MAX_STEPS}; got {steps}.")
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(steps)
        return torch.tensor((x + 1) / 2, dtype=torch.float64), torch.tensor(w / 2, dtype=torch.float64)
    if rule == "riemann":
        return (torch.arange(steps, dtype=torch.float64) + 0.5) / steps, torch.full((steps,), 1.0 / steps,
                                                                                    dtype=torch.float64)
    raise ValueError(f"unknown quadrature {rule!r}; use {' or '.join(QUADRATURES)}.")


def baseline_ids(model: torch.nn.Module, tok: Tokenizer, ex: ExplainInput, baseline: str = "pad") -> torch.Tensor:
    """[1, seq] ids of the baseline input: every token the baseline does not keep becomes the
    family's pad (or mask) token, read from the tokenizer through `model.family.special_tokens`."""
    if baseline not in ("pad", "mask"):
        raise ValueError(f"baseline ids exist for 'pad' and 'mask', not {baseline!r}.")
    _, swap = model.family.special_tokens(tok)[baseline]
    keep = torch.tensor(ex.keep, device=ex.input_ids.device)[None]  # [1, seq]
    return torch.where(keep, ex.input_ids, torch.full_like(ex.input_ids, swap))


def attribute(
    model: torch.nn.Module,
    tok: Tokenizer,
    ex: ExplainInput,
    target: Target,
    method: str = "ig",
    steps: int | None = None,
    baseline: str = "pad",
    rule: str = DEFAULT_RULE,
) -> Attribution:
    """Per-token attribution of `target`'s probability for input `ex` (see the module's docstring).
    steps: quadrature points for IG (None: DEFAULT_STEPS midpoints, tripled while the completeness
    gap is over GAP_AIM, up to AUTO_MAX_STEPS; with rule "gausslegendre", doubled); baseline: "pad",
    "mask" or "zero"; rule: "riemann" (midpoint) or "gausslegendre"."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use {' or '.join(METHODS)}.")
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}.")
    _require_target_head(model, target)
    words = model.family.embeddings(model).word_embeddings
    with torch.no_grad():
        x = words(ex.input_ids)[0].float()  # [seq, d_emb]
        if baseline == "zero":
            keep = torch.tensor(ex.keep, device=x.device)[:, None]
            base = torch.where(keep, x, torch.zeros_like(x))
        else:
            base = words(baseline_ids(model, tok, ex, baseline))[0].float()  # [seq, d_emb]
    if method == "grad-x-input":
        values, grads = path_gradients(model, ex, target, x[None])  # [1], [1, seq, d]
        scores = (grads[0] * x).sum(-1)  # [seq]
        return Attribution(list(ex.tokens), scores.tolist(), method, target, float(values[0]),
                           keep=list(ex.keep), warning=ex.warning)
    if steps is None and rule == "riemann":
        elementwise, value, base_value, steps = refined_integrated_gradients(
            lambda points: path_gradients(model, ex, target, points), x, base,
            value_fn=lambda points: path_values(model, ex, target, points))
        return Attribution(list(ex.tokens), elementwise.sum(-1).tolist(), "ig", target, value=value,
                           baseline_value=base_value, baseline=baseline, steps=steps, quadrature=rule,
                           keep=list(ex.keep), warning=ex.warning)
    if steps is None:
        steps = DEFAULT_STEPS
        result = _integrated(model, ex, target, x, base, steps, rule, baseline)
        while not _complete(result.total, result.value, result.baseline_value) and steps < AUTO_MAX_STEPS:
            steps *= 2
            result = _integrated(model, ex, target, x, base, steps, rule, baseline)
        return result
    return _integrated(model, ex, target, x, base, int(steps), rule, baseline)


def refined_integrated_gradients(
    grad_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    base: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    aim: float = GAP_AIM,
    max_steps: int = AUTO_MAX_STEPS,
    value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, float, float, int]:
    """Integrated gradients with the midpoint rule, the grid cut in three until the completeness gap
    is at most `aim` or the sum is within GAP_FLOOR of f(x) - f(x') (or the points would pass
    `max_steps`): the middle third's midpoint is the old point, so each refinement adds only the two
    new points per cell. grad_fn and value_fn as for `integrated_gradients`. Returns (attributions
    [*x.shape] float64, f(x), f(x'), points used); equal to `integrated_gradients(..., points used,
    "riemann")` up to rounding."""
    shape = (-1,) + (1,) * x.dim()
    diff = (x - base).double()
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    grads, base_value, value = _path_and_ends(grad_fn, value_fn, x, base, alphas)
    total = grads.double().sum(0)  # Σ ∂f/∂x over the points so far
    n = steps
    while True:
        attr = total / n * diff
        if _complete(float(attr.sum()), value, base_value, aim) or 3 * n > max_steps:
            return attr, value, base_value, n
        cells = torch.arange(n, dtype=torch.float64)
        new = torch.cat([(cells + 1 / 6) / n, (cells + 5 / 6) / n])  # the thirds' outer midpoints
        _, more = grad_fn(base[None] + new.to(x.dtype).to(x.device).view(shape) * (x - base)[None])
        total = total + more.double().sum(0)
        n *= 3


def _complete(total: float, value: float, base_value: float, aim: float = GAP_AIM) -> bool:
    """Whether the scores' sum is within `aim` of f(x) - f(x') (relative), or within GAP_FLOOR."""
    err = abs(total - (value - base_value))
    return err <= aim * abs(value - base_value) or err <= GAP_FLOOR


def _integrated(model: torch.nn.Module, ex: ExplainInput, target: Target, x: torch.Tensor, base: torch.Tensor,
                steps: int, rule: str, baseline: str) -> Attribution:
    """IG with `steps` points from word embeddings `base` to `x` (both [seq, d_emb])."""
    elementwise, value, base_value = integrated_gradients(
        lambda points: path_gradients(model, ex, target, points), x, base, steps, rule,
        value_fn=lambda points: path_values(model, ex, target, points))
    scores = elementwise.sum(-1)  # [seq]: summed over the embedding's width
    return Attribution(list(ex.tokens), scores.tolist(), "ig", target, value=value, baseline_value=base_value,
                       baseline=baseline, steps=steps, quadrature=rule, keep=list(ex.keep), warning=ex.warning)


def integrated_gradients(
    grad_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    base: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    rule: str = DEFAULT_RULE,
    value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, float, float]:
    """Integrated gradients of any f, element by element: (x - x') · Σ_i w_i ∂f/∂x(x' + α_i (x - x')).

    grad_fn(points [n, *x.shape]) -> (f [n], ∂f/∂points [n, *x.shape]) is called once with every
    path point in one batch (it may split it); value_fn(points) -> f [n] gives f at the two ends
    (without it, the ends join grad_fn's batch). Returns (attributions [*x.shape] float64, f(x), f(x'))."""
    alphas, weights = quadrature(steps, rule)
    shape = (-1,) + (1,) * x.dim()
    grads, base_value, value = _path_and_ends(grad_fn, value_fn, x, base, alphas)
    w = weights.to(x.device).view(shape)
    avg_grad = (grads.double() * w).sum(0)  # ≈ ∫₀¹ ∂f/∂x dα
    return avg_grad * (x - base).double(), value, base_value


def _path_and_ends(grad_fn, value_fn, x: torch.Tensor, base: torch.Tensor,
                   alphas: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """(∂f/∂x at x' + α (x - x') for each alpha [n, *x.shape], f(x'), f(x))."""
    shape = (-1,) + (1,) * x.dim()
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
    if value_fn is not None:
        a = alphas.to(x.dtype).to(x.device).view(shape)
        _, grads = grad_fn(base[None] + a * (x - base)[None])
        values = value_fn(torch.stack([base, x]))
        return grads, float(values[0]), float(values[1])
    a = torch.cat([alphas, ends]).to(x.dtype).to(x.device).view(shape)  # the path, then x' and x
    values, grads = grad_fn(base[None] + a * (x - base)[None])
    return grads[: len(alphas)], float(values[-2]), float(values[-1])


def path_gradients(model: torch.nn.Module, ex: ExplainInput, target: Target, points: torch.Tensor,
                   tokens_per_pass: int = TOKENS_PER_PASS) -> tuple[torch.Tensor, torch.Tensor]:
    """f and ∂f/∂(word embeddings) at each of `points` [n, seq, d_emb] (word embeddings put in place
    of the input's through the `hook_word` hook point; positions and segments are the input's).
    Returns (values [n], gradients [n, seq, d_emb]), float32 on the model's device. Batched:
    `tokens_per_pass` tokens per forward/backward pass."""
    hook = model.family.embedding_part_hook("hook_word")
    seq = ex.input_ids.shape[1]
    rows = max(1, tokens_per_pass // seq)
    dtype = model.family.embeddings(model).word_embeddings.weight.dtype
    values, grads = [], []
    with eval_mode(model), torch.enable_grad():
        for chunk in points.split(rows):
            n = chunk.shape[0]
            leaf = chunk.to(dtype).detach().requires_grad_()

            def put(_x: torch.Tensor, _name: str, leaf=leaf) -> torch.Tensor:
                return leaf  # [n, seq, d_emb] in place of the word embeddings

            kwargs = head_kwargs(model, target, n, seq, ex.input_ids.device)
            with model.hooks([(hook, put)]):
                out = model(ex.input_ids.expand(n, -1), token_type_ids=ex.token_type_ids.expand(n, -1), **kwargs)
            f = target.probability(out)  # [n]
            (g,) = torch.autograd.grad(f.sum(), leaf)  # rows are independent: row i's gradient is ∂f_i/∂x_i
            values.append(f.detach().float())
            grads.append(g.float())
    return torch.cat(values), torch.cat(grads)


def path_values(model: torch.nn.Module, ex: ExplainInput, target: Target, points: torch.Tensor) -> torch.Tensor:
    """f at each of `points` [n, seq, d_emb] put in place of the word embeddings (no gradients): [n]."""
    hook = model.family.embedding_part_hook("hook_word")
    n, seq = points.shape[:2]
    dtype = model.family.embeddings(model).word_embeddings.weight.dtype
    kwargs = head_kwargs(model, target, n, seq, ex.input_ids.device)
    with eval_mode(model), torch.inference_mode(), model.hooks([(hook, lambda _x, _name: points.to(dtype))]):
        out = model(ex.input_ids.expand(n, -1), token_type_ids=ex.token_type_ids.expand(n, -1), **kwargs)
        return target.probability(out).float()


def target_probability(model: torch.nn.Module, ex: ExplainInput, target: Target,
                       head_masks: torch.Tensor | None = None) -> torch.Tensor:
    """f at the input, one row per head mask [n, layer, head] (1 on, 0 off; None: all on): [n], on the CPU.
    A head is switched off by scaling its `hook_z` output (as `model(..., head_mask=...)` does)."""
    cfg = model.config
    if head_masks is None:
        head_masks = torch.ones(1, cfg.num_hidden_layers, cfg.num_attention_heads)
    device = model_device(model)
    head_masks = head_masks.to(device)
    n, seq = head_masks.shape[0], ex.input_ids.shape[1]
    hooks = []
    for layer in range(cfg.num_hidden_layers):
        m = head_masks[:, layer]  # [n, head]
        if not bool(m.all()):
            def scale(z: torch.Tensor, _name: str, m=m) -> torch.Tensor:
                return z * m.to(z.dtype)[:, None, :, None]  # z: [batch, seq, head, d_head]

            hooks.append((model.family.hook_name(layer, "hook_z"), scale))
    kwargs = head_kwargs(model, target, n, seq, device)
    with eval_mode(model), torch.inference_mode(), model.hooks(hooks):
        out = model(ex.input_ids.expand(n, -1), token_type_ids=ex.token_type_ids.expand(n, -1), **kwargs)
        return target.probability(out).float().cpu()


def head_kwargs(model: torch.nn.Module, target: Target, n: int, seq: int, device: torch.device) -> dict:
    """`mlm_positions` for a model with an MLM head: run it only where the target reads it (nowhere
    unless the target is a word), not over the whole vocabulary at every token."""
    if not model.has_mlm:
        return {}
    where = torch.zeros(n, seq, dtype=torch.bool, device=device)  # [n, seq]
    if target.kind == "mlm":
        where[:, target.position] = True
    return {"mlm_positions": where}


def _require_target_head(model: torch.nn.Module, target: Target) -> None:
    if target.kind == "mlm":
        model.require("mlm")
    elif target.kind == "pair":
        model.require("nsp")
    elif target.kind == "class":
        require_head(model, "sequence_classification", "Explaining a class")
    elif target.kind == "tag":
        require_head(model, "token_classification", "Explaining an entity tag")
    else:
        require_head(model, "question_answering", "Explaining an answer")
