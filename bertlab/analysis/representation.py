"""Input representation: what BERT adds up before the first layer.

Each token's input vector is token embedding + segment embedding + position embedding,
then LayerNorm ("normalised"). This module reads those parts off the embedding hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from bertlab.analysis import encode_input
from bertlab.analysis.similarity import project_2d
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.runtime import eval_mode, model_device
from bertlab.tokenizer import Tokenizer

PARTS: tuple[str, ...] = ("token", "segment", "position", "sum", "normalised")
# Part -> the embeddings' hook point (`model.family.embedding_part_hook(...)` names it in each family).
PART_HOOKS: dict[str, str] = {
    "token": "hook_word",
    "segment": "hook_token_type",
    "position": "hook_position",
    "sum": "hook_sum",  # token + segment + position, before LayerNorm
    "normalised": "hook_out",  # after LayerNorm
}
# Projected by default: the additive parts. The projection is linear and not centred, so the
# sum's point is exactly the sum of its three parts' points. LayerNorm rescales to a much
# larger norm, which would swamp the others in a shared map.
PROJECTED: tuple[str, ...] = ("token", "segment", "position", "sum")


@dataclass
class Representation:
    """The input side of BERT for one sentence (or pair), one entry per token."""

    tokens: list[str]  # the tokenizer's pieces as stored ("##less", "Ġclue", "▁clue")
    ids: list[int]  # vocabulary ids
    segment_ids: list[int]  # 0 = sentence A (with [CLS] and its [SEP]), 1 = sentence B
    position_ids: list[int]  # 0, 1, 2, ... (plus the model's position offset)
    word_ids: list[int | None]  # index of the word within its sentence; None for [CLS]/[SEP]
    parts: dict[str, torch.Tensor]  # part name (PARTS) -> [seq, d_model]
    norms: dict[str, torch.Tensor]  # part name -> [seq] L2 norm of each token's vector
    projected_parts: tuple[str, ...]  # which parts `projection` holds, in order
    projection: torch.Tensor  # [len(projected_parts), seq, 2] in one shared 2-D basis
    explained: torch.Tensor  # [2] share of the squared norm on each axis of that basis
    text_a: str = ""
    text_b: str | None = None
    warning: str | None = None
    shown: list[str] = field(default_factory=list)  # the pieces as drawn (`Tokenizer.readable_pieces`)
    tokenizer: str = ""  # the tokenizer kind, as the family names it ("WordPiece", "byte-level BPE", ...)

    @property
    def labels(self) -> list[str]:
        """What the pictures write for each token: the readable pieces (the stored ones if none)."""
        return self.shown or self.tokens

    def part(self, name: str) -> torch.Tensor:
        """[seq, d_model] vectors of one part, with a clear error for an unknown name."""
        if name not in self.parts:
            raise KeyError(f"no part {name!r}: choose one of {', '.join(self.parts)}.")
        return self.parts[name]


def input_representation(
    model: Bert,
    tok: Tokenizer,
    a: str,
    b: str | None = None,
    projected: Sequence[str] = PROJECTED,
) -> Representation:
    """Tokenize `a` (and `b`), run the embeddings, and return pieces, segment/position/word ids,
    the token, segment and position parts, their sum, the normalised sum, per-token norms, and
    a 2-D projection of the `projected` parts (top-2 singular directions of their stacked
    vectors, not centred, signs fixed)."""
    projected = tuple(projected)
    unknown = [p for p in projected if p not in PARTS]
    if unknown or not projected:
        raise InputError(f"cannot project {unknown or 'nothing'}: choose among {', '.join(PARTS)}.")
    enc = encode_input(model, tok, a, b)
    device = model_device(model)
    ids = torch.tensor([enc.ids], device=device)  # [1, seq]
    types = torch.tensor([enc.type_ids], device=device)  # [1, seq]
    cache: dict[str, torch.Tensor] = {}

    def store(x: torch.Tensor, name: str) -> None:
        cache[name] = x.detach()

    # Only the embeddings layer runs: its hook points fire the same as in a full forward pass.
    family = model.family
    hooks = {part: family.embedding_part_hook(short) for part, short in PART_HOOKS.items()}
    with eval_mode(model), torch.inference_mode(), model.hooks([(list(hooks.values()), store)]):
        family.embeddings(model)(ids, types)
    # [seq, d] each; a part that never fired is absent (DistilBERT has no segment embedding)
    parts = {name: cache[hook][0].to("cpu", torch.float32) for name, hook in hooks.items() if hook in cache}
    projected = tuple(p for p in projected if p in parts)
    seq = len(enc)
    stacked = torch.cat([parts[p] for p in projected])  # [part * seq, d]
    points, explained = project_2d(stacked, center=False)
    offset = model.config.position_offset
    return Representation(
        tokens=list(enc.tokens),
        ids=list(enc.ids),
        segment_ids=list(enc.type_ids),
        position_ids=[offset + i for i in range(seq)],
        word_ids=list(enc.word_ids),
        parts=parts,
        norms={name: v.norm(dim=-1) for name, v in parts.items()},
        projected_parts=projected,
        projection=points.view(len(projected), seq, 2),
        explained=explained,
        text_a=a,
        text_b=b if b and b.strip() else None,
        warning=enc.warning,
        shown=tok.readable_pieces(enc.tokens),
        tokenizer=family.tokenizer_title,
    )


def first_tokens(rep: Representation, n: int) -> Representation:
    """The first `n` tokens of `rep`, with the 2-D map refitted to them. Exact: a token's input
    vector depends only on its own piece, segment and position."""
    if len(rep.tokens) <= n:
        return rep
    parts = {name: v[:n] for name, v in rep.parts.items()}  # [n, d] each
    points, explained = project_2d(torch.cat([parts[p] for p in rep.projected_parts]), center=False)
    return replace(
        rep,
        tokens=rep.tokens[:n], ids=rep.ids[:n], segment_ids=rep.segment_ids[:n],
        position_ids=rep.position_ids[:n], word_ids=rep.word_ids[:n], shown=rep.shown[:n],
        parts=parts, norms={name: v[:n] for name, v in rep.norms.items()},
        projection=points.view(len(rep.projected_parts), n, 2), explained=explained,
    )
