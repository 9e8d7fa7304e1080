"""The Pre-training tab's comparison: the session's runs on one plot (each objective's own loss, MLM
accuracy, the probe's P(target)), a button that fine-tunes each kept model on SST-2 the same way and
scores it on sentences it never trained on (and probes its frozen features with a logistic regression on
the same sentences), an untrained model of the first run's shape scored the same way as the floor, and a
download link for any kept model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import ipywidgets as widgets

from bertlab.panels.base import Level, note_html
from bertlab.panels.runs import BackgroundRun, error_text
from bertlab.training.objectives.compare import (
    SST2_SETTINGS,
    ComparedRun,
    sst2_probe,
    sst2_score,
    sst2_splits,
    write_untrained,
)
from bertlab.training.queue import waiting_text
from bertlab.viz.export import download_link, zip_folder
from bertlab.viz.figure_widget import SyncedFigureWidget, redraw
from bertlab.viz.objectives import plot_objective_curves, scores_html

log = logging.getLogger(__name__)

SST2_TRAIN = 2000  # sentences each model fine-tunes on (SST2_SETTINGS) and the probe fits on
SST2_DEV = 500  # dev sentences each is scored on (never trained on)


class CompareView:
    """Runs on one plot and their SST-2 scores; `widget` is its box."""

    def __init__(self, sst2_dir: Path | None = None, sst2_train: int = SST2_TRAIN, sst2_dev: int = SST2_DEV,
                 hide: Callable[[str], str] = str) -> None:
        self.runs: list[ComparedRun] = []
        self.sst2_dir, self.sst2_train, self.sst2_dev, self.hide = sst2_dir, sst2_train, sst2_dev, hide
        self.figure = SyncedFigureWidget(plot_objective_curves({}))
        self.untrained: ComparedRun | None = None  # the floor: the first run's shape, random weights
        epochs = SST2_SETTINGS["epochs"]
        self.finetune = widgets.Button(description="Fine-tune each on SST-2", icon="flask", disabled=True,
                                       tooltip=f"the same small fine-tuning for every kept model: {sst2_train} "
                                               f"sentences, {epochs} epoch(s), and a linear probe of its frozen "
                                               f"features; scored on {sst2_dev} held-out sentences")
        self.finetune.on_click(self._on_finetune)
        self.job = BackgroundRun("bertlab-compare", self.finetune)
        self.scores = widgets.HTML()
        self.message = widgets.HTML()
        self.messages: list[tuple[Level, str]] = []
        self.widget = widgets.VBox([
            widgets.HTML("<b>Compare objectives</b>: every run of this session on one plot. Pre-train with two or "
                         "more objectives (same size, corpus and steps) to see which learns most for the compute."),
            self.figure, widgets.HBox([self.finetune]), self.message, self.scores,
        ])

    def show(self, text: str, level: Level = "info") -> None:
        self.messages = [(level, text)]
        self.message.value = note_html(level, text)

    def add(self, run: ComparedRun) -> None:
        self.runs.append(run)
        self.draw()

    def draw(self) -> None:
        names = [r.name for r in self.runs]
        curves = {r.name: r.points for r in self.runs}
        title = f"{len(names)} run(s) of this session" if names else ""
        redraw(self.figure, plot_objective_curves(curves, title, {r.name: r.objective for r in self.runs}))
        shown = self.runs + ([self.untrained] if self.untrained is not None else [])
        self.scores.value = scores_html([r.row() for r in shown])
        self.finetune.disabled = self.job.running or not self.runs

    def _on_finetune(self, _=None) -> None:
        if self.job.running:
            return
        todo = [r for r in self.runs if r.score is None]
        if not todo and self.untrained is not None and self.untrained.score is not None:
            self.show("Every run has its SST-2 score already.")
            return
        self.show(f"Fine-tuning {len(todo)} model(s) on SST-2 (and an untrained one), one after the other…")
        self.job.start(lambda: self._score_all(todo), queue="SST-2 comparison",
                       on_place=lambda ahead: self.show(waiting_text(ahead, leave="closing the page")),
                       on_error=self._failed, on_done=self._ended)

    def _failed(self, error: BaseException) -> None:
        self.show(f"The SST-2 comparison stopped: {error_text(error, self.hide)}", "error")

    def _ended(self) -> None:
        self.finetune.disabled = not self.runs

    def _score_all(self, todo: list[ComparedRun]) -> None:
        """The background job (its place in the class queue is taken): score every run of `todo`."""
        train, dev = sst2_splits(self.sst2_dir, self.sst2_train, self.sst2_dev)
        if self.untrained is None:
            self.untrained = self.runs[0].floor()
            self.draw()
        if self.untrained.score is None:
            todo = [*todo, self.untrained]
        for i, run in enumerate(todo, start=1):
            self.show(f"Scoring {run.name} on SST-2 ({i} of {len(todo)}: a linear probe of its frozen features, "
                      f"then fine-tuning on {len(train)} sentences, {SST2_SETTINGS['epochs']} epoch(s))…")
            if run is self.untrained:
                write_untrained(run.folder, like=self.runs[0].folder)
            run.probe = sst2_probe(run.folder, train, dev)
            self.draw()
            run.score = sst2_score(run.folder, train, dev)
            self.draw()
        best = max(self.runs, key=lambda r: (r.probe or {}).get("accuracy", -1.0))
        self.show(f"Done: each model fine-tuned the same way on {len(train)} SST-2 sentences, and probed (a "
                  f"logistic regression on its frozen features), scored on {len(dev)} others; the untrained row "
                  f"is the floor. Best probe here: {best.name}. At this toy scale differences of a point or two "
                  "are noise (change the seed and they move).")

    def download_html(self, run: ComparedRun) -> str:
        """A link that downloads the run's folder as a zip (a data: URL, as the Export tab does)."""
        stem = run.folder.parent.name if run.folder.name == "model" else run.folder.name  # the run folder's name
        return download_link(zip_folder(run.folder), f"{stem}.zip", label=f"Download {run.name} (.zip)")
