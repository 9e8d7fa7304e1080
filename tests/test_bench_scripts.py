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
                "--warmup", "1", "--batches", "1", "--profile", "1", "--precision", "fp32", "--out", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["variant"] for r in rows] == ["hf", "bertlab", "bertlab-lean", "bertlab-full-head"]
    for r in rows:  # one more step each, profiled: its busy time split by kind of work
        pr = r["profile"]
        assert pr["steps"] == 1 and pr["launches_per_step"] is None and pr["clock"].startswith("CPU")
        assert 0 < pr["busy_ms_per_step"] <= pr["wall_ms_per_step"]
        assert abs(sum(pr["by_kind_ms_per_step"].values()) - pr["busy_ms_per_step"]) < 0.05
        assert pr["by_kind_ms_per_step"]["matmul"] > 0 and pr["by_kind_ms_per_step"]["optimizer"] > 0
        assert pr["top"][0]["ms_per_step"] >= pr["top"][-1]["ms_per_step"]
    assert rows[0]["speedup_vs_hf"] == 1.0 and rows[0]["speedup_vs_hf_per_step"] == [1.0]
    assert all(len(r["speedup_vs_hf_per_step"]) == 1 and r["speedup_vs_hf_per_step"][0] > 0 for r in rows)
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["ms_per_step"] > 0
        assert r["loss_diff_before_training"] < 1e-3
        assert r["masked_per_step"] == 2 * round(0.15 * 30)  # 15 % of the 30 maskable tokens per row
        assert r["mfu"] is None  # no MFU on CPU
        assert r["matmul_gflop_per_step"] > 0
    work = {r["variant"]: r["matmul_work_vs_hf"] for r in rows}
    # the head on the masked rows alone (bertlab: and the last layer on those rows alone)
    assert work["hf"] == 1.0 and work["bertlab"] > work["bertlab-lean"] > 1.2
    assert 0.95 < work["bertlab-full-head"] < work["bertlab"]  # the head on every position, as HF's
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


def test_profiled_work_is_sorted_into_kinds_by_its_names():
    """CPU op names and CUDA kernel names (as torch's profiler reports them on an H100) land in their kind."""
    bp = _module("bench_pretrain")
    names = {
        "aten::addmm": "matmul", "aten::bmm": "matmul", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN": "matmul",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "matmul",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits": "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention", "aten::_softmax": "attention",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>": "loss",
        "aten::_log_softmax_backward_data": "loss", "aten::nll_loss_forward": "loss",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>": "layernorm",
        "aten::native_layer_norm_backward": "layernorm", "aten::bernoulli_": "dropout", "aten::random_": "dropout",
        "aten::ge": "elementwise",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float>": "dropout",
        "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>": "optimizer",
        "aten::_fused_adamw_": "optimizer", "aten::linalg_vector_norm": "optimizer",
        "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda": "memory",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>": "memory",
        "aten::index_select": "memory", "aten::embedding_dense_backward": "memory",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl": "elementwise",
        "aten::gelu_backward": "elementwise", "aten::add": "elementwise", "aten::argmax": "other",
    }
    assert {n: bp.kind_of(n) for n in names} == names


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
@pytest.mark.slow  # ~40 s: four processes import torch, three of them transformers
def test_finetune_script_times_every_variant_over_the_same_sentences(tmp_path, shared_data):
    pytest.importorskip("accelerate")
    out = tmp_path / "finetune.json"
    variants = ["bertlab", "bertlab-fp32", "hf", "hf-grouped", "hf-grouped-bf16"]
    proc = _run("bench_finetune.py", "--presets", "tiny", "--variants", *variants, "--examples", "70",
                "--warmup", "1", "--batch", "8", "--rounds", "1", "--out", str(out),
                env={"BERTLAB_DATA": str(shared_data)})
    result = json.loads(out.read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"bertlab", "bertlab-fp32", "hf", "hf-grouped", "hf-grouped-bf16"}
    # each row says what its products ran in: HF's default is fp32 on a CPU, bertlab's follows the CPU
    from bertlab.training.loop import native_bf16

    auto = "bf16" if native_bf16(torch.device("cpu")) else "fp32"
    assert {v: r["precision"] for v, r in rows.items()} == {
        "bertlab": auto, "bertlab-fp32": "fp32", "hf": "fp32", "hf-grouped": "fp32", "hf-grouped-bf16": "bf16"}
    # one whole epoch of the same 64 sentences (70 cut to whole batches of 8) for every variant
    assert {(r["examples"], r["tokens"], r["steps"]) for r in rows.values()} == {(64, rows["hf"]["tokens"], 8)}
    for r in rows.values():
        assert r["examples_per_s"] > 0 and 0 < r["tokens_per_s"] <= r["positions_per_s"]
        assert r["tokens_per_s"] / r["examples_per_s"] == pytest.approx(r["tokens"] / 64, rel=0.01)
        assert r["peak_rss_mb"] > 0 and r["rss_increase_mb"] is not None and r["setup_s"] >= 0
        assert r["rounds"] == 1 and len(r["load_before"]) == 1 and len(r["load_before"][0]) == 3
    assert rows["hf"]["speedup_vs_hf"] == 1.0 and rows["hf-grouped"]["speedup_vs_hf_grouped"] == 1.0
    assert rows["hf-grouped-bf16"]["speedup_vs_hf_grouped_bf16"] == 1.0
    ratio = rows["bertlab"]["examples_per_s"] / rows["hf-grouped"]["examples_per_s"]
    assert rows["bertlab"]["speedup_vs_hf_grouped"] == pytest.approx(ratio, rel=0.01)
    # length-bucketing: both bucketing samplers pad less than random batches over the same epoch
    assert rows["bertlab"]["padding"] < rows["hf"]["padding"]
    assert rows["hf-grouped"]["padding"] < rows["hf"]["padding"]
    # each variant's matmul work, counted over the same epoch: packing and the [CLS]-only last layer do less
    # than HF's grouped batches, which do less than its random ones (more padding)
    assert all(r["matmul_gflop"] > 0 for r in rows.values())
    assert rows["hf"]["matmul_gflop"] > rows["hf-grouped"]["matmul_gflop"] > rows["bertlab-fp32"]["matmul_gflop"]
    assert rows["hf-grouped"]["matmul_work_vs_hf_grouped"] == 1.0
    assert rows["bertlab-fp32"]["matmul_work_vs_hf_grouped"] == pytest.approx(
        rows["hf-grouped"]["matmul_gflop"] / rows["bertlab-fp32"]["matmul_gflop"], rel=0.01)
    meta = result["meta"]
    assert meta["examples"] == 64 and meta["timed"] == "one epoch" and len(meta["load_avg_start"]) == 3
    assert "| tiny | hf-grouped | fp32 | 64 |" in proc.stdout


def test_the_timed_sentences_are_a_seeded_sample_of_whole_batches():
    bf = _module("bench_finetune")
    timed, warm = bf.pick_sentences(100, 50, 8, 16, seed=0)
    assert len(timed) == 48 and len(warm) == 16 and not set(timed) & set(warm)  # 50 cut to 6 batches of 8
    assert (timed, warm) == bf.pick_sentences(100, 50, 8, 16, seed=0)  # every variant draws the same
    assert timed != bf.pick_sentences(100, 50, 8, 16, seed=1)[0]
    everything, warm = bf.pick_sentences(100, 0, 8, 16, seed=0)
    assert len(set(everything)) == 96 and warm == everything[:16]  # all: the warm-up reuses timed sentences
    with pytest.raises(ValueError, match="at least one batch"):
        bf.pick_sentences(5, 0, 8, 0, seed=0)


def test_speedups_need_the_same_sentences_in_every_variant():
    bf = _module("bench_finetune")

    def row(variant, eps, examples=64, tokens=900, work=None):
        return {"variant": variant, "examples_per_s": eps, "examples": examples, "tokens": tokens, "matmul_gflop": work}

    rows = [row("bertlab", 30.0, work=50.0), row("hf", 10.0, work=100.0), row("hf-grouped", 20.0, work=60.0)]
    bf.add_speedups(rows)
    assert [(r["speedup_vs_hf"], r["speedup_vs_hf_grouped"]) for r in rows] == [(3.0, 1.5), (1.0, 0.5), (2.0, 1.0)]
    assert [(r["matmul_work_vs_hf"], r["matmul_work_vs_hf_grouped"]) for r in rows] == [
        (2.0, 1.2), (1.0, 0.6), (1.667, 1.0)]
    uncounted = [row("bertlab", 30.0, work=50.0), row("hf-grouped", 20.0)]  # --no-count-work, or an older file
    bf.add_speedups(uncounted)
    assert uncounted[0]["matmul_work_vs_hf_grouped"] is None and uncounted[0]["speedup_vs_hf_grouped"] == 1.5
    with pytest.raises(RuntimeError, match="same sentences"):
        bf.add_speedups([row("bertlab", 30.0, tokens=800), row("hf", 10.0)])
    alone = [row("bertlab", 30.0)]
    bf.add_speedups(alone)
    assert alone[0]["speedup_vs_hf"] is None


def test_matmul_work_is_counted_over_the_timed_epochs_own_batches():
    bf = _module("bench_finetune")
    counting = bf.CountingCollate(lambda feats: {"input_ids": torch.ones(len(feats), 4, dtype=torch.long),
                                                 "attention_mask": torch.ones(len(feats), 4)})
    weight = torch.randn(4, 8)
    cut = {"size": 2}

    def run(features, steps):
        for i in range(0, len(features), cut["size"]):
            counting(features[i:i + cut["size"]])["attention_mask"] @ weight  # [n, 4] @ [4, 8]

    run(list(range(6)), None)  # the timed epoch: three batches of two
    assert bf.matmul_flops(run, list(range(6)), counting) == 2 * 6 * 4 * 8
    assert counting.batches == [(2, 8, 8)] * 3
    cut["size"] = 3  # a second epoch cut otherwise would count other work
    with pytest.raises(RuntimeError, match="not cut into the timed epoch's batches"):
        bf.matmul_flops(run, list(range(6)), counting)


def test_bertlab_buckets_as_many_batches_as_hf_groups_by_length():
    bf = _module("bench_finetune")
    assert [bf.bucket_batches(n, 32) for n in (31, 128, 768, 6400, 60608)] == [1, 1, 6, 50, 50]


def test_rounds_add_their_time_and_must_repeat_the_same_batches():
    bf = _module("bench_finetune")

    def run(seconds, positions=1000, rss=900):
        return {"variant": "hf", "examples": 64, "tokens": 800, "positions": positions, "seconds": seconds,
                "setup_s": 0.5, "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 2.0, 2.0],
                "peak_mem_mb": None, "peak_rss_mb": rss, "rss_increase_mb": 100}

    row = bf.merge_rounds([run(2.0), run(6.0, rss=950)])
    assert row["rounds"] == 2 and row["seconds_each"] == [2.0, 6.0] and row["seconds"] == 4.0
    assert (row["examples_per_s"], row["tokens_per_s"], row["positions_per_s"]) == (16.0, 200.0, 250.0)
    assert row["peak_rss_mb"] == 950 and row["peak_mem_mb"] is None and len(row["load_before"]) == 2
    with pytest.raises(RuntimeError, match="same batches"):
        bf.merge_rounds([run(2.0), run(2.0, positions=1200)])


def test_counting_collate_counts_examples_tokens_and_padding():
    bf = _module("bench_finetune")
    from bertlab.tasks import ClassificationFeature, collate

    feats = [ClassificationFeature(str(i), [101] + [7] * i + [102], [0] * (i + 2), 0) for i in (1, 3, 5, 2)]
    counting = bf.CountingCollate(collate)
    counting(feats[:2])  # lengths 3, 5 -> 8 tokens in 10 positions
    counting(feats[2:])  # lengths 7, 4 -> 11 tokens in 14 positions
    assert counting.batches == [(2, 8, 10), (2, 11, 14)]
    assert counting.totals(1, 2) == (2, 11, 14)
    assert counting.totals() == (4, 19, 24)
    assert counting.first_call is not None
    counting.reset()
    assert counting.batches == [] and counting.first_call is None


def test_finetune_pairs_task_reads_sick_pairs_with_three_labels(shared_data, monkeypatch):
    monkeypatch.setenv("BERTLAB_DATA", str(shared_data))
    bf = _module("bench_finetune")
    pairs, labels = bf.task_data("sick")
    sentences, two = bf.task_data("sst2")
    assert len(labels) == 3 and len(two) == 2
    assert all(ex.text_b for ex in pairs[:50]) and not any(ex.text_b for ex in sentences[:50])
    # bf16 like for like on any device: bertlab-bf16 is bf16 even where "auto" means fp32
    assert bf.variant_precision("bertlab-bf16", torch.device("cpu")) == "bf16"
    assert bf.variant_precision("bertlab-fp32", torch.device("cpu")) == "fp32"


def test_finetune_asks_for_the_data_folder(tmp_path):
    cmd = [sys.executable, str(BENCH / "bench_finetune.py"), "--device", "cpu", "--presets", "tiny", "--examples", "64",
           "--warmup", "1", "--out", str(tmp_path / "x.json")]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env={**os.environ, "BERTLAB_DATA": str(tmp_path)}, timeout=120)
    assert proc.returncode != 0
    assert "BERTLAB_DATA" in proc.stderr


# -- fill-mask against the HF pipeline ------------------------------------------------------------
@pytest.mark.slow  # ~25 s: loads the default in bertlab and in transformers
def test_the_bf16_peak_is_looked_up_by_the_gpus_name():
    bp = _module("bench_pretrain")
    assert bp.known_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bp.known_peak_tflops("NVIDIA H100 PCIe") == 756.0 and bp.known_peak_tflops("NVIDIA H200") == 989.0
    assert bp.known_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and bp.known_peak_tflops("Some GPU") is None


def test_heads_steps_fit_the_time_left(tmp_path):
    gb = _module("gpu_bundle")
    result = tmp_path / "pretrain.json"
    result.write_text(json.dumps({"rows": [{"preset": "minilm", "variant": "hf", "tokens_per_s": 1.0},
                                           {"preset": "minilm", "variant": "bertlab", "tokens_per_s": 409600.0}]}))
    # 210 s - 90 s fixed = 120 s at 0.4 x 100 steps/s (409,600 tokens/s over batches of 32 x 128)
    assert gb.heads_steps(result, 210) == 4800
    assert gb.heads_steps(result, 80) == 0  # nothing fits after loading and evaluating
    assert gb.heads_steps(tmp_path / "missing.json", 300) == 2000 and gb.heads_steps(tmp_path / "x.json", 150) == 0


def test_forward_mixed_row_takes_real_sentences_of_spread_lengths(shared_data, tmp_path):
    forward = _module("bench_forward")
    sentences = forward.mixed_sentences(8)
    words = [len(s.split()) for s in sentences]
    assert len(set(sentences)) == 8 and words == sorted(words) and words[-1] >= 4 * words[0]
    out = tmp_path / "forward.json"
    out.write_text(json.dumps({"meta": {"threads": 1}, "rows": [{"model": "kept"}]}))
    cmd = [sys.executable, str(BENCH / "bench_forward.py"), "--mixed-only", "--repeats", "1", "--threads", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    row = d["mixed"]["row"]
    assert d["rows"] == [{"model": "kept"}]  # the other rows stay
    assert row["tokens"] == sum(row["lengths"]) < row["padded_tokens"] and row["packed_max_diff_vs_hf"] < 1e-4


# -- the feature table (the BERT paper's Table 7) ------------------------------------------------------------
def test_the_table_script_writes_a_well_formed_file_on_a_tiny_model(tok, tmp_path, monkeypatch):
    from test_finetune import write_conll
    from tiny_models import tiny_bert

    from bertlab.loading import save_pretrained
    from bertlab.tasks.layer_features import FEATURES

    tiny4 = tiny_bert(tok, seed=1, layers=4)  # five stages: every choice (the last four layers too) applies
    save_pretrained(tiny4, tok, tmp_path / "tiny")
    data = write_conll(tmp_path / "conll", n_train=64, n_dev=24)
    table = _module("feature_table")
    monkeypatch.setattr(table, "HEAD_CHOICES", ((1e-2, 2), (3e-2, 2)))
    out = tmp_path / "feature_table.json"
    assert table.main(["--model", str(tmp_path / "tiny"), "--data", str(data), "--train", "40", "--dev", "16",
                       "--out", str(out), "--no-readme"]) == 0
    d = json.loads(out.read_text())
    assert [r["name"] for r in d["rows"]] == [*FEATURES, "fine-tuning"]
    assert d["head"] == "linear" and d["train_sentences"] == 40 and d["dev_sentences"] == 16
    assert d["head_choice"]["held_out_sentences"] == 8 and len(d["head_choice"]["tried"]) == 2
    for r in d["rows"]:
        assert 0 <= r["dev_f1"] <= 1 and r["train_sentences"] == 40 and r["dev_sentences"] == 16
        assert r["device"] == "cpu" and len(r["load_avg_start"]) == 3 and r["seconds"] > 0
    mix = d["rows"][FEATURES.index("mix")]["mix"]
    assert len(mix["weights"]) == 5
    assert d["rows"][-1]["mode"] == "full" and "mix" not in d["rows"][-1]
    render = _module("render")
    block = render.block("benchmarks.md", "feature-table", tmp_path)
    assert "| concat-last-4 | feature | linear |" in block and "| fine-tuning | full |" in block


# -- masking schemes ---------------------------------------------------------------------------
def test_masking_script_scores_each_scheme_on_held_out_text_with_its_spread(tmp_path, shared_data):
    out = tmp_path / "masking.json"
    _run("bench_masking.py", "--steps", "1", "--seeds", "0", "1", "--schemes", "token", "entity", "--eval-pairs", "8",
         "--out", str(out), env={"BERTLAB_DATA": str(shared_data)})
    result = json.loads(out.read_text())
    assert [r["scheme"] for r in result["rows"]] == ["token", "entity"] and len(result["runs"]) == 4
    token, entity = result["rows"]
    assert "vs_token" not in token and set(entity["vs_token"]) == {"acc", "loss"}
    for key in ("token_acc", "whole_word_acc", "entity_acc", "token_loss", "entity_loss"):
        assert entity[key]["min"] <= entity[key]["mean"] <= entity[key]["max"] and entity[key]["sd"] >= 0
    assert result["meta"]["held_out"].endswith("dev.txt") and result["meta"]["corpus"].endswith("train.txt")
