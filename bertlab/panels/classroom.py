"""The class question on a student's tab ("predict, then reveal").

The teacher pushes a question (bertlab.panels.teacher); each student's Mask tab (or Next sentence
tab) shows it in a `ClassQuestionBox`: the student sends a guess, and only when the teacher reveals
does the box show the model's answer beside the class's guesses. Until the student has sent a
guess, the tab's own results are hidden (`on_hide`), so the tab cannot give the answer away; and
until the reveal, every view that would show the model's guess for the question's sentence (Mask,
Ablation and its logit lens, Family, attributions, replay) holds it back with `HELD_NOTE`
(`AnswerHold`, one per view; bertlab.classroom.hold, which also finds this kernel's class store).

The box looks at the store in a background thread: one cheap `PRAGMA data_version` a second while a
question is live, every few seconds otherwise; it reads the question only when something changed.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import ipywidgets as widgets

from bertlab.classroom.hold import HELD_NOTE as HELD_NOTE  # the tabs import these from here
from bertlab.classroom.hold import AnswerHold as AnswerHold
from bertlab.classroom.hold import class_store as class_store
from bertlab.classroom.questions import NSP_CHOICES, pair_ask, pair_choices, tally, verdict
from bertlab.classroom.store import GuessError, Kind, Question, QuestionStore
from bertlab.panels.base import note_html
from bertlab.panels.runs import BackgroundRun
from bertlab.service_client import ClassServiceError
from bertlab.viz.classroom import plot_class_guesses, question_html
from bertlab.viz.figure_widget import show_figure
from bertlab.viz.theme import NOTE_EDGE

log = logging.getLogger(__name__)

POLL_LIVE_S = 1.0  # while a question is live
POLL_IDLE_S = 3.0  # while there is none: a push reaches the students within this
TAB_OF: dict[Kind, str] = {"mask": "Mask", "nsp": "Next sentence"}


class ClassQuestionBox:
    """The live class question of one kind, a guess to send, and the reveal. Hidden when there is none.

    `on_hide(True)` asks the tab to hide its own results (a question is open and this student has
    not answered), `on_hide(False)` to show them again; `on_change()` says the live question came,
    was revealed or went (results computed before may now be held back, or free again). `poll_s=None`
    starts no thread: call `poll()`."""

    def __init__(self, store: QuestionStore, kind: Kind, on_hide: Callable[[bool], None] | None = None,
                 poll_s: float | None = POLL_LIVE_S, idle_s: float = POLL_IDLE_S,
                 mask_token: str | None = None, on_change: Callable[[], None] | None = None) -> None:
        self.store, self.kind, self.on_hide, self.mask_token = store, kind, on_hide, mask_token
        self.on_change = on_change
        self._state: tuple[int, bool] | None = None  # (id, revealed) of the live question of any kind
        self.student = uuid.uuid4().hex  # anonymous: one id per page
        self.question: Question | None = None  # the live question of this kind
        self.elsewhere: Question | None = None  # a live question of the other kind
        self.guess: str | None = None  # this student's guess to `question`, as counted
        self.hiding = False
        self._lock = threading.RLock()

        self.title = widgets.HTML()
        self.prompt = widgets.HTML()
        if kind == "mask":
            self.input: widgets.ValueWidget = widgets.Text(
                placeholder="the hidden word", description="Your guess",
                layout=widgets.Layout(width="min(100%, 320px)"), continuous_update=True)
        else:
            self.input = widgets.ToggleButtons(options=list(NSP_CHOICES), value=None, description="Your guess",
                                               style=widgets.ToggleButtonsStyle(button_width="auto"))
        self.send_button = widgets.Button(description="Send", button_style="primary",
                                          tooltip="Send your guess to the teacher (you can change it until the reveal)")
        self.send_button.on_click(lambda _: self.send())
        self.status = widgets.HTML()
        self.figure_box = widgets.VBox([])
        self.widget = widgets.VBox(
            [self.title, self.prompt, widgets.HBox([self.input, self.send_button],
                                                   layout=widgets.Layout(flex_flow="row wrap", align_items="center")),
             self.status, self.figure_box],
            layout=widgets.Layout(display="none", border=f"2px solid {NOTE_EDGE['warning']}", padding="6px 10px",
                                  margin="0 0 8px 0"),
        )
        self.widget.add_class("bertlab-class-question")

        on_change, self.on_change = self.on_change, None  # the tab sets itself up once this box exists
        try:  # a page opened while a question is live shows it at once, not after the first poll
            self.poll()
        except Exception:  # the store is away: the polls below try again
            log.exception("reading the class store failed")
        finally:
            self.on_change = on_change
        self.watch = BackgroundRun(f"bertlab-class-{kind}")
        if poll_s:  # often while a question is live, seldom otherwise
            self.watch.poll(self.poll, lambda: poll_s if (self.question or self.elsewhere) else idle_s)

    # -- looking at the store ----------------------------------------------------------------------
    def poll(self) -> None:
        """Read the store if it changed, and show what it holds."""
        if self.store.changed():
            self.show(self.store.current())

    def stop(self) -> None:
        """Stop looking at the store (the page went away)."""
        self.watch.cancel()

    # -- what the student sees -----------------------------------------------------------------------
    def show(self, current: Question | None) -> None:
        """Show `current` (the store's live question, or None)."""
        with self._lock:
            mine = current if current is not None and current.kind == self.kind else None
            self.elsewhere = current if current is not None and mine is None else None
            if mine is None or self.question is None or mine.id != self.question.id:
                self.guess = None  # a new question (or none): nothing sent yet
                self.figure_box.children = []
            self.question = mine
            # the tab's own results hidden before the question shows: the page gets the widgets' changes in this
            # order, so a student never sees a new question beside the answers it asks them to predict
            self._hide_results(mine is not None and not mine.revealed and self.guess is None)
            if mine is None:
                self._show_elsewhere()
            else:
                self._show_question(mine)
            state = (current.id, current.revealed) if current is not None else None
            if state != self._state:
                self._state = state
                if self.on_change is not None:
                    self.on_change()

    def send(self) -> None:
        """Send the guess in the input (or change the one sent)."""
        with self._lock:
            if self.question is None or self.question.revealed:
                return
            try:
                if self.input.value is None:
                    raise GuessError("Pick one of the two answers, then press Send.")
                self.guess = self.store.answer(self.question.id, self.student, self.input.value)
            except (GuessError, ClassServiceError) as e:  # or the hub's class service refused or is away
                self.status.value = note_html("warning", str(e))
                if isinstance(e, GuessError) and self.store.changed():  # closed meanwhile: show the reveal now
                    self.show(self.store.current())
                return
            self.send_button.description = "Change"
            self.status.value = note_html(
                "info", f"Sent: '{self.guess}'. You can change it until the teacher reveals the model's answer.")
            self._hide_results(False)

    def _show_question(self, q: Question) -> None:
        self.widget.layout.display = None
        state = "revealed" if q.revealed else "guess first, then the teacher reveals the model's answer"
        self.title.value = f'<b style="font-size:1.1em">Class question</b> — {state}'
        self.prompt.value = question_html(q.text, self.mask_token, q.text_b, pair_ask(q) if q.kind == "nsp" else None)
        if q.kind == "nsp" and tuple(self.input.options) != pair_choices(q):  # as the model's objective asks
            self.input.options, self.input.value = pair_choices(q), None
        self.input.disabled = self.send_button.disabled = q.revealed
        self.send_button.description = "Change" if self.guess else "Send"
        if not q.revealed:
            if self.guess is None:
                ask = ("What will the model say? Type your guess and press Send." if q.kind == "mask"
                       else f"{pair_ask(q)} Pick one and press Send.")
                self.status.value = note_html("info", f"{ask} This tab's own results come back once you have sent it.")
            return
        counts = tally(self.store.answers(q.id))
        self.status.value = note_html("info", verdict(q, self.guess))
        show_figure(self.figure_box, plot_class_guesses(counts, q.model))

    def _show_elsewhere(self) -> None:
        if self.elsewhere is None:
            self.widget.layout.display = "none"
            return
        self.widget.layout.display = None
        self.title.value = "<b>Class question</b>"
        self.prompt.value = ""
        self.status.value = note_html("info", f"The teacher's question is on the {TAB_OF[self.elsewhere.kind]} tab.")
        self.input.disabled = self.send_button.disabled = True

    def _hide_results(self, hide: bool) -> None:
        if hide != self.hiding:
            self.hiding = hide
            if self.on_hide is not None:
                self.on_hide(hide)
