"""The fine-tuning lab's defaults per task and mode: the encoder a run starts from and the loop's
settings, chosen by measurement (the runs and their dev figures are in bench/results/finetune_sweep.json
and bench/results/finetune_table.json; `python bench/finetune_table.py` re-measures the rows of docs/results.md).

    r = recipe("nli", "full")     # r.model, r.epochs, r.lr, r.batch_size, r.max_length, r.warmup_ratio

`model` is a `bertlab.load` source. "default-encoder" is the offline default's encoder as the package
ships it: bertlab's own MLM/NSP heads re-train all six of its layers, which costs the pair and span
tasks (SICK, CoNLL, SQuAD) when they are fine-tuned from them; the task head is new either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertlab.settings import DEFAULT_ENCODER  # settings, not loading: this module imports no torch

OFFLINE_DEFAULT = None  # `bertlab.load(None)`: the offline default with bertlab's heads

START_NAMES = {
    DEFAULT_ENCODER: "the MiniLM encoder as its package ships it",
    OFFLINE_DEFAULT: "the offline default (MiniLM with bertlab's re-trained layers)",
}


@dataclass(frozen=True)
class Recipe:
    """What a run of one task in one mode starts from and trains with, unless told otherwise."""

    model: str | None  # the start encoder: a `bertlab.load` source (None = the offline default)
    epochs: int
    lr: float  # peak learning rate (linear warm-up, then linear decay to 0)
    batch_size: int
    max_length: int  # tokens per example (per window for QA)
    warmup_ratio: float = 0.1
    basis: str = ""  # what chose these settings: runs in bench/results/finetune_sweep.json or _table.json

    @property
    def start_name(self) -> str:
        """The start encoder in words, for the picker, the tab and the log."""
        return START_NAMES.get(self.model, str(self.model))


_FULL = {
    "sst2": Recipe(DEFAULT_ENCODER, epochs=1, lr=5e-5, batch_size=32, max_length=128,
                   basis="start: table row sst2-4k vs sweep sst2-4k-offline-default; epochs and lr not re-tuned"),
    "nli": Recipe(DEFAULT_ENCODER, epochs=3, lr=5e-5, batch_size=32, max_length=128,
                  basis="sweep nli-pkg-e3 (dev accuracy after each epoch)"),
    "sts": Recipe(DEFAULT_ENCODER, epochs=3, lr=5e-5, batch_size=32, max_length=128,
                  basis="nli's settings on the same SICK pairs (not swept for sts); bench/results/sts.json"),
    "ner": Recipe(DEFAULT_ENCODER, epochs=3, lr=1e-4, batch_size=32, max_length=128,
                  basis="table row ner (dev F1 after each epoch)"),
    "qa": Recipe(DEFAULT_ENCODER, epochs=3, lr=2e-4, batch_size=32, max_length=384,
                 basis="start: sweeps qa-3000-encoder-e2 vs qa-3000-offline-default-e2; epochs: table row qa "
                       "(dev F1 after each epoch); lr: sweep qa-lr2e-4-e3 against the lr 1e-4 table row"),
}
_NOT_TUNED = "not re-tuned: start and epochs as full mode, lr 1e-3"
# (lr, epochs or None = full mode's, basis) per task where a sweep chose them (bench/results/finetune_sweep.json)
_FEATURE_TUNED = {
    "sst2": (1e-2, 3, "sweeps sst2-4k-feature-lr{1e-3,3e-3,1e-2}, -lr{3e-3,1e-2}-e3"),
    "nli": (1e-2, None, "sweeps nli-feature-lr{1e-3,3e-3,1e-2}"),
}
_ADAPTER_TUNED = {
    "sst2": (3e-3, None, "sweeps sst2-4k-adapter-lr{3e-4,1e-3,3e-3}"),
    "nli": (1e-3, None, "sweeps nli-adapter-lr{3e-4,1e-3,3e-3}"),
}


def _frozen_encoder_recipes(tuned: dict[str, tuple[float, int | None, str]]) -> dict[str, Recipe]:
    """A frozen-encoder mode's recipes: full mode's start, batch and length, with the swept lr (and epochs)."""
    out = {}
    for task, r in _FULL.items():
        lr, epochs, basis = tuned.get(task, (1e-3, None, _NOT_TUNED))
        out[task] = Recipe(r.model, epochs=epochs or r.epochs, lr=lr, batch_size=r.batch_size,
                           max_length=r.max_length, basis=basis)
    return out


_FEATURE = _frozen_encoder_recipes(_FEATURE_TUNED)
_ADAPTER = _frozen_encoder_recipes(_ADAPTER_TUNED)
RECIPES: dict[tuple[str, str], Recipe] = {
    **{(t, "full"): r for t, r in _FULL.items()},
    **{(t, "feature"): r for t, r in _FEATURE.items()},
    **{(t, "adapter"): r for t, r in _ADAPTER.items()},
}


# A linear head on cached word features (feature mode with `features`, training.feature_head): its lr and
# epochs from bench/feature_table.py's `head_choice` (fitted and scored on the train subset alone).
FEATURE_HEAD_RECIPES: dict[str, Recipe] = {
    "ner": Recipe(_FULL["ner"].model, epochs=10, lr=3e-2, batch_size=32, max_length=128,
                  basis="bench/results/feature_table.json head_choice (train subset only)"),
}


def recipe(task: str, mode: str = "full", features: str | None = None) -> Recipe:
    """The defaults of `task` (sst2, nli, sts, ner, qa) in `mode` (full, feature, adapter); with `features` (feature
    mode's choice of layers), those of a linear head on cached word features."""
    if features is not None:
        if task not in FEATURE_HEAD_RECIPES:
            raise KeyError(f"no feature-head defaults for task {task!r}: tasks {', '.join(FEATURE_HEAD_RECIPES)}.")
        return FEATURE_HEAD_RECIPES[task]
    try:
        return RECIPES[(task, mode)]
    except KeyError:
        tasks = sorted({t for t, _ in RECIPES})
        modes = sorted({m for _, m in RECIPES})
        raise KeyError(f"no defaults for task {task!r} in mode {mode!r}: tasks {', '.join(tasks)}; "
                       f"modes {', '.join(modes)}.") from None


__all__ = ["DEFAULT_ENCODER", "FEATURE_HEAD_RECIPES", "RECIPES", "START_NAMES", "Recipe", "recipe"]
