"""The "Replay" section of the training tabs: a time slider over the snapshots a run kept, and the probe
sentence as the model read it at that step in the Mask, Attention, Embeddings and logit-lens views.

Each run of the tab joins the run list (`add_run`, on the kernel's thread when the run ends); the probe
is read by every snapshot once (`analysis.replay`), so a slider move only draws a frame already computed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.analysis.replay import Replay, ReplayRun, replay, replay_model
from bertlab.classroom.hold import AnswerHold
from bertlab.families.bert import Bert
from bertlab.panels.base import Panel
from bertlab.panels.runs import in_background
from bertlab.tokenizer import Tokenizer
from bertlab.training.snapshots import iter_snapshots, list_snapshots
from bertlab.viz.figure_widget import SyncedFigureWidget, show_figure
from bertlab.viz.replay import VIEWS, marker, plot_frame, plot_trajectory
from bertlab.viz.theme import help_html

log = logging.getLogger(__name__)

HELP = ("Each run keeps a few snapshots of its weights (log-spaced: more of them early, when the model changes "
        "most). Move the slider to read the probe sentence with the model as it was at that step: the guesses "
        "at the {mask}, the attention of one head forming, the token vectors, and the logit lens.")


class ReplaySection(Panel):
    """Replay the runs of one training tab on a probe sentence, snapshot by snapshot."""

    title = "Replay"
    teaches = "A model during training: the right word rising, heads forming, representations settling."

    def __init__(self, tok: Tokenizer, probe: str, intro: str = "") -> None:
        super().__init__()
        self.tok = tok
        self.answer_hold = AnswerHold.of_kernel()  # the class question's answer, until the teacher reveals it
        self.runs: dict[str, ReplayRun] = {}
        self.result: Replay | None = None
        self.draw_ms: list[float] = []  # how long each redraw took
        self._figure_cache: dict[tuple, go.Figure] = {}
        self._shown_view: str | None = None  # the view the figure widget on show draws
        self._prebuilt: tuple | None = None  # the selection whose figures are being built in the background
        self._prebuild_token = 0
        self._ready: tuple[str, str, Replay] | None = None  # a run read in the background, for `compute`
        self.intro = widgets.HTML(self._help(intro, tok))
        self._intro_text = intro
        self.run = widgets.Dropdown(options=[], description="Run", layout=widgets.Layout(width="min(100%, 420px)"))
        self.probe = widgets.Text(value=probe, description="Probe", continuous_update=False,  # a sentence: whole
                                  layout=widgets.Layout(width="min(100%, 820px)"))      # even in projector mode
        self.replay_button = widgets.Button(description="Replay", icon="history", disabled=True,
                                            tooltip="Read the probe with every snapshot of the run")
        self.step = widgets.SelectionSlider(options=[("–", 0)], value=0, description="Step", disabled=True,
                                            continuous_update=True, layout=widgets.Layout(width="min(100%, 520px)"))
        self.view = widgets.ToggleButtons(options=list(VIEWS), value="Mask", description="View",
                                          style={"button_width": "auto"})
        self.layer = widgets.IntSlider(value=0, min=0, max=0, description="Layer", continuous_update=True)
        self.head = widgets.IntSlider(value=0, min=0, max=0, description="Head", continuous_update=True)
        self.stage = widgets.IntSlider(value=0, min=0, max=0, description="Stage", continuous_update=True)
        self.trajectory_box = widgets.Box([])
        self.view_box = widgets.Box([], layout=widgets.Layout(overflow="auto"))
        self.run.observe(self._on_replay, names="value")
        self.probe.observe(self._on_replay, names="value")
        self.replay_button.on_click(self._on_replay)
        for w in (self.step, self.view, self.layer, self.head, self.stage):
            w.observe(self._on_draw, names="value")
        self._widget = widgets.VBox([
            self.intro, widgets.HBox([self.run, self.replay_button]), self.probe, self.message, self.step,
            self.trajectory_box, self.view, widgets.HBox([self.layer, self.head, self.stage]), self.view_box,
        ], layout=widgets.Layout(width="100%"))
        self._widget.add_class("bertlab-replay")  # for the browser tests
        self._show_controls()

    def set_model(self, model, tok: Tokenizer) -> None:
        """The picker's model does not change a replay: a run replays the model it trained."""

    def figures(self) -> dict[str, go.Figure]:
        if self.result is None:
            return {}
        figs = {}
        for name, box in (("replay: over training", self.trajectory_box), ("replay: view", self.view_box)):
            if box.children and isinstance(box.children[0], go.FigureWidget):
                figs[name] = go.Figure(box.children[0])
        return figs

    @staticmethod
    def _help(intro: str, tok: Tokenizer) -> str:
        text = (intro + " " if intro else "") + HELP.format(mask=tok.mask_token)
        return help_html(text)

    # -- runs -------------------------------------------------------------------------------------
    def waiting(self, text: str) -> None:
        """The busy sign while a run that just ended is read in the background (until `add_run`/`offer`)."""
        self._busy_text = text
        self.show_messages(self.messages)

    def add_run(self, label: str, model: Bert, tok: Tokenizer, folder: str | Path, base: Bert | None = None,
                probe: str | None = None, read: Replay | None = None) -> None:
        """Offer a finished (or stopped) run, pick it, and replay it on `probe` (default: the probe typed).
        `read`: the run already read on `probe` (`read_run`, in the background), so nothing is computed here."""
        self._busy_text = None
        if not list_snapshots(folder):
            self.show_message(f"{label}: the run kept no snapshots to replay.", "warning")
            return
        self.runs[label] = ReplayRun(label, model, tok, Path(folder), base)
        self._ready = (label, probe, read) if read is not None and probe is not None else None
        with self.hold():
            if probe is not None:
                self.probe.value = probe
            self.run.options = list(self.runs)
            self.run.value = label
        self.compute()

    def offer(self, label: str, model: Bert, tok: Tokenizer, folder: str | Path, hide: Callable[[str], str] = str,
              base: Bert | None = None, probe: str | None = None, read: Replay | None = None) -> None:
        """`add_run` for a run that has just ended: never raises (the run itself is done and kept); a failure
        is said here, with paths the student should not see rewritten by `hide`."""
        try:
            self.add_run(label, model, tok, folder, base=base, probe=probe, read=read)
        except Exception as e:  # noqa: BLE001
            log.exception("replay of %s failed", label)
            self.show_message(f"{label} cannot be replayed: {hide(str(e))}", "error")

    def _on_replay(self, _=None) -> None:
        """Another run or probe, or the Replay button: replay (not while `add_run` sets them both)."""
        if not self._holding:
            self.compute()

    def compute(self) -> None:
        """Read the probe with every snapshot of the chosen run; then draw the last step."""
        run = self.runs.get(self.run.value)
        self.replay_button.disabled = run is None
        if run is None:
            return
        with self.reporting(), self.busy(self.replay_button, text="Reading the probe with every snapshot…"):
            self.result, self._figure_cache, self._shown_view, self._prebuilt = None, {}, None, None
            self.tok = run.tok
            self.intro.value = self._help(self._intro_text, run.tok)
            self.answer_hold.check(self.probe.value, run.tok.mask_token)
            ready, self._ready = self._ready, None
            result = ready[2] if ready is not None and ready[:2] == (run.label, self.probe.value) else \
                read_run(run, self.probe.value)
            extra = not run.model.has_mlm and run.base is not None and run.base.has_mlm  # its MLM head borrowed
            run.probe = self.probe.value
            self.result = result
            notes = [("info", n) for n in result.notes]
            if extra:
                notes.append(("info", "The Mask and logit-lens views read each snapshot's encoder with the MLM head "
                                      "of the model the run started from: how much word guessing survives "
                                      "fine-tuning."))
            self.show_messages(notes)
            self._set_controls(result)
        if self.result is None:  # the message says why; no old frame stays under it
            self.trajectory_box.children, self.view_box.children, self._shown_view = (), (), None
            self._show_controls()

    # -- drawing ----------------------------------------------------------------------------------
    def _set_controls(self, result: Replay) -> None:
        frame = result.frames[-1]
        layers, heads = frame.attention.num_layers, frame.attention.num_heads
        with self.hold():
            self.layer.max, self.head.max = layers - 1, heads - 1
            self.stage.max = frame.similarity.num_stages - 1
            self.stage.value = self.stage.max
            self.step.options = [(str(s), s) for s in result.steps]
            self.step.value = result.steps[-1]
            self.step.disabled = False
        self._show_controls()
        show_figure(self.trajectory_box, plot_trajectory(result, self.step.value))
        self.draw()

    def _on_draw(self, _change=None) -> None:
        if self._holding:
            return
        self._show_controls()
        with self.reporting(self.view_box):  # a frame that cannot be drawn takes the old one with it
            self.draw()

    def draw(self) -> None:
        """Show the chosen frame in the chosen view, and move the trajectory's marker."""
        if self.result is None:
            return
        t0 = time.perf_counter()
        step, view = self.step.value, self.view.value
        selection = self._selection()
        fig = self._figure(self.result, step, selection)
        if selection != self._prebuilt:  # the other steps' figures of this selection, in the background
            self._prebuild(self.result, selection)
        if view != self._shown_view:  # another kind of figure: a new widget (an update would keep old axes)
            old = self.view_box.children
            self.view_box.children = (SyncedFigureWidget(fig),)
            for w in old:
                w.close()
            self._shown_view = view
        else:
            show_figure(self.view_box, fig)
        traj = self.trajectory_box.children[0] if self.trajectory_box.children else None
        if isinstance(traj, go.FigureWidget) and self.result.steps and step in self.result.steps:
            traj.layout.shapes = [marker(self.result, step)]
        self.draw_ms.append(1000 * (time.perf_counter() - t0))

    def _selection(self) -> tuple[str, int, int, int]:
        """(view, layer, head, stage): what a figure shows besides the step."""
        view = self.view.value
        return (view, self.layer.value if view == "Attention" else 0, self.head.value if view == "Attention" else 0,
                self.stage.value if view == "Embeddings" else 0)

    def _figure(self, result: Replay, step: int, selection: tuple[str, int, int, int]) -> go.Figure:
        """The figure of `step` in `selection`, built once (the cache lives as long as the replay)."""
        key = (id(result), step, *selection)
        fig = self._figure_cache.get(key)
        if fig is None:
            view, layer, head, stage = selection
            fig = plot_frame(result, result.frame(step), view, layer, head, stage)
            self._figure_cache[key] = fig
        return fig

    def _prebuild(self, result: Replay, selection: tuple[str, int, int, int]) -> None:
        """Build the figures of every step of `selection` in a background thread, so that the step slider
        finds them ready; a newer selection or replay stops it."""
        self._prebuilt = selection
        token = self._prebuild_token = self._prebuild_token + 1

        def work() -> None:
            for step in result.steps:
                if self._prebuild_token != token or self.result is not result:
                    return
                try:
                    self._figure(result, step, selection)
                except Exception:  # noqa: BLE001 - the slider builds it again and reports the error
                    log.debug("prebuilding step %d failed", step, exc_info=True)
                    return

        in_background(work, "bertlab-replay-prebuild")

    def _show_controls(self) -> None:
        view = self.view.value
        self.layer.layout.display = self.head.layout.display = "" if view == "Attention" else "none"
        self.stage.layout.display = "" if view == "Embeddings" else "none"
        shown = self.result is not None
        for w in (self.view, self.trajectory_box, self.view_box):
            w.layout.display = "" if shown else "none"
        if not shown:
            self.layer.layout.display = self.head.layout.display = self.stage.layout.display = "none"


def read_run(run: ReplayRun, probe: str) -> Replay:
    """Read `probe` with every snapshot of `run` (no widget: the training thread calls it when a run ends)."""
    frame_model, extra = replay_model(run.model, run.base)
    return replay(iter_snapshots(frame_model, run.folder, extra=extra), run.tok, probe)

