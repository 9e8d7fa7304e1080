"""Text typed by a student, drawn as typed.

plotly reads a subset of HTML in every string it draws (tick labels, bar text, hover text, titles,
annotations, legend names): `<a href>` becomes a live link, `<span style>` a 90 px word, `<b>` and
`<br>` bold and line breaks, and a tokenizer's own `<s>` or `<mask>` vanish. An HTML widget reads
all of HTML. `plain_text` is the one escape for both: `&`, `<` and `>` become the entities that plotly
and browsers both turn back into the characters (text inside an HTML attribute needs `html.escape`).

`finish()` (bertlab.viz.theme) passes every trace's data strings and every axis's tick labels
through it; titles and annotations that carry student text call it where they are built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_MARKUP = frozenset("&<>")
# trace fields whose strings are data (tokens, words, sentences, guesses, names), never markup
DATA_FIELDS = ("x", "y", "text", "hovertext", "customdata", "labels", "name", "ids")


def plain_text(text: object) -> str:
    """`text` as a string that plotly and HTML both draw literally (no tags, no entities read)."""
    return str(text).translate(_ENTITIES)


def plain_texts(items: Iterable[object]) -> list[str]:
    """`plain_text` of each item."""
    return [plain_text(item) for item in items]


def plain_data(value: Any) -> Any:
    """`value` with every string in it (at any depth of lists and tuples) passed through `plain_text`;
    numbers and arrays of numbers as they are."""
    if isinstance(value, str):
        return plain_text(value)
    if isinstance(value, (list, tuple)):
        return type(value)(plain_data(v) for v in value)
    if getattr(value, "dtype", None) is not None and getattr(value.dtype, "kind", "") in "OUS":  # numpy strings
        return [plain_data(v) for v in value.tolist()]
    return value


def _needs(value: Any) -> bool:
    """Whether any string in `value` holds a character `plain_text` changes (most figures: none)."""
    if isinstance(value, str):
        return not _MARKUP.isdisjoint(value)
    if isinstance(value, (list, tuple)):
        return any(_needs(v) for v in value)
    if getattr(value, "dtype", None) is not None and getattr(value.dtype, "kind", "") in "OUS":
        return _needs(value.tolist())
    return False


def plain_figure(fig: Any) -> None:
    """Escape, in place, the strings of `fig` that hold data: each trace's DATA_FIELDS, a table's
    header and cells, and every axis's tick labels and the categories it names (titles and
    annotations are the builder's). Only what needs it is assigned again (plotly validates it)."""
    for trace in fig.data:
        for field in DATA_FIELDS:
            value = trace[field] if field in trace else None
            if value is not None and _needs(value):
                trace[field] = plain_data(value)
        if getattr(trace, "type", "") == "table":
            for part in (trace.header, trace.cells):
                if part.values is not None and _needs(part.values):
                    part.values = plain_data(part.values)
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        for field in ("ticktext", "tickvals", "categoryarray"):  # the last two name categories of the data
            if axis[field] is not None and _needs(axis[field]):
                axis[field] = plain_data(axis[field])
