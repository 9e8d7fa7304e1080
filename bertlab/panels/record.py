"""What a lab record holds, read off the dashboard: the model, the seeds, and each opened tab's inputs,
figures and attention views (the page itself is made by bertlab.viz.record)."""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as widgets
import plotly.graph_objects as go

from bertlab.analysis.attention import AttentionResult
from bertlab.panels.base import Panel
from bertlab.viz.attention_view import to_standalone_html
from bertlab.viz.record import RecordHeader, RecordSection

MAX_VALUE_CHARS = 5000  # an input longer than this is cut in the record
MAX_ATTENTION_TOKENS = 128  # attention views of longer inputs are left out (the page would grow large)
_TYPED = (widgets.Text, widgets.Textarea)


def widget_inputs(root: widgets.Widget) -> list[tuple[str, str]]:
    """(description, value) of every text box with a description and a value, and every seed field,
    in the order they are shown; hidden parts (display none) are skipped."""
    out: list[tuple[str, str]] = []

    def walk(w: widgets.Widget) -> None:
        layout = getattr(w, "layout", None)  # a plotly figure's layout is no widget Layout
        if isinstance(layout, widgets.Layout) and layout.display == "none":
            return
        description = str(getattr(w, "description", "") or "")
        if isinstance(w, _TYPED) and description and str(w.value).strip():
            value = str(w.value)
            out.append((description, value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"))
        elif isinstance(w, (widgets.IntText, widgets.BoundedIntText)) and "seed" in description.lower():
            out.append((description, str(w.value)))
        for child in getattr(w, "children", ()) or ():
            if isinstance(child, widgets.Widget):
                walk(child)

    walk(root)
    return out


def panel_seed(panel: Panel) -> int | None:
    """The seed a panel draws its random choices with, when it keeps one as an int."""
    seed = getattr(panel, "seed", None)
    if isinstance(seed, widgets.Widget):
        seed = getattr(seed, "value", None)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def attention_pages(tab: str, panel: Panel) -> dict[str, str]:
    """The tab's attention result as a standalone head/model view page (none when it has none)."""
    result = getattr(panel, "result", None)
    if not isinstance(result, AttentionResult) or len(result.tokens) > MAX_ATTENTION_TOKENS:
        return {}
    title = f"{tab}: attention of {result.text_a[:60]}" + (f" / {result.text_b[:60]}" if result.text_b else "")
    return {"attention view (head view and model view)": to_standalone_html(
        result.patterns, result.tokens, result.sentence_b_start, title=title)}


def session_sections(panels: Mapping[str, Panel], skip: tuple[str, ...] = ("Export",)) -> list[RecordSection]:
    """One section per opened tab (in tab order), its inputs, figures on show and attention views."""
    sections = []
    for tab, panel in panels.items():
        if tab in skip:
            continue
        try:
            figures = {name: go.Figure(fig) for name, fig in panel.figures().items()}
        except Exception:  # a tab that cannot list its figures still gives its inputs
            figures = {}
        try:
            made_with = {name: model for name, model in panel.made_with().items() if name in figures}
        except Exception:  # noqa: BLE001 (the section still names the tab's model)
            made_with = {}
        sections.append(RecordSection(tab, widget_inputs(panel.widget), figures, attention_pages(tab, panel),
                                      model=panel.model_name, made_with=made_with))
    return sections


def session_header(model, name: str, panels: Mapping[str, Panel], student: str = "") -> RecordHeader:
    """The model (its name in the picker and what it is) and the seeds of the opened tabs."""
    describe = getattr(model, "describe", None)
    details = [("What it is", describe())] if callable(describe) else []
    seeds = {}
    for tab, panel in panels.items():
        if (seed := panel_seed(panel)) is not None:
            seeds[tab] = seed
        for part in vars(panel).values():  # sections inside a tab ("Does attention explain it?")
            if isinstance(part, Panel) and part is not panel and (seed := panel_seed(part)) is not None:
                seeds[f"{tab} ({part.title})"] = seed
    return RecordHeader(model=name, details=details, seeds=seeds, student=student)
