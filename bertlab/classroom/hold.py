"""Whether a view may show the model's answer for a sentence now: not for the sentence of the live class
question before the teacher reveals it (`AnswerHold`, one per view), and how a kernel finds the class store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from bertlab.classroom.questions import AnswerHeld, same_sentence
from bertlab.classroom.remote import open_store
from bertlab.classroom.store import ClassStore, Question, QuestionStore

log = logging.getLogger(__name__)

HELD_NOTE = ("This is the sentence of the teacher's class question: the model's answer for it is held back "
             "until the teacher reveals it (then run it again here). Send your guess in the class question "
             "box at the top of the Mask tab.")


class AnswerHold:
    """Whether a view may show the model's guesses for a sentence now: not for the sentence of the
    live class question before the teacher reveals it. Outside class mode (no store) it holds nothing.

        self.answer_hold = AnswerHold.of_kernel()        # in the panel's __init__
        self.answer_hold.check(text, mask_token)         # before computing: raises AnswerHeld
        note = self.answer_hold.note(text, mask_token)  # or: HELD_NOTE / None, for a view with its own notes
    """

    def __init__(self, store: str | Path | QuestionStore | None) -> None:
        """`store`: the class store, or its SQLite file (None: no class, nothing held). The hold keeps a
        handle of its own (`another()`): another's `changed()` (the question box polls) must not
        swallow its news."""
        if isinstance(store, (str, Path)):
            path = Path(store)
            store = _opened(lambda: ClassStore(path))
        elif store is not None:
            store = _opened(store.another)
        self.store: QuestionStore | None = store
        self._question: Question | None = None

    @classmethod
    def of_kernel(cls) -> AnswerHold:
        """A hold on this kernel's class store (`BERTLAB_CLASS_STORE`, or the class service on a hub;
        none outside class mode)."""
        return cls(class_store())

    def live(self) -> Question | None:
        """The live mask question not revealed yet (re-read only when the store changed)."""
        if self.store is None:
            return None
        try:
            if self.store.changed():
                self._question = self.store.current()
        except Exception:  # a locked or vanished store: keep what was known
            log.exception("reading the class store failed")
        q = self._question
        return q if q is not None and q.kind == "mask" and not q.revealed else None

    def note(self, text: str, mask_token: str) -> str | None:
        """HELD_NOTE when `text` is the live question's sentence (`same_sentence`), else None."""
        q = self.live()
        return HELD_NOTE if q is not None and same_sentence(text, q.text, mask_token) else None

    def check(self, text: str, mask_token: str) -> None:
        """Raise AnswerHeld when `note` would hold `text` back."""
        note = self.note(text, mask_token)
        if note is not None:
            raise AnswerHeld(note)


def class_store() -> QuestionStore | None:
    """The class store of this kernel (`BERTLAB_CLASS_STORE`, or the class service when the hub set
    `BERTLAB_CLASS_SERVICE_URL`), or None outside class mode or when it cannot be opened (logged: the
    tab still works, without class questions)."""
    return _opened(open_store)


def _opened(opener: Callable[[], QuestionStore | None]) -> QuestionStore | None:
    try:
        return opener()
    except Exception:
        log.exception("could not open the class store: no class questions in this page")
        return None
