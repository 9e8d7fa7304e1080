"""The model that every tab shows, and the list of models a student can switch between.

A tab never holds on to a model by itself: the app calls `panel.set_model(model, tok)` on
every built tab when `ModelState.switch` runs, so all tabs always show the same model.
Models made in the training tabs join with `ModelState.add`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bertlab.runtime import release_free_memory
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_NAME = "offline default (MiniLM-L6)"

Listener = Callable[["ModelState"], None]


@dataclass
class ModelEntry:
    """A model the picker offers: loaded already (`model`/`tok`) or loadable from `source`."""

    name: str
    source: str | None  # hub name or folder for `bertlab.load`; None = the offline default
    model: torch.nn.Module | None = None
    tok: Tokenizer | None = None

    @property
    def loaded(self) -> bool:
        return self.model is not None


class ModelState:
    """Which model is current, which others are known, and who to tell when it changes."""

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, name: str = DEFAULT_NAME,
                 source: str | None = None) -> None:
        self.entries: dict[str, ModelEntry] = {name: ModelEntry(name, source, model, tok)}
        self.name = name
        self._listeners: list[Listener] = []

    @property
    def model(self) -> torch.nn.Module:
        return self.entries[self.name].model

    @property
    def tok(self) -> Tokenizer:
        return self.entries[self.name].tok

    def observe(self, fn: Listener) -> None:
        """Call `fn(state)` after every switch (and after `add`, so pickers can list the new model)."""
        self._listeners.append(fn)

    def add(self, name: str, model: torch.nn.Module, tok: Tokenizer, source: str | None = None,
            switch: bool = False) -> str:
        """Offer another model (e.g. one just trained); returns the name it is listed under."""
        unique, n = name, 2
        while unique in self.entries and self.entries[unique].model is not model:
            unique, n = f"{name} ({n})", n + 1
        self.entries[unique] = ModelEntry(unique, source, model, tok)
        release_free_memory()  # the run that made it has ended: give back what its training freed
        if switch:
            self.switch(unique)
        else:
            self._tell()
        return unique

    def offer(self, name: str, source: str) -> str | None:
        """List a model that loads from `source` when first picked (e.g. a run saved in an earlier page of
        this workspace); nothing when the list has it already. Returns the name it is listed under."""
        if self.listed_as(source) is not None or name in self.entries:
            return None
        self.entries[name] = ModelEntry(name, source)
        self._tell()
        return name

    def listed_as(self, source: str | None) -> str | None:
        """The name of the entry that loads the same model as `source` (see `bertlab.loading.source_key`:
        "default" is the offline default, a folder by its real path), None when none does."""
        from bertlab.loading import source_key

        key = source_key(source)
        return next((name for name, e in self.entries.items() if source_key(e.source) == key), None)

    def switch(self, name: str) -> None:
        """Make `name` the current model (loading it first if needed) and tell every listener."""
        entry = self.entries[name]
        if not entry.loaded:
            from bertlab.loading import load

            entry.model, entry.tok = load(entry.source)
        self.name = name
        self._tell()

    def _tell(self) -> None:
        for fn in list(self._listeners):
            fn(self)
