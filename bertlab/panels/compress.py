"""Compression tab: make the picked model smaller (int8 quantization, head pruning, distillation into
fewer layers), watch it happen, and compare every variant of the session with the model it came
from in one table and one plot: size × CPU latency × score on held-out examples.

Each run goes in a background thread (`bertlab.compress.lab`), with a busy sign, progress and Cancel;
the pruning curve and the student's curves draw live. Each variant is saved (class mode: in the
student's workspace) and joins the model picker through `self.model_made`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.compress.distill import DistillConfig
from bertlab.compress.lab import (
    Comparison,
    CompressedModel,
    TaskData,
    check_method,
    run_distill,
    run_prune,
    run_quantize,
)
from bertlab.compressed.structure import CompressError
from bertlab.inputs import InputError
from bertlab.panels.base import Panel, labelled
from bertlab.panels.runs import CPU_MAX_DEV, CPU_MAX_TRAIN, error_text, run_controls
from bertlab.tasks.models import model_task
from bertlab.tokenizer import Tokenizer
from bertlab.training.loop import TrainEvent
from bertlab.viz.compress import (
    made_text,
    peer_text,
    plot_distill_curves,
    plot_prune_curve,
    plot_variants,
    variants_html,
)
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.mask import empty_figure
from bertlab.viz.theme import MUTED, help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

METHODS = {"quantize": "int8 quantization", "prune": "head pruning", "distill": "distillation"}
METHOD_HELP = {
    "quantize": "The encoder's weights become 8-bit integers: a quarter of the size, int8 matmuls on the CPU. "
                "No training. The int8 model is also exported to ONNX and timed with ONNX Runtime (what you "
                "would deploy with), side by side with torch's int8 on the same sentences.",
    "prune": "Each head is scored by how much the task loss depends on it (Michel et al. 2019); the least "
             "important are removed, and the curve shows the dev score against the heads kept.",
    "distill": "A student with fewer layers (every other layer of the teacher to start) learns the teacher's "
               "soft answers at temperature T and the true labels.",
}
HELP = ("Pick a fine-tuned model above (e.g. one just made in the Fine-tuning tab), a method, and press "
        "Compress. Every variant of this session joins the table and the plot with the model it came from, "
        "and the model list above.")
TASKS_SCORED = ("sst2", "nli", "ner")  # tasks whose held-out score the lab measures
DATA_UNREAD = ("The Data field was not read: this model has no sentiment, NLI or NER head, so its variants are "
               "compared by size and speed alone. To compare scores too, pick a fine-tuned model above.")
LATENCY_REPS = 3


class CompressPanel(Panel):
    """Compress the picked model in the background; compare all variants of the session."""

    title = "Compression"
    teaches = ("Smaller models: int8 weights, fewer attention heads, fewer layers — what each costs in "
               "accuracy and gains in size and speed.")

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, runs_dir: str | Path | None = None,
                 workspace: Workspace | None = None, latency_reps: int = LATENCY_REPS) -> None:
        super().__init__()
        self.model, self.tok = model, tok
        self.workspace = workspace or Workspace.for_session()
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.latency_reps = latency_reps
        self.comparison = Comparison()
        self.variants = self.comparison.rows  # every row of the session (originals included)
        self._data_cache: dict[tuple, TaskData] = {}
        self._curve: list[dict[str, Any]] = []
        self._history: list[dict[str, Any]] = []
        self._teacher_score: float | None = None
        self._curve_kind = "prune"
        self._metric = "accuracy"
        self.made: list[CompressedModel] = []
        style = {"description_width": "initial"}
        layers = model.family.num_layers

        self.method = widgets.ToggleButtons(options=[(v, k) for k, v in METHODS.items()], value="quantize",
                                            description="Method", style={"description_width": "initial",
                                                                         "button_width": "140px"})
        self.method_help = widgets.HTML()
        self.keep = widgets.FloatSlider(value=0.5, min=0.1, max=0.9, step=0.05, description="Heads kept",
                                        readout_format=".0%", style=style)
        whole, real = widgets.BoundedIntText, widgets.BoundedFloatText
        self.layers = labelled(whole, "Student layers", "170px", value=max(1, layers // 2), min=1,
                               max=max(1, layers - 1))
        self.temperature = labelled(real, "Temperature T", "170px", value=2.0, min=0.5, max=20, step=0.5)
        self.alpha = labelled(real, "Soft-target weight", "190px", value=0.5, min=0, max=1, step=0.1)
        self.epochs = labelled(whole, "Epochs", "120px", value=2, min=1, max=50)
        self.lr = labelled(real, "Learning rate", "200px", value=1e-4, min=1e-7, max=1.0, step=1e-5)
        self.path = labelled(widgets.Text, "Data", "min(100%, 420px)", continuous_update=False,
                             placeholder="data file or folder (empty: BERTLAB_DATA)")
        self.max_train = labelled(whole, "Max train examples (0 = all)", "260px", value=CPU_MAX_TRAIN, min=0, max=10**8)
        self.max_dev = labelled(whole, "Max dev examples", "200px", value=CPU_MAX_DEV, min=0, max=10**8)
        self.options = widgets.VBox()
        self.start_button, self.cancel_button, self.job, self.progress, self.progress_text = run_controls(
            "bertlab-compress", "Compress", "Compress the model picked above (a copy of it)",
            "Stop the run (nothing is kept: a half-trained student is no variant to compare)", icon="compress")
        self._curve_fig = empty_figure("Prune or distil a model to see its curve here.")
        self.curve = SyncedFigureWidget(self._curve_fig)
        self.curve_box = widgets.Box([self.curve])
        self._plot_fig = plot_variants([])
        self.plot_box = widgets.Box([SyncedFigureWidget(self._plot_fig)])
        self.batch_choice = widgets.ToggleButtons(options=[("batch 1", 1), ("batch 32", 32)], value=1,
                                                  description="Latency at", style=style)
        self.table = widgets.HTML()
        help_line = widgets.HTML(help_html(HELP))

        self.method.observe(lambda _: self._show_options(), names="value")
        self.batch_choice.observe(lambda _: self._draw_variants(), names="value")
        self.start_button.on_click(self._on_start)
        self.cancel_button.on_click(lambda _: self.cancel())
        self._show_options()
        self._widget = widgets.VBox([
            help_line, self.method, self.method_help, self.options,
            widgets.HBox([self.path, self.max_dev], layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox([self.start_button, self.cancel_button, self.progress, self.progress_text]),
            self.message, self.curve_box, self.table, self.batch_choice, self.plot_box,
        ], layout=widgets.Layout(width="100%"))

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """The next run compresses this model; the session's table stays."""
        if model is self.model:
            return
        self.model, self.tok = model, tok
        layers = model.family.num_layers
        self.layers.max = max(1, layers - 1)
        self.layers.value = min(self.layers.value, self.layers.max)
        if not self.job.running:
            self.show_messages([])

    def figures(self) -> dict[str, go.Figure]:
        figs = {"variants": self._plot_fig}
        if self._curve or self._history:
            figs["curve"] = self._curve_fig
        return figs

    def cancel(self) -> None:
        self.job.cancel()
        self.progress_text.value = "Cancelling…"

    # -- settings -----------------------------------------------------------------------------
    def _show_options(self) -> None:
        method = self.method.value
        self.method_help.value = help_html(METHOD_HELP[method])
        wrap = widgets.Layout(flex_flow="row wrap")
        self.options.children = {  # training examples: what head scores average over, what a student learns on
            "quantize": [],
            "prune": [widgets.HBox([self.keep, self.max_train], layout=wrap)],
            "distill": [widgets.HBox([self.layers, self.temperature, self.alpha, self.epochs, self.lr], layout=wrap),
                        self.max_train],
        }[method]

    def _source(self) -> str | None:
        text = self.path.value.strip()
        return str(self.workspace.resolve(text, "data")) if text else None

    # -- a run --------------------------------------------------------------------------------
    def _on_start(self, _=None) -> None:
        with self.reporting():
            self.start()

    def start(self) -> None:
        """Compress the current model with the chosen method in the background."""
        self.job.check_idle()
        method, model, tok = self.method.value, self.model, self.tok
        task = model_task(model)
        if task not in TASKS_SCORED and method != "quantize":
            raise InputError("This model has no sentiment, NLI or NER head to score: fine-tune it in the "
                             "Fine-tuning tab first, then pick the fine-tuned model in the list above.")
        try:
            check_method(method, model)
        except CompressError as e:
            raise InputError(str(e)[:1].upper() + str(e)[1:]) from None
        source = self._source() if task in TASKS_SCORED else None  # fails early on a path outside the workspace
        settings = {"keep": self.keep.value, "layers": self.layers.value, "temperature": self.temperature.value,
                    "alpha": self.alpha.value, "epochs": self.epochs.value, "lr": self.lr.value,
                    "max_train": self.max_train.value or None, "max_dev": self.max_dev.value or None,
                    "data_unread": task not in TASKS_SCORED and bool(self.path.value.strip())}
        self.messages = []
        self._busy_text = f"{METHODS[method]} of the model picked above…"
        self.show_messages(self.messages)  # the busy sign goes on top of the message line
        self.progress.value, self.progress.max = 0, 1
        named = self.model_name or "this model"  # the picker's name: every row and picker entry says where it came from
        self.job.start(functools.partial(self._run, method, model, tok, task, source, settings, named),
                       on_error=functools.partial(self._failed, method), on_done=self._ended)

    def _failed(self, method: str, error: BaseException) -> None:
        level = "warning" if self.job.cancelled else "error"
        self.show_message(f"{METHODS[method]}: {error_text(error, self.workspace.hide_root)}", level)

    def _ended(self) -> None:
        self._busy_text = None
        self.show_messages(self.messages)
        self.progress_text.value = ""

    def _run(self, method: str, model: torch.nn.Module, tok: Tokenizer, task: str | None, source: str | None,
             settings: dict[str, Any], named: str = "this model") -> None:
        """The background job: data, the original's row, the method, the new row. `named`: the model's name
        in the picker, which the rows and the new picker entry name as where they came from."""
        data = self._data(task, source, model, tok, settings) if task in TASKS_SCORED else None
        original = self._original_row(model, tok, data, named)
        self._teacher_score = original.get("score")
        self._metric = data.task.main_metric if data is not None else "accuracy"
        folder = self.workspace.new_run_dir(f"compress-{method}", parent=self.runs_dir)
        try:
            made = self._compress(method, model, tok, data, folder, settings)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # this run's own folder: a failed or cancelled run leaves nothing
            raise
        row = self.comparison.add(made, original, named)
        self.made.append(made)
        self._draw_variants()
        unread = [("warning", DATA_UNREAD)] if settings["data_unread"] else []
        peer = [("info", peer_text(self.variants[-1], row, self.workspace.shown))] if made.peer is not None else []
        missing = [("warning", made.peer_note)] if made.peer_note else []
        self.show_messages([("info", made_text(row, self.workspace.shown)), *peer, *missing, *unread,
                            *self.offer_model(row["name"], made.model, self.tok)])

    def _data(self, task: str, source: str | None, model: torch.nn.Module, tok: Tokenizer,
              settings: dict[str, Any]) -> TaskData:
        key = (task, source or "", settings["max_train"], settings["max_dev"], id(tok),
               tuple(sorted(model.config.id2label.items())))
        if key not in self._data_cache:
            self._status("reading the data…")
            self._data_cache[key] = TaskData.read(task, tok, model, data=source, max_train=settings["max_train"],
                                                  max_dev=settings["max_dev"])
        return self._data_cache[key]

    def _original_row(self, model: torch.nn.Module, tok: Tokenizer, data: TaskData | None,
                      named: str = "this model") -> dict[str, Any]:
        """The row of the model a run starts from (`Comparison.original`), drawn in the table."""
        row = self.comparison.original(model, tok, data, named, self.latency_reps,
                                       lambda: self._status("measuring the original (size, latency, score)…"))
        self._draw_variants()
        return row

    def _compress(self, method: str, model: torch.nn.Module, tok: Tokenizer, data: TaskData | None,
                  folder: Path, settings: dict[str, Any]) -> CompressedModel:
        reps = self.latency_reps
        if method == "quantize":
            self._status("quantizing to int8…")
            return run_quantize(model, tok, data, folder, reps=reps)
        if method == "prune":
            self._curve, self._curve_kind = [], "prune"
            self._draw_curve()
            keep = settings["keep"]

            def on_point(point) -> None:
                self._curve.append(dataclasses.asdict(point))
                self.progress.value = min(self.progress.max, self.progress.value + 1)
                self._draw_curve()

            def progress(done: int, total: int) -> None:
                self._status(f"scoring the heads: batch {done} of {total}…")

            self.progress.value, self.progress.max = 0, 10
            made = run_prune(model, tok, data, keep, folder, name=f"pruned to {keep:.0%} of heads", on_point=on_point,
                             progress=progress, cancel=self.job.cancel_event, reps=reps)
            self._draw_curve(keep=made.variant.heads)
            return made
        self._history, self._curve_kind = [], "distill"
        self._draw_curve()
        cfg = DistillConfig(task=data.task.name, layers=settings["layers"], temperature=settings["temperature"],
                            alpha=settings["alpha"], epochs=settings["epochs"], lr=settings["lr"], device="cpu",
                            log_every=1)
        self._status("distilling: the teacher's score first…")
        return run_distill(model, tok, data, cfg, folder, name=f"student, {cfg.layers} layers",
                           callbacks=[self._on_event], cancel=self.job.cancel_event, reps=reps)

    def _on_event(self, event: TrainEvent) -> None:
        """A loop event from the distillation thread: record, redraw now and then. Never raises."""
        try:
            if event.kind == "start":
                self.progress.max = max(1, event.total_steps)
            elif (entry := event.history_entry()) is not None:
                self._history.append(entry)
            self.progress.value = min(event.step, self.progress.max)
            self._status(f"distilling: step {event.step} of {event.total_steps}")
            if self.job.redraw.due(force=event.kind in ("eval", "end")):
                self._draw_curve()
        except Exception:
            log.exception("the compression panel could not show a training event")

    def _status(self, text: str) -> None:
        self.progress_text.value = f'<span style="{MUTED}">{text}</span>'

    # -- drawing ------------------------------------------------------------------------------
    def _draw_curve(self, keep: int | None = None) -> None:
        if self._curve_kind == "prune":
            fig = plot_prune_curve(self._curve, self._metric, keep)
        else:
            fig = plot_distill_curves(self._history, self._metric, self._teacher_score)
        self._curve_fig = fig
        show_figure(self.curve_box, fig)

    def _draw_variants(self) -> None:
        self.table.value = variants_html(self.variants)
        self._plot_fig = plot_variants(self.variants, self.batch_choice.value)
        show_figure(self.plot_box, self._plot_fig)


__all__ = ["CompressPanel", "METHODS"]
