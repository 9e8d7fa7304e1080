"""A checkpoint folder's weights as files hold them: which file, its tensors read safely, the error a broken
one gives, and the report of what a load found. Below `bertlab.loading` and the compressed-folder format
(`bertlab.compressed.storage`), which both read weights this way."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and what is wrong."""


@dataclass
class LoadReport:
    """What `load` found, for the UI and the log."""

    source: str
    folder: Path
    weights_file: Path
    heads: tuple[str, ...]
    task: str | None
    missing_heads: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(file, state dict) from model.safetensors, its sharded index, or pytorch_model.bin."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            break
    else:
        raise CheckpointError(f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)}.")
    if name == "model.safetensors":
        return path, read_safetensors(path)
    if name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{path} is not a valid safetensors index ({e}).") from e
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            if not isinstance(shard, str) or not (folder / shard).resolve().is_relative_to(folder.resolve()):
                raise CheckpointError(f"{path} names a shard outside its folder ({str(shard)[:80]!r}); "
                                      f"shards must sit beside the index. The index is damaged or unsafe.")
            state.update(read_safetensors(folder / shard))
        return path, state
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors all mean the same thing here
        raise CheckpointError(
            f"{path} could not be read ({type(e).__name__}: {e}). It may be truncated or corrupt, or hold "
            f"more than weights (bertlab reads .bin files with weights_only=True). Download it again."
        ) from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors.")
    return path, state


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing (named in the safetensors index).")
    try:
        return load_file(str(path), device="cpu")
    except Exception as e:  # SafetensorError, OSError: truncated header, bad JSON, short data
        raise CheckpointError(
            f"{path} could not be read: it looks truncated or corrupt ({e}). Download or save it again."
        ) from e
