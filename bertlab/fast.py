"""The speed seam: what makes bertlab's BERT train faster without changing its numbers, kept out of the
reference modules (`bertlab.model`), which only receive the values these functions return.

Two devices, each with its bench row (docs/benchmarks.md, "The model core"):

- **unpadding** (`unpad_input` / `pad_output`, as transformers' ModernBERT `_unpad_modernbert_input` /
  `_pad_modernbert_output`): while training a padded batch, the encoder's linears, LayerNorms and feed-forward
  run on the real tokens alone ([1, tokens, d_model]); attention pads q, k and v back to [batch, seq] for the
  scores. Switch: `model.bert.packing` ("cpu", the default: while training on a CPU in fp32; True: while
  training on any device in any precision; "always": in evaluation too; False: never, the reference path). Its
  bench rows: it pays in fp32 on a CPU; under bf16 autocast and on a GPU the padded batch was faster.
- **the last layer on the rows the heads read** (`asked_rows`): a sentence classifier reads [CLS] alone, a
  pre-training model [CLS] and the masked positions, so the last layer's attention and feed-forward run for
  those rows only. Switch: the forward's `all_positions=False` (the lab's losses pass it); True (the default)
  is the reference path.

Neither is taken while a hook watches the layers it would change: hooks see the reference shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Packing = bool | Literal["cpu", "always"]  # `BertModel.packing`, the unpadding switch


@dataclass(frozen=True)
class Unpadded:
    """Where a padded batch's real tokens are: passed down the encoder with its packed hidden states."""

    index: torch.Tensor  # [tokens] flat positions (batch * seq + position) of the real tokens
    batch: int
    seq: int
    additive: torch.Tensor  # [batch, 1, 1, seq] (a decoder: [batch, 1, seq, seq]) the mask for the padded-back q, k, v


def unpad_input(x: torch.Tensor, attention_mask: torch.Tensor, additive: torch.Tensor
                ) -> tuple[torch.Tensor, Unpadded]:
    """x [batch, seq, ...], attention_mask [batch, seq] (1 = token) -> (x's real tokens [1, tokens, ...],
    where they were). additive: the model's [batch, 1, 1, seq] mask of the same batch."""
    batch, seq = attention_mask.shape
    index = attention_mask.reshape(-1).nonzero().squeeze(1)
    return x.reshape(batch * seq, *x.shape[2:]).index_select(0, index)[None], Unpadded(index, batch, seq, additive)


def pad_output(x: torch.Tensor, where: Unpadded) -> torch.Tensor:
    """x [1, tokens, ...] -> [batch, seq, ...], zeros at the padding (`unpad_input` undone)."""
    flat = x.new_zeros(where.batch * where.seq, *x.shape[2:]).index_copy_(0, where.index, x[0])  # in place: fresh zeros
    return flat.view(where.batch, where.seq, *x.shape[2:])


def repack(x: torch.Tensor, where: Unpadded) -> torch.Tensor:
    """x [batch, seq, ...] -> its real tokens [1, tokens, ...] (the positions `where` holds)."""
    return x.reshape(where.batch * where.seq, *x.shape[2:]).index_select(0, where.index)[None]


def unpads(packing: Packing, training: bool, attention_mask: torch.Tensor | None, head_mask: torch.Tensor | None,
           watched: bool) -> bool:
    """Whether the encoder runs unpadded: asked for by `packing` in this mode, device and precision, a batch
    with padding (looked at on the CPU only: on a GPU the look waits for the device), no head mask, no hook
    watching a layer."""
    if attention_mask is None or head_mask is not None or watched:
        return False
    on_cpu = attention_mask.device.type == "cpu"
    where_it_pays = on_cpu and not torch.is_autocast_enabled("cpu")  # "cpu": fp32 on a CPU
    if packing != "always" and not (training and packing and (where_it_pays or packing is True)):
        return False
    return not (on_cpu and bool(attention_mask.all()))


def asked_rows(input_ids: torch.Tensor, mlm_positions: torch.Tensor | None, *, reads_first_only: bool,
               reads_mlm_only: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows [batch, n] the last layer may compute alone, which of them the MLM head reads [batch, n] bool), or
    (None, None) when the heads read every row. reads_first_only: every head reads position 0 alone (a sentence
    classifier, NSP); reads_mlm_only: the heads read position 0 and `mlm_positions` (MLM, + NSP). Rows are [CLS]
    then each sequence's MLM positions in order, filled up to the longest with other positions (computed,
    unread)."""
    batch = input_ids.shape[0]
    cls = torch.zeros(batch, 1, dtype=torch.long, device=input_ids.device)
    if reads_first_only:
        return cls, None
    if mlm_positions is None or not reads_mlm_only:
        return None, None
    counts = mlm_positions.sum(1)  # [batch]
    n = int(counts.max()) if counts.numel() else 0
    order = torch.sort(mlm_positions.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :n]
    read = torch.arange(n, device=input_ids.device) < counts[:, None]  # [batch, n]
    return torch.cat([cls, order], 1), torch.cat([torch.zeros_like(cls, dtype=torch.bool), read], 1)
