"""Pieces the analysis tabs share beyond the panel kit (bertlab.panels.base): the flag a panel holds while
it changes its own widgets, sliders over a model's layers and heads, the class question's box above a tab,
and a sub-tab's help line. (The boxes that show figures: bertlab.viz.figure_widget.)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import ipywidgets as widgets
import torch

from bertlab.classroom.store import Kind, QuestionStore
from bertlab.panels.classroom import ClassQuestionBox, class_store
from bertlab.viz.theme import help_html


class Hold:
    """Set while a panel changes its own widgets, so that their observers do nothing meanwhile:
    `with self.hold(): slider.value = 3` here, `if self.hold: return` in the observer."""

    def __init__(self) -> None:
        self._depth = 0

    def __bool__(self) -> bool:
        return self._depth > 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1


def on_input(callback: Callable[..., None], *inputs: widgets.Widget) -> None:
    """Call `callback` when one of `inputs` changes its value, or (a button) is clicked."""
    for w in inputs:
        if isinstance(w, widgets.Button):
            w.on_click(callback)
        else:
            w.observe(callback, names="value")


Count = Literal["layer", "head", "stage"]  # a layer (0 … L-1), a head (0 … H-1), a stage (0 embeddings … L)


def count_max(model: torch.nn.Module, count: Count) -> int:
    """The largest layer, head or stage index of `model`."""
    cfg = model.config
    return cfg.num_attention_heads - 1 if count == "head" else cfg.num_hidden_layers - (count == "layer")


class CountSliders:
    """IntSliders over a model's layers, heads or stages; `fit(model)` gives each the new model's range,
    keeping its value where the new model has it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._made: list[tuple[widgets.IntSlider, Count]] = []

    def __call__(self, count: Count, description: str, value: int = 0, **kw) -> widgets.IntSlider:
        top = count_max(self.model, count)
        slider = widgets.IntSlider(value=min(max(value, 0), top), min=0, max=top, description=description, **kw)
        self._made.append((slider, count))
        return slider

    def fit(self, model: torch.nn.Module) -> None:
        self.model = model
        for slider, count in self._made:
            slider.max = count_max(model, count)  # IntSlider clamps its value to the new range


def class_question(classroom: QuestionStore | None, kind: Kind, results: Sequence[widgets.Widget],
                   **kw) -> ClassQuestionBox | None:
    """The teacher's question above a tab, in class mode (`classroom`, default: the kernel's own store,
    `BERTLAB_CLASS_STORE`); None outside class mode. Until the student sends a guess, the widgets of
    `results` are hidden, so that the tab cannot give the answer away. `kw`: ClassQuestionBox's."""
    store = classroom if classroom is not None else class_store()
    if store is None:
        return None

    def hide(on: bool) -> None:
        for w in results:
            w.layout.display = "none" if on else None

    return ClassQuestionBox(store, kind, on_hide=hide, **kw)


def above(box: ClassQuestionBox | None, rows: list[widgets.Widget]) -> list[widgets.Widget]:
    """`rows` under the class question's box (when there is one)."""
    return ([box.widget] if box is not None else []) + rows


def hidden_by(box: ClassQuestionBox | None) -> bool:
    """Whether the class question hides the tab's results now (not even the Export tab may show them)."""
    return box is not None and box.hiding


def help_note(text: str, width: str = "720px") -> widgets.HTML:
    """A help line (HTML) at most `width` wide, at the top of a sub-tab."""
    return widgets.HTML(help_html(text, extra=f";max-width:{width}"))
