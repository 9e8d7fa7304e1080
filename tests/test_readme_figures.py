"""The docs pages' generated figure blocks equal what bench/readme_tables.py makes from bench/results."""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_figures_match_the_results_files():
    tables = _tables()
    pages = tables.pages()
    assert ROOT / "docs" / "results.md" in pages
    names: Counter[str] = Counter()
    for page in pages:
        text = page.read_text(encoding="utf-8")
        names.update(re.findall(r"<!-- figures:([\w-]+) -->", text))
        _, changed = tables.render(text)
        assert not changed, f"{page.name}: figures differ from bench/results for {changed}: run bench/readme_tables.py"
    assert set(names) == set(tables.BLOCKS), f"blocks on no page: {set(tables.BLOCKS) - set(names)}"
    assert max(names.values()) == 1, f"a block on two pages: {[n for n, c in names.items() if c > 1]}"


def test_the_readme_is_a_front_door_without_figure_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- figures:" not in text and len(text.splitlines()) < 120


def test_a_changed_result_is_caught(tmp_path, monkeypatch):
    tables = _tables()
    text = "<!-- figures:fillmask -->\n| old |\n<!-- /figures:fillmask -->\n"
    new, changed = tables.render(text)
    assert changed == ["fillmask"] and "| old |" not in new
    assert tables.render(new)[1] == []  # rendering is stable


def test_the_check_names_a_stale_page(tmp_path, monkeypatch, capsys):
    tables = _tables()
    (tmp_path / "page.md").write_text("<!-- figures:fillmask -->\n| old |\n<!-- /figures:fillmask -->\n")
    monkeypatch.setattr(tables, "DOCS", tmp_path)
    assert tables.main(["--check"]) == 1 and "page.md (fillmask)" in capsys.readouterr().out
    assert tables.main([]) == 0 and tables.main(["--check"]) == 0
