"""Class mode's "predict, then reveal": the store every kernel shares (`store`), and the questions
the teacher pushes, with the model's answer computed by the analysis functions (`questions`)."""

from bertlab.classroom.store import ClassStore, GuessError, Question, QuestionClosedError, normalise_guess

__all__ = ["ClassStore", "GuessError", "Question", "QuestionClosedError", "normalise_guess"]
