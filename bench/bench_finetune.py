"""Fine-tuning speed and peak memory of bertlab's loop against the Hugging Face Trainer: one epoch of SST-2
(single sentences) or of SICK (sentence pairs, `--task sick`: A and B as segments 0 and 1, three NLI labels).

Every variant trains one epoch over the **same** examples: a seeded sample of `--examples` from the task's
train file in BERTLAB_DATA (0 = all; rounded down to a whole number of batches, since bertlab's default
order skips a partial last batch), tokenized once by bertlab's tokenizer (`featurize_classification`, the
same max length). The variants differ only in how they cut that epoch into batches and in the code that
trains: so examples/s and real tokens/s are over the same sentences, and their ratios are like for like.
The classifiers have the same shape (random initialisation: the speed does not depend on the weights),
batch size, learning rate and linear decay, AdamW with torch's fused kernel on every device (bertlab's
`make_optimizer`; HF's default optimizer, `adamw_torch_fused` from torch 2.8, which the bench leaves to HF), no
decay on biases/LayerNorm, and gradient clipping at 1.0 (bertlab's loop hands the clip to the fused step,
`clip_and_step`); each row records the optimizer that ran (`optimizer`). Precision is each variant's own (the
row's `precision`): bertlab's default, "auto", is bf16 autocast where the device multiplies bf16 natively (a GPU;
a CPU with AVX-512 BF16 or AMX), else fp32; HF's `Trainer` defaults to fp32 (the GPU runs give it bf16=True, as
before). Variants:

  bertlab           `training.loop.train` with `BucketBatchSampler` (batches of similar lengths, padded to
                    their longest) and `tasks.collate`; the lab's loss (`training.finetune.sequence_loss`:
                    the logits alone are read, so the last layer runs for [CLS] alone, as HF's does not).
                    Its buckets hold as many batches as HF's mega-batches (see `bucket_batches`: its default
                    50 from 6,400 sentences up), so on a sample both bucketing samplers pad alike. Precision
                    "auto", what `bertlab finetune` runs
  bertlab-fp32      the same in fp32: like for like with `hf-grouped` on a CPU
  bertlab-bf16      the same in bf16 autocast whatever the device: like for like with `hf-grouped-bf16` (on a
                    CPU without native bf16, "auto" is fp32, so `bertlab` alone would not give this pair)
  bertlab-shuffled  the same loop (precision "auto") with its default seeded shuffle (no bucketing)
  bertlab-shuffled-padded  `bertlab-shuffled` with packing off: what packing saves where batches pad most
  bertlab-padded    `bertlab` with the encoder's packing off (`model.bert.packing = False`): every padded
                    position computed, as before training packed the real tokens (packing's default, "cpu",
                    packs in fp32 on a CPU only, so under bf16 autocast this equals `bertlab`)
  bertlab-fp32-padded  `bertlab-fp32` with packing off: what packing pays where it is on by default
  hf                `Trainer` + `BertForSequenceClassification` (attn_implementation="sdpa") with the
                    default `DataCollatorWithPadding` and random batches, HF's default precision
  hf-grouped        the same with `train_sampling_strategy="group_by_length"` (HF's own bucketing)
  hf-grouped-bf16   the same with `bf16=True` (bf16 autocast): like for like with `bertlab` where it runs bf16

Each variant runs in a fresh process, so that its peak memory is its own: on GPU
`torch.cuda.max_memory_allocated` during training; on CPU the process's peak resident set (`ru_maxrss`)
and how far it rose above the resident set just before training. Before the timed epoch each variant
trains `--warmup` steps on other sentences (one-time costs: kernels, allocator, thread pools); then the
clock runs over the whole epoch call (`train(...)` / `trainer.train()`, synchronised on GPU), so data
loading, collation and each library's per-run set-up are counted (`setup_s`: from the call to the first
batch asked for; the optimizer, HF's accelerator and sampler). Reported per variant: examples/s,
tokens/s (real, non-padding tokens), positions/s (padded batch positions: the speed of model + loop
whatever the batching), the share of padding and the mean padded length, and the speed-up over `hf` and
over `hf-grouped` on the same sentences. With `--rounds R` each variant trains the epoch R times, each in
a fresh process, every other round in reverse order (a drift in background load then hits all variants
alike); the rates are over the summed time. The parent stops if two variants did not see the same number of
sentences and tokens. The load average goes into the JSON: the machine may be shared.

Each variant's matmul work is counted, not estimated (`matmul_gflop`; off with `--no-count-work`): in the first
round, after everything above was read, the same epoch trains once more, untimed, under torch's `FlopCounterMode`
(forward and backward, the same batches: checked). `matmul_work_vs_<baseline>` (the baseline's count / the
variant's) is the speed-up that less arithmetic alone gives when both libraries' products run at the same speed: a
like-for-like speed-up above it comes from elsewhere (fewer passes over memory, cheaper dropout, less Python).

    BERTLAB_DATA=../shared/data python bench/bench_finetune.py [--quick] [--device cpu|cuda] [--presets minilm base]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import json
import logging
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

# name -> (layers, hidden, heads, intermediate); the vocabulary is the offline default's.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),  # for smoke tests only
    "minilm": (6, 384, 12, 1536),  # the offline default's shape (all-MiniLM-L6-v2)
    "base": (12, 768, 12, 3072),  # BERT-base
}
VARIANTS = ("bertlab", "bertlab-fp32", "bertlab-bf16", "bertlab-shuffled", "bertlab-padded", "bertlab-fp32-padded",
            "bertlab-shuffled-padded", "hf", "hf-grouped",
            "hf-grouped-bf16")
BASELINES = ("hf", "hf-grouped", "hf-grouped-bf16")  # the speed-ups are over these
# with BucketBatchSampler
BUCKETED = ("bertlab", "bertlab-fp32", "bertlab-bf16", "bertlab-padded", "bertlab-fp32-padded")
TASKS = ("sst2", "sick")  # one sentence, sentence pairs
LR = 2e-5
RESULT = "RESULT "  # prefix of the worker's JSON line
OPTIMIZERS: list[Any] = []  # the optimizer of each training call of this worker process, as it ran


def describe_optimizer(optimizer: Any) -> str:
    """"AdamW (fused)", "AdamW (foreach)", ...: the class and kernel of an optimizer as it ran (HF's `Trainer` wraps
    it in accelerate's `AcceleratedOptimizer`)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    fused, foreach = inner.defaults.get("fused"), inner.defaults.get("foreach")
    kernel = "fused" if fused else {True: "foreach", False: "for-loop"}.get(foreach, "torch's default kernel")
    return f"{type(inner).__name__} ({kernel})"


# -- data ----------------------------------------------------------------------------------------
def pick_sentences(
    total: int, examples: int, batch: int, warmup_examples: int, seed: int
) -> tuple[list[int], list[int]]:
    """Indices of the timed sentences (a seeded sample of `examples`, 0 = all, cut to whole batches)
    and of the warm-up ones (the next in the same permutation, or the first timed ones when all are timed)."""
    n = min(examples or total, total) // batch * batch
    if n == 0:
        raise ValueError(f"need at least one batch of {batch} sentences (got {min(examples or total, total)}).")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist()
    rest = order[n:] if total - n >= warmup_examples else order
    return order[:n], rest[:warmup_examples]


def bucket_batches(examples: int, batch: int) -> int:
    """Batches per length bucket: BucketBatchSampler's default 50, cut as HF's `group_by_length` cuts its
    mega-batches on a small data set (`min(examples // (4 * batch), 50)`, at least 1), so that both
    samplers sort buckets of the same size and pad alike; 50 for both from 6,400 sentences (batch 32) up."""
    return max(1, min(examples // (4 * batch), 50))


def task_data(task: str) -> tuple[list, Mapping[int, str]]:
    """(train examples, label names) of a task: SST-2's sentences or SICK's TRAIN pairs."""
    from bertlab.tasks import NLI_LABELS, SST2_LABELS, read_sick, read_sst2

    return (read_sst2("train"), SST2_LABELS) if task == "sst2" else (read_sick("train"), NLI_LABELS)


def load_features(spec: Mapping[str, Any]) -> tuple[list, list, Any]:
    """(timed features, warm-up features, bertlab's tokenizer of the offline default) from the task's train set."""
    from bertlab.loading import default_model_folder
    from bertlab.tasks import featurize_classification
    from bertlab.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(default_model_folder())
    data, _ = task_data(spec["task"])
    timed, warm = pick_sentences(len(data), spec["examples"], spec["batch"], spec["warmup"] * spec["batch"],
                                 spec["seed"])
    feats = functools.partial(featurize_classification, tokenizer=tok, max_length=spec["max_length"])
    return feats([data[i] for i in timed]), feats([data[i] for i in warm]), tok


class CountingCollate:
    """Wraps a collate and records (examples, real tokens, padded positions) of each batch it makes,
    read from the CPU tensors it returns (no device sync)."""

    def __init__(self, fn: Callable[[Sequence[Any]], Mapping[str, torch.Tensor]]) -> None:
        self.fn = fn
        self.batches: list[tuple[int, int, int]] = []
        self.first_call: float | None = None  # perf_counter() when the first batch was asked for

    def reset(self) -> None:
        self.batches, self.first_call = [], None

    def __call__(self, features: Sequence[Any]) -> Mapping[str, torch.Tensor]:
        if self.first_call is None:
            self.first_call = time.perf_counter()
        batch = self.fn(features)
        ids, mask = batch["input_ids"], batch["attention_mask"]  # [batch, seq] each
        self.batches.append((int(ids.shape[0]), int(mask.sum()), int(ids.numel())))
        return batch

    def totals(self, first: int = 0, last: int | None = None) -> tuple[int, int, int]:
        """Summed (examples, real tokens, positions) of batches first..last-1 (in the order they were made)."""
        part = self.batches[first:last]
        return sum(b[0] for b in part), sum(b[1] for b in part), sum(b[2] for b in part)


# -- memory and clocks ---------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_mb() -> float:
    """The process's resident set now, in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [round(x, 2) for x in os.getloadavg()]


# -- the two trainers ----------------------------------------------------------------------------
def classification_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The lab's sentence-classification loss, what `bertlab finetune` trains with
    (`training.finetune.sequence_loss`: cross-entropy of the logits [batch, labels], the last layer for [CLS]
    alone since only the logits are read)."""
    from bertlab.training.finetune import sequence_loss

    return sequence_loss(model, batch)


Run = Callable[[list, int | None], None]  # run(features, steps): `steps` optimizer steps, or one epoch for None


def prepare_bertlab(spec: Mapping[str, Any], tok: Any, counting: CountingCollate) -> Run:
    """A bertlab variant's model; the returned callable trains it with the lab's loop."""
    from bertlab.config import BertConfig
    from bertlab.families.bert import Bert
    from bertlab.tasks import BucketBatchSampler, collate
    from bertlab.training import loop
    from bertlab.training.loop import TrainConfig, train

    layers, hidden, heads, inter = PRESETS[spec["preset"]]
    torch.manual_seed(spec["seed"])
    model = Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=inter, pad_token_id=tok.pad_token_id,
                            task="sequence_classification", id2label=dict(task_data(spec["task"])[1])))
    counting.fn = functools.partial(collate, pad_token_id=tok.pad_token_id)
    model.bert.packing = spec["variant"] not in ("bertlab-padded", "bertlab-fp32-padded", "bertlab-shuffled-padded")

    precision = variant_precision(spec["variant"], torch.device(spec["device"]))
    made = loop.make_optimizer

    def make_optimizer(*args: Any, **kwargs: Any) -> torch.optim.Optimizer:  # the loop's own, recorded
        OPTIMIZERS.append(made(*args, **kwargs))
        return OPTIMIZERS[-1]

    loop.make_optimizer = make_optimizer

    def run(features: list, steps: int | None) -> None:
        sampler = None
        if spec["variant"] in BUCKETED:
            sampler = BucketBatchSampler([len(f) for f in features], spec["batch"],
                                         bucket_batches=bucket_batches(len(features), spec["batch"]), seed=spec["seed"])
        epoch_steps = len(features) // spec["batch"]
        cfg = TrainConfig(lr=LR, max_steps=steps, epochs=1, batch_size=spec["batch"], seed=spec["seed"],
                          device=spec["device"], precision=precision, log_every=steps or epoch_steps,
                          max_grad_norm=1.0, weight_decay=0.01)
        train(model, classification_loss, features, cfg, collate=counting, batch_sampler=sampler).raise_for_status()

    return run


def prepare_hf(spec: Mapping[str, Any], tok: Any, counting: CountingCollate) -> Run:
    """An HF variant's model; the returned callable trains it with a fresh `Trainer` each call."""
    import transformers

    from bertlab.loading import default_model_folder

    layers, hidden, heads, inter = PRESETS[spec["preset"]]
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=inter,
                                  num_labels=len(task_data(spec["task"])[1]),
                                  pad_token_id=tok.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(spec["seed"])
    model = transformers.BertForSequenceClassification(cfg)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"HF built {model.config._attn_implementation!r} attention, not sdpa.")
    counting.fn = transformers.DataCollatorWithPadding(
        transformers.BertTokenizerFast.from_pretrained(str(default_model_folder())))
    gpu = spec["device"] == "cuda"
    bf16 = variant_precision(spec["variant"], torch.device(spec["device"])) == "bf16"

    def run(features: list, steps: int | None) -> None:
        data = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids,
                 "attention_mask": [1] * len(f.input_ids), "labels": f.label} for f in features]
        out = tempfile.mkdtemp(prefix="bench_finetune_")  # HF wants one; nothing is saved (save_strategy="no")
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=spec["batch"], num_train_epochs=1,
            max_steps=steps or -1, learning_rate=LR, weight_decay=0.01, warmup_steps=0, lr_scheduler_type="linear",
            max_grad_norm=1.0, seed=spec["seed"], bf16=bf16, use_cpu=not gpu,
            # optim left to HF: its default (adamw_torch_fused with this torch) is what a user of the Trainer gets
            **_sampling(transformers, grouped=spec["variant"].startswith("hf-grouped")),
            logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=counting)
        try:
            trainer.train()
            OPTIMIZERS.append(trainer.optimizer)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    return run


def _sampling(transformers: Any, grouped: bool) -> dict[str, Any]:
    """HF's length-grouped or random order, in the installed version's words: `train_sampling_strategy` (from
    transformers 5.x, which dropped `group_by_length`) or `group_by_length` (before it)."""
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    if "train_sampling_strategy" in fields:
        return {"train_sampling_strategy": "group_by_length" if grouped else "random"}
    return {"group_by_length": grouped}


def variant_precision(variant: str, device: torch.device) -> str:
    """"bf16" (autocast) or "fp32": what a variant's matrix products run in on `device`."""
    from bertlab.training.loop import resolve_precision

    if variant.startswith("hf"):
        return "bf16" if device.type == "cuda" or variant == "hf-grouped-bf16" else "fp32"
    fixed = {"bertlab-fp32": "fp32", "bertlab-fp32-padded": "fp32", "bertlab-bf16": "bf16"}
    return resolve_precision(fixed.get(variant, "auto"), device)


def matmul_flops(run: Run, timed: list, counting: CountingCollate) -> int:
    """The matmul FLOPs of the timed epoch, as torch's `FlopCounterMode` counts them: the same epoch trained once
    more, untimed, after the timed one (the same batches: checked), forward and backward. The linears, the heads
    and the attention products torch has formulas for (a CPU's fused attention kernels have none; training with
    dropout, both libraries take eager or math attention there, whose products are counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    timed_batches = list(counting.batches)
    counting.reset()
    with FlopCounterMode(display=False) as counter:
        run(timed, None)
    if counting.batches != timed_batches:
        raise RuntimeError("the epoch counted for its matmul work was not cut into the timed epoch's batches.")
    return counter.get_total_flops()


def worker(spec: Mapping[str, Any]) -> dict:
    """One variant in this process: warm up, train one timed epoch, then speed and memory as a dict."""
    torch.set_num_threads(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    device = torch.device(spec["device"])
    timed, warm, tok = load_features(spec)
    hf = spec["variant"].startswith("hf")
    if hf:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    counting = CountingCollate(lambda features: {})  # its collate is set by the variant
    run = (prepare_hf if hf else prepare_bertlab)(spec, tok, counting)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # what is already there (HF moved its model) still counts
    rss_before = _rss_mb()
    run(warm, spec["warmup"])  # untimed
    counting.reset()
    load_before = _load()
    _sync(device)
    t0 = time.perf_counter()
    run(timed, None)
    _sync(device)
    sec = time.perf_counter() - t0
    examples, tokens, positions = counting.totals()
    if examples != len(timed):
        raise RuntimeError(f"{spec['variant']} trained on {examples} sentences, not the {len(timed)} asked for.")
    out = {
        "task": spec["task"], "preset": spec["preset"], "variant": spec["variant"],
        "precision": variant_precision(spec["variant"], device),
        "batch": spec["batch"], "examples": examples,
        "tokens": tokens, "positions": positions, "steps": len(counting.batches), "seconds": round(sec, 3),
        "setup_s": round(counting.first_call - t0, 3),
        "examples_per_s": round(examples / sec, 2), "tokens_per_s": round(tokens / sec, 1),
        "positions_per_s": round(positions / sec, 1), "padding": round(1 - tokens / positions, 3),
        "mean_len": round(positions / examples, 1), "load_before": load_before, "load_after": _load(),
        "peak_mem_mb": None, "peak_rss_mb": round(_max_rss_mb()), "rss_increase_mb": None,
        "optimizer": describe_optimizer(OPTIMIZERS[-1]) if OPTIMIZERS else None,
        "matmul_gflop": None,
    }
    if device.type == "cuda":
        out["peak_mem_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    else:
        out["rss_increase_mb"] = round(_max_rss_mb() - rss_before)
    if spec.get("count_work"):  # after everything above was read: the counted epoch changes none of it
        out["matmul_gflop"] = round(matmul_flops(run, timed, counting) / 1e9, 2)
    return out


# -- the parent: one process per variant -----------------------------------------------------------
def run_in_subprocess(spec: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {spec['variant']} run ({spec['preset']}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def merge_rounds(runs: list[dict]) -> dict:
    """One row from the rounds of one variant (the same epoch each time): rates over the summed time,
    the largest memory, and each round's seconds and load averages."""
    if len({(r["examples"], r["tokens"], r["positions"]) for r in runs}) != 1:
        raise RuntimeError(f"the rounds of {runs[0]['variant']} did not train on the same batches.")
    sec = sum(r["seconds"] for r in runs)
    n = len(runs)
    out = {**runs[0], "rounds": n, "seconds": round(sec / n, 3), "seconds_each": [r["seconds"] for r in runs],
           "setup_s": round(sum(r["setup_s"] for r in runs) / n, 3),
           "load_before": [r["load_before"] for r in runs], "load_after": [r["load_after"] for r in runs]}
    for key in ("examples", "tokens", "positions"):
        out[f"{key}_per_s"] = round(n * runs[0][key] / sec, 2 if key == "examples" else 1)
    for key in ("peak_mem_mb", "peak_rss_mb", "rss_increase_mb"):
        vals = [r[key] for r in runs if r[key] is not None]
        out[key] = max(vals) if vals else None
    return out


def add_speedups(rows: list[dict]) -> None:
    """Speed-ups of the rows of one preset over each baseline variant present, after checking that every
    variant trained on the same sentences and tokens (so examples/s and tokens/s give the same ratio)."""
    seen = {(r["examples"], r["tokens"]) for r in rows}
    if len(seen) != 1:
        raise RuntimeError(f"the variants did not train on the same sentences: (examples, tokens) {sorted(seen)}.")
    by_variant = {r["variant"]: r for r in rows}
    for r in rows:
        for base in BASELINES:
            ref = by_variant.get(base)
            key = base.replace("-", "_")
            r[f"speedup_vs_{key}"] = round(r["examples_per_s"] / ref["examples_per_s"], 3) if ref else None
            counted = ref is not None and r.get("matmul_gflop") and ref.get("matmul_gflop")
            r[f"matmul_work_vs_{key}"] = round(ref["matmul_gflop"] / r["matmul_gflop"], 3) if counted else None


HEADER = ("| preset | variant | precision | sentences | s | examples/s | real tokens/s | positions/s | vs hf "
          "| vs hf-grouped | vs hf-grouped-bf16 | padding | mean padded len | peak MiB | RSS rise MiB |\n"
          + "|---" * 15 + "|")


def _dash(v: object) -> object:
    return "-" if v is None else v


def fmt_row(r: dict) -> str:
    mem = r["peak_mem_mb"] if r["peak_mem_mb"] is not None else r["peak_rss_mb"]
    return (f"| {r['preset']} | {r['variant']} | {r['precision']} | {r['examples']} | {r['seconds']:.1f} | "
            f"{r['examples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['positions_per_s']:.0f} | "
            f"{_dash(r.get('speedup_vs_hf'))} | {_dash(r.get('speedup_vs_hf_grouped'))} | "
            f"{_dash(r.get('speedup_vs_hf_grouped_bf16'))} | {100 * r['padding']:.1f} % | {r['mean_len']} | {mem} | "
            f"{_dash(r['rss_increase_mb'])} |")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--task", choices=TASKS, default="sst2",
                   help="sst2: single sentences; sick: sentence pairs (SICK's TRAIN part, three labels)")
    p.add_argument("--presets", nargs="+", choices=tuple(PRESETS), default=None,
                   help="model shapes (default minilm base on cuda, minilm on cpu)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--examples", type=int, default=None,
                   help="examples in the timed epoch, a seeded sample of the task's train set (0 = all; "
                        "default all on cuda, 768 on cpu)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps on other sentences first (default 30 / 3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="epochs per variant, each in a fresh process, every other round in reverse order; "
                        "rates over their summed time (default 1 on cuda, 2 on cpu)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="MiniLM shape, bertlab against hf and hf-grouped, 128 sentences, 1 warm-up step")
    p.add_argument("--no-count-work", dest="count_work", action="store_false",
                   help="skip counting each variant's matmul work (one more untimed epoch per variant, first round)")
    p.add_argument("--out", default=None, help="default bench/results/finetune.json (sst2), finetune_sick.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one variant (JSON spec)
    a = p.parse_args()
    gpu = a.device == "cuda"
    a.out = a.out or str(Path(__file__).parent / "results" / ("finetune.json" if a.task == "sst2" else
                                                                 f"finetune_{a.task}.json"))
    a.presets = a.presets or (["minilm", "base"] if gpu else ["minilm"])
    a.examples = a.examples if a.examples is not None else (0 if gpu else 768)
    a.rounds = a.rounds or (1 if gpu else 2)
    a.warmup = a.warmup if a.warmup is not None else (30 if gpu else 3)
    if a.quick:
        a.presets = [p for p in a.presets if p != "base"] or a.presets
        a.variants = [v for v in ("bertlab", "hf", "hf-grouped") if v in a.variants] or a.variants
        a.examples, a.warmup, a.rounds = min(a.examples or 128, 128), min(a.warmup, 1), 1
    if a.warmup < 1 or a.batch < 1 or a.examples < 0 or a.rounds < 1:
        p.error(f"need --warmup >= 1, --batch >= 1, --examples >= 0, --rounds >= 1 "
                f"(got {a.warmup}, {a.batch}, {a.examples}, {a.rounds}).")
    if a.examples and a.examples < a.batch:
        p.error(f"--examples {a.examples} is less than one batch of {a.batch}.")
    return a


def main() -> None:
    a = _parse()
    if a.worker:
        print(RESULT + json.dumps(worker(json.loads(a.worker))), flush=True)
        return
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but CUDA is not available here; use --device cpu.")
    from bertlab.settings import DataNotFoundError

    try:
        task_data(a.task)
    except DataNotFoundError as e:
        raise SystemExit(f"the {a.task} train set is needed: {e}") from None
    load_start, t_start = _load(), time.perf_counter()
    print(HEADER)
    rows = []
    for preset in a.presets:
        runs: dict[str, list[dict]] = {v: [] for v in a.variants}
        for i in range(a.rounds):  # every other round in reverse order, so a drift in load hits all alike
            for variant in a.variants if i % 2 == 0 else a.variants[::-1]:
                spec = {"preset": preset, "variant": variant, "batch": a.batch, "examples": a.examples, "task": a.task,
                        "warmup": a.warmup, "max_length": a.max_length, "threads": a.threads, "seed": a.seed,
                        "device": a.device, "count_work": i == 0 and a.count_work}
                runs[variant].append(run_in_subprocess(spec))
        part = [merge_rounds(runs[v]) for v in a.variants]
        add_speedups(part)
        for r in part:
            print(fmt_row(r), flush=True)
        rows += part
    meta = {"torch": torch.__version__, "transformers": importlib.metadata.version("transformers"), "device": a.device,
            "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": a.threads,
            "precision": "per row", "timed": "one epoch",
            "examples": rows[0]["examples"] if rows else None, "examples_asked": a.examples or "all",
            "sample_seed": a.seed, "warmup_steps": a.warmup, "rounds": a.rounds,
            "bucket_batches": bucket_batches(rows[0]["examples"], a.batch) if rows else None, "batch": a.batch,
            "max_length": a.max_length, "lr": LR,
            "task": a.task, "load_avg_start": load_start, "load_avg_end": _load(),
            "wall_s": round(time.perf_counter() - t_start, 1),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nload average (1, 5, 15 min) {load_start} at the start, {meta['load_avg_end']} at the end")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
