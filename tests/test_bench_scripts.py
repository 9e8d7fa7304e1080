"""The training benchmarks run end to end at tiny settings, and their bookkeeping is right.

Timings are never asserted (they depend on the machine): only that the scripts finish, write
their JSON and table, and that the quantities they derive (loss agreement, FLOPs, padding,
example counts) are what they should be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(BENCH / script), "--device", "cpu", "--threads", "1", *args]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# -- pre-training ------------------------------------------------------------------------------
def test_pretrain_script_runs_every_variant(tmp_path):
    out = tmp_path / "pretrain.json"
    proc = _run("bench_pretrain.py", "--presets", "tiny", "--batch", "2", "--seq", "32", "--steps", "1",
                "--warmup", "1", "--batches", "1", "--out", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["variant"] for r in rows] == ["hf", "bertlab", "bertlab-lean", "bertlab-full-head"]
    assert rows[0]["speedup_vs_hf"] == 1.0
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0
        assert r["loss_diff_before_training"] < 1e-3
        assert r["masked_per_step"] == 2 * round(0.15 * 30)  # 15 % of the 30 maskable tokens per row
        assert r["mfu"] is None  # no MFU on CPU
    assert result["meta"]["precision"] == "fp32"
    assert "| tiny | bertlab |" in proc.stdout and "speed-up vs HF" in proc.stdout


def test_pretrain_models_share_weights_and_the_check_catches_a_difference():
    bp = _module("bench_pretrain")
    torch.manual_seed(0)
    setup = bp.Setup(torch.device("cpu"), bp.make_batches(1, 2, 16, 0, torch.device("cpu")), 30522, "tiny", 2, 16)
    hf, ours = bp.build_models("tiny", 30522, 16, seed=0)
    assert bp.check_same_loss(hf, ours, setup) < 1e-4
    with torch.no_grad():
        ours.bert.encoder.layer[0].intermediate.dense.weight.mul_(3.0)
    with pytest.raises(RuntimeError, match="disagree"):
        bp.check_same_loss(hf, ours, setup)


def test_pretrain_flops_formula():
    bp = _module("bench_pretrain")
    _, ours = bp.build_models("tiny", 30522, 16, seed=0)
    layers, hidden, _, inter = bp.PRESETS["tiny"]
    per_layer = 4 * (hidden * hidden + hidden) + 2 * hidden * inter + inter + hidden + 2 * 2 * hidden
    assert bp.encoder_params(ours) == layers * per_layer
    n, t, s, m, v = 1000, 64, 32, 10, 50
    expected = 6 * n * t + 12 * 2 * 8 * s * t + 6 * (8 * 8 + 8 * v) * m
    assert bp.flops_per_step(n, 2, 8, v, s, t, m) == expected


# -- fine-tuning -------------------------------------------------------------------------------
@pytest.mark.slow  # ~30 s: three processes import torch, two of them transformers
def test_finetune_script_compares_bertlab_with_the_hf_trainer(tmp_path, shared_data):
    pytest.importorskip("accelerate")
    out = tmp_path / "finetune.json"
    proc = _run("bench_finetune.py", "--presets", "tiny", "--variants", "bertlab", "hf", "--steps", "3",
                "--warmup", "1", "--batch", "4", "--examples", "64", "--out", str(out),
                env={"BERTLAB_DATA": str(shared_data)})
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"bertlab", "hf"}
    for r in rows.values():
        assert r["timed_steps"] == 2 and r["examples_per_s"] > 0 and 0 < r["tokens_per_s"] <= r["positions_per_s"]
        assert r["peak_rss_mb"] > 0 and r["rss_increase_mb"] is not None
    assert rows["hf"]["speedup_vs_hf"] == 1.0
    # length-bucketing: all 64 sentences fall in one bucket, sorted, so batches carry little padding
    assert rows["bertlab"]["padding"] < rows["hf"]["padding"]
    assert "| tiny | hf |" in proc.stdout


def test_counting_collate_counts_examples_tokens_and_padding():
    bf = _module("bench_finetune")
    from bertlab.training.tasks import ClassificationFeature, collate

    feats = [ClassificationFeature(str(i), [101] + [7] * i + [102], [0] * (i + 2), 0) for i in (1, 3, 5, 2)]
    counting = bf.CountingCollate(collate)
    counting(feats[:2])  # lengths 3, 5 -> 8 tokens in 10 positions
    counting(feats[2:])  # lengths 7, 4 -> 11 tokens in 14 positions
    assert counting.batches == [(2, 8, 10), (2, 11, 14)]
    assert counting.totals(1, 2) == (2, 11, 14)
    assert counting.totals(0, 2) == (4, 19, 24)


def test_finetune_asks_for_the_data_folder(tmp_path):
    cmd = [sys.executable, str(BENCH / "bench_finetune.py"), "--device", "cpu", "--presets", "tiny", "--steps", "2",
           "--warmup", "1", "--out", str(tmp_path / "x.json")]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env={**os.environ, "BERTLAB_DATA": str(tmp_path)}, timeout=120)
    assert proc.returncode != 0
    assert "BERTLAB_DATA" in proc.stderr
