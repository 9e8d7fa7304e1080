"""Head ablation and the logit lens for one masked word (needs an MLM head).

Switching a head off multiplies its output `z` by 0 (what `head_mask` does). Many head masks
run as one batch: a hook on each layer's `attention.self.hook_z` scales every example with
its own mask, which equals `model(..., head_mask=mask)` example by example.
The logit lens applies the MLM head to the masked position's vector after every stage
(0 = embeddings, s = after layer s - 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import torch

from bertlab.analysis import encode_input, normalise_masks, require_context
from bertlab.analysis.similarity import hidden_states, stage_names
from bertlab.families.bert import Bert
from bertlab.inputs import InputError, echo, require_text
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

TOKENS_PER_BATCH = 4096  # head masks per forward pass: this many tokens (all 72 MiniLM heads in one pass)


# ---------------------------------------------------------------------------------------------
# The masked input and its target
# ---------------------------------------------------------------------------------------------
@dataclass
class MaskedQuery:
    """One input with one [MASK] to explain, and the word whose probability we follow there."""

    text: str
    tokens: list[str]  # as the model reads them ([MASK] at `position`)
    input_ids: torch.Tensor  # [1, seq]
    token_type_ids: torch.Tensor  # [1, seq]
    position: int  # token index of the [MASK]
    target: str  # the vocabulary piece followed
    target_id: int
    original: str | None = None  # the piece that stood at `position` when a position was chosen
    warning: str | None = None

    @property
    def mask_token(self) -> str:
        """The tokenizer's mask token, as it stands at `position`."""
        return self.tokens[self.position]


def masked_query(
    model: Bert, tok: Tokenizer, text: str, target: str | None = None, position: int | None = None
) -> MaskedQuery:
    """Prepare `text` for the MLM head: exactly one [MASK] (typed in any case, as in the Mask tab),
    or the token at `position` masked; some other word must stay visible.

    `target` is the word to follow (one vocabulary piece); by default the piece that stood at
    `position`, or the model's top prediction at the [MASK]. Raises MissingHeadError without an
    MLM head, InputError for text without exactly one [MASK] or a target the vocabulary lacks.
    """
    model.require("mlm")
    text = normalise_masks(require_text(text), tok)
    enc = encode_input(model, tok, text)
    ids = list(enc.ids)
    original = None
    if position is None:
        masks = [i for i, t in enumerate(ids) if t == tok.mask_token_id]
        if not masks and enc.truncated and tok.mask_token in text:
            raise InputError(f"The {tok.mask_token} was cut off: {enc.warning} Move the {tok.mask_token} nearer "
                             f"the start or shorten the text.")
        if not masks:
            raise InputError(f"The text has no {tok.mask_token}: write {tok.mask_token} where the word to predict "
                             f"goes, e.g. 'The capital of France is {tok.mask_token}.'")
        if len(masks) > 1:
            raise InputError(f"The text has {len(masks)} {tok.mask_token} tokens; this view explains one prediction: "
                             f"keep exactly one.")
        position = masks[0]
    else:
        if not 0 <= position < len(ids) or enc.special_tokens_mask[position]:
            words = [i for i, s in enumerate(enc.special_tokens_mask) if not s]
            raise IndexError(f"position {position} is not a word piece of this text: choose one of "
                             f"{words[0]}..{words[-1]} ({', '.join(enc.tokens[words[0]:words[-1] + 1])}).")
        original = enc.tokens[position]
        ids[position] = tok.mask_token_id
    require_context(enc, {position}, tok)
    device = model_device(model)
    query = MaskedQuery(
        text=text,
        tokens=tok.convert_ids_to_tokens(ids),
        input_ids=torch.tensor([ids], device=device),
        token_type_ids=torch.tensor([enc.type_ids], device=device),
        position=position,
        target="",
        target_id=-1,
        original=original,
        warning=enc.warning,
    )
    if target is not None and str(target).strip():
        target_id = target_piece_id(tok, target)
    elif original is not None:
        target_id = tok.token_to_id(original)
    else:  # the model's own top prediction
        target_id = int(masked_log_probs(model, query)[0].argmax())
    query.target_id, query.target = target_id, tok.id_to_token(target_id)
    return query


def next_token_query(model: Bert, tok: Tokenizer, text: str, target: str | None = None) -> MaskedQuery:
    """A left-to-right model's question "which token comes after `text`?": `position` is the text's last token
    (nothing is masked: no token sees what follows it). `target`: the piece to follow (default: the model's
    own top guess). Raises MissingHeadError without an LM head, InputError for text it cannot use."""
    model.require("lm")
    enc = encode_input(model, tok, require_text(text))
    if not enc.ids:
        raise InputError("The text has no words the tokenizer can read: type a sentence.")
    device = model_device(model)
    ids = torch.tensor([enc.ids], device=device)
    query = MaskedQuery(text=text, tokens=list(enc.tokens), input_ids=ids, token_type_ids=torch.zeros_like(ids),
                        position=len(enc) - 1, target="", target_id=-1, warning=enc.warning)
    if target is not None and str(target).strip():
        target_id = target_piece_id(tok, target)
    else:
        with eval_mode(model), torch.inference_mode():
            target_id = int(model.next_token_logits(model(ids).last_hidden_state[0, -1]).argmax())
    query.target_id, query.target = target_id, tok.id_to_token(target_id)
    return query


def target_piece_id(tok: Tokenizer, word: str) -> int:
    """The vocabulary id of `word` (a whole word or a "##" piece; with byte-level BPE, the word as it follows a
    space, when that is one piece); InputError when it needs several pieces."""
    word = require_text(word, "target word").strip()
    spaced = tok.encode_ids([" " + word])[0]  # byte-level BPE: the word as it follows a space ("Ġparis"),
    if len(spaced) == 1 and spaced[0] != tok.unk_token_id and spaced != tok.encode_ids([word])[0]:  # as a
        return spaced[0]  # [MASK] after a space predicts it
    exact = tok.token_to_id(word)
    if exact is not None:
        return exact
    pieces, ids = tok.tokenize(word), tok.encode_ids([word])[0]
    if len(ids) == 1 and ids[0] != tok.unk_token_id:
        return ids[0]
    if not pieces or tok.unk_token_id in ids:
        raise InputError(f"{echo(word)} is not in the model's vocabulary: choose another target word.")
    shown = " ".join(pieces[:8]) + (" …" if len(pieces) > 8 else "")
    raise InputError(f"{echo(word)} is split into {len(pieces)} pieces ({shown}); the model predicts one piece "
                     f"at a {tok.mask_token}: choose a word that is a single piece.")


# ---------------------------------------------------------------------------------------------
# The MLM head at the masked position, under head masks
# ---------------------------------------------------------------------------------------------
def masked_log_probs(
    model: Bert,
    query: MaskedQuery,
    head_masks: torch.Tensor | None = None,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Log-probabilities over the vocabulary at the [MASK], one row per head mask.

    head_masks: [n, layer, head] of 1 (on) / 0 (off); None = nothing switched off (n = 1).
    batch_size: masks per forward pass (default: TOKENS_PER_BATCH tokens' worth).
    progress: called as progress(masks done, masks in all) after each forward pass.
    Returns [n, vocab] float32 on CPU.
    """
    model.require("mlm")
    cfg = model.config
    shape = (cfg.num_hidden_layers, cfg.num_attention_heads)
    device = model_device(model)
    if head_masks is None:
        head_masks = torch.ones(1, *shape)
    if head_masks.dim() != 3 or tuple(head_masks.shape[1:]) != shape:
        raise ValueError(f"head_masks must be [n, {shape[0]}, {shape[1]}]; got {tuple(head_masks.shape)}.")
    batch_size = batch_size or max(1, TOKENS_PER_BATCH // query.input_ids.shape[1])
    rows = []
    with eval_mode(model), torch.inference_mode():
        for chunk in head_masks.to(device).split(batch_size):  # [n, layer, head]
            n = chunk.shape[0]
            where = torch.zeros(n, query.input_ids.shape[1], dtype=torch.bool, device=device)
            where[:, query.position] = True
            hooks = [
                (model.family.hook_name(i, "hook_z"), partial(_scale_heads, chunk[:, i]))
                for i in range(shape[0]) if not bool(chunk[:, i].all())
            ]
            with model.hooks(hooks):
                out = model(query.input_ids.expand(n, -1), token_type_ids=query.token_type_ids.expand(n, -1),
                            mlm_positions=where)
            rows.append(out.mlm_logits.float().log_softmax(dim=-1).cpu())  # [n, vocab]
            if progress is not None:
                progress(sum(len(r) for r in rows), head_masks.shape[0])
    return torch.cat(rows)


def _scale_heads(mask: torch.Tensor, z: torch.Tensor, name: str) -> torch.Tensor:
    """z [batch, seq, head, d_head] times each example's mask [batch, head]."""
    return z * mask.to(z.dtype)[:, None, :, None]


def _rank(log_probs: torch.Tensor, target_id: int) -> torch.Tensor:
    """1-based rank of `target_id` in each row of [n, vocab] (1 = most likely): [n]."""
    return 1 + (log_probs > log_probs[:, target_id : target_id + 1]).sum(dim=-1)


def _top(tok: Tokenizer, log_probs: torch.Tensor, k: int) -> list[tuple[str, float]]:
    """(piece, probability) of the k most likely pieces of one [vocab] row."""
    values, ids = log_probs.topk(k)
    return [(tok.id_to_token(int(i)), float(v.exp())) for v, i in zip(values, ids)]


# ---------------------------------------------------------------------------------------------
# Switching chosen heads off
# ---------------------------------------------------------------------------------------------
@dataclass
class AblationResult:
    """The target's log-probability at the [MASK] with and without the chosen heads."""

    query: MaskedQuery
    heads_off: list[tuple[int, int]]  # (layer, head), layers from 0
    head_mask: torch.Tensor  # [layer, head] 1 = on, 0 = off
    base_log_prob: float  # nats, nothing switched off
    ablated_log_prob: float  # nats, with heads_off switched off
    base_rank: int  # 1 = the model's top prediction
    ablated_rank: int
    base_top: list[tuple[str, float]]  # (piece, probability), k best without ablation
    ablated_top: list[tuple[str, float]]  # with ablation

    @property
    def change(self) -> float:
        """ablated - base log-probability (nats): negative = the heads helped predict the target."""
        return self.ablated_log_prob - self.base_log_prob


def head_mask_for(model: Bert, heads_off: Iterable[tuple[int, int]]) -> torch.Tensor:
    """[layer, head] mask with 0 at each (layer, head) in `heads_off`; IndexError for a head that does not exist."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    mask = torch.ones(layers, heads)
    for layer, head in heads_off:
        if not (0 <= layer < layers and 0 <= head < heads):
            raise IndexError(f"there is no head ({layer}, {head}): layers are 0..{layers - 1}, heads 0..{heads - 1}.")
        mask[layer, head] = 0.0
    return mask


def head_ablation(
    model: Bert,
    tok: Tokenizer,
    text: str,
    heads_off: Iterable[tuple[int, int]],
    target: str | None = None,
    position: int | None = None,
    k: int = 5,
) -> AblationResult:
    """Switch off `heads_off` ((layer, head) pairs) and compare the target's log-probability at the [MASK]."""
    heads_off = sorted({(int(la), int(h)) for la, h in heads_off})
    mask = head_mask_for(model, heads_off)
    query = masked_query(model, tok, text, target, position)
    both = masked_log_probs(model, query, torch.stack([torch.ones_like(mask), mask]))  # [2, vocab]
    ranks = _rank(both, query.target_id)
    return AblationResult(
        query=query,
        heads_off=heads_off,
        head_mask=mask,
        base_log_prob=float(both[0, query.target_id]),
        ablated_log_prob=float(both[1, query.target_id]),
        base_rank=int(ranks[0]),
        ablated_rank=int(ranks[1]),
        base_top=_top(tok, both[0], k),
        ablated_top=_top(tok, both[1], k),
    )


@dataclass
class HeadEffects:
    """What switching off each head alone does to the target's log-probability."""

    query: MaskedQuery
    base_log_prob: float  # nats, nothing switched off
    log_probs: torch.Tensor  # [layer, head] target log-prob with only that head off
    ranks: torch.Tensor  # [layer, head] target rank with only that head off (1 = top)

    @property
    def effects(self) -> torch.Tensor:
        """[layer, head] change in log-prob (nats); negative = the head helped predict the target."""
        return self.log_probs - self.base_log_prob

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, effect) from the most helpful head (most negative effect) to the least."""
        e = self.effects
        order = e.flatten().argsort()
        heads = e.shape[1]
        return [(int(i) // heads, int(i) % heads, float(e.flatten()[i])) for i in order]


def single_head_effects(
    model: Bert,
    tok: Tokenizer,
    text: str,
    target: str | None = None,
    position: int | None = None,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> HeadEffects:
    """Switch off each head alone (layer x head runs, batched) and record the target's log-probability.

    batch_size and progress(done, total) go to `masked_log_probs` (total = 1 + layers x heads).
    """
    query = masked_query(model, tok, text, target, position)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    masks = torch.ones(1 + layers * heads, layers * heads)  # row 0: nothing off; row 1 + i: head i off
    masks[1:].fill_diagonal_(0.0)
    log_probs = masked_log_probs(model, query, masks.view(-1, layers, heads), batch_size, progress)
    # [1 + layer * head, vocab]
    target = log_probs[:, query.target_id]
    return HeadEffects(
        query=query,
        base_log_prob=float(target[0]),
        log_probs=target[1:].view(layers, heads),
        ranks=_rank(log_probs[1:], query.target_id).view(layers, heads),
    )


# ---------------------------------------------------------------------------------------------
# Logit lens
# ---------------------------------------------------------------------------------------------
@dataclass
class LogitLens:
    """The MLM head read at the [MASK] after every stage (0 = embeddings, s = after layer s - 1)."""

    query: MaskedQuery
    stage_names: list[str]
    top_ids: torch.Tensor  # [stage, k]
    top_tokens: list[list[str]]  # [stage][k]
    top_probs: torch.Tensor  # [stage, k]
    target_log_probs: torch.Tensor  # [stage]
    target_ranks: torch.Tensor  # [stage] 1 = top
    next_token: bool = False  # a left-to-right model's next-token lens: the guess for the token after `position`


def logit_lens(
    model: Bert, tok: Tokenizer, text: str, target: str | None = None, position: int | None = None, k: int = 5
) -> LogitLens:
    """Apply the MLM head to the masked position's vector after every stage (as the head expects it:
    `model.lens_input`, a pre-norm family's final norm on the intermediate stages): the top-k pieces,
    and the target's log-probability and rank at each stage. A left-to-right model (`family.causal`) has no
    MLM head, and a model with a next-word head (`has_lm`) is asked for the token after the text instead: its
    next-token lens (`next_token_query`)."""
    causal = bool(getattr(model, "has_lm", False))  # a next-word head: the next-token lens
    query = next_token_query(model, tok, text, target) if causal else masked_query(model, tok, text, target, position)
    if k < 1:
        raise InputError(f"k must be at least 1; got {k}.")
    states = hidden_states(model, query.input_ids, query.token_type_ids)[:, 0, query.position]  # [stage, d]
    head = model.next_token_logits if causal else model.mlm_head
    model.require("lm" if causal else "mlm")
    dtype = next(model.parameters()).dtype
    with eval_mode(model), torch.inference_mode():
        logits = head(model.lens_input(states.to(model_device(model), dtype)))  # [stage, vocab]
    log_probs = logits.float().log_softmax(dim=-1).cpu()
    values, ids = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)  # [stage, k]
    return LogitLens(
        query=query,
        stage_names=stage_names(model.config.num_hidden_layers),
        top_ids=ids,
        top_tokens=[tok.convert_ids_to_tokens(row.tolist()) for row in ids],
        top_probs=values.exp(),
        target_log_probs=log_probs[:, query.target_id],
        target_ranks=_rank(log_probs, query.target_id),
        next_token=causal,
    )
