"""The docs' figure blocks are what bench/render.py makes from the results files now."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import render  # noqa: E402


def test_every_page_matches_its_results_files():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "render.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_figure_is_caught(tmp_path, monkeypatch, capsys):
    results, docs = tmp_path / "results", tmp_path / "docs"
    shutil.copytree(render.RESULTS, results)
    shutil.copytree(render.DOCS, docs)
    monkeypatch.setattr(render, "RESULTS", results)
    monkeypatch.setattr(render, "DOCS", docs)
    assert render.main(["--check"]) == 0
    d = json.loads((results / "compress.json").read_text())
    d["rows"][0]["size_mb"] = 999.0
    (results / "compress.json").write_text(json.dumps(d))
    assert render.main(["--check"]) == 1 and "docs/benchmarks.md (compress)" in capsys.readouterr().out
    assert render.main([]) == 0 and "| 999.0 |" in (docs / "benchmarks.md").read_text()
    assert render.main(["--check"]) == 0
    with (docs / "cli.md").open("a") as page:  # a block no table declares would never be rewritten
        page.write("<!-- figures:typed -->\n| 1 |\n<!-- /figures:typed -->\n")
    assert render.main(["--check"]) == 1 and "docs/cli.md (typed: no table declares it)" in capsys.readouterr().out


def test_an_aim_column_compares_the_unrounded_figure():
    verdict = render.aim("x", 1.5)
    assert (verdict({"x": 1.495}), verdict({"x": 1.5}), verdict({"x": None})) == ("no", "yes", None)
    assert render.aim("x", 1.15, at_most=True)({"x": 1.2}) == "no"
