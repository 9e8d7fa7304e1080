"""One place for the page's styles: panels draw with the theme's colours (bertlab.viz.theme) and the panel
kit's notes, never a colour literal of their own, so that a colour changes in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bertlab
from bertlab.panels.base import busy_html, note_html
from bertlab.viz.mask import hidden_html, reads_html
from bertlab.viz.theme import HIDDEN_MARK, NOTE_EDGE, NOTE_STYLE

PANELS = Path(bertlab.__file__).resolve().parent / "panels"
COLOUR = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?\b|\brgba?\(")


def colour_literals(path: Path) -> list[str]:
    """`line: literal` for each colour written in a string of `path` (f-string parts included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{node.lineno}: {m.group(0)}" for m in COLOUR.finditer(node.value)]
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_no_panel_writes_a_colour_of_its_own():
    found = [f"{p.name}:{hit}" for p in sorted(PANELS.glob("*.py")) for hit in colour_literals(p)]
    assert not found, "colours written in panels (use bertlab.viz.theme's constants):\n" + "\n".join(found)


def test_the_colour_scanner_sees_plain_and_formatted_strings(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('A = "color:#555"\nB = f\'<div style="border:1px solid #dddddd">{x}</div>\'\n'
                 'C = "rgb(1, 2, 3)"\nD = "issue #12 and #section"\n')
    assert colour_literals(f) == ["1: #555", "2: #dddddd", "3: rgb("]


def test_notes_busy_sign_and_hidden_pieces_draw_with_the_theme():
    for level, style in NOTE_STYLE.items():
        assert style in note_html(level, "x") and NOTE_EDGE[level] in style
    assert NOTE_EDGE["info"] in busy_html()
    assert hidden_html("<mask>") == f'<span style="{HIDDEN_MARK}">&lt;mask&gt;</span>'
    assert hidden_html("[MASK]") in reads_html(["[CLS]", "a", "[MASK]", "[SEP]"])


def test_the_class_question_marks_its_mask_and_escapes_the_teachers_text():
    from bertlab.viz.classroom import question_html

    shown = question_html("a <b>bold</b> [MASK] here", "[MASK]")
    assert hidden_html("[MASK]") in shown and "&lt;b&gt;bold&lt;/b&gt;" in shown and "<b>bold" not in shown
    assert hidden_html("[MASK]") not in question_html("no mask [MASK]", None)
    pair = question_html("A <i>one</i>", "[MASK]", "B two", ask="Does B follow A?")
    assert "A &lt;i&gt;one&lt;/i&gt;" in pair and "B two" in pair and "Does B follow A?" in pair
