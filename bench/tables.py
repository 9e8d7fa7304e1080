"""The docs' figure tables, declared for bench/render.py: each names its page and block, its results file,
where the rows are and its columns (header, key, format), and a caption from the file's own meta."""

from __future__ import annotations

import sys
from collections.abc import Callable

from render import ROOT, Table, aim, duration, pct, times


def batch_seq(r: dict) -> str:
    return f"{r['batch']} × {r['seq']}"


def finetune_rows(d: dict) -> list[dict]:
    sys.path.insert(0, str(ROOT / "bench"))
    from finetune_table import shown_rows
    return shown_rows(d)


def mean_sd(v: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{format(scale * v['mean'], fmt)} ± {format(scale * v['sd'], fmt)}"


def against_token(r: dict) -> str | None:
    """The gaps to token masking, held-out tokens hidden (top-1 points, loss), each inside or outside the spread:
    whether the seeds' ranges overlap."""
    vs = r.get("vs_token")
    if vs is None:
        return None

    def said(m: dict) -> str:
        return "inside the spread" if m["inside_spread"] else "outside the spread"
    return (f"top-1 {100 * vs['acc']['gap']:+.1f} points, {said(vs['acc'])}; "
            f"loss {vs['loss']['gap']:+.2f}, {said(vs['loss'])}")


def against_mlm(metric: str) -> Callable[[dict], str]:
    """A why-masking cell: the metric's mean ± sd over seeds (in %), and for every row but MLM's its gap to MLM
    (points) inside or outside the spread: whether the seeds' ranges overlap."""
    def cell(r: dict) -> str:
        shown = mean_sd(r[metric], 100, ".1f")
        vs = r.get("vs_mlm")
        if vs is None:
            return shown
        where = "inside" if vs[metric]["inside_spread"] else "outside"
        return f"{shown} ({100 * vs[metric]['gap']:+.1f}, {where} the spread)"
    return cell


WHY_MASKING_NAMES = {"untrained": "untrained (the floor)", "mlm": "MLM (BERT)", "causal": "Causal (GPT)",
                     "elmo": "ELMo"}
WHY_MASKING = (
    ("model", lambda r: WHY_MASKING_NAMES.get(r["kind"], r["kind"]), ""),
    ("reads the middle word from", "reads", ""),
    ("middle word, top-1 %", against_mlm("middle_top1"), ""),
    ("middle word, top-5 %", against_mlm("middle_top5"), ""),
    ("SST-2 probe %", against_mlm("sst2"), ""), ("POS probe %", against_mlm("pos"), ""))
WHY_MASKING_CAPTION = (
    "**{meta[steps]} steps.** Mean ± sd over seeds {meta[seeds]}; in brackets, the gap to MLM in points and whether "
    "it is inside the spread (the seeds' ranges overlap). Middle word: {meta[held_out_sentences]} sentences of the "
    "{meta[held_out]}. Probes: {meta[probe]}; SST-2 {meta[sst2]}, POS {meta[pos]}. A new tiny model per run, "
    "{meta[steps]} steps of {meta[batch]} × {meta[seq_len]} tokens of the {meta[corpus]}, lr {meta[lr]}, "
    "{meta[precision]}; {meta[cpu]}, {meta[threads]} thread, {meta[wall_s]} s in all, load average "
    "{meta[load_avg_start][0]} → {meta[load_avg_end][0]}, {meta[when]} (`{meta[command]}`)")
WHY_MASKING_FILES = ("why_masking", "why_masking_steps200")  # the default budget first, then longer runs
FT_AIM, MFU_AIM = 1.5, 0.45  # bertlab over HF's grouped bf16 `Trainer`; pre-training MFU at 512 tokens
PRETRAIN = (("shape", "preset", ""), ("variant", "variant", ""), ("precision", "precision", ""),
            ("batch × seq", batch_seq, ""), ("ms per step", "ms_per_step", ",.1f"),
            ("tokens/s", "tokens_per_s", ",.0f"), ("vs HF", "speedup_vs_hf", times))
PRETRAIN_CAPTION = ("{meta[device]} ({meta[cpu]}), {meta[threads]} thread(s), {meta[precision]}, "
                    "median of {meta[steps]} steps after {meta[warmup]} warm-up, load average "
                    "{meta[load_avg_start][0]} → {meta[load_avg_end][0]}, {meta[when]} "
                    "(`python bench/bench_pretrain.py`)")
FINETUNE = (("variant", "variant", ""), ("shape", "preset", ""), ("precision", "precision", ""),
            ("examples/s", "examples_per_s", ",.1f"), ("real tokens/s", "tokens_per_s", ",.0f"),
            ("padding", "padding", ".1%"), ("vs HF `Trainer`", "speedup_vs_hf", times),
            ("vs HF grouped", "speedup_vs_hf_grouped", times),
            ("vs HF grouped bf16", "speedup_vs_hf_grouped_bf16", times),
            (f"≥ {FT_AIM}× HF grouped", aim(lambda r: None if r["variant"].startswith("hf") else (
                r.get("speedup_vs_hf_grouped") or r.get("speedup_vs_hf_grouped_bf16")), FT_AIM), ""))
FINETUNE_CAPTION = ("{meta[task]}, one epoch of the same {meta[examples]} examples, batch {meta[batch]}, "
                    "{meta[device]} ({meta[cpu]}), {meta[threads]} thread(s), {meta[rounds]} round(s), "
                    "load average {meta[load_avg_start][0]} → {meta[load_avg_end][0]}, {meta[when]} "
                    "(`python bench/bench_finetune.py`)")
FORWARD = (("model", "model", ""), ("seq", "seq", ""), ("bertlab ms", "bertlab_plain", ",.1f"),
           ("HF ms", "hf_plain", ",.1f"), ("bertlab ÷ HF", "plain_ratio_vs_hf", ".2f"),
           ("bertlab capture ms", "bertlab_capture", ",.1f"), ("HF capture ms", "hf_capture", ",.1f"),
           ("capture: bertlab ÷ HF", "capture_ratio_vs_hf", ".2f"))
FORWARD_CAPTION = ("batch {rows[0][batch]}, {meta[device]} ({meta[cpu]}), torch {meta[torch]}, {meta[threads]} "
                   "thread(s), median of {meta[repeats]} calls taking turns (`python bench/bench_forward.py`)")
CAPTURE_AIM = 1.15  # what capturing a view's patterns may cost, times the plain pass
B = "benchmarks.md"


def context_rows(d: dict) -> list[dict]:
    """context_window.json: one row per window, a column per layer group (full attention in every column)."""
    full = next(r for r in d["rows"] if r["window"] == "full")
    by = {}
    for r in d["rows"]:
        if r["window"] != "full":
            by.setdefault(r["window"], {"window": r["window"]})[r["layers"]] = r["top1"]
    return [*by.values(), {"window": "full", **{g: full["top1"] for g in ("all layers", "lower half", "upper half")}}]

TABLES: list[Table] = [
    *(Table(B, "forward", name, FORWARD, FORWARD_CAPTION) for name in ("forward", "forward_modernbert",
                                                                       "forward_deberta")),
    Table(B, "forward", "forward_capture", (
        ("model", "model", ""), ("seq", "seq", ""), ("plain ms", "bertlab_plain", ",.1f"),
        ("one layer's patterns ÷ plain", "view_layer_overhead", times),
        ("one head's patterns ÷ plain", "view_head_overhead", times),
        ("everything ÷ plain", "capture_overhead", times),
        (f"a view ≤ {CAPTURE_AIM}×", aim("view_layer_overhead", CAPTURE_AIM, at_most=True), "")),
        "What a view's capture costs (float16 patterns of one layer or one head): " + FORWARD_CAPTION),
    Table(B, "attention-window", "attention_window", (
        ("n", "seq", ","), ("eager ms", "eager_ms", ",.1f"), ("SDPA ms", "sdpa_ms", ",.1f"),
        ("SDPA + window mask ms", "masked_ms", ",.1f"), ("banded ms", "banded_ms", ",.1f"),
        ("SDPA ÷ banded", "sdpa_over_banded", times), ("eager MiB", "eager_peak_mib", ",.1f"),
        ("SDPA MiB", "sdpa_peak_mib", ",.1f"), ("masked MiB", "masked_peak_mib", ",.1f"),
        ("banded MiB", "banded_peak_mib", ",.1f"),
        ("banded pairs ÷ n²", lambda r: r["banded_pairs"] / r["sdpa_pairs"], ".1%")),
        "One attention call, batch {meta[batch]}, {meta[heads]} heads × {meta[d_head]}, {meta[dtype]}, window "
        "±{meta[window]} with {meta[globals]} global token; {meta[device]} ({meta[cpu]}), torch {meta[torch]}, "
        "{meta[threads]} thread(s), median of {meta[repeats]} calls taking turns, load average "
        "{meta[load_avg_start][0]} → {meta[load_avg_end][0]}, {meta[when]} (`{meta[command]}`)"),
    Table(B, "pretrain", "pretrain", PRETRAIN, PRETRAIN_CAPTION),
    Table(B, "pretrain", "pretrain_bf16", PRETRAIN, PRETRAIN_CAPTION),
    Table(B, "finetune", "finetune", FINETUNE, FINETUNE_CAPTION),
    Table(B, "finetune", "finetune_sick", FINETUNE, FINETUNE_CAPTION),
    Table(B, "finetune", "finetune_bf16", FINETUNE, FINETUNE_CAPTION),
    Table(B, "core", "core_before_after", (
        ("bench", "bench", ""), ("before (7dc3b5f)", "before", ".2f"), ("after", "after", ".2f"),
        ("the aim", lambda r: r["aim"] and f"≥ {r['aim']}×: " + ("yes" if r["after"] >= r["aim"] else "no"), "")),
        "{meta[what]} (`python bench/core/before_after.py`)"),
    Table(B, "core-kept", "finetune_packing_fp32", FINETUNE[:5], FINETUNE_CAPTION),
    Table(B, "core-kept", "finetune_packing", FINETUNE[:5], FINETUNE_CAPTION),
    Table(B, "core-kept", "pretrain_rows", PRETRAIN[:6], PRETRAIN_CAPTION),
    Table(B, "core-devices", "core_before_after", (
        ("device", "device", ""), ("what it was", "what", ""), ("now", "status", "")), rows="devices"),
    Table(B, "compress", "compress", (
        ("model", "name", ""), ("library", "lib", ""), ("layers", "layers", ""), ("heads", "heads", ""),
        ("weights, MB", "size_mb", ",.1f"), ("ms, batch 1", "latency_ms_b1", ",.1f"),
        ("ms, batch 32", "latency_ms_b32", ",.0f"), ("held-out accuracy", "accuracy", pct)),
        "{meta[dev_examples]} held-out SST-2 sentences; {meta[cpu]}, {meta[threads]} thread, torch {meta[torch]}, "
        "onnxruntime {meta[onnxruntime]}, {meta[date]}. Teacher: {meta[teacher]}; student: {meta[student]} "
        "(`{meta[command]}`)"),
    Table(B, "compress", "compress", (
        ("against", "against", ""), ("speed-up, batch 1", "speedup_b1", times),
        ("speed-up, batch 32", "speedup_b32", times), ("time ratio, batch 1", "time_ratio_b1", ".2f"),
        ("time ratio, batch 32", "time_ratio_b32", ".2f"), ("size ratio", "size_ratio", ".2f"),
        ("points lost", "points_lost", "+.1f")),
        rows=lambda d: [{"against": k.replace("_", " "), **v} for k, v in d["ratios"].items()]),
    Table(B, "feature-table", "feature_table", (
        ("features", "name", ""), ("mode", "mode", ""), ("head", "head", ""), ("dev F1", "dev_f1", pct),
        ("epochs", "epochs", ""), ("lr", "lr", "g"), ("seconds", "seconds", ",.0f")),
        "CoNLL-2003 NER, {model} ({model_text}); {train_sentences:,} train sentences, {dev_sentences:,} dev "
        "sentences, seed {seed}; {cores} cores, {threads} thread (`python bench/feature_table.py`)"),
    Table(B, "default-heads", "bertlab/assets/default_heads.json", (
        ("held-out text", "name", ""), ("masked tokens", "masked_tokens", ","), ("top-1", "top1", pct),
        ("top-5", "top5", pct)),
        "{total_steps:,} steps in all; {_where}",
        rows=lambda d: [{"name": "Wikipedia (held-out articles)", **d["mlm_wiki_held_out"]},
                        {"name": "WikiText-2 valid", **d["mlm_wikitext2_valid"]}]),
    # the GPU check (bench/gpu_check.sh; bench/gpu_results.py writes these files and this block)
    Table(B, "gpu", "gpu_check_cuda", (
        ("fine-tune", "task", ""), ("training examples", "train_examples", ","),
        ("dev examples", "eval_examples", ","), ("steps", "steps", ","), ("training time", "wall_time_s", duration),
        ("dev figure", lambda r: f"{r['main_metric']} {r['score']:.4g}", ""),
        ("precision", "precision", "")),
        "On one {gpu} (torch {torch}, CUDA {cuda}), {when}; CUDA tests: {tests[passed]} passed, {tests[failed]} "
        "failed, {tests[skipped]} skipped (`bash bench/gpu_check.sh`). Start model: {start_model}.",
        rows=lambda d: [r for r in (d["finetune_sst2"], d["finetune_qa"]) if r]),
    Table(B, "gpu", "finetune_cuda", FINETUNE, FINETUNE_CAPTION.replace("{meta[cpu]}", "{meta[gpu]}")),
    *(Table(B, "gpu", name, (*PRETRAIN[:2], ("batch × seq", batch_seq, ""), PRETRAIN[5], PRETRAIN[6],
                             ("MFU", "mfu", ".1%"), (f"≥ {MFU_AIM:.0%} MFU", aim("mfu", MFU_AIM), "")),
            PRETRAIN_CAPTION.replace("{meta[cpu]}", "{meta[gpu]}")
            + "; torch.compile: {meta[compile]}; MFU against {meta[peak_tflops]} TFLOP/s")
      for name in ("pretrain_cuda", "pretrain_seq512_cuda", "pretrain_seq512_compile_cuda")),
    Table(B, "gpu", "packing_cuda", (
        ("packed", "packed", ""), ("padded", "padded", ""), ("padding", "padding", ".1%"),
        ("packed, examples/s", "packed_examples_per_s", ",.1f"),
        ("padded, examples/s", "padded_examples_per_s", ",.1f"), ("packed ÷ padded", "packed_vs_padded", ".2f")),
        "Packing on the GPU: {meta[gpu]}, {meta[when]}, each pair on the same sentences and batches",
        rows="finetune"),
    # the pages a teacher reads keep only what they need to plan a lesson
    Table("teacher.md", "context-window", "context_window", (
        ("window", "window", ""), ("all layers cut", "all layers", pct), ("lower half cut", "lower half", pct),
        ("upper half cut", "upper half", pct)),
        "{meta[model]}, {meta[layers]} layers; {meta[masked_tokens]:,} masked tokens of {meta[text]} (a row's "
        "standard error: about {meta[se_points]} points); {meta[when]} "
        "(`python bench/{meta[command]}`)", rows=context_rows),
    Table("results.md", "finetune-table", "finetune_table", (
        ("task", "task", ""), ("train data", "data", ""), ("mode", "mode", ""), ("epochs", "epochs", ""),
        ("lr", "lr", "g"), ("dev figure", "shown", ""), ("training time", "train_s", duration),
        ("device", lambda r: f"{r['device']} {r.get('precision', 'fp32')}, {r['threads']} thread(s)", ""),
        ("measured", lambda r: r["when"][:10], "")),
        rows=finetune_rows),
    Table("class.md", "class-load", "class", (
        ("students", "n", ""), ("page ready p50 / p95, s", lambda r: "{p50} / {p95}".format(**r["page_ready_s"]), ""),
        ("Mask edit → chart p50 / p95, ms", lambda r: "{p50:.0f} / {p95:.0f}".format(**r["mask_edit_ms"]), ""),
        ("PSS per kernel, MB", "pss_mb.per_kernel_median", ",.0f"),
        ("PSS of all kernels, MB", "pss_mb.kernels_total", ",.0f"),
        ("stale charts", lambda r: f"{r['stale_charts']} of {r['charts_checked']}", "")),
        "{meta[cpus]} cores shared with the students' headless browsers, {meta[when]} "
        "(`python bench/{meta[command]}`)"),
    Table("class.md", "mask-edit", "class_one", (
        ("students", "n", ""),
        ("Mask edit → chart p50 / p95 / max, ms", lambda r: "{p50:,.0f} / {p95:,.0f} / {max:,.0f}".format(
            **r["mask_edit_ms"]), ""),
        ("edits timed", "mask_edit_ms.n", ""), ("Attention edit → chart p50, ms", "attention_edit_ms.p50", ",.0f"),
        ("load average before / after", lambda r: "{:.1f} / {:.1f}".format(
            r["load_avg"]["before"][0], r["load_avg"]["after_flows"][0]), "")),
        "{meta[cpus]} cores, {meta[when]} (`python bench/{meta[command]}`)"),
    Table("models.md", "classic-panel", "classic_panel", (
        ("sentence", "sentence", ""), ("in the top 5", lambda r: "yes" if r["hit"] else "no", ""),
        ("top 5", "top", ", ".join)),
        "{rows[0][model]}: {rows[0][hits]} of {rows[0][total]} in its top 5, {meta[when]} "
        "(`python bench/{meta[command]}`)",
        rows=lambda d: next(r["sentences"] for r in d["rows"] if r["measured"])),
    Table("results.md", "masking-schemes", "masking_schemes", (
        ("masking", "scheme", ""),
        ("top-1, tokens hidden", lambda r: mean_sd(r["token_acc"], 100, ".1f"), ""),
        ("loss, tokens hidden", lambda r: mean_sd(r["token_loss"]), ""),
        ("loss, whole words hidden", lambda r: mean_sd(r["whole_word_loss"]), ""),
        ("top-1, entities hidden", lambda r: mean_sd(r["entity_acc"], 100, ".1f"), ""),
        ("loss, entities hidden", lambda r: mean_sd(r["entity_loss"]), ""),
        ("against token masking (tokens hidden)", against_token, "")),
        "Top-1 accuracy (%) and loss (cross-entropy, nats per masked token) at the masked positions of "
        "{meta[held_out_sequences]} sequences of {meta[held_out]}, mean ± sd over seeds {meta[seeds]}; a new tiny "
        "BERT per run, {meta[steps]} steps of {meta[batch]} × {meta[seq_len]} tokens of {meta[corpus]}, MLM only, "
        "{meta[precision]}; {meta[cpu]}, {meta[threads]} thread, {meta[wall_s]} s in all, load average "
        "{meta[load_avg_start][0]} → {meta[load_avg_end][0]}, {meta[when]} (`{meta[command]}`)"),
    *(Table("teacher.md", "why-masking", name, WHY_MASKING, WHY_MASKING_CAPTION) for name in WHY_MASKING_FILES),
    Table("install.md", "install", "install", (
        ("what", "what", ""), ("wall time", "wall_s", duration), ("CPU time", "cpu_s", duration),
        ("venv size, MB", "venv_mb", ","),
        ("load average before / after", lambda r: "{:.1f} / {:.1f}".format(
            r["load_avg"]["before"][0], r["load_avg"]["after"][0]), "")),
        "{meta[cpus]} cores, Python {meta[python]}, this machine's package index, {meta[when]} "
        "(`python bench/{meta[command]}`)",
        rows=lambda d: [d]),
    Table("results.md", "sts", "sts", (
        ("way", "way", ""), ("encoder", "encoder", ""), ("trained on", "trained_on", ""),
        ("held-out pairs", "pairs", ","), ("Pearson", "pearson", ".3f"), ("Spearman", "spearman", ".3f"),
        ("squared error", "mse", ".3f"), ("time", "seconds", duration), ("timed", "timed", "")),
        "SICK relatedness; {meta[held_out]} The fine-tune: {rows[2][epochs]} epochs, lr {rows[2][lr]:g}, batch "
        "{rows[2][batch_size]}, trained in {rows[2][precision]}, scored in fp32. {meta[cpu]}, {meta[threads]} "
        "thread(s), load average {meta[load_avg][0]}, {meta[when]} (`{meta[command]}`)"),
    Table("results.md", "run-disk", "run_disk", (
        ("run", "name", ""), ("steps", "steps", ","), ("weights, MB", "MB.weights", ",.1f"),
        ("checkpoints, MB", "MB.checkpoints", ",.1f"), ("replay, MB", "MB.replay", ",.1f"),
        ("total, MB", "MB.total", ",.1f"), ("≤ 150 MB", lambda r: "yes" if r["MB"]["total"] <= 150 else "no", "")),
        "{what}; {machine[threads]} thread, load average {machine[load]:.1f} (`python bench/bench_run_disk.py`)",
        rows=lambda d: [{"name": {"tab": "the Fine-tuning tab", "cli": "`bertlab finetune`"}[k], **v}
                        for k, v in d["runs"].items()]),
    Table("jupyterhub.md", "hub-sizing", "jupyterhub_sizing", (
        ("process", "name", ""), ("RSS MB", "rss_mb", ",.1f"), ("PSS MB", "pss_mb", ",.1f"),
        ("private (USS) MB", "uss_mb", ",.1f")),
        "(`{command}`)",
        rows=lambda d: [{"name": n, **d[k]} for k, n in (("server", "the student's Jupyter server (Voilà)"),
                                                         ("kernel", "the dashboard page's kernel"),
                                                         ("student", "one student"))]),
]
