"""The probe table and neighbour benchmarks run end to end at tiny settings and write their JSON (timings are
never asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def data(monkeypatch, tmp_path):
    from bertlab.settings import data_dir

    if not (data_dir() / "ud_ewt").is_dir():
        pytest.skip("the shared data (BERTLAB_DATA) is not present")
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))


def test_probe_table_writes_counts_and_layers(tmp_path, data, default_model):
    out = tmp_path / "probes.json"
    assert _module("probe_table").main(["--train", "20", "--eval", "10", "--properties", "pos,tree",
                                        "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    pos, tree = table["properties"]["pos"], table["properties"]["tree"]
    assert pos["train_sentences"] == 20 and pos["eval_sentences"] == 10 and "20 training" in table["note"]
    assert len(pos["accuracy"]) == len(pos["selectivity"]) == len(tree["spearman"]) == len(pos["layers"])


def test_neighbour_bench_fills_the_index_to_the_asked_size(tmp_path, default_model):
    pytest.importorskip("gensim")
    out = tmp_path / "neighbours.json"
    assert _module("bench_neighbours").main(["--sentences", "12", "--tokens", "5000", "--repeats", "1",
                                             "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["index_tokens"] == 5000 and row["rows_copied"] == 5000 - row["built_tokens"] > 0
    assert row["built_sentences"] == 12
