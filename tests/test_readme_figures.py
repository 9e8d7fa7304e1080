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
    assert "both sides" not in with_rounds([1.05, 1.1], 1.08)  # a round at the limit meets it


def test_a_fine_tuning_ratio_shows_each_round_and_warns_when_they_straddle_the_aim(monkeypatch):
    import copy

    tables = _tables()
    real = {name: tables._load(name) for name in ("finetune", "finetune_sick", "finetune_bf16")}

    def said(ours: list[float], theirs: list[float]) -> str:
        d = copy.deepcopy(real["finetune_sick"])
        by = {r["variant"]: r for r in d["rows"]}
        by["bertlab-fp32"]["seconds_each"], by["hf-grouped"]["seconds_each"] = ours, theirs
        monkeypatch.setattr(tables, "_load", lambda name: d if name == "finetune_sick" else real[name])
        return tables.finetune().splitlines()[-1]

    line = said([20.0, 25.0], [32.0, 30.0])
    assert "SICK pairs, fp32" in line and "(rounds 1.60, 1.20; the rounds fall on both sides of 1.5" in line
    clear = said([20.0, 20.0], [32.0, 31.0])
    sick = clear.split("SICK pairs")[1].split("SST-2")[0]
    assert "(rounds 1.60, 1.55" in sick and "both sides" not in sick


def test_a_fine_tuning_ratio_says_what_the_arithmetic_alone_gives_and_never_rounds_onto_the_aim(monkeypatch):
    import copy

    tables = _tables()
    real = {name: tables._load(name) for name in ("finetune", "finetune_sick", "finetune_bf16")}

    def said(speedup: float, work: float | None) -> str:
        d = copy.deepcopy(real["finetune_sick"])
        by = {r["variant"]: r for r in d["rows"]}
        by["bertlab-fp32"].update(speedup_vs_hf_grouped=speedup, matmul_work_vs_hf_grouped=work)
        monkeypatch.setattr(tables, "_load", lambda name: d if name == "finetune_sick" else real[name])
        return tables.finetune()

    text = said(1.36, 1.33)
    assert "SICK pairs, fp32 **1.36×** (" in text and "the matmul work alone differs 1.33×)" in text
    assert "| 1.36 | – |" in text  # the table's cell
    text = said(1.495, None)  # not counted (--no-count-work, an older file): nothing said of the work
    assert "SICK pairs, fp32 **1.495×**" in text and "| 1.495 | – |" in text
    assert "alone differs" not in text.splitlines()[-1].split("SICK pairs")[1].split("SST-2")[0]
    assert "SICK pairs, fp32 **1.50×**" in said(1.5, 1.4) and "SICK pairs, fp32 **1.51×**" in said(1.506, 1.4)
    assert [tables._against_aim(x, 1.5) for x in (1.4949, 1.495, 1.4999, 1.5, 1.504, None)] == [
        "1.49", "1.495", "1.4999", "1.50", "1.50", "–"]
    assert [tables._against_aim(x, 1.15, at_most=True) for x in (1.154, 1.15, 1.1449, 1.16)] == [
        "1.154", "1.15", "1.14", "1.16"]


def test_a_profiled_step_is_shown_as_shares_of_its_busy_time():
    tables = _tables()
    row = {"preset": "base", "variant": "bertlab", "precision": "bf16",
           "profile": {"steps": 3, "clock": "GPU kernels", "wall_ms_per_step": 200.0, "busy_ms_per_step": 100.0,
                       "by_kind_ms_per_step": {"matmul": 60.0, "attention": 25.0, "other": 15.0},
                       "launches_per_step": 1234.0, "top": []}}
    table = tables.profile_table([row, {"preset": "base", "variant": "hf"}])  # an unprofiled row is left out
    assert len([line for line in table if line.startswith("| base |")]) == 1
    line = next(line for line in table if line.startswith("| base |"))
    assert "| 200.0 | 100.0 | 60 % | 25 % | 0 % |" in line and line.endswith("| 1,234 |")
    assert "waits on the host" in table[-1] and "3 profiled steps" in table[-1]
    assert tables.profile_table([{"preset": "base", "variant": "hf"}]) == []
    failed = {"preset": "base", "variant": "hf", "profile": {"error": "RuntimeError: CUPTI not available"}}
    said = "The profile asked for failed (base hf: RuntimeError: CUPTI not available)."
    assert tables.profile_table([failed]) == [said]
    assert tables.profile_table([row, failed]) == table + ["", said]  # the profiled rows as before, then why not hf


def test_a_pre_training_ratio_shows_the_middle_half_of_its_steps():
    tables = _tables()
    assert tables._middle_half([1.2, 1.3, 1.4, 1.5, 1.6]) == " (1.25–1.55)"
    assert tables._middle_half([1.3, 1.4, 1.5]) == "" and tables._middle_half(None) == ""
    assert tables._middle_half([1.0] * 6) == ""  # HF against itself


def test_the_profile_table_has_a_column_for_every_kind_the_benchmark_sorts_work_into():
    import importlib.util as iu
    import sys

    spec = iu.spec_from_file_location("bench_pretrain", ROOT / "bench" / "bench_pretrain.py")
    bp = iu.module_from_spec(spec)
    sys.modules["bench_pretrain"] = bp
    spec.loader.exec_module(bp)
    assert sorted(_tables().PROFILE_KINDS) == sorted([kind for kind, _ in bp.KINDS] + ["other"])


def test_the_gpu_packing_verdict_follows_the_figures(monkeypatch):
    """The GPU block says packing lost only while every packed/padded pair says so."""
    import copy

    tables = _tables()
    real = tables._load("packing_cuda")
    ft = {"meta": {"when": "2026-01-01T00:00:00Z", "examples": 100},
          "rows": [{"variant": "bertlab", "padding": 0.05, "examples_per_s": 90.0},
                   {"variant": "bertlab-padded", "padding": 0.05, "examples_per_s": 100.0}]}
    monkeypatch.setattr(tables, "_load", lambda name: real if name == "packing_cuda" else None)
    said = "\n".join(tables.packing_on_gpu(ft))
    ratios = [0.9] + [r["packed_examples_per_s"] / r["padded_examples_per_s"] for r in real["finetune"]]
    assert f"at best {max(ratios):.2f}× the padded path's speed" in said and "slower in every pair" in said
    row = "| fine-tuning, bucketed, tokens found on the device (2026-01-01T00:00) | 5.0 % | 100 | 90.0 | 100.0 | 0.90 |"
    assert row in said
    faster = copy.deepcopy(real)
    faster["finetune"][0]["packed_examples_per_s"] = 2 * faster["finetune"][0]["padded_examples_per_s"]
    monkeypatch.setattr(tables, "_load", lambda name: faster if name == "packing_cuda" else None)
    said = "\n".join(tables.packing_on_gpu(ft))
    assert "**The packed path was faster in a pair** (2.00×" in said and "revisit that default" in said
    assert "slower in every pair" not in said
