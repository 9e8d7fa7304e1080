"""Six attention masks on one sentence, built by `bertlab.masks` (the grids the code applies), and the
model's own attention run under one of them.

BERT reads both ways; GPT left to right; UniLM's seq2seq reads its source both ways and its target left to
right; Longformer reads a window with global tokens; Reformer reads the tokens hashed into the same bucket;
Transformer-XL reads its segment and the previous one. Each mask is a boolean grid `allowed[query, key]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bertlab import masks
from bertlab.inputs import optional_text, require_text
from bertlab.runtime import eval_mode
from bertlab.tokenizer import Tokenizer

MASK_NAMES = ("bidirectional", "left-to-right", "prefix", "sliding window", "LSH buckets", "segment recurrence")


@dataclass
class MaskView:
    """One mask on the sentence: `allowed[query, key]` True where the query may read the key."""

    name: str  # one of MASK_NAMES
    title: str  # "Bidirectional (BERT)"
    description: str  # one line: what each token may read
    allowed: torch.Tensor  # [n, n] bool

    @property
    def allowed_pairs(self) -> int:
        """How many (query, key) pairs are read: the attention's work, out of n² for full attention."""
        return int(self.allowed.sum())


@dataclass
class MasksResult:
    """The six masks of one input, and what they were built from."""

    tokens: list[str]  # one per position, as the tokenizer spells them
    labels: list[str]  # the tokens as a student reads them
    masks: list[MaskView]  # in MASK_NAMES order
    input_ids: torch.Tensor  # [1, n]
    token_type_ids: torch.Tensor  # [1, n]
    sentence_b_start: int | None
    buckets: torch.Tensor  # [n] the LSH bucket of each token
    warning: str | None = None  # set when the text was cut to fit
    text_a: str = ""
    text_b: str | None = None
    settings: dict[str, int] = field(default_factory=dict)  # window, segment, buckets, seed, source

    @property
    def n(self) -> int:
        return len(self.tokens)

    def mask(self, name: str) -> MaskView:
        for m in self.masks:
            if m.name == name:
                return m
        raise ValueError(f"no mask named {name!r}; the masks are {', '.join(MASK_NAMES)}.")


def query_vectors(model: torch.nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                  layer: int = 0) -> torch.Tensor:
    """The query vectors of `layer` (every head side by side) for one input [1, n]: [n, d_model]."""
    name = model.family.hook_name(layer, "hook_q")
    with eval_mode(model), torch.inference_mode():
        _, cache = model.run_with_cache(input_ids, token_type_ids=token_type_ids, names=[name])
    q = cache[name][0]  # [n, head, d_head]
    return q.reshape(q.shape[0], -1).to("cpu", torch.float32)


def build_masks(model: torch.nn.Module, tok: Tokenizer, a: str, b: str | None = None, window: int = 2,
                segment: int = 4, n_buckets: int = 4, seed: int = 0, max_length: int = 64) -> MasksResult:
    """The six masks for sentence `a` (and `b`) as `tok` splits it: the prefix's source is [CLS] A [SEP] when
    there is a B, else the first half; the window is ±`window` tokens with the first token ([CLS]) global;
    the LSH buckets hash the model's layer-0 query vectors (`n_buckets`, rotation seeded by `seed`); the
    segments hold `segment` tokens. Text longer than `max_length` tokens is cut (`warning` says so)."""
    a = require_text(a if isinstance(a, str) else None)
    b = optional_text(b, "second sentence (B)")
    for value, what, low in ((window, "window", 0), (segment, "segment", 1), (max_length, "max_length", 3)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"The {what} must be a whole number of at least {low}, not {value!r}.")
    limit = model.config.max_position_embeddings - model.config.position_offset
    max_length = min(max_length, limit)
    enc = tok.encode(a, b, max_length=max_length)
    warning = None
    if enc.truncated:
        warning = (f"The text is {len(enc) + enc.num_truncated} tokens long; the masks are drawn for the first "
                   f"{max_length} (so that a cell stays visible), {enc.num_truncated} were cut.")
    n = len(enc)
    input_ids, token_type_ids = torch.tensor([enc.ids]), torch.tensor([enc.type_ids])  # [1, n]
    b_start = enc.sequence_ids.index(1) if 1 in enc.sequence_ids else None
    source = b_start if b_start is not None else n // 2
    buckets = masks.lsh_buckets(query_vectors(model, input_ids, token_type_ids), n_buckets, seed)
    cls = tok.cls_token
    where = "sentence A with its specials" if b_start is not None else "the first half"
    views = [
        MaskView("bidirectional", "Bidirectional (BERT)", "every token reads every token, left and right",
                 masks.bidirectional(n)),
        MaskView("left-to-right", "Causal (GPT)", "each token reads itself and the tokens to its left",
                 masks.causal(n)),
        MaskView("prefix", "Prefix (UniLM seq2seq)",
                 f"the source ({where}, {source} tokens) reads itself both ways; the rest reads the source and "
                 "its own left", masks.prefix(n, source)),
        MaskView("sliding window", "Sliding window (Longformer)",
                 f"each token reads ±{window} tokens; {cls} is global: it reads and is read by all",
                 masks.sliding_window(n, window, (0,))),
        MaskView("LSH buckets", "LSH buckets (Reformer)",
                 f"tokens hashed into {n_buckets} buckets by their layer-0 queries read their own bucket only",
                 masks.lsh_hash(buckets)),
        MaskView("segment recurrence", "Segment recurrence (Transformer-XL)",
                 f"segments of {segment}: a token reads its segment up to itself and all of the previous "
                 "segment (cached states)", masks.segment_recurrence(n, segment)),
    ]
    return MasksResult(
        tokens=list(enc.tokens), labels=tok.readable_pieces(enc.tokens), masks=views, input_ids=input_ids,
        token_type_ids=token_type_ids, sentence_b_start=b_start, buckets=buckets, warning=warning, text_a=a,
        text_b=b, settings=dict(window=window, segment=segment, buckets=n_buckets, seed=seed, source=source),
    )


def masked_patterns(model: torch.nn.Module, result: MasksResult, name: str) -> torch.Tensor:
    """The model's attention on `result`'s input with mask `name` applied in every layer: `masks.additive` of
    the grid is added to each head's scores before the softmax (on top of the model's own masks, e.g. a
    ModernBERT local band). -> [layers, heads, query, key] float32; a row sums to 1 over its allowed keys."""
    add = masks.additive(result.mask(name).allowed)  # [1, 1, query, key]
    scores = model.family.layer_hook_names("hook_scores")
    names = model.family.layer_hook_names("hook_pattern")
    kept: dict[str, torch.Tensor] = {}

    def apply(x: torch.Tensor, hook: str) -> torch.Tensor:
        return x + add.to(x.dtype)

    def keep(x: torch.Tensor, hook: str) -> None:
        kept[hook] = x.detach()

    with eval_mode(model), torch.inference_mode(), model.hooks([(scores, apply), (names, keep)]):
        model(result.input_ids, token_type_ids=result.token_type_ids,
              mlm_positions=torch.zeros_like(result.input_ids, dtype=torch.bool) if model.has_mlm else None)
    return torch.stack([kept[h][0] for h in names]).to("cpu", torch.float32)
