"""Fine-tuning tab: pick a task, data and a way to adapt the encoder (full fine-tuning, a head on
frozen features, or Houlsby adapters), watch the training loss and the dev metric live, cancel at
any time; then use the model on your own text and see its [CLS] vectors before and after.

Training runs in a background thread (`bertlab.training.finetune.finetune`), which reports through
loop events; every run of the session stays on one plot, labelled "task · mode", so the three
modes compare. A finished or cancelled run joins the model picker through `self.model_made`.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis import InputError, max_tokens
from bertlab.analysis.attribution import ExplainInput, Target
from bertlab.analysis.predict import answer, classify, cls_vectors, entail, entities, pca_2d, split_words
from bertlab.analysis.targets import class_target, span_target, tag_target
from bertlab.model import Bert
from bertlab.panels.base import BackgroundWork, Level, Panel, SyncedFigureWidget, retire, show_figure
from bertlab.panels.explain import ExplainSection
from bertlab.panels.finetune_diff import ChangedSection, measure_change
from bertlab.panels.replay import ReplaySection
from bertlab.settings import DataNotFoundError, data_dir, upload_max_bytes
from bertlab.tokenizer import DEFAULT_SPECIALS, Tokenizer
from bertlab.training.finetune import MODES, FinetuneConfig, finetune, subset
from bertlab.training.finetune_defaults import START_NAMES, Recipe, recipe
from bertlab.training.loop import TrainEvent
from bertlab.training.queue import turn as queue_turn
from bertlab.training.queue import waiting_text
from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper
from bertlab.training.tasks import (
    NLI_LABELS,
    SST2_LABELS,
    TASKS,
    DataSourceError,
    DataSplit,
    get_task,
    read_train_dev,
)
from bertlab.viz.finetune import (
    answer_html,
    entities_html,
    plot_class_probabilities,
    plot_cls_pca,
    plot_confusion_matrix,
    plot_span_probabilities,
    plot_training_curves,
)
from bertlab.workspace import UploadTooLarge, Workspace

log = logging.getLogger(__name__)

STUDENT_ERRORS = (ValueError, KeyError, DataNotFoundError, DataSourceError)  # their message says what to change

CPU_MAX_TRAIN, CPU_MAX_DEV = 2000, 500  # CPU runs must stay small (0 = all, the default on a GPU)
EVALS_PER_EPOCH = 4  # dev evaluations per epoch: enough points for a live curve
PCA_SAMPLE = 200  # dev examples in the [CLS] picture
REDRAW_EVERY_S = 0.5  # the curves redraw at most this often while training
MODE_HELP = {
    "full": "every weight learns",
    "feature": "frozen encoder, only the head learns",
    "adapter": "Houlsby adapters + LayerNorms + head learn",
}
PICKED = "picked"  # the "Start from" choice: the model picked above
REPLAY_PROBE = "This movie was {mask}, the best I have seen all year."  # spelled with the model's mask token
HELP = (
    "Pick a task, its data and a way to adapt the encoder, then press Start. Every run of this session "
    "stays on the plot (labelled task · mode) so full fine-tuning, a frozen encoder and adapters compare. "
    "Cancel keeps the model so far; finished and cancelled models join the model list above."
)
USE_HELP = (
    "Try the model just made (or a fine-tuned model picked above) on your own text. "
    "The {cls} picture projects dev examples onto 2 axes before and after fine-tuning."  # the model's {cls}
)
DEFAULT_SENTENCE = "A gripping, funny and beautifully acted film."
DEFAULT_PREMISE, DEFAULT_HYPOTHESIS = "A man is playing a guitar on a stage.", "A person is playing an instrument."
DEFAULT_NER_TEXT = "Angela Merkel met Emmanuel Macron in Paris to talk about Airbus and the European Union."
DEFAULT_QUESTION = "Who designed the Eiffel Tower?"
DEFAULT_PARAGRAPH = (
    "The Eiffel Tower was built for the 1889 World's Fair in Paris. It was designed by the engineering "
    "company of Gustave Eiffel and is 330 metres tall, the tallest structure in the city."
)


# ---------------------------------------------------------------------------------------------
# Pure helpers: data, models, failures
# ---------------------------------------------------------------------------------------------
def save_upload(upload: dict[str, Any], folder: Path) -> Path:
    """Write one ipywidgets.FileUpload entry (name, content) into `folder`; returns the file."""
    name = Path(str(upload.get("name") or "")).name  # no folders: only the file's own name
    if name in ("", ".", ".."):
        name = "upload"
    path = folder / name
    path.write_bytes(bytes(upload["content"]))
    return path


def model_task(model: Bert) -> str | None:
    """The "use it" view a model's head calls for: sst2, nli, classification, ner, qa (None = no head)."""
    cfg = model.config
    if cfg.task == "sequence_classification":
        labels = {str(v).lower() for v in cfg.id2label.values()}
        if labels == set(NLI_LABELS.values()):
            return "nli"
        return "sst2" if labels == set(SST2_LABELS.values()) else "classification"
    return {"token_classification": "ner", "question_answering": "qa"}.get(cfg.task)


def is_offline_default(model: Bert) -> bool:
    """Whether `model` is the offline default as `bertlab.load()` gives it (with bertlab's heads)."""
    from bertlab.loading import DEFAULT_MODEL

    return getattr(getattr(model, "load_report", None), "source", None) == DEFAULT_MODEL


def is_out_of_memory(error: BaseException | str | None) -> bool:
    """Whether an exception (or a failed run's error text) is the GPU running out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return error is not None and re.search(r"out of (gpu )?memory", str(error), re.IGNORECASE) is not None


def oom_message(batch_size: int, max_length: int) -> str:
    smaller = max(1, batch_size // 2)
    shorter = max(32, max_length // 2)
    return (f"Out of GPU memory with batches of {batch_size} × up to {max_length} tokens. Try a smaller batch "
            f"(e.g. {smaller}) or shorter sequences (max length {shorter}), then press Start again. "
            "Earlier runs and saved models are not affected.")


def percent(task: str, value: float) -> float:
    """The task's main metric in percent (SQuAD's F1 already is)."""
    return value if task == "qa" else 100 * value


# ---------------------------------------------------------------------------------------------
# One run of this session
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    """What the panel keeps of one training run (the model itself goes to the picker)."""

    label: str  # "sst2 · full" (+ " #2" for a repeat)
    task: str
    mode: str
    out_dir: Path
    base: Bert  # the model the run started from (the "before" of the [CLS] picture)
    history: list[dict[str, Any]] = field(default_factory=list)  # train/eval entries, as plot_training_curves reads
    status: str = "starting"  # starting, running, completed, cancelled, failed
    step: int = 0
    total_steps: int = 0
    summary: dict[str, Any] = field(default_factory=dict)  # FinetuneResult.summary() at the end
    dev: list[Any] = field(default_factory=list)  # the dev examples the run scored
    id2label: dict[int, str] = field(default_factory=dict)
    checkpoint: str | None = None
    error: str | None = None
    start: str = PICKED  # "Start from": the model picked above, or a start encoder's `bertlab.load` source
    precision: str | None = None  # what the loop computes in ("bf16" autocast or "fp32"), from its start event

    @property
    def metric(self) -> str:
        return get_task(self.task).main_metric

    @property
    def score(self) -> float | None:
        """The last dev evaluation's main metric (task scale), None before any."""
        evals = [h for h in self.history if h.get("kind") == "eval"]
        return evals[-1][self.metric] if evals else None


# ---------------------------------------------------------------------------------------------
# The panel
# ---------------------------------------------------------------------------------------------
class FinetunePanel(BackgroundWork, Panel):
    """Fine-tune the picked model on a task in the background; compare runs; use the result."""

    title = "Fine-tuning"
    teaches = ("Fine-tuning adapts a pre-trained encoder to a task: training every weight, only a head "
               "on frozen features, or small adapters, compared on the same dev metric.")

    def __init__(self, model: Bert, tok: Tokenizer, runs_dir: str | Path | None = None, device: str = "auto",
                 workspace: Workspace | None = None) -> None:
        """`runs_dir`: where run folders go (default: the session's workspace, see bertlab.workspace)."""
        super().__init__()
        self.model, self.tok = model, tok
        self.workspace = workspace or Workspace.for_session()
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.device = device
        self.runs: list[Run] = []
        self._cancel = threading.Event()
        self._draw_lock = threading.Lock()
        self._last_draw = 0.0
        self._data_cache: dict[tuple[str, str], DataSplit] = {}
        self._upload_path: Path | None = None
        self._upload_name = ""  # the file's name on the student's machine
        on_gpu = self._device_name().startswith("cuda")
        style = {"description_width": "initial"}

        self.task = widgets.Dropdown(
            options=[(f"{name}: {t.description}", name) for name, t in TASKS.items()], value="sst2",
            description="Task", style=style, layout=widgets.Layout(width="min(100%, 640px)"),
        )
        self.mode = widgets.ToggleButtons(
            options=[(m, m) for m in MODES], value="full", description="Adapt",
            style={"description_width": "initial", "button_width": "90px"},
            tooltips=[MODE_HELP[m] for m in MODES],
        )
        self.mode_help = widgets.HTML(self._mode_note("full"))
        self.data = widgets.Dropdown(
            options=[("BERTLAB_DATA folder", "default"), ("a path (file or folder)", "path"),
                     ("an uploaded file", "upload")],
            value="default", description="Data", style=style, layout=widgets.Layout(width="300px"),
        )
        self.path = widgets.Text(placeholder="data file or folder", continuous_update=False,
                                 layout=widgets.Layout(width="min(100%, 340px)"))
        self.upload = widgets.FileUpload(accept=".tsv,.txt,.json,.conll", multiple=False, description="Upload")
        self.data_note = widgets.HTML()
        self.epochs = widgets.BoundedIntText(value=2, min=1, max=100, description="Epochs", style=style,
                                             layout=widgets.Layout(width="120px"))
        self.lr = widgets.BoundedFloatText(value=recipe("sst2").lr, min=1e-7, max=1.0, step=1e-5,
                                           description="Learning rate", style=style,
                                           layout=widgets.Layout(width="200px"))
        self.batch = widgets.BoundedIntText(value=32 if on_gpu else 16, min=1, max=4096, description="Batch",
                                            style=style, layout=widgets.Layout(width="120px"))
        self.max_length = widgets.BoundedIntText(value=128, min=16, max=max_tokens(model), description="Max length",
                                                 style=style, layout=widgets.Layout(width="150px"))
        self.max_train = widgets.BoundedIntText(value=0 if on_gpu else CPU_MAX_TRAIN, min=0, max=10**8,
                                                description="Max train examples (0 = all)", style=style,
                                                layout=widgets.Layout(width="260px"))
        self.max_dev = widgets.BoundedIntText(value=0 if on_gpu else CPU_MAX_DEV, min=0, max=10**8,
                                              description="Max dev examples", style=style,
                                              layout=widgets.Layout(width="200px"))
        self.device_note = widgets.HTML(self._device_note())
        self.start_from = widgets.Dropdown(description="Start from", style=style,
                                           layout=widgets.Layout(width="min(100%, 520px)"))
        self.start_note = widgets.HTML()
        self._encoders: dict[str, tuple[Bert, Tokenizer]] = {}  # start encoders loaded by this panel
        self._apply_recipe()
        self.start_button = widgets.Button(description="Start", button_style="primary", icon="play",
                                           tooltip="Fine-tune the model picked above (a copy of it)")
        self.cancel_button = widgets.Button(description="Cancel", button_style="warning", icon="stop", disabled=True,
                                            tooltip="Stop after the current step; the model so far is kept")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="260px"))
        self.progress_text = widgets.HTML('<span style="color:#777">No run yet.</span>')
        self._curves_fig = plot_training_curves({}, "accuracy")
        self.curves = SyncedFigureWidget(self._curves_fig)
        self._curves_key: tuple = ()
        self.curves_box = widgets.Box([self.curves])
        self.runs_table = widgets.HTML()
        self._confusion_fig: go.Figure | None = None
        self.confusion_box = widgets.Box([])
        self.use = UsePanel(model, tok, dev_examples=self.dev_examples)
        self.replay = ReplaySection(tok, tok.spell(REPLAY_PROBE), intro="Replay a run of this session.")
        self.replay.show_message("Fine-tune a model above: its run can then be replayed here.")
        self.changed = ChangedSection()
        self.help = widgets.HTML(f'<div style="color:#555;font-size:0.9em">{HELP}</div>')

        self.task.observe(self._on_task, names="value")
        self.mode.observe(self._on_mode, names="value")
        self.start_from.observe(lambda _: self._show_start_note(), names="value")
        self.data.observe(self._on_data, names="value")
        self.path.observe(self._on_path, names="value")
        self.upload.observe(self._on_upload, names="value")
        self.start_button.on_click(self._on_start)
        self.cancel_button.on_click(self._on_cancel)
        self._on_data()
        wrap = widgets.Layout(flex_flow="row wrap")
        self._widget = widgets.VBox(
            [
                self.help,
                self.task,
                widgets.HBox([self.mode, self.mode_help]),
                widgets.HBox([self.start_from, self.start_note], layout=wrap),
                widgets.HBox([self.data, self.path, self.upload]),
                self.data_note,
                widgets.HBox([self.epochs, self.lr, self.batch, self.max_length], layout=wrap),
                widgets.HBox([self.max_train, self.max_dev], layout=wrap),
                self.device_note,
                widgets.HBox([self.start_button, self.cancel_button, self.progress, self.progress_text]),
                self.message,
                self.curves_box,
                self.runs_table,
                self.confusion_box,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">Use it</h3>'),
                self.use.widget,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">Replay</h3>'),
                self.replay.widget,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">What changed</h3>'),
                self.changed.widget,
            ],
            layout=widgets.Layout(width="100%"),
        )

    @property
    def widget(self) -> widgets.VBox:
        return self._widget

    def set_model(self, model: Bert, tok: Tokenizer) -> None:
        """The next run fine-tunes this model; a model with a task head goes to "Use it"."""
        if model is self.model:
            return  # the app re-sends the current model when another one joins the list
        self.model, self.tok = model, tok
        self.max_length.max = max_tokens(model)
        self._apply_recipe()  # "Start from" offers the package's encoder only for the offline default
        if model_task(model):
            self.use.show_model(model, tok, "the model picked above")

    def figures(self) -> dict[str, go.Figure]:
        figs: dict[str, go.Figure] = {}
        if self.runs:
            figs["training curves"] = self._curves_fig
        if self._confusion_fig is not None:
            figs["confusion matrix"] = self._confusion_fig
        return {**figs, **self.use.figures(), **self.replay.figures(), **self.changed.figures()}

    def cancel(self) -> None:
        """Stop the run after its current step; the loop saves a checkpoint of the model so far."""
        self._cancel.set()

    # -- settings callbacks ---------------------------------------------------------------------
    def _on_task(self, change) -> None:
        if not self.running:  # a message about the previous task's data or run no longer applies
            self.show_messages([])
        self._apply_recipe()
        if self.data.value == "upload":
            self._check_upload()

    def _on_mode(self, change) -> None:
        self.epochs.value, self.lr.value = self.recipe.epochs, self.recipe.lr  # batch and length stay the task's
        self.mode_help.value = self._mode_note(change["new"])

    @property
    def recipe(self) -> Recipe:
        """The measured defaults of the chosen task and mode (training.finetune_defaults)."""
        return recipe(self.task.value, self.mode.value)

    def _apply_recipe(self) -> None:
        """Fill the settings and "Start from" with the chosen task's (and mode's) defaults."""
        r = self.recipe
        self.epochs.value, self.lr.value, self.batch.value = r.epochs, r.lr, r.batch_size
        self.max_length.value = min(r.max_length, self.max_length.max)
        options = [("the model picked above", PICKED)]
        if is_offline_default(self.model) and r.model is not None:  # the package's encoder is the better start
            options.append((f"{START_NAMES[r.model]} (this task's default)", r.model))
        self.start_from.options = options
        self.start_from.value = options[-1][1]
        self._show_start_note()

    def _show_start_note(self) -> None:
        r, choice = self.recipe, self.start_from.value
        if choice == PICKED and len(self.start_from.options) > 1:
            text = (f"The default for {self.task.value} starts from {START_NAMES[r.model]}: the offline default's "
                    "re-trained layers fine-tune worse on this task.")
        elif choice == PICKED:
            text = "Fine-tunes a copy of the model picked above."
        else:
            text = (f"Fine-tunes a copy of {START_NAMES[choice]}, not the offline default picked above: bertlab's "
                    "MLM/NSP heads re-trained its layers, which fine-tune worse on this task (see the documentation: "
                    "Results, fine-tuning).")
        self.start_note.value = f'<span style="color:#555;font-size:0.9em">{html.escape(text)}</span>'

    def _on_data(self, _=None) -> None:
        self.path.disabled = self.data.value != "path"
        notes = {
            "default": f"The task's copy under BERTLAB_DATA ({html.escape(str(data_dir()))}).",
            "path": "A data file in the task's format, or a folder holding its train and dev files.",
            "upload": (f"Uploaded: {html.escape(self._upload_name)}" if self._upload_path
                       else "Upload a file in the task's format (SST-2 TSV, SICK TSV, CoNLL text, SQuAD JSON)."),
        }
        if self.workspace.confined:  # class mode: say what the path field and uploads accept
            notes["path"] += " In class: a path inside the class data folder (e.g. sst2) or your workspace."
            if not self._upload_path:
                notes["upload"] += f" Up to {upload_max_bytes() / 2**20:g} MB."
        self.data_note.value = f'<span style="color:#555;font-size:0.9em">{notes[self.data.value]}</span>'

    def _on_path(self, change) -> None:
        if change["new"].strip() and self.data.value != "path":
            self.data.value = "path"

    def _on_upload(self, change) -> None:
        """Save the file and read it at once: a malformed file is named with its line here."""
        with self.reporting():
            if not change["new"]:
                return
            entry = change["new"][0]
            try:
                self.workspace.check_upload(memoryview(entry["content"]).nbytes)  # class mode: size-limited
            except UploadTooLarge:
                self.upload.value = ()  # do not keep the refused bytes in the kernel
                raise
            self._upload_path = save_upload(entry, self.workspace.uploads)
            self._upload_name = str(entry.get("name") or self._upload_path.name)
            self._data_cache = {k: v for k, v in self._data_cache.items() if k[1] != str(self._upload_path)}
            self.data.value = "upload"
            self._on_data()
            self._check_upload()

    def _check_upload(self) -> None:
        with self.reporting():
            if self._upload_path is None:
                raise InputError("Upload a data file first (the Upload button).")
            split = self._read(self.task.value, self._source("upload"))
            self.show_message(split.note)

    # -- data -------------------------------------------------------------------------------------
    def _source(self, kind: str) -> str | None:
        if kind == "path":
            path = self.path.value.strip()
            if not path:
                raise InputError("Type the path of a data file or folder (or pick BERTLAB_DATA).")
            return str(self.workspace.resolve(path, "data"))  # class mode: the workspace and BERTLAB_DATA only
        if kind == "upload":
            if self._upload_path is None:
                raise InputError("Upload a data file first (the Upload button), or pick another data source.")
            return str(self._upload_path)
        return None

    def _read(self, task: str, source: str | None) -> DataSplit:
        """The examples of `task` from `source` (None = BERTLAB_DATA), cached; errors name the
        uploaded file as the student knows it."""
        key = (task, source or "")
        if key not in self._data_cache:
            try:
                self._data_cache[key] = read_train_dev(get_task(task), source)
            except (ValueError, DataNotFoundError, DataSourceError) as e:
                text = str(e)
                if self._upload_path is not None:
                    text = text.replace(str(self._upload_path), self._upload_name)
                text = self.workspace.hide_root(text)
                raise InputError(text) from e
        return self._data_cache[key]

    def dev_examples(self, task: str) -> list[Any]:
        """Dev examples of `task` from the chosen data source (for the [CLS] picture of a picked model)."""
        return self._read(task, self._source(self.data.value)).dev

    # -- a run ------------------------------------------------------------------------------------
    def _on_start(self, _=None) -> None:
        with self.reporting():
            self.start()

    def start(self) -> None:
        """Start fine-tuning a copy of the current model in a background thread."""
        if self.running:
            raise InputError("A run is in progress: cancel it or wait for it to end.")
        task, mode = self.task.value, self.mode.value
        source = self._source(self.data.value)  # fails early on a missing path / upload
        cfg = FinetuneConfig(
            task=task, mode=mode, model=self.model, epochs=self.epochs.value, lr=self.lr.value,
            batch_size=self.batch.value, eval_batch_size=max(64, self.batch.value), max_length=self.max_length.value,
            max_train_examples=self.max_train.value or None, max_eval_examples=self.max_dev.value or None,
            out_dir=str(self._out_dir(task, mode)), device=self.device,
        )
        run = Run(self._label(task, mode), task, mode, Path(cfg.out_dir), base=self.model,
                  start=self.start_from.value)
        self.runs.append(run)
        self._cancel = threading.Event()
        self._set_running(True)
        self.show_message(f"{run.label}: reading the data…")
        self.progress.value, self.progress.max = 0, 1
        self._draw_curves(force=True)
        on_event = functools.partial(self._on_event, run)
        self.start_work(self._train, (run, cfg, self.tok, source, on_event), f"bertlab-finetune-{run.label}")

    def _on_cancel(self, _=None) -> None:
        self.cancel()
        self.progress_text.value = "Cancelling: finishing the current step and saving a checkpoint…"

    def _train(self, run: Run, cfg: FinetuneConfig, tok: Tokenizer, source: str | None,
               on_event: Callable[[TrainEvent], None]) -> None:
        """The background thread: wait for a slot in the class queue, read the data, fine-tune,
        report; never raises."""
        turn = None
        try:
            turn = queue_turn(run.label)
            if not turn.wait(self._cancel, lambda ahead: self.show_message(f"{run.label}: {waiting_text(ahead)}")):
                run.status = "cancelled"
                self.progress_text.value = ""
                self.show_message(f"{run.label}: you left the class queue before the run started; nothing ran.",
                                  "warning")
                return
            if run.start != PICKED:  # the task's start encoder instead of the offline default
                self.show_message(f"{run.label}: loading {START_NAMES.get(run.start, run.start)}…")
                run.base, tok = self._start_encoder(run.start)
                cfg = dataclasses.replace(cfg, model=run.base)
            data = self._read(run.task, source)
            cfg = self._cadence(cfg, len(data.train))
            run.dev = subset(data.dev, cfg.max_eval_examples, cfg.seed, "dev")  # what finetune scores
            self.show_message(f"{run.label}: {data.note}")
            keeper = SnapshotKeeper(run.out_dir / REPLAY_DIR)  # a few weights-only snapshots, for the replay
            result = finetune(cfg, callbacks=[on_event, keeper], cancel=self._cancel, tokenizer=tok,
                              train_examples=data.train, eval_examples=data.dev)
        except Exception as e:
            run.status, run.error = "failed", self._failure_text(e, cfg)
            if not isinstance(e, STUDENT_ERRORS) and not is_out_of_memory(e):
                log.exception("fine-tuning run %s failed", run.label)
            self.show_message(f"{run.label}: {run.error}", "error")
            if run.total_steps == 0 and not run.history:  # it never started: no row, no run number, no curve
                self.runs.remove(run)
        else:
            self._finished(run, result, cfg)
            self._replay_and_compare(run, result, keeper.folder, cfg.max_length or 128)
            del result
        finally:
            if turn is not None:
                turn.leave()  # the next student's run may start
            if run.status == "failed":
                _free_gpu_memory()  # outside the except block: the traceback no longer holds the tensors
            self._set_running(False)
            self._draw_curves(force=True)
            self._draw_table()

    def _replay_and_compare(self, run: Run, result: Any, folder: Path, max_length: int) -> None:
        """A run that took a step joins the Replay section (replayed at once) and "What changed" (measured
        against its base). Never raises: the run itself is done and kept."""
        if result.status == "failed" or run.step == 0:
            return
        try:
            self.replay.add_run(run.label, result.model, result.tokenizer, folder, base=run.base)
        except Exception as e:  # noqa: BLE001
            log.exception("replay of %s failed", run.label)
            self.replay.show_message(f"{run.label} cannot be replayed: {self.workspace.hide_root(str(e))}", "error")
        try:
            with self.changed.busy(text=f"Measuring what {run.label} changed…"):
                change = measure_change(run.base, result.model, result.tokenizer, run.task, run.dev, max_length)
            self.changed.add(run.label, change)
        except Exception as e:  # noqa: BLE001
            log.exception("measuring what %s changed failed", run.label)
            self.changed.show_message(f"What {run.label} changed could not be measured: {e}", "error")

    def _start_encoder(self, source: str) -> tuple[Bert, Tokenizer]:
        """The start encoder `source` (e.g. the package's MiniLM encoder), loaded once per panel."""
        if source not in self._encoders:
            from bertlab.loading import load

            self._encoders[source] = load(source)
        return self._encoders[source]

    def _cadence(self, cfg: FinetuneConfig, n_train: int) -> FinetuneConfig:
        """Evaluate a few times an epoch, log ~20 times an epoch, checkpoint once an epoch (keeping
        the last checkpoint only: with its optimizer state it is 3× the model's size)."""
        n = min(n_train, cfg.max_train_examples or n_train)
        steps = max(1, math.ceil(n / cfg.batch_size))
        return dataclasses.replace(cfg, eval_every=max(1, steps // EVALS_PER_EPOCH), checkpoint_every=steps,
                                   log_every=max(1, min(10, steps // 20)), extra_train={"keep_last": 1})

    def _failure_text(self, error: BaseException, cfg: FinetuneConfig) -> str:
        if is_out_of_memory(error):
            return oom_message(cfg.batch_size, cfg.max_length or 128)
        if isinstance(error, STUDENT_ERRORS):
            return str(error.args[0] if isinstance(error, KeyError) and error.args else error)
        return f"the run stopped ({type(error).__name__}: {error})."

    def _finished(self, run: Run, result: Any, cfg: FinetuneConfig) -> None:
        """Report how the run ended; a completed or cancelled model joins the picker and "Use it"."""
        run.status, run.step, run.summary = result.status, result.train.step, result.summary()
        run.id2label = dict(result.model.config.id2label)
        if result.status == "failed":
            oom = is_out_of_memory(result.train.exception) or is_out_of_memory(result.error)
            run.error = (oom_message(cfg.batch_size, cfg.max_length or 128) if oom
                         else f"the run failed: {result.error}")
            self.show_message(f"{run.label}: {run.error}", "error")
            return
        if run.step == 0:
            self.show_message(f"{run.label}: cancelled before the first step; nothing to keep.", "warning")
            return
        score = run.score
        shown = f"{run.metric}={score:.3g}" if score is not None else "not evaluated"
        name = f"{run.task} · {run.mode} ({shown})"
        if result.status == "cancelled":
            name = f"{run.task} · {run.mode} ({shown}, cancelled at step {run.step})"
        done = result.status == "completed"
        ended = "finished" if done else f"cancelled at step {run.step} of {run.total_steps}"
        scored = f", dev {run.metric} {score:.3g}" if score is not None else ""
        saved = f"; saved in {self.workspace.shown(result.saved_to)}" if result.saved_to else ""
        notes: list[tuple[Level, str]] = [(
            "info" if done else "warning",
            f"{run.label}: {ended}{scored}{saved}. It joins the model list as “{name}”.",
        )]
        if done and result.metrics.get("per_type"):  # NER: how each entity type fares
            per_type = ", ".join(f"{t} {v['f1']:.2f}" for t, v in sorted(result.metrics["per_type"].items()))
            notes.append(("info", f"F1 by entity type: {per_type}."))
        if done and "exact_match" in result.metrics:  # QA
            em, f1 = result.metrics["exact_match"], result.metrics["f1"]
            notes.append(("info", f"Exact match {em:.1f}, F1 {f1:.1f} (SQuAD, 0-100)."))
        self.use.show_model(result.model, result.tokenizer, name, before=run.base, dev=run.dev, task=run.task)
        self._draw_confusion(run, result.metrics)
        if self.model_made is not None:
            try:
                self.model_made(name, result.model, result.tokenizer)
            except Exception as e:
                log.exception("adding %s to the model list failed", name)
                notes.append(("warning", f"Could not add it to the model list ({type(e).__name__}: {e})."))
        self.show_messages(notes)

    def _on_event(self, run: Run, event: TrainEvent) -> None:
        """A loop event (from the training thread): record it and redraw. Never raises."""
        try:
            if event.kind == "start":
                run.status, run.total_steps, run.precision = "running", event.total_steps, event.precision
                self.progress.max = max(1, event.total_steps)
            elif event.kind == "step":
                run.history.append({"kind": "train", "step": event.step, "epoch": event.epoch, "loss": event.loss})
            elif event.kind == "eval":
                scores = {k: v for k, v in event.metrics.items() if isinstance(v, (int, float))}
                run.history.append({"kind": "eval", "step": event.step, "epoch": event.epoch, **scores})
            elif event.kind == "checkpoint":
                run.checkpoint = event.path
            run.step = event.step
            self.progress.value = min(event.step, self.progress.max)
            self.progress_text.value = _progress_html(run, event)
            if event.kind in ("eval", "end") or time.perf_counter() - self._last_draw > REDRAW_EVERY_S:
                self._draw_curves()
        except Exception:
            log.exception("the fine-tuning panel could not show a training event")

    # -- drawing ----------------------------------------------------------------------------------
    def _draw_curves(self, force: bool = False) -> None:
        """Every run's loss and dev curve; swap in a new widget when the runs (traces) change."""
        with self._draw_lock:
            self._last_draw = time.perf_counter()
            metric, curves = self._curve_data()
            scored = [len(r.dev) for r in self.runs if r.dev]
            fig = plot_training_curves(curves, metric, dev_examples=min(scored) if scored else None)
            self._curves_fig = fig
            key = (metric, tuple(curves))
            if key == self._curves_key and not force:
                with self.curves.batch_update():
                    for old, new in zip(self.curves.data, fig.data):
                        old.x, old.y = new.x, new.y
            else:
                old, self.curves = self.curves, SyncedFigureWidget(fig)
                self.curves_box.children = (self.curves,)
                retire(self.curves_box, old)  # closed at the next swap: its view may still be talking
                self._curves_key = key

    def _curve_data(self) -> tuple[str, dict[str, list[dict[str, Any]]]]:
        """(dev metric name, label -> history) with the dev metric in percent for every run."""
        metrics = {r.metric for r in self.runs}
        name = f"{metrics.pop()} (%)" if len(metrics) == 1 else "main metric (%)"
        curves = {}
        for r in self.runs:
            curves[r.label] = [
                {**h, name: percent(r.task, h[r.metric])} if h["kind"] == "eval" and r.metric in h else h
                for h in list(r.history)
            ]
        return name, curves

    def _draw_table(self) -> None:
        self.runs_table.value = runs_html(self.runs, self.workspace.shown)

    def _draw_confusion(self, run: Run, metrics: dict[str, Any]) -> None:
        matrix = metrics.get("confusion_matrix")
        if matrix is None or not run.id2label:
            self._confusion_fig, self.confusion_box.children = None, ()
            return
        labels = [run.id2label[i] for i in range(len(run.id2label))]
        self._confusion_fig = plot_confusion_matrix(matrix, labels)
        self._confusion_fig.update_layout(title_text=f"{run.label}: {self._confusion_fig.layout.title.text}")
        show_figure(self.confusion_box, self._confusion_fig)

    # -- small things -----------------------------------------------------------------------------
    def _set_running(self, running: bool) -> None:
        self.start_button.disabled = running
        self.cancel_button.disabled = not running

    def _label(self, task: str, mode: str) -> str:
        label = f"{task} · {mode}"
        n = sum(1 for r in self.runs if r.task == task and r.mode == mode)
        return label if n == 0 else f"{label} #{n + 1}"

    def _out_dir(self, task: str, mode: str) -> Path:
        """A new folder for a run, made now: no other run (of any session) can get the same one."""
        return self.workspace.new_run_dir(f"{task}-{mode}", parent=self.runs_dir)

    def _device_name(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def _device_note(self) -> str:
        name = self._device_name()
        if name.startswith("cuda"):
            what = f"{name} ({torch.cuda.get_device_name()})"
            tip = "the whole training set fits in minutes."
        else:
            what = f"cpu ({torch.get_num_threads()} threads)"
            tip = f"keep runs small: about {CPU_MAX_TRAIN:,} examples and 1–2 epochs take a minute or two."
        return f'<span style="color:#555;font-size:0.9em">Trains on <b>{html.escape(what)}</b>: {tip}</span>'

    @staticmethod
    def _mode_note(mode: str) -> str:
        return f'<span style="color:#555;font-size:0.9em;margin-left:8px">{MODE_HELP[mode]}</span>'


def _free_gpu_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _progress_html(run: Run, event: TrainEvent) -> str:
    """One line: step, epoch, loss, speed, last dev score, time left."""
    parts = [f"<b>{html.escape(run.label)}</b>", f"step {event.step}/{event.total_steps}", f"epoch {event.epoch:.2f}"]
    if run.precision == "bf16":  # said, since a run's figures differ a little from an fp32 run's
        tip = "matrix products in bfloat16 (autocast); weights and optimizer in float32"
        parts.append(f'<span title="{tip}">bf16</span>')
    losses = [h["loss"] for h in run.history if h["kind"] == "train"]
    if losses:
        parts.append(f"loss {losses[-1]:.3f}")
    if event.examples_per_s:
        parts.append(f"{event.examples_per_s:.0f} examples/s")
    if run.score is not None:
        parts.append(f"dev {run.metric} {run.score:.3g}")
    if 0 < event.step < event.total_steps and event.kind not in ("end", "error"):
        left = event.elapsed_s / event.step * (event.total_steps - event.step)
        parts.append(f"~{left:.0f} s left")
    if event.kind == "end" and event.message:
        parts.append(html.escape(event.message))
    return " · ".join(parts)


def runs_html(runs: Sequence[Run], shown: Callable[[str], str] = str) -> str:
    """A table of this session's runs: how each ended, its dev score, what it trained, where it is."""
    if not runs:
        return ""
    head = "".join(f'<th style="text-align:left;padding:2px 10px">{h}</th>'
                   for h in ("run", "status", "steps", "dev score", "trained parameters", "time", "saved in"))
    rows = []
    for r in runs:
        s = r.summary
        score = f"{r.metric} {r.score:.3g}" if r.score is not None else "–"
        trained = (f"{s['trainable_parameters'] / 1e6:.2f}M of {s['total_parameters'] / 1e6:.1f}M "
                   f"({100 * s['trainable_parameters'] / max(1, s['total_parameters']):.1f}%)" if s else "–")
        cells = (r.label, r.status, f"{r.step}/{r.total_steps or '?'}", score, trained,
                 f"{s['wall_time_s']:.0f} s" if s else "–", shown(s.get("saved_to") or r.checkpoint or "–"))
        rows.append("<tr>" + "".join(f'<td style="padding:2px 10px">{html.escape(str(c))}</td>' for c in cells)
                    + "</tr>")
    return (f'<table style="border-collapse:collapse;font-size:0.9em;margin:6px 0"><tr>{head}</tr>'
            f'{"".join(rows)}</table>')


# ---------------------------------------------------------------------------------------------
# "Use it": the fine-tuned model on the student's own text
# ---------------------------------------------------------------------------------------------
class UsePanel(Panel):
    """Class probabilities, entailment, entities or the answer span of a fine-tuned model, and
    the [CLS] vectors of dev examples before and after fine-tuning."""

    title = "Use it"
    teaches = "A fine-tuned head turns the encoder's vectors into a task's answer: try it on your own text."

    def __init__(self, model: Bert | None = None, tok: Tokenizer | None = None,
                 dev_examples: Callable[[str], list[Any]] | None = None) -> None:
        super().__init__()
        self.model: Bert | None = None
        self.tok = tok
        self.name = ""
        self.kind: str | None = None  # sst2, nli, classification, ner, qa
        self.task: str | None = None  # the fine-tuning task the model came from, when known
        self.before: Bert | None = None
        self.dev: list[Any] | None = None
        self.dev_examples = dev_examples
        self._figures: dict[str, go.Figure] = {}  # the view's figure (by name), on show
        self._pca_figure: go.Figure | None = None
        wide = widgets.Layout(width="min(100%, 720px)")

        def button(text: str, tip: str) -> widgets.Button:
            b = widgets.Button(description=text, button_style="primary", tooltip=tip)
            b.on_click(self._on_use)
            return b

        def text_box(view: str, value: str, description: str, area: bool = False,
                     placeholder: str = "") -> widgets.Widget:
            cls = widgets.Textarea if area else widgets.Text
            w = cls(value=value, description=description, placeholder=placeholder, continuous_update=False,
                    layout=widgets.Layout(width="min(100%, 720px)", height="4.5em" if area else None))
            w.observe(lambda _change: self._on_input(view), names="value")
            return w

        self.header = widgets.HTML()
        self.sentence = text_box("sst2", DEFAULT_SENTENCE, "Sentence", area=True)
        self.sentence_b = text_box("sst2", "", "Sentence B", placeholder="optional second sentence")
        self.premise = text_box("nli", DEFAULT_PREMISE, "Premise (A)")
        self.hypothesis = text_box("nli", DEFAULT_HYPOTHESIS, "Hypothesis (B)")
        self.ner_text = text_box("ner", DEFAULT_NER_TEXT, "Text", area=True)
        self.question = text_box("qa", DEFAULT_QUESTION, "Question")
        self.paragraph = text_box("qa", DEFAULT_PARAGRAPH, "Paragraph", area=True)
        self.top_k = widgets.IntSlider(value=5, min=1, max=10, description="Top k spans")
        self.top_k.observe(lambda _change: self._on_input("qa"), names="value")
        self.probs_box = widgets.Box([])
        self.entities_out = widgets.HTML(layout=wide)
        self.answer_out = widgets.HTML(layout=wide)
        self.spans_box = widgets.Box([])
        self.top_spans = widgets.HTML()
        classify_button = button("Classify", "Class probabilities")
        self.views: dict[str, widgets.VBox] = {
            "sst2": widgets.VBox([self.sentence, classify_button, self.probs_box]),  # SST-2 reads one sentence
            # another sentence classifier may have been trained on pairs: it gets a sentence B field
            "classification": widgets.VBox([self.sentence, self.sentence_b, classify_button, self.probs_box]),
            "nli": widgets.VBox([self.premise, self.hypothesis, button("Infer", "Entailment probabilities"),
                                 self.probs_box]),
            "ner": widgets.VBox([self.ner_text, button("Find entities", "Tag each word"), self.entities_out]),
            "qa": widgets.VBox([self.question, self.paragraph, widgets.HBox([button("Answer", "Find the span"),
                                                                            self.top_k]),
                                self.answer_out, self.top_spans, self.spans_box]),
        }
        self.view = widgets.Box([])
        self.pca_button = widgets.Button(icon="braille")
        self.pca_button.on_click(self._on_pca)
        self.pca_box = widgets.Box([])
        self.help = widgets.HTML()
        self._label_cls(tok.cls_token if tok is not None else DEFAULT_SPECIALS["cls"])
        self.explain = ExplainSection(None, tok, self._explain_request)  # "Does attention explain it?"
        self._widget = widgets.VBox([self.help, self.header, self.view, self.message, self.explain.widget,
                                     self.pca_button, self.pca_box], layout=widgets.Layout(width="100%"))
        if model is not None and model_task(model):
            self.show_model(model, tok, "the model picked above")
        else:
            self._show_header()

    @property
    def widget(self) -> widgets.VBox:
        return self._widget

    def set_model(self, model: Bert, tok: Tokenizer) -> None:
        if model_task(model):
            self.show_model(model, tok, "the model picked above")

    def _label_cls(self, cls: str) -> None:
        """Name the [CLS] picture after the tokenizer's own first token."""
        self.pca_button.description = f"{cls} before / after"
        self.pca_button.tooltip = f"PCA of the {cls} vectors of {PCA_SAMPLE} dev examples"
        self.help.value = f'<div style="color:#555;font-size:0.9em">{USE_HELP.format(cls=html.escape(cls))}</div>'

    def figures(self) -> dict[str, go.Figure]:
        pca = {f"{self.tok.cls_token} PCA": self._pca_figure} if self._pca_figure is not None else {}
        return {**self._figures, **pca, **self.explain.figures()}

    def show_model(self, model: Bert, tok: Tokenizer, name: str, before: Bert | None = None,
            dev: list[Any] | None = None, task: str | None = None) -> None:
        """Show the view for `model`'s head and run it on the text already typed."""
        self.model, self.tok, self.name = model, tok, name
        self._label_cls(tok.cls_token)
        self.kind = model_task(model)
        self.task = task or (self.kind if self.kind in ("sst2", "nli") else None)
        self.before, self.dev = before, dev
        self._figures, self._pca_figure = {}, None
        self.pca_box.children = ()
        self._show_header()
        self.view.children = (self.views[self.kind],) if self.kind else ()
        self.explain.set_model(model, tok, refresh=False)  # update refreshes it
        self.update()

    def _show_header(self) -> None:
        if self.model is None or self.kind is None:
            self.header.value = ('<span style="color:#777">Fine-tune a model above (or pick a fine-tuned one) '
                                 "to try it here.</span>")
            self.pca_button.disabled = True
            return
        labels = ", ".join(str(v) for v in self.model.config.id2label.values())
        what = {"sst2": "sentiment", "nli": "entailment", "classification": "sentence classification",
                "ner": "named entities", "qa": "question answering"}[self.kind]
        self.header.value = (f"Using <b>{html.escape(self.name)}</b>: {what}"
                             f"{f' ({html.escape(labels)})' if labels and len(labels) < 120 else ''}.")
        self.pca_button.disabled = False

    # -- the views --------------------------------------------------------------------------------
    def _on_use(self, _=None) -> None:
        self.update()

    def _on_input(self, view: str) -> None:
        """An input of `view` changed: rerun only if that view is on show."""
        if {"classification": "sst2"}.get(self.kind or "", self.kind) == view:
            self.update()

    def update(self) -> None:
        """Run the model on the current view's input and show the result (or a message)."""
        if self.model is None or self.kind is None:
            return
        with self.reporting():
            notes = {"sst2": self._classify, "classification": self._classify, "nli": self._entail,
                     "ner": self._entities, "qa": self._answer}[self.kind]()
            self.show_messages(notes)
        self.explain.set_choices(explain_choices(self.kind, self.ner_text.value))
        self.explain.refresh()

    def _explain_request(self, which: int) -> tuple[ExplainInput, Target]:
        """What "Does attention explain it?" explains: the predicted class, the tag of the first entity
        (or of word `which` - 1), the answer's start (`which` 0) or end (1)."""
        if self.kind in ("sst2", "classification"):
            text_b = self.sentence_b.value if self.kind == "classification" else None
            return class_target(self.model, self.tok, self.sentence.value, text_b)
        if self.kind == "nli":
            return class_target(self.model, self.tok, self.premise.value, self.hypothesis.value)
        if self.kind == "ner":
            return tag_target(self.model, self.tok, self.ner_text.value, None if which == 0 else which - 1)
        if self.kind == "qa":
            return span_target(self.model, self.tok, self.question.value, self.paragraph.value, end=which == 1)
        raise InputError("Fine-tune a model first (or pick a fine-tuned one): there is no prediction to explain.")

    def _classify(self) -> list[tuple[Level, str]]:
        text_b = self.sentence_b.value if self.kind == "classification" else None  # not on show for SST-2
        pred = classify(self.model, self.tok, self.sentence.value, text_b)
        return self._show_probabilities(pred)

    def _entail(self) -> list[tuple[Level, str]]:
        return self._show_probabilities(entail(self.model, self.tok, self.premise.value, self.hypothesis.value))

    def _show_probabilities(self, pred) -> list[tuple[Level, str]]:
        fig = plot_class_probabilities(pred)
        self._figures = {"class probabilities": fig}
        show_figure(self.probs_box, fig)
        return _cut_notes(pred.warning, pred.tokens, self.tok.unk_token)

    def _entities(self) -> list[tuple[Level, str]]:
        text = self.ner_text.value
        found = entities(self.model, self.tok, text)
        self.entities_out.value = entities_html(text, found)
        self._figures = {}
        enc = self.tok.encode(text, max_length=min(self.tok.model_max_length, max_tokens(self.model)))
        notes = _cut_notes(enc.warning and (enc.warning + " Words after the cut are not tagged."), enc.tokens,
                           self.tok.unk_token)
        return notes or [("info", f"{len(found)} entit{'y' if len(found) == 1 else 'ies'} found.")]

    def _answer(self) -> list[tuple[Level, str]]:
        result = answer(self.model, self.tok, self.question.value, self.paragraph.value, k=self.top_k.value)
        self.answer_out.value = answer_html(result)
        self.top_spans.value = _top_spans_html(result.top_k)
        fig = plot_span_probabilities(result)
        self._figures = {"answer span probabilities": fig}
        show_figure(self.spans_box, fig)
        notes: list[tuple[Level, str]] = []
        if result.windows > 1:
            notes.append(("info", (f"The paragraph is long: the model read it in {result.windows} overlapping "
                                  "windows and kept the best span of all.")))
        return notes + _cut_notes(None, result.tokens, self.tok.unk_token)

    # -- [CLS] before and after -------------------------------------------------------------------
    def _on_pca(self, _=None) -> None:
        with self.reporting():
            self.show_cls_pca()

    def show_cls_pca(self) -> None:
        """PCA of the last layer's [CLS] of PCA_SAMPLE dev examples, before and after fine-tuning."""
        if self.model is None or self.kind is None:
            raise InputError("Fine-tune a model first: the picture compares the sentence vectors before and after.")
        if self.kind not in ("sst2", "nli") or self.task not in ("sst2", "nli"):
            cls = self.tok.cls_token
            raise InputError(f"The {cls} picture is for sentence classification (SST-2 or NLI), where the head "
                             f"reads {cls}; NER and QA read every token.")
        examples = self.dev if self.dev else (self.dev_examples(self.task) if self.dev_examples else [])
        if not examples:
            raise InputError(f"No {self.task} dev examples to project: check the data source above.")
        sample = subset(examples, PCA_SAMPLE, 0, "cls pca")
        texts, texts_b = [e.text_a for e in sample], [e.text_b for e in sample]
        id2label = self.model.config.id2label
        labels = [str(id2label[e.label]) for e in sample]
        models = {"before fine-tuning": self.before, "after fine-tuning": self.model} if self.before is not None \
            else {"this model": self.model}
        points, explained = {}, {}
        for name, model in models.items():
            points[name], explained[name] = pca_2d(cls_vectors(model, self.tok, texts, texts_b))
        fig = plot_cls_pca(points, labels, [t if b is None else f"{t} / {b}" for t, b in zip(texts, texts_b)],
                           explained, cls_token=self.tok.cls_token)
        self._pca_figure = fig
        show_figure(self.pca_box, fig)
        note = "" if self.before is not None else " Fine-tune here to see it before and after."
        self.show_message(f"{self.tok.cls_token} of {len(sample)} dev examples, coloured by their gold label.{note}")


def explain_choices(kind: str | None, ner_text: str, limit: int = 60) -> list[str]:
    """What "Does attention explain it?" offers for a view: NER a word's tag, QA the start or end."""
    if kind == "ner":
        words = split_words(ner_text)[:limit] if ner_text.strip() else []
        return ["tag of the first entity"] + [f"tag of word {i}: {w}" for i, (w, _, _) in enumerate(words)]
    if kind == "qa":
        return ["answer start", "answer end"]
    return []


def _cut_notes(warning: str | None, tokens: Sequence[str], unk_token: str) -> list[tuple[Level, str]]:
    notes: list[tuple[Level, str]] = []
    if warning:
        notes.append(("warning", warning))
    unknown = sum(1 for t in tokens if t == unk_token)
    if unknown:
        notes.append(("warning", (f"{unknown} piece(s) are not in this model's vocabulary and show as {unk_token} "
                                 "(emoji and rare symbols often are).")))
    return notes


def _top_spans_html(spans: Sequence[Any]) -> str:
    rows = "".join(
        f'<tr><td style="padding:1px 8px">{i}</td><td style="padding:1px 8px">{html.escape(s.text)}</td>'
        f'<td style="padding:1px 8px;text-align:right">{100 * s.probability:.1f}%</td></tr>'
        for i, s in enumerate(spans, start=1)
    )
    return (f'<table style="font-size:0.9em;border-collapse:collapse"><tr><th>#</th><th style="text-align:left">'
            f'span</th><th>probability</th></tr>{rows}</table>' if spans else "")
