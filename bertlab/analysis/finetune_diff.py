"""Before and after fine-tuning: how much each layer's attention and representations changed, and the
loss around the fine-tuned weights.

    diff = finetune_diff(base, tuned, tok)          # on PROBE_SENTENCES
    diff.attention_jsd      # [layer, head] Jensen-Shannon divergence of the patterns, bits (0..1)
    diff.cka, diff.cosine   # [stage] linear CKA and mean cosine of the token vectors (1 = unchanged)
    loss_slice(tuned, lambda m: loss_of(m), seed=0)   # the loss along a filter-normalised random direction

Hao et al. (2019, "Visualizing and understanding the effectiveness of BERT") compare attention and
representations before and after fine-tuning, layer by layer, and plot loss landscapes; the directions
are filter-normalised as in Li et al. (2018, "Visualizing the loss landscape of neural nets").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from bertlab.analysis.similarity import stage_names
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

# A fixed probe set: everyday sentences of several kinds (the same for every run, so runs compare).
PROBE_SENTENCES: tuple[str, ...] = (
    "The film was a delight from start to finish.",
    "I would not watch this movie again.",
    "A man is playing a guitar on a stage.",
    "Two children are running through a field of flowers.",
    "Angela Merkel met Emmanuel Macron in Paris on Monday.",
    "The Eiffel Tower was designed by the company of Gustave Eiffel.",
    "Who wrote the first novel about the sea?",
    "The river flooded the village after three days of rain.",
    "She poured a cup of coffee and sat down by the window.",
    "Prices rose sharply after the bank raised interest rates.",
    "The plot is thin, but the acting is wonderful.",
    "Scientists found water ice near the south pole of the Moon.",
    "He forgot his keys, so he waited outside in the cold.",
    "The team won the match in the final minute.",
    "Nobody expected the old bridge to hold for so long.",
    "Our train was late because of snow on the tracks.",
)
SLICE_POINTS = 9  # loss evaluated at this many points from -radius to +radius


# ---------------------------------------------------------------------------------------------
# The measures
# ---------------------------------------------------------------------------------------------
def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in bits (0 = equal, 1 = disjoint) of distributions along the last axis:
    [..., n] x [..., n] -> [...]. Zeros are fine (0 log 0 = 0)."""
    p, q = p.double(), q.double()
    m = (p + q) / 2
    kl_pm = torch.special.xlogy(p, p).sum(-1) - torch.special.xlogy(p, m).sum(-1)
    kl_qm = torch.special.xlogy(q, q).sum(-1) - torch.special.xlogy(q, m).sum(-1)
    return ((kl_pm + kl_qm) / 2 / torch.log(torch.tensor(2.0, dtype=torch.float64))).clamp(min=0).float()


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear centred kernel alignment of two sets of the same n examples, x [n, d1], y [n, d2]:
    1 when y is x rotated and scaled (any orthogonal Q: cka(x, x @ Q) = 1), 0 when unrelated
    (Kornblith et al. 2019). Rows of zeros only: 0."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA compares the same examples: got {x.shape[0]} and {y.shape[0]} rows.")
    x = x.double() - x.double().mean(0, keepdim=True)
    y = y.double() - y.double().mean(0, keepdim=True)
    cross = (y.T @ x).pow(2).sum()
    norm = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    return float(cross / norm) if norm > 0 else 0.0


@dataclass
class FinetuneDiff:
    """How a fine-tuned model differs from its base on a set of sentences."""

    attention_jsd: torch.Tensor  # [layer, head] mean JSD (bits) of each query token's attention row
    cka: torch.Tensor  # [stage] linear CKA of the token vectors (stage 0 = embeddings)
    cosine: torch.Tensor  # [stage] mean cosine of each token's vector before and after
    stage_names: list[str]
    sentences: int  # how many sentences
    tokens: int  # how many tokens (the rows CKA compares)

    @property
    def layer_jsd(self) -> torch.Tensor:
        """[layer] mean JSD over the layer's heads."""
        return self.attention_jsd.mean(-1)


def _encode(model: Bert, tok: Tokenizer, sentences: Sequence[str]):
    encs = [tok.encode(s, max_length=min(128, model.config.max_position_embeddings - model.config.position_offset))
            for s in sentences]
    return tok.pad(encs)


def _read(model: Bert, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(patterns [layer, batch, head, q, k], states [stage, batch, seq, d]), float32 on CPU."""
    family = model.family
    pattern_names = family.layer_hook_names("hook_pattern")
    state_names = [family.embedding_hook, *family.layer_hook_names("hook_resid_post")]
    device = model_device(model)
    nowhere = torch.zeros(batch.input_ids.shape, dtype=torch.bool, device=device)  # skip the MLM decoder
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(
            batch.input_ids.to(device), token_type_ids=batch.token_type_ids.to(device),
            attention_mask=batch.attention_mask.to(device), mlm_positions=nowhere if model.has_mlm else None,
            names=pattern_names + state_names,
        )
    patterns = torch.stack([cache[n] for n in pattern_names]).to("cpu", torch.float32)
    states = torch.stack([cache[n] for n in state_names]).to("cpu", torch.float32)
    return patterns, states


def finetune_diff(base: Bert, tuned: Bert, tok: Tokenizer, sentences: Sequence[str] = PROBE_SENTENCES) -> FinetuneDiff:
    """Attention (JSD per head) and representation (CKA and mean cosine per stage) change from `base` to
    `tuned` on `sentences`, padding left out. The two must have the same layers, heads and width."""
    shape = lambda m: (m.config.num_hidden_layers, m.config.num_attention_heads, m.config.hidden_size)  # noqa: E731
    if shape(base) != shape(tuned):
        raise InputError(f"the two models differ in shape (layers, heads, width): {shape(base)} and {shape(tuned)}; "
                         "compare a fine-tuned model with the model it started from.")
    if not sentences:
        raise InputError("give at least one sentence to compare the models on.")
    batch = _encode(base, tok, sentences)
    pa, sa = _read(base, batch)
    pb, sb = _read(tuned, batch)
    real = batch.attention_mask.bool()  # [batch, seq]
    jsd = js_divergence(pa, pb)  # [layer, batch, head, q]
    weight = real[None, :, None, :].float()  # queries that are tokens
    per_head = (jsd * weight).sum((1, 3)) / weight.sum((1, 3))  # [layer, head]
    xa, xb = sa[:, real], sb[:, real]  # [stage, tokens, d]
    cka = torch.tensor([linear_cka(a, b) for a, b in zip(xa, xb)])
    cos = torch.nn.functional.cosine_similarity(xa, xb, dim=-1, eps=1e-8).mean(-1)  # [stage]
    return FinetuneDiff(per_head, cka, cos, stage_names(base.config.num_hidden_layers), len(sentences),
                        int(real.sum()))


# ---------------------------------------------------------------------------------------------
# A 1-D slice of the loss landscape
# ---------------------------------------------------------------------------------------------
@dataclass
class LossSlice:
    """The loss at weights + alpha x direction, for a filter-normalised random direction."""

    alphas: list[float]
    losses: list[float]
    seed: int

    @property
    def centre(self) -> float:
        """The loss at alpha = 0 (the model itself)."""
        return self.losses[min(range(len(self.alphas)), key=lambda i: abs(self.alphas[i]))]


def filter_normalised_direction(model: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A random direction in weight space, name -> tensor: Gaussian, then each filter (a row: one output
    unit, or one token's embedding) rescaled to the norm of the same row of the weights. Biases and
    LayerNorm weights (1-d) get no component (Li et al. 2018)."""
    out = {}
    for name, p in model.named_parameters():
        if not p.is_floating_point():
            continue
        if p.dim() <= 1:
            out[name] = torch.zeros_like(p)
            continue
        d = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device, p.dtype)
        rows, w = d.flatten(1), p.detach().flatten(1)
        rows = rows * (w.norm(dim=1, keepdim=True) / rows.norm(dim=1, keepdim=True).clamp(min=1e-12))
        out[name] = rows.view_as(p)
    return out


def loss_slice(model: torch.nn.Module, loss: Callable[[torch.nn.Module], torch.Tensor], radius: float = 1.0,
               points: int = SLICE_POINTS, seed: int = 0) -> LossSlice:
    """`loss(model)` at `points` evenly spaced alphas in [-radius, radius] along one filter-normalised random
    direction (seeded), in eval mode, without gradients. `model` is not changed (a copy is moved)."""
    if points < 2 or radius <= 0:
        raise ValueError(f"need points >= 2 and radius > 0 (got {points}, {radius}).")
    moved = copy.deepcopy(model).eval()
    direction = filter_normalised_direction(moved, torch.Generator().manual_seed(seed))
    params = dict(moved.named_parameters())
    start = {n: params[n].detach().clone() for n in direction}
    alphas = [radius * (2 * i / (points - 1) - 1) for i in range(points)]
    losses = []
    with torch.inference_mode():
        for a in alphas:
            for n, d in direction.items():
                params[n].copy_(start[n] + a * d)
            losses.append(float(loss(moved)))
    return LossSlice(alphas, losses, seed)
