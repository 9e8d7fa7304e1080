"""The map from a tab's name to its code (docs/contributing.md, "Where each tab lives"): a row per tab of
bertlab.panels.app.TABS, every module it names exists, the row's first widgets module is the tab's panel,
and the tab's widgets modules import each computation and figure module the row names (so a row that
drifts from the code fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import bertlab
from bertlab.panels.app import TABS

ROOT = Path(bertlab.__file__).resolve().parent
DOC = ROOT.parent / "docs" / "contributing.md"
COLUMNS = ("tab", "computation", "figures", "widgets")


def tab_map(text: str) -> dict[str, dict[str, list[str]]]:
    """Tab title -> {column: [bertlab-relative paths]} from the doc's table whose header is COLUMNS."""
    rows: dict[str, dict[str, list[str]]] = {}
    header = "| " + " | ".join(COLUMNS) + " |"
    if header not in text:
        return rows
    for line in text.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = {col: re.findall(r"`([^`]+)`", cell) for col, cell in zip(COLUMNS[1:], cells[1:])}
    return rows


def module_of(path: str) -> str:
    """`viz/knows.py` -> bertlab.viz.knows; `tasks/` -> bertlab.tasks."""
    return "bertlab." + path.rstrip("/").removesuffix(".py").replace("/", ".")


def imported_by(path: Path) -> set[str]:
    """The bertlab modules `path` imports (`from bertlab.x import y` counts x, and x.y when y is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertlab"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


MAP = tab_map(DOC.read_text(encoding="utf-8"))


def test_every_tab_has_a_row_and_every_row_a_tab():
    titles = [title for title, _ in TABS]
    assert sorted(MAP) == sorted(titles), f"docs/contributing.md's tab map vs TABS: {sorted(MAP)} != {sorted(titles)}"


@pytest.mark.parametrize("title, spec", TABS, ids=[t for t, _ in TABS])
def test_a_tabs_row_names_its_panel_and_modules_that_exist_and_that_it_uses(title, spec):
    row = MAP.get(title)
    assert row is not None, f"no row for the {title} tab in docs/contributing.md"
    assert all(row[col] for col in COLUMNS[1:]), f"{title}: an empty column in {row}"
    for path in (p for col in COLUMNS[1:] for p in row[col]):
        where = ROOT / path
        assert where.is_dir() if path.endswith("/") else where.is_file(), f"{title}: bertlab/{path} does not exist"
    assert module_of(row["widgets"][0]) == spec.split(":")[0], f"{title}: the first widgets module is not its panel"
    used = set().union(*(imported_by(ROOT / p) for p in row["widgets"]))
    for path in row["computation"] + row["figures"]:
        name = module_of(path)
        assert any(u == name or u.startswith(name + ".") for u in used), \
            f"{title}: its panel modules {row['widgets']} do not import {name}"


def test_the_map_reader_reads_a_table(tmp_path):
    text = ("intro\n\n| tab | computation | figures | widgets |\n|---|---|---|---|\n"
            "| Mask | `analysis/mask.py` | `viz/mask.py` | `panels/mask.py`, `panels/explain.py` |\n\nafter | x |\n")
    assert tab_map(text) == {"Mask": {"computation": ["analysis/mask.py"], "figures": ["viz/mask.py"],
                                      "widgets": ["panels/mask.py", "panels/explain.py"]}}
    assert tab_map("no table") == {}
