"""The README's generated figure blocks equal what bench/readme_tables.py makes from bench/results."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_figures_match_the_results_files():
    tables = _tables()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    names = re.findall(r"<!-- figures:([\w-]+) -->", text)
    assert names, "the README has no generated figure blocks"
    assert set(names) <= set(tables.BLOCKS), f"unknown blocks: {set(names) - set(tables.BLOCKS)}"
    _, changed = tables.render(text)
    assert not changed, f"README figures differ from bench/results for {changed}: run python bench/readme_tables.py"


def test_a_changed_result_is_caught(tmp_path, monkeypatch):
    tables = _tables()
    text = "<!-- figures:fillmask -->\n| old |\n<!-- /figures:fillmask -->\n"
    new, changed = tables.render(text)
    assert changed == ["fillmask"] and "| old |" not in new
    assert tables.render(new)[1] == []  # rendering is stable
