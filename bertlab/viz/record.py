"""A lab record: one self-contained HTML page of a session's views, for a student to hand in.

The page holds the model, the seed(s) and the date, then each tab's inputs and figures (interactive:
plotly.js is inlined once, read from the plotly package) and attention views (each a standalone page
in an iframe's srcdoc). Nothing is fetched from the network: it opens offline.

    page = lab_record_html(RecordHeader(model="MiniLM ...", seeds={"Next sentence": 0}),
                           [RecordSection("Mask", [("Text", "The cat sat on the [MASK].")], {"guesses": fig})])
"""

from __future__ import annotations

import datetime as dt
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io as pio

_PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1d2733; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.2em; border-bottom: 2px solid #4a90d9;
padding-bottom: 3px; margin-top: 32px; } h3 { font-size: 1em; margin: 18px 0 4px; color: #34495e; }
table.meta, table.inputs { border-collapse: collapse; margin: 6px 0 12px; font-size: 0.92em; }
table.meta td, table.inputs td { border: 1px solid #dde3ea; padding: 4px 10px; vertical-align: top; }
table.meta td:first-child, table.inputs td:first-child { background: #f3f6f9; font-weight: 600; white-space: nowrap; }
td.value { white-space: pre-wrap; word-break: break-word; }
iframe.attention { width: 100%; height: 720px; border: 1px solid #dde3ea; }
.figure { overflow-x: auto; } .note { color: #555; font-size: 0.9em; } .other-model { color: #a34700; }
"""


@dataclass
class RecordSection:
    """One tab of the session: what was typed or set, what it drew."""

    tab: str
    inputs: list[tuple[str, str]] = field(default_factory=list)  # (label, value) as on the tab
    figures: dict[str, go.Figure] = field(default_factory=dict)
    attention_pages: dict[str, str] = field(default_factory=dict)  # name -> a standalone attention view page
    model: str = ""  # the model the tab drew with ("" when unknown)
    made_with: dict[str, str] = field(default_factory=dict)  # figure name -> its model, where not `model`


@dataclass
class RecordHeader:
    """What the record is of: the model, the seeds that drove random choices, who, when."""

    model: str
    details: list[tuple[str, str]] = field(default_factory=list)  # more (label, value) lines: size, heads
    seeds: dict[str, int] = field(default_factory=dict)  # where -> seed
    student: str = ""
    made: str = ""  # date and time; default now (UTC)
    title: str = "bertlab lab record"


def lab_record_html(header: RecordHeader, sections: list[RecordSection]) -> str:
    """The record as one HTML page (plotly.js inlined once, attention views embedded): opens offline."""
    made = header.made or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = [("Student", header.student)] if header.student.strip() else []
    meta += [("Model picked", header.model), *header.details]
    meta += [("Seed" + ("s" if len(header.seeds) > 1 else ""),
              "\n".join(f"{where} = {seed}" for where, seed in header.seeds.items()))] if header.seeds else []
    meta += [("Made", made)]
    body = [f"<h1>{html.escape(header.title)}</h1>", _table(meta, "meta")]
    shown = [s for s in sections if s.inputs or s.figures or s.attention_pages]
    if not shown:
        body.append('<p class="note">No tab had drawn anything yet when this record was made.</p>')
    n = 0
    for section in shown:
        body.append(f"<h2>{html.escape(section.tab)}</h2>")
        if section.model:
            body.append(_made_with(section.model, header.model))
        if section.inputs:
            body.append(_table(section.inputs, "inputs"))
        for name, fig in section.figures.items():
            n += 1
            body.append(f"<h3>{html.escape(name)}</h3>")
            if section.made_with.get(name):
                body.append(_made_with(section.made_with[name], section.model or header.model, "figure"))
            div = pio.to_html(go.Figure(fig), include_plotlyjs=False, full_html=False, include_mathjax=False,
                              div_id=f"bertlab-figure-{n}", config={"displaylogo": False})
            body.append(f'<div class="figure">{div}</div>')
        for name, page in section.attention_pages.items():
            body.append(f"<h3>{html.escape(name)}</h3>")
            body.append(f'<iframe class="attention" title="{html.escape(name)}" srcdoc="{html.escape(page)}">'
                        "</iframe>")
    plotly_js = _script_text(_PLOTLY_JS.read_text(encoding="utf-8"))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(header.title)}</title>\n<style>{_STYLE}</style>\n"
        f"<script>{plotly_js}</script>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def _made_with(model: str, picked: str, what: str = "tab") -> str:
    """Which model a tab's (or a figure's) views were made with; said louder when it is not `picked`."""
    if model == picked:
        return f'<p class="note">Made with <b>{html.escape(model)}</b>.</p>'
    why = ("this tab last drew before another model was picked, and was not opened again" if what == "tab"
           else f"not the tab's model, {html.escape(picked)}")
    return f'<p class="note other-model">Made with <b>{html.escape(model)}</b> ({why}).</p>'


def _table(rows: list[tuple[str, str]], cls: str) -> str:
    cells = "".join(f"<tr><td>{html.escape(str(k))}</td><td class=\"value\">{html.escape(str(v))}</td></tr>"
                    for k, v in rows)
    return f'<table class="{cls}">{cells}</table>'


def _script_text(source: str) -> str:
    """Make code safe inside <script>...</script>."""
    return re.sub(r"</(script)", r"<\\/\1", source, flags=re.IGNORECASE).replace("<!--", "<\\!--")
