"""Every sentence the Fine-tuning tab says: its help, the notes beside its settings, what a run says as it
goes and when it ends, and the name its model takes in the model list. Plain text unless the name ends in
`_html`; the tab escapes what it puts in HTML."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from bertlab.analysis.sample_size import examples_text, too_few
from bertlab.training.feature_head import HEAD
from bertlab.training.finetune_defaults import START_NAMES
from bertlab.training.run_state import FinetuneRun, Level

HELP = (
    "Pick a task, its data and a way to adapt the encoder, then press Start. Every run of this session "
    "stays on the plot (labelled task · mode) so full fine-tuning, a frozen encoder and adapters compare. "
    "Cancel keeps the model so far; finished and cancelled models join the model list above."
)
MODE_HELP = {
    "full": "every weight learns",
    "feature": "frozen encoder, only the head learns",
    "adapter": "Houlsby adapters + LayerNorms + head learn",
}
FEATURES_HELP = (f"The BERT paper's feature-based NER: each word's vectors (its first piece) at every layer of the "
                 f"frozen encoder are computed once and cached, and a {HEAD} head (the paper: a two-layer BiLSTM) "
                 "learns on the chosen ones; “mix” learns a weight per layer with it (plotted after the run). "
                 "The head stays in this tab; “the model's own head” makes a whole model for the model list.")
OWN_HEAD_TEXT = "the model's own head on the last layer"
PICKED_TEXT = "the model picked above"
REPLAY_PROBE = "This movie was {mask}, the best I have seen all year."  # spelled with the model's mask token
REPLAY_INTRO = "Replay a run of this session."
REPLAY_WAITING = "Fine-tune a model above: its run can then be replayed here."
START_TOOLTIP = "Fine-tune the model picked above (a copy of it)"
CANCEL_TOOLTIP = "Stop after the current step; the model so far is kept"
CANCELLING = "Cancelling: finishing the current step and saving a checkpoint…"
SECTIONS = ("Use it", "Replay", "What changed")


def device_html(device: str, on_gpu: bool, cpu_max_train: int) -> str:
    """Where the runs train (`device` in words) and how big a run to make there."""
    tip = ("the whole training set fits in minutes." if on_gpu else
           f"keep runs small: about {cpu_max_train:,} examples and 1–2 epochs take a minute or two.")
    return f"Trains on <b>{html.escape(device)}</b>: {tip}"


def start_text(task: str, start: str | None, default: str | None) -> str:
    """The note beside "Start from": `start` the start encoder chosen (None: the model picked above),
    `default` the task's default start encoder where it is offered (None: it is not)."""
    if start is None and default is not None:
        return (f"The default for {task} starts from {START_NAMES[default]}: the offline default's re-trained "
                "layers fine-tune worse on this task.")
    if start is None:
        return "Fine-tunes a copy of the model picked above."
    return (f"Fine-tunes a copy of {START_NAMES[start]}, not the offline default picked above: bertlab's MLM/NSP "
            "heads re-trained its layers, which fine-tune worse on this task (see the documentation: Results, "
            "fine-tuning).")


def start_choice_text(name: str) -> str:
    return f"{START_NAMES[name]} (this task's default)"


def data_note(choice: str, data_dir: str, uploaded: str | None, upload_limit: int | None = None) -> str:
    """The note under a data source `choice` ("default", "path", "upload"), as HTML: BERTLAB_DATA's folder
    (`data_dir`), the file `uploaded` (its name on the student's machine; None: none yet). `upload_limit`
    (bytes) is given in class mode, which also says where a path may point."""
    notes = {
        "default": f"The task's copy under BERTLAB_DATA ({html.escape(data_dir)}).",
        "path": "A data file in the task's format, or a folder holding its train and dev files.",
        "upload": (f"Uploaded: {html.escape(uploaded)}" if uploaded is not None
                   else "Upload a file in the task's format (SST-2 TSV, SICK TSV, CoNLL text, SQuAD JSON)."),
    }
    if upload_limit is not None:
        notes["path"] += " In class: a path inside the class data folder (e.g. sst2) or your workspace."
        if uploaded is None:
            notes["upload"] += f" Up to {upload_limit / 2**20:g} MB."
    return notes[choice]


# -- what a run says --------------------------------------------------------------------------------
def reading_text(label: str) -> str:
    return f"{label}: reading the data…"


def loading_text(label: str, start: str) -> str:
    return f"{label}: loading {START_NAMES.get(start, start)}…"


def features_text(label: str) -> str:
    return f"{label}: computing the frozen encoder's word features (once; cached)…"


def waiting_place_text(label: str, waiting: str) -> str:
    return f"{label}: {waiting}"


def left_queue_text(label: str) -> str:
    return f"{label}: you left the class queue before the run started; nothing ran."


def features_cancelled_text(label: str) -> str:
    return f"{label}: cancelled while computing the word features; nothing trained."


def nothing_kept_text(label: str) -> str:
    return f"{label}: cancelled before the first step; nothing to keep."


def measuring_text(label: str) -> str:
    return f"Measuring what {label} changed…"


def replaying_text(label: str) -> str:
    return f"Reading the probe with every snapshot of {label}…"


def not_measured_text(label: str, error: str) -> str:
    return f"What {label} changed could not be measured: {error}"


def loop_failed_text(error: str | None) -> str:
    return f"the run failed: {error}"


def picker_name(run: FinetuneRun) -> str:
    """The name a fine-tuned model takes in the model list: "task · mode (score[, cancelled at step N])"."""
    shown = f"{run.metric}={run.score:.3g}" if run.score is not None else "not evaluated"
    cancelled = f", cancelled at step {run.step}" if run.status == "cancelled" else ""
    return f"{run.task} · {run.mode} ({shown}{cancelled})"


def kept_text(saved_to: str | None, name: str) -> str:
    """What became of a whole model: where it is saved and its name in the model list."""
    saved = f"; saved in {saved_to}" if saved_to else ""
    return f"{saved}. It joins the model list as “{name}”."


def head_kept_text(features: str) -> str:
    """What became of a head trained on cached features (`features` in words)."""
    return (f" ({features}, a {HEAD} head; the encoder stayed frozen). The head stays in this tab: it is not a "
            "whole model for the model list.")


def run_notes(run: FinetuneRun, metrics: Mapping[str, Any], what: str, n_dev: int = 0) -> list[tuple[Level, str]]:
    """(level, text) notes on how a run ended: its end and dev score (on `n_dev` examples when given) and
    `what` became of it, the sample-size warning, F1 by entity type (NER), exact match and F1 (SQuAD)."""
    done = run.status == "completed"
    ended = "finished" if done else f"cancelled at step {run.step} of {run.total_steps}"
    scored = "" if run.score is None else f", dev {run.metric} {run.score:.3g}" + (
        f" on {examples_text(n_dev, 'dev examples')}" if n_dev else "")
    notes: list[tuple[Level, str]] = [("info" if done else "warning", f"{run.label}: {ended}{scored}{what}")]
    few = too_few(n_dev, "dev examples") if run.score is not None and n_dev else ""
    if few:  # the one rule of bertlab.analysis.sample_size, as the curves and the confusion matrix say it
        notes.append(("warning", few))
    if metrics.get("per_type"):  # NER: how each entity type fares
        per_type = ", ".join(f"{t} {v['f1']:.2f}" for t, v in sorted(metrics["per_type"].items()))
        notes.append(("info", f"F1 by entity type: {per_type}."))
    if "exact_match" in metrics:  # QA
        notes.append(("info", f"Exact match {metrics['exact_match']:.1f}, F1 {metrics['f1']:.1f} (SQuAD, 0-100)."))
    return notes
