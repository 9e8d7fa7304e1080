"""What the README promises a new teacher holds: the first install's time as bench_install.py measured it,
a screenshot a script makes from today's app, and a page of two screens."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_install_time_is_the_measured_one():
    measured = json.loads((ROOT / "bench" / "results" / "install.json").read_text(encoding="utf-8"))
    found = re.search(r"installs torch and the notebook stack: about (\d+) minutes", README)
    assert found, "the README says how long the first install takes"
    assert int(found.group(1)) == round(measured["wall_s"] / 60)
    assert "bench_install.py" in (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


def test_the_screenshot_is_made_by_a_script_from_the_app():
    assert "![" in README and "docs/img/tab-mask.png" in README and "docs/screenshot.py" in README
    script = (ROOT / "docs" / "screenshot.py").read_text(encoding="utf-8")
    assert "tab-mask.png" in script and "bertlab.cli" in script and (ROOT / "docs" / "img" / "tab-mask.png").exists()


def test_the_readme_says_where_make_app_finds_the_data_and_how_to_have_a_real_bert():
    assert "BERTLAB_DATA" in README and "../shared/data" in README
    assert "bertlab download bert-base-uncased" in README and "--model bert-base-uncased" in README


def test_the_readme_fits_two_screens():
    assert len(README.splitlines()) <= 70
