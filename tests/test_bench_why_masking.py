"""bench/bench_why_masking.py: each model guesses the middle word without reading it (causal from the left only,
MLM through [MASK], ELMo from its two neighbours), and the script runs end to end at --quick, writing every
model's row with its spread and its gap to MLM."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import word_tokenizer

from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives import ModelShape, get_objective
from bertlab.training.pretrain import new_model

BENCH = Path(__file__).resolve().parents[1] / "bench"
WORDS = ["cat", "dog", "bird", "mat", "sofa", "tree", "red", "blue", "the", "sat", "on", "was", "happy", "a"]
SHAPE = ModelShape(layers=2, hidden=32, heads=2, max_len=64)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_why_masking", BENCH / "bench_why_masking.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return word_tokenizer(tmp_path_factory.mktemp("words"), WORDS)


@pytest.fixture(scope="module")
def models(tok) -> dict[str, dict]:
    torch.manual_seed(0)
    elmo = get_objective("elmo").build(SHAPE, tok).eval()
    return {"mlm": {"model": new_model("tiny", tok, pair_task="none").eval()},
            "causal": {"model": get_objective("causal").build(SHAPE, tok).eval()},
            "elmo": {"forward": elmo.forward_lm, "backward": elmo.backward_lm}}


@pytest.mark.parametrize("kind", ["mlm", "causal", "elmo"])
def test_no_model_reads_the_middle_word_and_causal_reads_only_its_left(tok, models, kind):
    bench = _bench()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, tok.vocab_size, (3, 9), generator=g)
    ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
    mask = torch.ones_like(ids)
    at = torch.tensor([4, 4, 4])
    base = bench.middle_word_logits(kind, models[kind], tok, ids, mask, at)
    assert base.shape == (3, tok.vocab_size)
    other = ids.clone()
    other[:, 4] = 5 + (other[:, 4] - 4) % (tok.vocab_size - 5)  # another middle word
    assert torch.allclose(bench.middle_word_logits(kind, models[kind], tok, other, mask, at), base, atol=1e-5)
    right = ids.clone()
    right[:, 5:8] = 5 + (right[:, 5:8] - 4) % (tok.vocab_size - 5)  # other words to its right
    same = torch.allclose(bench.middle_word_logits(kind, models[kind], tok, right, mask, at), base, atol=1e-5)
    assert same == (kind == "causal"), "causal reads the left only; MLM and ELMo read the right too"


def test_the_ranges_decide_inside_the_spread():
    bench = _bench()
    a, b, c = bench.spread([0.1, 0.2]), bench.spread([0.15, 0.3]), bench.spread([0.4, 0.5])
    assert bench.overlap(a, b) and not bench.overlap(a, c)
    assert a["min"] <= a["mean"] <= a["max"] and a["sd"] > 0


@pytest.mark.slow
def test_quick_run_writes_every_model_with_its_spread_and_gap_to_mlm(tmp_path, shared_data):
    pytest.importorskip("sklearn")
    from bertlab.training.corpora import load_corpus

    try:
        load_corpus("ovos-wiki", split="held_out")
    except Exception as e:  # the corpus package is an extra
        pytest.skip(f"ovos-wiki is not available here: {e}")
    out = tmp_path / "why.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_why_masking.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["kind"]: r for r in result["rows"]}
    assert list(rows) == ["untrained", "mlm", "causal", "elmo"] and len(result["runs"]) == 8
    assert "vs_mlm" not in rows["mlm"]
    for kind, r in rows.items():
        for m in ("middle_top1", "middle_top5", "sst2", "pos"):
            assert 0 <= r[m]["min"] <= r[m]["mean"] <= r[m]["max"] <= 1 and r[m]["sd"] >= 0
            if kind != "mlm":
                assert isinstance(r["vs_mlm"][m]["inside_spread"], bool)
    meta = result["meta"]
    assert meta["quick"] and meta["held_out_sentences"] == 40 and meta["corpus"].endswith("train split")
