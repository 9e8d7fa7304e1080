"""Activation patching (causal tracing) for one masked word: run the *corrupted* sentence, copy one
activation from the *clean* run into it, and measure how much of the clean behaviour comes back.

One generic function, `patch_runs`, takes a list of patches — each a hook name and an index into that
activation (batch axis left out) — and runs them as rows of batched forward passes, one patch per row,
with a metric passed in. The grids are lists of patches:

- the residual stream after the embeddings and after each layer × positions (`residual_grid`),
- each layer's attention output and MLP output × positions (`component_grid`),
- each head of one layer × positions, and each head at every position at once (`head_grid`).

The metric here is the logit difference answer − wrong at the [MASK]; a patch's *recovery* is
(patched − corrupt) / (clean − corrupt): 0 = no effect, 1 = the clean difference restored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from bertlab.analysis import normalise_masks
from bertlab.analysis.ablation import target_piece_id
from bertlab.analysis.similarity import encode_input
from bertlab.families.bert import Bert
from bertlab.inputs import InputError, echo, require_text
from bertlab.model import ModelOutput
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

TOKENS_PER_BATCH = 4096  # patched runs per forward pass: this many tokens in all
Index = tuple  # an index into one example's activation, e.g. (position,) or (position, head)
Metric = Callable[[ModelOutput], torch.Tensor]  # a batch's output -> one number per row [batch]
KINDS = ("residual", "attention", "mlp")  # what `component_grid` patches: resid_post, attn_out, mlp_out


@dataclass(frozen=True)
class Patch:
    """Copy the clean activation at `hook_name`[index] into the corrupted run (index leaves out the batch axis)."""

    hook_name: str
    index: Index


@dataclass
class PatchingInput:
    """A clean and a corrupted sentence of equal length, each with one [MASK] at the same place, and the
    two vocabulary pieces whose logit difference there is followed."""

    clean_text: str
    corrupt_text: str
    tokens: list[str]  # the clean sentence's tokens
    corrupt_tokens: list[str]
    clean_ids: torch.Tensor  # [1, seq]
    corrupt_ids: torch.Tensor  # [1, seq]
    token_type_ids: torch.Tensor  # [1, seq]
    position: int  # token index of the [MASK]
    answer: str
    wrong: str
    answer_id: int
    wrong_id: int

    @property
    def differing(self) -> list[int]:
        """Positions where the two sentences have different tokens."""
        return [i for i, (a, b) in enumerate(zip(self.clean_ids[0].tolist(), self.corrupt_ids[0].tolist())) if a != b]


def patching_input(model: Bert, tok: Tokenizer, clean: str, corrupt: str, answer: str, wrong: str) -> PatchingInput:
    """Check and encode the pair; InputError (a message saying what to change) when the sentences differ in
    length, lack the [MASK] or put it in different places, or when a word is not one vocabulary piece."""
    model.require("mlm")
    mask = tok.mask_token
    texts = {}
    for what, text in (("clean", clean), ("corrupted", corrupt)):
        text = normalise_masks(require_text(text, f"{what} sentence"), tok)
        texts[what] = (text, encode_input(model, tok, text, what=f"{what} sentence"))
    (clean, c), (corrupt, k) = texts["clean"], texts["corrupted"]
    if len(c) != len(k):
        raise InputError(
            f"The clean sentence has {len(c)} pieces ({' '.join(c.tokens)}) and the corrupted one {len(k)} "
            f"({' '.join(k.tokens)}). Patching copies activations position by position, so both need the same "
            f"number of pieces: change the corrupted sentence only by swapping a word for one that splits into "
            f"as many pieces (e.g. a name for a name)."
        )
    where = {}
    for what, enc in (("clean", c), ("corrupted", k)):
        masks = [i for i, t in enumerate(enc.ids) if t == tok.mask_token_id]
        if len(masks) != 1:
            raise InputError(f"The {what} sentence has {len(masks)} {mask} tokens: put exactly one {mask} where "
                             f"the answer goes, e.g. 'The capital of France is {mask}.'")
        where[what] = masks[0]
    if where["clean"] != where["corrupted"]:
        raise InputError(f"The {mask} is piece {where['clean']} of the clean sentence but piece "
                         f"{where['corrupted']} of the corrupted one: keep it in the same place in both.")
    answer_id, wrong_id = target_piece_id(tok, answer), target_piece_id(tok, wrong)
    if answer_id == wrong_id:
        raise InputError(f"The answer and the wrong word are both {echo(answer)}: pick two different words.")
    device = model_device(model)
    return PatchingInput(
        clean_text=clean, corrupt_text=corrupt, tokens=list(c.tokens), corrupt_tokens=list(k.tokens),
        clean_ids=torch.tensor([c.ids], device=device), corrupt_ids=torch.tensor([k.ids], device=device),
        token_type_ids=torch.tensor([c.type_ids], device=device), position=where["clean"],
        answer=tok.id_to_token(answer_id), wrong=tok.id_to_token(wrong_id), answer_id=answer_id, wrong_id=wrong_id,
    )


def logit_diff_metric(inp: PatchingInput) -> Metric:
    """answer − wrong logit at the [MASK], one number per row (the runs ask the MLM head only there)."""

    def metric(out: ModelOutput) -> torch.Tensor:
        logits = out.mlm_logits.float()  # [batch, vocab]: one [MASK] per row
        return logits[:, inp.answer_id] - logits[:, inp.wrong_id]

    return metric


def _run(model: Bert, inp: PatchingInput, ids: torch.Tensor, metric: Metric) -> torch.Tensor:
    where = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    where[:, inp.position] = True
    out = model(ids, token_type_ids=inp.token_type_ids.expand(ids.shape[0], -1), mlm_positions=where)
    return metric(out).float().cpu()


def clean_cache(model: Bert, inp: PatchingInput, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The clean run's activations at `names` (each [1, ...])."""
    with eval_mode(model), torch.inference_mode():
        where = torch.zeros(inp.clean_ids.shape, dtype=torch.bool, device=inp.clean_ids.device)
        where[:, inp.position] = True
        _, cache = model.run_with_cache(inp.clean_ids, token_type_ids=inp.token_type_ids, mlm_positions=where,
                                        names=list(dict.fromkeys(names)))
    return dict(cache)


def patch_runs(
    model: Bert,
    inp: PatchingInput,
    patches: Sequence[Patch],
    metric: Metric,
    cache: dict[str, torch.Tensor] | None = None,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The metric of the corrupted run with each patch applied alone: [len(patches)].

    Patches run as rows of batched forward passes (`batch_size` rows each; default TOKENS_PER_BATCH
    tokens' worth); each row copies the clean activation at its own hook name and index.
    `cache` holds the clean activations (made here when None); progress(done, total) after each pass."""
    cache = cache if cache is not None else clean_cache(model, inp, [p.hook_name for p in patches])
    seq = inp.corrupt_ids.shape[1]
    batch_size = batch_size or max(1, TOKENS_PER_BATCH // seq)
    out = []
    with eval_mode(model), torch.inference_mode():
        for start in range(0, len(patches), batch_size):
            chunk = patches[start : start + batch_size]
            rows: dict[str, list[tuple[int, Index]]] = defaultdict(list)  # hook name -> (row, index)
            for row, p in enumerate(chunk):
                rows[p.hook_name].append((row, p.index))
            hooks = [(name, _setter(cache[name][0], todo)) for name, todo in rows.items()]
            with model.hooks(hooks):
                out.append(_run(model, inp, inp.corrupt_ids.expand(len(chunk), -1), metric))
            if progress is not None:
                progress(min(start + batch_size, len(patches)), len(patches))
    return torch.cat(out) if out else torch.zeros(0)


def _setter(clean: torch.Tensor, todo: list[tuple[int, Index]]):
    """A hook that writes clean[index] into row `row` of the activation, for each (row, index)."""

    def hook(act: torch.Tensor, name: str) -> torch.Tensor:
        act = act.clone()
        for row, index in todo:
            act[row][index] = clean[index].to(act.dtype)
        return act

    return hook


# ---------------------------------------------------------------------------------------------
# The grids
# ---------------------------------------------------------------------------------------------
@dataclass
class PatchingGrid:
    """Recovery of each patch: rows (stages, components or heads) × columns (token positions)."""

    inp: PatchingInput
    kind: str  # "residual", "attention", "mlp" or "heads"
    rows: list[str]  # row labels
    recovery: torch.Tensor  # [row, position]
    clean_diff: float  # answer − wrong logit at the [MASK], clean run
    corrupt_diff: float  # the same, corrupted run
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # "all positions": [row] for the head grid

    @property
    def warning(self) -> str | None:
        """Why the recovery figures mean nothing here, or None: the clean run must prefer the answer (a
        difference above 0) and the corrupted run must prefer it less, else there is no clean behaviour that
        a patch could restore."""
        answer, wrong = echo(self.inp.answer), echo(self.inp.wrong)
        clean, corrupt = f"{self.clean_diff:+.2f}", f"{self.corrupt_diff:+.2f}"
        if self.clean_diff <= 0:
            return (f"The clean run does not prefer {answer} to {wrong} (logit difference {clean}; corrupted "
                    f"{corrupt}): there is no clean answer to restore, so the recovery figures mean nothing. Pick a "
                    f"pair where the clean sentence leads the model to the answer, e.g. the tab's default.")
        if self.corrupt_diff >= self.clean_diff:
            return (f"The corrupted sentence does not lower {answer}'s lead over {wrong} (clean {clean}, corrupted "
                    f"{corrupt}): there is nothing for a patch to restore, so the recovery figures mean nothing. "
                    f"Change the corrupted sentence so that it points to {wrong}.")
        return None

    def as_json(self) -> dict:
        return {"tokens": self.inp.tokens, "layers": self.rows, "kind": self.kind,
                "recovery": [[None if v != v else round(v, 4) + 0.0 for v in row] for row in self.recovery.tolist()],
                "clean_diff": round(self.clean_diff, 4), "corrupt_diff": round(self.corrupt_diff, 4)}


def baselines(model: Bert, inp: PatchingInput, metric: Metric) -> tuple[float, float]:
    """(clean, corrupt) metric values."""
    with eval_mode(model), torch.inference_mode():
        both = _run(model, inp, torch.cat([inp.clean_ids, inp.corrupt_ids]), metric)
    return float(both[0]), float(both[1])


def recovery(values: torch.Tensor, clean: float, corrupt: float) -> torch.Tensor:
    """(patched − corrupt) / (clean − corrupt); NaN where clean == corrupt (nothing to recover)."""
    gap = clean - corrupt
    if gap == 0:
        return torch.full_like(values, float("nan"))
    return (values - corrupt) / gap


def _grid(model: Bert, inp: PatchingInput, kind: str, rows: list[str], names: list[str], index_of,
          ncols: int, metric: Metric | None, progress, batch_size: int | None = None) -> PatchingGrid:
    metric = metric or logit_diff_metric(inp)
    clean, corrupt = baselines(model, inp, metric)
    patches = [Patch(name, index_of(col)) for name in names for col in range(ncols)]
    values = patch_runs(model, inp, patches, metric, batch_size=batch_size, progress=progress)
    return PatchingGrid(inp, kind, rows, recovery(values, clean, corrupt).view(len(names), ncols), clean, corrupt)


def residual_grid(model: Bert, inp: PatchingInput, metric: Metric | None = None,
                  progress: Callable[[int, int], None] | None = None, batch_size: int | None = None) -> PatchingGrid:
    """The residual stream after the embeddings and after each layer (rows) × positions (columns)."""
    fam = model.family
    names = [fam.embedding_hook, *fam.layer_hook_names("hook_resid_post")]
    rows = ["embeddings"] + [f"layer {i}" for i in range(fam.num_layers)]
    return _grid(model, inp, "residual", rows, names, lambda p: (p,), len(inp.tokens), metric, progress, batch_size)


def component_grid(model: Bert, inp: PatchingInput, kind: str, metric: Metric | None = None,
                   progress: Callable[[int, int], None] | None = None, batch_size: int | None = None
                   ) -> PatchingGrid:
    """Each layer's attention output ("attention") or MLP output ("mlp"), or the residual ("residual") × positions."""
    if kind == "residual":
        return residual_grid(model, inp, metric, progress, batch_size)
    short = {"attention": "hook_attn_out", "mlp": "hook_mlp_out"}.get(kind)
    if short is None:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}.")
    fam = model.family
    rows = [f"layer {i}" for i in range(fam.num_layers)]
    return _grid(model, inp, kind, rows, fam.layer_hook_names(short), lambda p: (p,), len(inp.tokens), metric,
                 progress, batch_size)


def head_grid(model: Bert, inp: PatchingInput, layer: int, metric: Metric | None = None,
              progress: Callable[[int, int], None] | None = None, batch_size: int | None = None) -> PatchingGrid:
    """Each head of `layer` (its output z) × positions; `extra["all positions"]`: each head patched everywhere."""
    fam = model.family
    name = fam.hook_name(layer, "hook_z")  # [batch, seq, head, d_head]; IndexError names the layers
    heads, seq = model.config.num_attention_heads, len(inp.tokens)
    metric = metric or logit_diff_metric(inp)
    clean, corrupt = baselines(model, inp, metric)
    patches = [Patch(name, (p, h)) for h in range(heads) for p in range(seq)]
    patches += [Patch(name, (slice(None), h)) for h in range(heads)]
    values = recovery(patch_runs(model, inp, patches, metric, batch_size=batch_size, progress=progress), clean, corrupt)
    return PatchingGrid(inp, "heads", [f"L{layer} H{h}" for h in range(heads)], values[: heads * seq].view(heads, seq),
                        clean, corrupt, extra={"all positions": values[heads * seq :]})


def patching(model: Bert, tok: Tokenizer, clean: str, corrupt: str, answer: str, wrong: str,
             kind: str = "residual") -> PatchingGrid:
    """Check the pair and compute one grid (`kind` in KINDS)."""
    return component_grid(model, patching_input(model, tok, clean, corrupt, answer, wrong), kind)
