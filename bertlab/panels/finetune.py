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
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.families.bert import Bert
from bertlab.loading import is_offline_default, load
from bertlab.panels.base import Panel, labelled
from bertlab.panels.data_source import DataSource
from bertlab.panels.finetune_diff import ChangedSection, measure_change
from bertlab.panels.replay import ReplaySection
from bertlab.panels.runs import CPU_MAX_DEV, CPU_MAX_TRAIN, error_text, run_controls
from bertlab.panels.use import PICKED as USE_PICKED
from bertlab.panels.use import UsePanel
from bertlab.runtime import describe_device, max_tokens, resolve_device
from bertlab.tasks import TASKS
from bertlab.tasks.layer_features import FEATURE_TEXT, FEATURES, Cancelled
from bertlab.tasks.models import model_task
from bertlab.tokenizer import Tokenizer
from bertlab.training.feature_head import HEAD, FeatureHeadResult, finetune_features
from bertlab.training.finetune import (
    MODES,
    FinetuneConfig,
    SessionRun,
    dev_curves,
    finetune,
    subset,
    with_schedule,
)
from bertlab.training.finetune_defaults import START_NAMES, Recipe, recipe
from bertlab.training.loop import TrainEvent
from bertlab.training.queue import waiting_text
from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.finetune import (
    picker_name,
    plot_confusion_matrix,
    plot_training_curves,
    progress_html,
    run_notes,
    runs_html,
    start_text,
)
from bertlab.viz.knows import plot_layer_weights
from bertlab.viz.text import plain_text
from bertlab.viz.theme import help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

MODE_HELP = {
    "full": "every weight learns",
    "feature": "frozen encoder, only the head learns",
    "adapter": "Houlsby adapters + LayerNorms + head learn",
}
PICKED = "picked"  # the "Start from" choice: the model picked above (SessionRun.start)
OWN_HEAD = "own head"  # the "Features" choice of feature mode that trains the model's own head (a whole model)
FEATURES_TASK = "ner"  # the task the BERT paper's feature choices (its Table 7) are for
FEATURES_HELP = (f"The BERT paper's feature-based NER: each word's vectors (its first piece) at every layer of the "
                 f"frozen encoder are computed once and cached, and a {HEAD} head (the paper: a two-layer BiLSTM) "
                 "learns on the chosen ones; “mix” learns a weight per layer with it (plotted after the run). "
                 "The head stays in this tab; “the model's own head” makes a whole model for the model list.")
REPLAY_PROBE = "This movie was {mask}, the best I have seen all year."  # spelled with the model's mask token
HELP = (
    "Pick a task, its data and a way to adapt the encoder, then press Start. Every run of this session "
    "stays on the plot (labelled task · mode) so full fine-tuning, a frozen encoder and adapters compare. "
    "Cancel keeps the model so far; finished and cancelled models join the model list above."
)


class FinetunePanel(Panel):
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
        self.runs: list[SessionRun] = []
        self._draw_lock = threading.Lock()
        on_gpu = resolve_device(device).type == "cuda"

        self.task = labelled(widgets.Dropdown, "Task", "min(100%, 640px)", value="sst2",
                             options=[(f"{name}: {t.description}", name) for name, t in TASKS.items()])
        self.mode = widgets.ToggleButtons(
            options=[(m, m) for m in MODES], value="full", description="Adapt",
            style={"description_width": "initial", "button_width": "90px"},
            tooltips=[MODE_HELP[m] for m in MODES],
        )
        self.mode_help = widgets.HTML(self._mode_note("full"))
        self.features = labelled(widgets.Dropdown, "Features", "min(100%, 640px)", value=OWN_HEAD, options=[
            ("the model's own head on the last layer", OWN_HEAD), *[(f"{n}: {FEATURE_TEXT[n]}", n) for n in FEATURES]])
        self.features_help = widgets.HTML(help_html(html.escape(FEATURES_HELP)))
        self.features_box = widgets.VBox([self.features, self.features_help], layout=widgets.Layout(display="none"))
        self.source = DataSource(self, self.workspace, lambda: self.task.value)
        self.data, self.path, self.upload = self.source.choice, self.source.path, self.source.upload
        whole = widgets.BoundedIntText
        self.epochs = labelled(whole, "Epochs", "120px", value=2, min=1, max=100)
        self.lr = labelled(widgets.BoundedFloatText, "Learning rate", "200px", value=recipe("sst2").lr, min=1e-7,
                           max=1.0, step=1e-5)
        self.batch = labelled(whole, "Batch", "120px", value=32 if on_gpu else 16, min=1, max=4096)
        self.max_length = labelled(whole, "Max length", "150px", value=128, min=16, max=max_tokens(model))
        self.max_train = labelled(whole, "Max train examples (0 = all)", "260px", value=0 if on_gpu else CPU_MAX_TRAIN,
                                  min=0, max=10**8)
        self.max_dev = labelled(whole, "Max dev examples", "200px", value=0 if on_gpu else CPU_MAX_DEV, min=0,
                                max=10**8)
        self.device_note = widgets.HTML(self._device_note())
        self.start_from = labelled(widgets.Dropdown, "Start from", "min(100%, 520px)")
        self.start_note = widgets.HTML()
        self._encoders: dict[str, tuple[Bert, Tokenizer]] = {}  # start encoders loaded by this panel
        self._apply_recipe()
        self.start_button, self.cancel_button, self.job, self.progress, self.progress_text = run_controls(
            "bertlab-finetune", "Start", "Fine-tune the model picked above (a copy of it)",
            "Stop after the current step; the model so far is kept")
        self._curves_fig = plot_training_curves({}, "accuracy")
        self.curves = SyncedFigureWidget(self._curves_fig)
        self.curves_box = widgets.Box([self.curves])
        self.runs_table = widgets.HTML()
        self._confusion_fig: go.Figure | None = None
        self.confusion_box = widgets.Box([])
        self._mix_fig: go.Figure | None = None
        self.mix_box = widgets.Box([])
        self.use = UsePanel(model, tok, dev_examples=self.dev_examples)
        self.replay = ReplaySection(tok, tok.spell(REPLAY_PROBE), intro="Replay a run of this session.")
        self.replay.show_message("Fine-tune a model above: its run can then be replayed here.")
        self.changed = ChangedSection()
        self.help = widgets.HTML(help_html(HELP))

        self.task.observe(self._on_task, names="value")
        self.mode.observe(self._on_mode, names="value")
        self.features.observe(self._on_features, names="value")
        self.start_from.observe(lambda _: self._show_start_note(), names="value")
        self.start_button.on_click(self._on_start)
        self.cancel_button.on_click(self._on_cancel)
        wrap = widgets.Layout(flex_flow="row wrap")
        self._widget = widgets.VBox(
            [
                self.help,
                self.task,
                widgets.HBox([self.mode, self.mode_help]),
                self.features_box,
                widgets.HBox([self.start_from, self.start_note], layout=wrap),
                self.source.widget,
                widgets.HBox([self.epochs, self.lr, self.batch, self.max_length], layout=wrap),
                widgets.HBox([self.max_train, self.max_dev], layout=wrap),
                self.device_note,
                widgets.HBox([self.start_button, self.cancel_button, self.progress, self.progress_text]),
                self.message,
                self.curves_box,
                self.runs_table,
                self.confusion_box,
                self.mix_box,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">Use it</h3>'),
                self.use.widget,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">Replay</h3>'),
                self.replay.widget,
                widgets.HTML('<h3 style="margin:14px 0 4px 0">What changed</h3>'),
                self.changed.widget,
            ],
            layout=widgets.Layout(width="100%"),
        )

    def set_model(self, model: Bert, tok: Tokenizer) -> None:
        """The next run fine-tunes this model; a model with a task head goes to "Use it"."""
        if model is self.model:
            return  # the app re-sends the current model when another one joins the list
        self.model, self.tok = model, tok
        self.max_length.max = max_tokens(model)
        self._apply_recipe()  # "Start from" offers the package's encoder only for the offline default
        if model_task(model):
            self.use.show_model(model, tok, USE_PICKED)

    def figures(self) -> dict[str, go.Figure]:
        figs: dict[str, go.Figure] = {}
        if self.runs:
            figs["training curves"] = self._curves_fig
        if self._confusion_fig is not None:
            figs["confusion matrix"] = self._confusion_fig
        if self._mix_fig is not None:
            figs["scalar mix weights"] = self._mix_fig
        return {**figs, **self.use.figures(), **self.replay.figures(), **self.changed.figures()}

    def made_with(self) -> dict[str, str]:
        return self.use.made_with()

    def cancel(self) -> None:
        """Stop the run after its current step; the loop saves a checkpoint of the model so far."""
        self.job.cancel()

    # -- settings callbacks ---------------------------------------------------------------------
    def _on_task(self, change) -> None:
        if not self.job.running:  # a message about the previous task's data or run no longer applies
            self.show_messages([])
        self._apply_recipe()
        self._show_features()
        if self.data.value == "upload":
            self.source.check_upload()

    def _on_mode(self, change) -> None:
        self.epochs.value, self.lr.value = self.recipe.epochs, self.recipe.lr  # batch and length stay the task's
        self.mode_help.value = self._mode_note(change["new"])
        self._show_features()

    def _on_features(self, change) -> None:
        """A feature choice trains a head on cached features: its own measured lr and epochs."""
        self.epochs.value, self.lr.value = self.recipe.epochs, self.recipe.lr

    def _show_features(self) -> None:
        """The "Features" choice, only where it applies: feature mode on the ner task."""
        self.features_box.layout.display = None if self._features_apply() else "none"

    def _features_apply(self) -> bool:
        return self.mode.value == "feature" and self.task.value == FEATURES_TASK

    def chosen_features(self) -> str | None:
        """The feature choice a run gets (None: the model's own head, or not feature mode on ner)."""
        return self.features.value if self._features_apply() and self.features.value != OWN_HEAD else None

    @property
    def recipe(self) -> Recipe:
        """The measured defaults of the chosen task and mode (training.finetune_defaults)."""
        return recipe(self.task.value, self.mode.value, self.chosen_features())

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
        choice, offered = self.start_from.value, len(self.start_from.options) > 1
        text = start_text(self.task.value, None if choice == PICKED else choice, self.recipe.model if offered else None)
        self.start_note.value = help_html(html.escape(text), "span")

    def dev_examples(self, task: str) -> list[Any]:
        """Dev examples of `task` from the chosen data source (for the [CLS] picture of a picked model)."""
        return self.source.read(task, self.source.chosen()).dev

    # -- a run ------------------------------------------------------------------------------------
    def _on_start(self, _=None) -> None:
        with self.reporting():
            self.start()

    def start(self) -> None:
        """Start fine-tuning a copy of the current model in the background."""
        self.job.check_idle()
        task, mode, features = self.task.value, self.mode.value, self.chosen_features()
        source = self.source.chosen()  # fails early on a missing path / upload
        cfg = FinetuneConfig(
            task=task, mode=mode, features=features, model=self.model, epochs=self.epochs.value, lr=self.lr.value,
            batch_size=self.batch.value, eval_batch_size=max(64, self.batch.value), max_length=self.max_length.value,
            max_train_examples=self.max_train.value or None, max_eval_examples=self.max_dev.value or None,
            # out_dir: a new folder, made now: no other run (of any session) can get the same one
            device=self.device, out_dir=str(self.workspace.new_run_dir(f"{task}-{mode}", parent=self.runs_dir)),
        )
        run = SessionRun(self._label(task, mode if features is None else f"{mode} ({features})"), task, mode,
                         Path(cfg.out_dir), base=self.model, start=self.start_from.value, features=features)
        self.runs.append(run)
        self.show_message(f"{run.label}: reading the data…")
        self.progress.value, self.progress.max = 0, 1
        self._draw_curves()
        self.job.start(functools.partial(self._train, run, cfg, self.tok, source), queue=run.label,
                       on_place=lambda ahead: self.show_message(f"{run.label}: {waiting_text(ahead)}"),
                       on_left_queue=functools.partial(self._left_queue, run),
                       on_error=functools.partial(self._failed, run, cfg), on_done=self._ended)

    def _on_cancel(self, _=None) -> None:
        self.cancel()
        self.progress_text.value = "Cancelling: finishing the current step and saving a checkpoint…"

    def _train(self, run: SessionRun, cfg: FinetuneConfig, tok: Tokenizer, source: str | None) -> None:
        """The background job (its place in the class queue is taken): read the data, fine-tune, report."""
        if run.start != PICKED:  # the task's start encoder instead of the offline default
            self.show_message(f"{run.label}: loading {START_NAMES.get(run.start, run.start)}…")
            run.base, tok = self._start_encoder(run.start)
            cfg = dataclasses.replace(cfg, model=run.base)
        data = self.source.read(run.task, source)
        cfg = with_schedule(cfg, len(data.train))
        run.dev = subset(data.dev, cfg.max_eval_examples, cfg.seed, "dev")  # what finetune scores
        self.show_message(f"{run.label}: {data.note}")
        keeper = SnapshotKeeper(run.out_dir / REPLAY_DIR)  # a few weights-only snapshots, for the replay
        callbacks = [functools.partial(self._on_event, run), keeper]
        if run.features is not None:  # a head on cached word features: reported here, not a whole model
            self.show_message(f"{run.label}: computing the frozen encoder's word features (once; cached)…")
            self._finished_features(run, finetune_features(
                cfg, callbacks, self.job.cancel_event, tokenizer=tok, train_examples=data.train,
                eval_examples=data.dev))
            return
        result = finetune(cfg, callbacks=callbacks, cancel=self.job.cancel_event, tokenizer=tok,
                          train_examples=data.train, eval_examples=data.dev)
        self._finished(run, result)
        self._replay_and_compare(run, result, keeper.folder, cfg.max_length or 128)

    def _left_queue(self, run: SessionRun) -> None:
        run.status = "cancelled"
        self.progress_text.value = ""
        self.show_message(f"{run.label}: you left the class queue before the run started; nothing ran.", "warning")

    def _failed(self, run: SessionRun, cfg: FinetuneConfig, error: BaseException) -> None:
        if isinstance(error, Cancelled):  # cancelled while the word features were computed: nothing trained
            run.status = "cancelled"
            self.show_message(f"{run.label}: cancelled while computing the word features; nothing trained.",
                              "warning")
            self.runs.remove(run)
            return
        run.status = "failed"
        run.error = error_text(error, self.workspace.hide_root, cfg.batch_size, cfg.max_length)
        self.show_message(f"{run.label}: {run.error}", "error")
        if run.total_steps == 0 and not run.history:  # it never started: no row, no run number, no curve
            self.runs.remove(run)

    def _ended(self) -> None:
        self._draw_curves()
        self._draw_table()

    def _replay_and_compare(self, run: SessionRun, result: Any, folder: Path, max_length: int) -> None:
        """A run that took a step joins the Replay section (replayed at once) and "What changed" (measured
        against its base). Never raises: the run itself is done and kept."""
        if result.status == "failed" or run.step == 0:
            return
        self.replay.offer(run.label, result.model, result.tokenizer, folder, self.workspace.hide_root, base=run.base)
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
            self._encoders[source] = load(source)
        return self._encoders[source]

    def _ran(self, run: SessionRun, result: Any) -> bool:
        """Record how the run ended; False (and the loop's own message, out of memory included) if it failed."""
        run.status, run.step, run.summary = result.status, result.train.step, result.summary()
        if result.status == "failed":
            run.error = f"the run failed: {result.error}"
            self.show_message(f"{run.label}: {run.error}", "error")
        return result.status != "failed"

    def _finished(self, run: SessionRun, result: Any) -> None:
        """Report how the run ended; a completed or cancelled model joins the picker and "Use it"."""
        run.id2label = dict(result.model.config.id2label)
        if not self._ran(run, result):
            return
        if run.step == 0:
            self.show_message(f"{run.label}: cancelled before the first step; nothing to keep.", "warning")
            return
        name = picker_name(run)
        saved = f"; saved in {self.workspace.shown(result.saved_to)}" if result.saved_to else ""
        notes = run_notes(run, result.metrics if result.status == "completed" else {},
                          f"{saved}. It joins the model list as “{name}”.", len(run.dev))
        self.use.show_model(result.model, result.tokenizer, name, before=run.base, dev=run.dev, task=run.task)
        self._draw_confusion(run, result.metrics)
        self.show_messages(notes + self.offer_model(name, result.model, result.tokenizer))

    def _finished_features(self, run: SessionRun, result: FeatureHeadResult) -> None:
        """Report a head trained on cached features; a mix run plots its learned weight per layer."""
        if not self._ran(run, result):
            return
        self._draw_mix(run, result)
        self.show_messages(run_notes(run, result.metrics, f" ({FEATURE_TEXT[result.features]}, a {HEAD} head; the "
                                     "encoder stayed frozen). The head stays in this tab: it is not a whole model "
                                     "for the model list."))

    def _draw_mix(self, run: SessionRun, result: FeatureHeadResult) -> None:
        """The learned scalar mix of a "mix" run (after the run), titled with the model and the run."""
        mix = result.mix
        if mix is None or run.step == 0:
            return
        scored = f", dev {run.metric} {run.score:.3g}" if run.score is not None else ""
        title = (f"Scalar mix learned with the NER head<br><sup>{plain_text(result.model_name)} · "
                 f"{plain_text(run.label)}{scored}</sup>")
        group = (f"{run.label} (γ = {mix['gamma']:.2f})", mix["layers"], mix["weights"])
        self._mix_fig = plot_layer_weights([group], title)
        show_figure(self.mix_box, self._mix_fig)

    def _on_event(self, run: SessionRun, event: TrainEvent) -> None:
        """A loop event (from the training thread): record it and redraw. Never raises."""
        try:
            if event.kind == "start":
                run.status, run.total_steps, run.precision = "running", event.total_steps, event.precision
                self.progress.max = max(1, event.total_steps)
            elif (entry := event.history_entry()) is not None:
                run.history.append(entry)
            elif event.kind == "checkpoint":
                run.checkpoint = event.path
            run.step = event.step
            self.progress.value = min(event.step, self.progress.max)
            self.progress_text.value = progress_html(run, event)
            if self.job.redraw.due(force=event.kind in ("eval", "end")):
                self._draw_curves()
        except Exception:
            log.exception("the fine-tuning panel could not show a training event")

    # -- drawing ----------------------------------------------------------------------------------
    def _draw_curves(self) -> None:
        """Every run's loss and dev curve (redrawn in place while the runs stay the same)."""
        with self._draw_lock:
            metric, curves = dev_curves(self.runs)
            scored = [len(r.dev) for r in self.runs if r.dev]
            self._curves_fig = plot_training_curves(curves, metric, dev_examples=min(scored) if scored else None)
            self.curves = show_figure(self.curves_box, self._curves_fig)

    def _draw_table(self) -> None:
        self.runs_table.value = runs_html(self.runs, self.workspace.shown)

    def _draw_confusion(self, run: SessionRun, metrics: dict[str, Any]) -> None:
        matrix = metrics.get("confusion_matrix")
        if matrix is None or not run.id2label:
            self._confusion_fig, self.confusion_box.children = None, ()
            return
        labels = [run.id2label[i] for i in range(len(run.id2label))]
        self._confusion_fig = plot_confusion_matrix(matrix, labels)
        self._confusion_fig.update_layout(title_text=f"{run.label}: {self._confusion_fig.layout.title.text}")
        show_figure(self.confusion_box, self._confusion_fig)

    # -- small things -----------------------------------------------------------------------------
    def _label(self, task: str, mode: str) -> str:
        label = f"{task} · {mode}"
        n = sum(1 for r in self.runs if r.task == task and r.mode == mode)
        return label if n == 0 else f"{label} #{n + 1}"

    def _device_note(self) -> str:
        device = resolve_device(self.device)
        tip = ("the whole training set fits in minutes." if device.type == "cuda" else
               f"keep runs small: about {CPU_MAX_TRAIN:,} examples and 1–2 epochs take a minute or two.")
        return help_html(f"Trains on <b>{html.escape(describe_device(device))}</b>: {tip}", "span")

    @staticmethod
    def _mode_note(mode: str) -> str:
        return help_html(MODE_HELP[mode], "span", extra=";margin-left:8px")


