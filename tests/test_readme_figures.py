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


def test_an_aim_the_rounds_straddle_says_so(monkeypatch):
    """int8 against ONNX Runtime at batch 1: a verdict the rounds' spread could flip is marked as noise's."""
    import copy

    tables = _tables()
    real = tables._load("compress")

    def with_rounds(rounds: list[float], median: float) -> str:
        d = copy.deepcopy(real)
        d["ratios"]["int8_vs_ort_int8"].update(time_ratio_b1=median, time_ratio_b1_rounds=rounds)
        d["aims"]["int8 ≤ 1.1× ONNX Runtime int8's time at batch 1"] = median <= 1.1
        monkeypatch.setattr(tables, "_load", lambda name: d if name == "compress" else real)
        return tables.compress()

    assert "both sides of 1.1" in with_rounds([1.07, 1.1, 1.18], 1.1)
    assert "both sides of 1.1" in with_rounds([1.05, 1.12, 1.2], 1.12)
    clear = with_rounds([1.01, 1.03, 1.05], 1.03)
    assert "both sides" not in clear and "≤ 1.1 at batch 1: met)" in clear
    assert "both sides" not in with_rounds([1.2, 1.25, 1.3], 1.25)
