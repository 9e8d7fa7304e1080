"""Where bertlab's trained MLM/NSP heads for the offline default ship, and which encoder layers they
re-trained: what `loading.load_default` needs to merge them, kept below both loading and training
(`recipes.default_heads` trains and writes the file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from bertlab.config import BertConfig
from bertlab.families import ModelFamily, family_for

PACKAGE = Path(__file__).resolve().parent


def heads_path() -> Path:
    """The shipped heads (`BERTLAB_DEFAULT_HEADS` overrides; an empty value disables them)."""
    return Path(os.environ.get("BERTLAB_DEFAULT_HEADS", str(PACKAGE / "assets" / "default_heads.safetensors")))


def default_family() -> ModelFamily:
    """The family of the offline default (the neutral spec's own: the heads file uses its weight names)."""
    config = BertConfig()
    return ModelFamily(family_for(config.model_type), config)


def retrained_layers(keys: Iterable[str]) -> list[int]:
    """The encoder layers a heads file's keys hold (the ones its runs re-trained), in order."""
    family = default_family()
    return sorted({n for n in (family.layer_of(k) for k in keys) if n is not None})
