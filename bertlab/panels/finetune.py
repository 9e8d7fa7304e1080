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
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.analysis.replay import ReplayRun
from bertlab.families.bert import Bert
from bertlab.loading import is_offline_default, load
from bertlab.panels.base import Panel, labelled
from bertlab.panels.data_source import DataSource
from bertlab.panels.finetune_diff import ChangedSection, measure_change
from bertlab.panels.replay import ReplaySection, read_run
from bertlab.panels.runs import CPU_MAX_DEV, CPU_MAX_TRAIN, error_text, run_controls
from bertlab.panels.use import PICKED as USE_PICKED
from bertlab.panels.use import UsePanel
from bertlab.runtime import describe_device, max_tokens, resolve_device
from bertlab.tasks import TASKS
from bertlab.tasks.layer_features import FEATURE_TEXT, FEATURES, Cancelled
from bertlab.tasks.models import model_task
from bertlab.tokenizer import Tokenizer
from bertlab.training.feature_head import FeatureHeadResult, finetune_features
from bertlab.training.finetune import MODES, FinetuneConfig, finetune, subset, with_schedule
from bertlab.training.finetune_defaults import Recipe, recipe
from bertlab.training.queue import waiting_text
from bertlab.training.run_state import Event, FinetuneRun, Note, Outcome, dev_curves
from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper
from bertlab.viz import finetune_words as words
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.finetune import plot_confusion_matrix, plot_training_curves, progress_html, runs_html
from bertlab.viz.finetune_words import REPLAY_PROBE
from bertlab.viz.knows import plot_layer_weights
from bertlab.viz.text import plain_text
from bertlab.viz.theme import help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["REPLAY_PROBE", "FinetunePanel"]  # REPLAY_PROBE: bench/bench_replay.py reads it here

PICKED = "picked"  # the "Start from" choice: the model picked above (FinetuneRun.start)
OWN_HEAD = "own head"  # the "Features" choice of feature mode that trains the model's own head (a whole model)
FEATURES_TASK = "ner"  # the task the BERT paper's feature choices (its Table 7) are for


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
        self.runs: list[FinetuneRun] = []  # every run of the session, oldest first
        self._seen: dict[str, int] = {}  # run label -> how many of its events the view has shown
        on_gpu = resolve_device(device).type == "cuda"

        self.task = labelled(widgets.Dropdown, "Task", "min(100%, 640px)", value="sst2",
                             options=[(f"{name}: {t.description}", name) for name, t in TASKS.items()])
        self.mode = widgets.ToggleButtons(
            options=[(m, m) for m in MODES], value="full", description="Adapt",
            style={"description_width": "initial", "button_width": "90px"},
            tooltips=[words.MODE_HELP[m] for m in MODES],
        )
        self.mode_help = widgets.HTML(self._mode_note("full"))
        self.features = labelled(widgets.Dropdown, "Features", "min(100%, 640px)", value=OWN_HEAD, options=[
            (words.OWN_HEAD_TEXT, OWN_HEAD), *[(f"{n}: {FEATURE_TEXT[n]}", n) for n in FEATURES]])
        self.features_help = widgets.HTML(help_html(html.escape(words.FEATURES_HELP)))
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
            "bertlab-finetune", "Start", words.START_TOOLTIP, words.CANCEL_TOOLTIP)
        self._curves_fig = plot_training_curves({}, "accuracy")
        self.curves = SyncedFigureWidget(self._curves_fig)
        self.curves_box = widgets.Box([self.curves])
        self.runs_table = widgets.HTML()
        self._confusion_fig: go.Figure | None = None
        self.confusion_box = widgets.Box([])
        self._mix_fig: go.Figure | None = None
        self.mix_box = widgets.Box([])
        self.use = UsePanel(model, tok, dev_examples=self.dev_examples)
        self.replay = ReplaySection(tok, tok.spell(REPLAY_PROBE), intro=words.REPLAY_INTRO)
        self.replay.show_message(words.REPLAY_WAITING)
        self.changed = ChangedSection()
        self.help = widgets.HTML(help_html(words.HELP))

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
                *(w for title, section in zip(words.SECTIONS, (self.use, self.replay, self.changed))
                  for w in (widgets.HTML(f'<h3 style="margin:14px 0 4px 0">{title}</h3>'), section.widget)),
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
        options = [(words.PICKED_TEXT, PICKED)]
        if is_offline_default(self.model) and r.model is not None:  # the package's encoder is the better start
            options.append((words.start_choice_text(r.model), r.model))
        self.start_from.options = options
        self.start_from.value = options[-1][1]
        self._show_start_note()

    def _show_start_note(self) -> None:
        choice, offered = self.start_from.value, len(self.start_from.options) > 1
        start, default = None if choice == PICKED else choice, self.recipe.model if offered else None
        text = words.start_text(self.task.value, start, default)
        self.start_note.value = help_html(html.escape(text), "span")

    def dev_examples(self, task: str) -> list[Any]:
        """Dev examples of `task` from the chosen data source (for the [CLS] picture of a picked model)."""
        return self.source.read(task, self.source.chosen()).dev

    # -- a run (its state: training.run_state.FinetuneRun) ----------------------------------------
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
        run = FinetuneRun(label=self._label(task, mode if features is None else f"{mode} ({features})"), config=cfg,
                          task=task, mode=mode, out_dir=Path(cfg.out_dir), picked=self.model,
                          start=self.start_from.value, features=features)
        run.add(Note(words.reading_text(run.label), busy=True))
        self.runs.append(run)
        self._seen[run.label] = 0
        self.progress.value, self.progress.max = 0, 1
        self.draw()
        self.job.start(functools.partial(self._train, run, cfg, self.tok, source, self.replay.probe.value),
                       queue=run.label,
                       on_place=lambda ahead: run.add(Note(words.waiting_place_text(run.label, waiting_text(ahead)))),
                       on_left_queue=functools.partial(self._left_queue, run),
                       on_error=functools.partial(self._failed, run, cfg), redraw=self.draw, on_done=self.draw)

    def _on_cancel(self, _=None) -> None:
        self.cancel()
        self.progress_text.value = words.CANCELLING

    def _train(self, run: FinetuneRun, cfg: FinetuneConfig, tok: Tokenizer, source: str | None,
               probe: str | None = None) -> None:
        """The background job (its place in the class queue is taken): read the data, fine-tune, measure what
        changed. It only appends events to `run`; the tab draws them (`draw`, on the kernel's thread)."""
        if run.start != PICKED:  # the task's start encoder instead of the offline default
            run.add(Note(words.loading_text(run.label, run.start), busy=True))
            base, tok = self._start_encoder(run.start)
            run.add(Outcome("base", base))
            cfg = dataclasses.replace(cfg, model=base)
        data = self.source.read(run.task, source)
        cfg = with_schedule(cfg, len(data.train))
        dev = subset(data.dev, cfg.max_eval_examples, cfg.seed, "dev")  # what finetune scores
        run.add(Outcome("dev", dev))
        run.add(Note(f"{run.label}: {data.note}"))
        keeper = SnapshotKeeper(run.out_dir / REPLAY_DIR)  # a few weights-only snapshots, for the replay
        callbacks = [run.add, keeper]
        if run.features is not None:  # a head on cached word features: reported here, not a whole model
            run.add(Note(words.features_text(run.label), busy=True))
            run.add(Outcome("result", finetune_features(cfg, callbacks, self.job.cancel_event, tokenizer=tok,
                                                        train_examples=data.train, eval_examples=data.dev)))
            return
        result = finetune(cfg, callbacks=callbacks, cancel=self.job.cancel_event, tokenizer=tok,
                          train_examples=data.train, eval_examples=data.dev)
        run.add(Outcome("result", result))
        if result.status == "failed" or result.train.step == 0:
            return
        probe = tok.spell(REPLAY_PROBE) if probe is None else probe
        try:  # Replay shows its busy sign meanwhile (see `_finished`)
            replayed = read_run(ReplayRun(run.label, result.model, result.tokenizer, keeper.folder, run.base), probe)
            run.add(Outcome("replay", (keeper.folder, probe, replayed)))
        except Exception:  # noqa: BLE001 - the run itself is done and kept; Replay reads it again
            log.exception("reading the replay of %s failed", run.label)
            run.add(Outcome("replay", (keeper.folder, None, None)))
        try:  # the section shows its busy sign meanwhile (see `_finished`)
            run.add(Outcome("change", measure_change(run.base, result.model, result.tokenizer, run.task, dev,
                                                     cfg.max_length or 128)))
        except Exception as e:  # noqa: BLE001 - the run itself is done and kept
            log.exception("measuring what %s changed failed", run.label)
            run.add(Outcome("change error", words.not_measured_text(run.label, str(e))))

    def _left_queue(self, run: FinetuneRun) -> None:
        run.add(Outcome("cancelled", words.left_queue_text(run.label)))
        self._busy_text, self.progress_text.value = None, ""
        self.show_message(run.error, "warning")
        self._seen[run.label] = len(run.events)

    def _failed(self, run: FinetuneRun, cfg: FinetuneConfig, error: BaseException) -> None:
        """The job raised (on the kernel's thread): say so; a run that never started leaves no row."""
        self._seen[run.label] = len(run.events)  # what it said before is over
        self._busy_text = None
        if isinstance(error, Cancelled):  # cancelled while the word features were computed: nothing trained
            run.add(Outcome("error", words.features_cancelled_text(run.label)))
            self.show_message(run.error, "warning")
            self.runs.remove(run)
            self.workspace.discard_run_dir(run.out_dir)  # its folder, if nothing was written to it
            return
        run.add(Outcome("error", error_text(error, self.workspace.hide_root, cfg.batch_size, cfg.max_length)))
        self.show_message(f"{run.label}: {run.error}", "error")
        if run.total_steps == 0 and not run.history:  # it never started: no row, no run number, no curve
            self.runs.remove(run)
            self.workspace.discard_run_dir(run.out_dir)  # and no folder: a failed Start leaves nothing
        self._seen[run.label] = len(run.events)

    def _start_encoder(self, source: str) -> tuple[Bert, Tokenizer]:
        """The start encoder `source` (e.g. the package's MiniLM encoder), loaded once per panel."""
        if source not in self._encoders:
            self._encoders[source] = load(source)
        return self._encoders[source]

    # -- drawing, on the kernel's thread, from the runs' state ----------------------------------
    def draw(self) -> None:
        """Show what the runs reported since the last draw: the lines they said, their ends (Use it, the
        model list, Replay, What changed), the progress line, the curves and the table."""
        for run in list(self.runs):
            events = run.snapshot()
            for event in events[self._seen.get(run.label, 0):]:
                self._show_event(run, event)
            self._seen[run.label] = len(events)
        run = self.runs[-1] if self.runs else None
        last = run.last_event if run is not None else None
        if run is not None and last is not None:
            self.progress.max = max(1, run.total_steps)
            self.progress.value = min(run.step, self.progress.max)
            self.progress_text.value = progress_html(run, last)
        self._draw_curves()
        self._draw_table()

    def _show_event(self, run: FinetuneRun, event: Event) -> None:
        """One event of `run`, new to the view: a line it said, or what its work handed back."""
        if isinstance(event, Note):  # work under way says so with the busy sign, until the next line
            self._busy_text = event.text if event.busy else None
            self.show_messages([] if event.busy else [(event.level, event.text)])
        elif isinstance(event, Outcome) and event.what == "result":
            self._busy_text = None
            if isinstance(event.value, FeatureHeadResult):
                self._finished_features(run, event.value)
            else:
                self._finished(run, event.value)
        elif isinstance(event, Outcome) and event.what == "replay":
            folder, probe, replayed = event.value
            result = run.result
            self.replay.offer(run.label, result.model, result.tokenizer, folder, self.workspace.hide_root,
                              base=run.base, probe=probe, read=replayed)
        elif isinstance(event, Outcome) and event.what == "change":
            self.changed.add(run.label, event.value)
        elif isinstance(event, Outcome) and event.what == "change error":
            self.changed.failed(event.value)

    def _ran(self, run: FinetuneRun, result: Any) -> bool:
        """False (and the loop's own message, out of memory included) if the run failed."""
        if result.status == "failed":
            self.show_message(f"{run.label}: {words.loop_failed_text(result.error)}", "error")
        return result.status != "failed"

    def _finished(self, run: FinetuneRun, result: Any) -> None:
        """Report how the run ended; a completed or cancelled model joins the picker, "Use it", Replay."""
        if not self._ran(run, result):
            return
        if run.step == 0:
            self.show_message(words.nothing_kept_text(run.label), "warning")
            return
        name = words.picker_name(run)
        saved = self.workspace.shown(result.saved_to) if result.saved_to else None
        notes = words.run_notes(run, result.metrics if result.status == "completed" else {},
                                words.kept_text(saved, name), len(run.dev))
        self.use.show_model(result.model, result.tokenizer, name, before=run.base, dev=run.dev, task=run.task)
        self._draw_confusion(run, result.metrics)
        self.show_messages(notes + self.offer_model(name, result.model, result.tokenizer))
        if run.outcome("replay") is None:
            self.replay.waiting(words.replaying_text(run.label))
        if run.outcome("change") is None and run.outcome("change error") is None:
            self.changed.measuring(words.measuring_text(run.label))

    def _finished_features(self, run: FinetuneRun, result: FeatureHeadResult) -> None:
        """Report a head trained on cached features; a mix run plots its learned weight per layer."""
        if not self._ran(run, result):
            return
        self._draw_mix(run, result)
        self.show_messages(words.run_notes(run, result.metrics, words.head_kept_text(FEATURE_TEXT[result.features])))

    def _draw_mix(self, run: FinetuneRun, result: FeatureHeadResult) -> None:
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

    def _draw_curves(self) -> None:
        """Every run's loss and dev curve (redrawn in place while the runs stay the same)."""
        metric, curves = dev_curves(self.runs)
        scored = [len(r.dev) for r in self.runs if r.dev]
        self._curves_fig = plot_training_curves(curves, metric, dev_examples=min(scored) if scored else None)
        self.curves = show_figure(self.curves_box, self._curves_fig)

    def _draw_table(self) -> None:
        self.runs_table.value = runs_html(self.runs, self.workspace.shown)

    def _draw_confusion(self, run: FinetuneRun, metrics: dict[str, Any]) -> None:
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
        return help_html(words.device_html(describe_device(device), device.type == "cuda", CPU_MAX_TRAIN), "span")

    @staticmethod
    def _mode_note(mode: str) -> str:
        return help_html(words.MODE_HELP[mode], "span", extra=";margin-left:8px")
