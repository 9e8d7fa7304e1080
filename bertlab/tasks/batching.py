"""Batching for task features: pad to the longest in the batch, and group features of
similar length (length-bucketing) so that little of each batch is padding."""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import torch
from torch.utils.data import Sampler

from bertlab.tasks.features import IGNORE_INDEX, FeatureError


class Feature(Protocol):
    input_ids: list[int]
    token_type_ids: list[int]


def collate(features: Sequence[Feature], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad features to the longest one. Returns input_ids, token_type_ids,
    attention_mask [batch, seq], and, when the features carry them, labels ([batch] for a
    class, [batch] floats for a number, [batch, seq] padded with IGNORE_INDEX for tokens) or
    start/end_positions [batch]."""
    if not features:
        raise FeatureError("cannot collate an empty batch.")
    ids, types, mask = pad_inputs([f.input_ids for f in features], [f.token_type_ids for f in features], pad_token_id)
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    batch.update(_labels(features, ids.shape[1]))
    return batch


def pad_inputs(
    input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int] | None], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids right-padded with `pad_token_id` to the longest row, segment ids (0 at the padding, and in a row
    given as None) and the attention mask: each [batch, seq]. What every collator here pads a batch with."""
    n = max(len(r) for r in input_ids)
    lengths = torch.tensor([len(r) for r in input_ids])  # [batch]
    types = [t if t is not None else () for t in token_type_ids]
    return (_padded(input_ids, n, pad_token_id), _padded(types, n, 0),
            (torch.arange(n) < lengths[:, None]).long())


def _padded(rows: Sequence[Sequence[int]], n: int, fill: int) -> torch.Tensor:
    """Rows of ints right-padded with `fill` to n, as one [rows, n] tensor made in one call (a tensor per row
    written into a padded one took three ops per row: hundreds per batch)."""
    return torch.tensor([[*r, *[fill] * (n - len(r))] for r in rows], dtype=torch.long)


def _labels(features: Sequence[Feature], n: int) -> dict[str, torch.Tensor]:
    first = features[0]
    if hasattr(first, "target"):  # a number to predict (regression)
        return {"labels": torch.tensor([f.target for f in features], dtype=torch.float32)}  # [batch]
    if hasattr(first, "label"):  # sequence classification
        return {"labels": torch.tensor([f.label for f in features], dtype=torch.long)}  # [batch]
    if hasattr(first, "labels"):  # token classification
        return {"labels": _padded([f.labels for f in features], n, IGNORE_INDEX)}  # [batch, seq]
    if hasattr(first, "start_position"):  # question answering
        return {
            "start_positions": torch.tensor([f.start_position for f in features], dtype=torch.long),  # [batch]
            "end_positions": torch.tensor([f.end_position for f in features], dtype=torch.long),  # [batch]
        }
    return {}


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of indices with similar lengths: a seeded shuffle of all indices, cut into
    buckets of `bucket_batches` batches, each bucket sorted by length and cut into batches,
    then a seeded shuffle of the batches. Each pass (epoch) reshuffles with seed + epoch;
    `shuffle=False` keeps the original order apart from sorting within buckets."""

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        bucket_batches: int = 50,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if batch_size < 1 or bucket_batches < 1:
            raise ValueError(f"batch_size ({batch_size}) and bucket_batches ({bucket_batches}) must be at least 1.")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.bucket_size = batch_size * bucket_batches
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next pass (it also advances by one after each pass)."""
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """The batches of the current epoch, without advancing it."""
        n = len(self.lengths)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        batches: list[list[int]] = []
        for lo in range(0, n, self.bucket_size):
            bucket = sorted(order[lo : lo + self.bucket_size], key=self.lengths.__getitem__)
            batches.extend(bucket[i : i + self.batch_size] for i in range(0, len(bucket), self.batch_size))
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        self.epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        n = len(self.lengths)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
