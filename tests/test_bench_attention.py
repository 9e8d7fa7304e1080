"""The cheaper-attention bench: its banded window equals SDPA under the window mask the views draw, its pair
counts are what it says, and the script writes its results file at tiny settings (timings never asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertlab import masks
from bertlab.analysis.window_cost import banded_attention, banded_pairs, time_window

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_attention", BENCH / "bench_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n, window, globals_", [(5, 2, (0,)), (37, 4, (0,)), (64, 8, (0, 63)), (20, 0, (0,)),
                                                 (16, 3, ())])
def test_banded_equals_sdpa_under_the_window_mask(n, window, globals_):
    b = _bench()
    q, k, v = b.inputs(n, 2, 8, seed=n)
    mask = masks.sliding_window(n, window, globals_)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(banded_attention(q, k, v, window, globals_), want, atol=1e-5)
    assert torch.allclose(b.eager_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_banded_pairs_grow_linearly():
    b = _bench()
    assert b.pairs("sdpa", 256, 16) == 256 ** 2
    assert b.pairs("banded", 256, 16) == banded_pairs(256, 16) == 256 * (3 * 16 + 1) + 256
    assert banded_pairs(512, 16) == 2 * banded_pairs(256, 16)


def test_time_window_times_both_at_each_length():
    threads = torch.get_num_threads()
    rows = time_window((16, 48), window=4, heads=2, d_head=8, repeats=1, threads=1)
    assert torch.get_num_threads() == threads  # given back
    assert [r.seq for r in rows] == [16, 48]
    assert all(r.full_ms > 0 and r.banded_ms > 0 and r.full_pairs == r.seq ** 2 for r in rows)
    assert rows[1].banded_pairs == banded_pairs(48, 4)
    with pytest.raises(ValueError, match="at least"):
        time_window((16,), window=0)


@pytest.mark.slow  # five fresh processes (the memory of each variant is measured in its own)
def test_script_writes_its_results(tmp_path):
    out = tmp_path / "attention_window.json"
    subprocess.run([sys.executable, str(BENCH / "bench_attention.py"), "--lengths", "40", "--window", "4",
                    "--heads", "2", "--d-head", "8", "--repeats", "1", "--out", str(out)], check=True,
                   capture_output=True, text=True, timeout=300)
    data = json.loads(out.read_text())
    assert [r["seq"] for r in data["rows"]] == [40] and data["meta"]["window"] == 4
    for r in data["rows"]:
        assert r["banded_max_abs_diff"] < 1e-5
        assert all(r[f"{v}_ms"] > 0 and r[f"{v}_peak_mib"] >= 0 for v in ("eager", "sdpa", "masked", "banded"))
