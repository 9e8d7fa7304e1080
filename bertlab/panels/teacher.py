"""The teacher's view ("predict, then reveal"): push a sentence with a [MASK] (or a sentence pair) to
every student's Mask tab (or Next sentence tab), watch the class's guesses come in as a histogram
beside the model's probabilities, and reveal the model's answer to everyone.

Served as its own dashboard (apps/teacher.ipynb) by `bertlab serve --class N`, at an address with
its own secret token that only the teacher gets (bertlab/serving/teacher.py).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.classroom.hold import class_store
from bertlab.classroom.questions import DEFAULT_K, mask_question, nsp_question, tally
from bertlab.classroom.store import Question, QuestionStore
from bertlab.panels.base import Panel, note_html
from bertlab.panels.class_queue import ClassQueueView
from bertlab.panels.classroom import POLL_LIVE_S, TAB_OF
from bertlab.panels.page import ProjectorSwitch, projector_requested
from bertlab.panels.runs import BackgroundRun
from bertlab.tokenizer import Tokenizer
from bertlab.training.queue import ClassQueue
from bertlab.viz import theme
from bertlab.viz.classroom import plot_class_guesses, question_status_html
from bertlab.viz.figure_widget import show_figure
from bertlab.viz.theme import MUTED

log = logging.getLogger(__name__)

# The question the teacher's page opens with: never a tab's own default (every student's tab shows the
# model's answer for that one as soon as the page loads, before any question is pushed).
DEFAULT_TEMPLATE = "She put the milk back in the {mask} to keep it cold."  # spelled with the model's mask token
DEFAULT_A = "I left my umbrella at home this morning."
DEFAULT_B = "I got soaked on the way to work."
NO_STORE = ("The teacher's view needs the class store, which `bertlab serve --class N` starts: serve the class "
            "with it and open the teacher's address it prints (or set BERTLAB_CLASS_STORE to the class's "
            "class.sqlite). On JupyterHub the hub's class service holds it: start the hub with "
            "deploy/jupyterhub/bertlab_config.py, which sets BERTLAB_CLASS_SERVICE_URL.")


class TeacherPanel(Panel):
    """Push a question, follow the answers, reveal the model's answer to all."""

    title = "Teacher"
    teaches = ("Students commit to a guess before they see the model's: push a question, watch the class's "
               "guesses gather beside the model's probabilities, then reveal it to everyone.")

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, store: QuestionStore,
                 poll_s: float | None = POLL_LIVE_S) -> None:
        """`poll_s`: how often the store is looked at (one cheap check; None: only by `refresh()`)."""
        super().__init__()
        self.model, self.tok, self.store = model, tok, store
        self._lock = threading.RLock()
        self.kind = widgets.ToggleButtons(options=[("Mask", "mask"), ("Next sentence", "nsp")], value="mask",
                                          description="Question", style=widgets.ToggleButtonsStyle(button_width="auto"))
        def wide() -> widgets.Layout:  # one Layout per widget: hiding B must not hide A
            return widgets.Layout(width="min(100%, 720px)", height="3.4em")

        default_text = tok.spell(DEFAULT_TEMPLATE)
        self.text = widgets.Textarea(value=default_text, description="Sentence", layout=wide(),
                                     placeholder=f"A sentence with one {tok.mask_token}")
        self.text_b = widgets.Textarea(value=DEFAULT_B, description="Sentence B", layout=wide(),
                                       placeholder="The sentence that may (or may not) follow A")
        self.k = widgets.IntSlider(value=DEFAULT_K, min=3, max=20, description="Model's top k",
                                   style={"description_width": "initial"})
        self.push_button = widgets.Button(description="Push to the class", button_style="primary",
                                          layout=widgets.Layout(width="auto"),
                                          tooltip="Show this question on every student's page (ends the one before)")
        self.reveal_button = widgets.Button(description="Reveal to all", button_style="success", disabled=True,
                                            tooltip="Show the model's answer and the class's guesses to every student")
        self.end_button = widgets.Button(description="End question", disabled=True,
                                         tooltip="Take the question off the students' pages")
        self.peek = widgets.Checkbox(value=False, indent=False, layout=widgets.Layout(width="auto"),
                                     description="Show the model's answer on my screen before the reveal")
        self.status = widgets.HTML()
        self.figure_box = widgets.VBox([])

        self.question: Question | None = None
        self.counts: list[tuple[str, int]] = []
        self._last_text, self._last_text_a = default_text, DEFAULT_A  # each kind's sentence, kept across switches

        self.kind.observe(self._on_kind, names="value")
        self.push_button.on_click(lambda _: self.push())
        self.reveal_button.on_click(lambda _: self.reveal())
        self.end_button.on_click(lambda _: self.end())
        self.peek.observe(lambda _: self._draw(), names="value")
        self._on_kind()
        self._widget = widgets.VBox([
            widgets.HTML(f'<div style="{MUTED}">Students see the question at the top of their <b>Mask</b> tab '
                         '(<b>Next sentence</b> for a pair), send a guess, and see the model\'s answer only when '
                         'you reveal it. Guesses are anonymous.</div>'),
            self.kind, self.text, self.text_b, self.k,
            widgets.HBox([self.push_button, self.reveal_button, self.end_button],
                         layout=widgets.Layout(flex_flow="row wrap")),
            self.peek, self.message, self.status, self.figure_box,
        ], layout=widgets.Layout(width="100%"))
        self.widget.add_class("bertlab-teacher")
        self.show(store.current())  # a reloaded page picks up the live question

        self.watch = BackgroundRun("bertlab-teacher")
        if poll_s:
            self.watch.poll(self.refresh, poll_s)

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """The next question is asked of this model (the live one keeps its answer)."""
        self.model, self.tok = model, tok

    def figures(self) -> dict[str, go.Figure]:
        return {"the class's guesses": go.Figure(self.figure_box.children[0])} if self.figure_box.children else {}

    # -- the teacher's buttons -----------------------------------------------------------------
    def push(self) -> None:
        """Ask the model, then make the question live on every student's page."""
        with self.busy(self.push_button, text="Asking the model…"), self.reporting():
            if self.kind.value == "mask":
                question = mask_question(self.model, self.tok, self.text.value, self.k.value)
            else:
                question = nsp_question(self.model, self.tok, self.text.value, self.text_b.value)
            with self._lock:
                self.show(self.store.push(question))
            self.show_messages([])

    def reveal(self) -> None:
        with self._lock, self.reporting():
            if self.question is not None:
                self.store.reveal(self.question.id)
                self.show(replace(self.question, revealed=True))

    def end(self) -> None:
        with self._lock, self.reporting():
            if self.question is not None:
                self.store.end(self.question.id)
                self.show(None)

    # -- following the answers -------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the store when another kernel wrote to it (answers; or a push, reveal or end from the
        teacher's other screen); redraw what changed."""
        with self._lock:
            if not self.store.changed():
                return
            current = self.store.current()
            q = self.question
            if current is None or q is None or (current.id, current.revealed) != (q.id, q.revealed):
                self.show(current)
                return
            counts = tally(self.store.answers(q.id))
            if counts != self.counts:
                self.counts = counts
                self._draw()

    def show(self, question: Question | None) -> None:
        """Show `question` (None: no live question) with its answers so far."""
        with self._lock:
            self.question = question
            self.counts = tally(self.store.answers(question.id)) if question is not None else []
            self.reveal_button.disabled = question is None or question.revealed
            self.end_button.disabled = question is None
            self._draw()

    def _draw(self) -> None:
        q = self.question
        self.status.value = question_status_html(q, sum(c for _, c in self.counts), TAB_OF[q.kind] if q else "")
        if q is None:
            self.figure_box.children = []
            return
        show_figure(self.figure_box, plot_class_guesses(self.counts, q.model, show_model=q.revealed or self.peek.value))

    def _on_kind(self, _=None) -> None:
        nsp = self.kind.value == "nsp"
        if nsp and self.text.description != "Sentence A":
            self._last_text = self.text.value
            self.text.value, self.text.description = self._last_text_a, "Sentence A"
        elif not nsp and self.text.description == "Sentence A":
            self._last_text_a = self.text.value
            self.text.value, self.text.description = self._last_text, "Sentence"
        self.text_b.layout.display = None if nsp else "none"
        self.k.layout.display = "none" if nsp else None

    def stop(self) -> None:
        self.watch.cancel()

    def redraw(self) -> None:
        """Draw the figure again (the theme changed)."""
        with self._lock:
            self._draw()


class TeacherPage:
    """The teacher's page: the panel in the dashboard's look, with its projector mode (a toggle,
    `?projector=1` in the address, `bertlab serve --projector`): text and the histogram grow together,
    the histogram as wide as the page, as every tab of the dashboard does."""

    def __init__(self, panel: TeacherPanel, projector: bool = False, queue: ClassQueueView | None = None) -> None:
        """`queue`: the class training queue's view, under the panel (None: the class has no queue)."""
        self.panel, self.queue = panel, queue
        theme.use(projector)
        self.switch = ProjectorSwitch(projector, panel.redraw)
        self.projector, self.page = self.switch.toggle, self.switch.page
        style = widgets.HTML(theme.css(), layout=widgets.Layout(display="none"))
        top = widgets.HBox([self.projector], layout=widgets.Layout(width="100%", justify_content="flex-end"))
        parts = [style, self.page, top, panel.widget] + ([queue.widget] if queue is not None else [])
        self.widget = widgets.VBox(parts, layout=widgets.Layout(width="100%"))
        self.switch.attach(self.widget)
        panel.redraw()

    def set_projector(self, on: bool) -> None:
        """Switch projector mode: the page's text at once (CSS), the histogram redrawn."""
        self.switch.set(on)


def teacher_view(source: str | None = None, projector: bool | None = None) -> widgets.Widget:
    """The teacher's dashboard: the served model (`source`, None = offline default) and the class
    store of `BERTLAB_CLASS_STORE`; a note saying what to do when there is no store. `projector`
    None: as the page's address or `bertlab serve --projector` asks."""
    from bertlab.loading import load
    from bertlab.runtime import cap_threads

    store = class_store()
    if store is None:
        return widgets.HTML(note_html("error", NO_STORE))
    cap_threads()
    model, tok = load(source)
    on = projector_requested() if projector is None else projector
    theme.use(on)  # before the panel draws
    queue = ClassQueue.from_env()  # the class service's on a hub, the SQLite one of `bertlab serve --class`
    view = ClassQueueView(queue) if queue is not None else None  # type: ignore[arg-type]
    return TeacherPage(TeacherPanel(model, tok, store), projector=on, queue=view).widget
