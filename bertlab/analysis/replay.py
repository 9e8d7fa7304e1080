"""Training replayed: one probe sentence read by every snapshot a run kept, for a time slider.

    frames = replay(iter_snapshots(model_copy, run_dir / "replay"), tok, "Paris is the capital of [MASK].")
    frames.frame(step).mask        # top-k at the [MASK] after `step` optimizer steps

Everything a view draws is computed here once per snapshot (attention of every head, token x token
cosines at every stage, the [MASK]'s top-k, the logit lens, a classifier's probabilities), so moving the
slider only picks a frame. A fine-tuned model has no MLM head: `with_borrowed_mlm(model, base)` gives it
the head of the model the run started from, which then reads each snapshot's encoder, showing how much of
its word guessing the encoder keeps as it fine-tunes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bertlab.analysis import normalise_masks
from bertlab.analysis.ablation import LogitLens, logit_lens, masked_log_probs
from bertlab.analysis.attention import AttentionResult, attention_patterns
from bertlab.analysis.mask import MaskPrediction, fill_mask
from bertlab.analysis.predict import ClassPrediction, classify
from bertlab.analysis.similarity import TokenSimilarity, token_similarity
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)

TRACKED = 3  # words followed across the run: the last snapshot's top guesses


@dataclass
class ReplayFrame:
    """What the probe looked like to the model after `step` optimizer steps."""

    step: int
    attention: AttentionResult  # patterns [layers, heads, query, key]
    similarity: TokenSimilarity  # matrices [stage, seq, seq]
    mask: MaskPrediction | None = None  # the first [MASK]'s top-k (None: no MLM head or no [MASK])
    lens: LogitLens | None = None  # the MLM head after every stage, following the last snapshot's top word
    classes: ClassPrediction | None = None  # a sentence classifier's probabilities
    tracked: dict[str, float] = field(default_factory=dict)  # word -> its probability at the [MASK]


@dataclass
class Replay:
    """A run's snapshots read on one probe, oldest first."""

    probe: str
    frames: list[ReplayFrame]
    tracked: list[str]  # the words whose probability `frames[i].tracked` follows
    notes: list[str] = field(default_factory=list)  # why a view is missing (no MLM head, no [MASK])

    @property
    def steps(self) -> list[int]:
        return [f.step for f in self.frames]

    def frame(self, step: int) -> ReplayFrame:
        """The frame of `step` (one of `steps`)."""
        for f in self.frames:
            if f.step == step:
                return f
        raise IndexError(f"no snapshot at step {step}: the run kept steps {', '.join(map(str, self.steps))}.")

    def trajectory(self) -> dict[str, list[float]]:
        """label -> value at each frame: the tracked words' probabilities at the [MASK], or (without an MLM
        view) the classifier's probability of each label."""
        if self.tracked:
            return {w: [f.tracked[w] for f in self.frames] for w in self.tracked}
        if self.frames and self.frames[0].classes is not None:
            labels = self.frames[0].classes.labels
            return {lab: [f.classes.probabilities[i] for f in self.frames] for i, lab in enumerate(labels)}
        return {}


def with_borrowed_mlm(model: Bert, donor: Bert) -> Bert:
    """A copy of `model` with `donor`'s MLM head (the decoder tied to `model`'s own word embeddings).
    The two must share the encoder's shape; InputError otherwise."""
    if not donor.has_mlm:
        raise InputError("the model the run started from has no MLM head to read the encoder with.")
    cfg = model.config
    heads = tuple(dict.fromkeys((*cfg.pretraining_heads, "mlm")))
    labels = dict(cfg.id2label) if cfg.task not in (None, "question_answering") else None
    out = model.with_heads(heads, cfg.task, labels, -1, saveable=False)  # looked at, never saved
    ours, theirs, given = model.state_dict(), donor.state_dict(), out.state_dict()
    for name in set(given) - set(ours):
        if name not in theirs or theirs[name].shape != given[name].shape:
            raise InputError("the run's base model and the fine-tuned model differ in shape: cannot borrow its "
                             "MLM head.")
        given[name] = theirs[name]
    out.load_state_dict(given)
    out.tie_weights()
    return out.eval()


@dataclass
class ReplayRun:
    """A run to replay: its final model (the architecture), its snapshots' folder, its base (for an MLM head)."""

    label: str
    model: Bert
    tok: Tokenizer
    folder: Path
    base: Bert | None = None  # fine-tuning: the model it started from, whose MLM head reads the encoder
    probe: str | None = None  # the probe it was last replayed with


def replay_model(model: Bert, base: Bert | None = None) -> tuple[Bert, set[str]]:
    """The model a replay loads each snapshot into: a copy of `model`, with `base`'s MLM head when `model`
    has none and `base` has one (fine-tuning: how much word guessing survives it); and the names of the
    parameters so borrowed, which the snapshots do not hold."""
    frame = copy.deepcopy(model)
    if frame.has_mlm or base is None or not base.has_mlm:
        return frame, set()
    own = {n for n, _ in frame.named_parameters()}
    frame = with_borrowed_mlm(frame, base)
    return frame, {n for n, _ in frame.named_parameters()} - own


def replay(
    frames: Iterable[tuple[int, Bert]],
    tok: Tokenizer,
    probe: str,
    k: int = 5,
    progress: Callable[[int], None] | None = None,
) -> Replay:
    """Read `probe` with each (step, model) of `frames` (e.g. `training.snapshots.iter_snapshots`, which
    loads every snapshot into one model in turn: nothing is kept of a model once its frame is read). The
    first frame's top guesses at the [MASK] are the words followed through the run: give the run's last
    snapshot first. Frames come back sorted by step. InputError for a probe the model cannot read;
    `progress(done)` is called after each frame."""
    probe = normalise_masks(probe, tok)
    has_mask = tok.mask_token in probe
    tracked: list[str] = []
    masked_words = True  # a next-token model (config.predicts_next: causal, peek) guesses none
    out: list[ReplayFrame] = []
    notes: list[str] = []
    for step, model in frames:
        if not out:
            masked_words = model.has_mlm and not model.config.predicts_next
            if model.has_mlm and not masked_words:
                notes.append("This model predicts the next token, not masked ones: the Mask and logit-lens views "
                             "stay empty; its attention shows what each position reads.")
            elif not model.has_mlm and model.config.task == "sequence_classification":
                notes.append("This model has no MLM head: the Mask view shows its class probabilities instead, "
                             "and the logit lens stays empty.")
            elif not model.has_mlm:
                notes.append("This model has no MLM head: the Mask and logit-lens views stay empty.")
            elif not has_mask:
                notes.append(f"The probe has no {tok.mask_token}: put one in it for the Mask and logit-lens views.")
        frame = ReplayFrame(step, attention_patterns(model, tok, probe), token_similarity(model, tok, probe))
        if masked_words and has_mask:
            frame.mask = fill_mask(model, tok, probe, k=k)[0]
            if not tracked:
                tracked = [c.token for c in frame.mask.candidates[:TRACKED]]
            frame.lens = logit_lens(model, tok, _one_mask(probe, tok), target=tracked[0], k=k)
            row = masked_log_probs(model, frame.lens.query)[0].exp()  # [vocab]
            frame.tracked = {w: float(row[tok.token_to_id(w)]) for w in tracked}
        if model.config.task == "sequence_classification":
            frame.classes = classify(model, tok, probe)
        out.append(frame)
        if progress is not None:
            progress(len(out))
    if not out:
        raise InputError("This run kept no snapshots to replay (it stopped before its first step, or its folder "
                         "was removed).")
    return Replay(probe, sorted(out, key=lambda f: f.step), tracked, notes)


def _one_mask(probe: str, tok: Tokenizer) -> str:
    """The probe with only its first mask token kept (the others become the unknown token): the logit
    lens follows one position."""
    m = tok.mask_token
    first = probe.index(m) + len(m)
    return probe[:first] + probe[first:].replace(m, tok.unk_token)
