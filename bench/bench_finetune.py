"""Fine-tuning throughput and peak memory of bertlab's loop against the Hugging Face Trainer, on SST-2.

Both sides fine-tune a sequence classifier of the same shape (random initialisation: throughput does not
depend on the weights) on the same SST-2 sentences from BERTLAB_DATA, tokenized once by bertlab's
tokenizer (`featurize_classification`, the same max length), with the same batch size, number of optimizer
steps, learning rate, AdamW (fused on CUDA, no decay on biases/LayerNorm), gradient clipping at 1.0 and
precision (bf16 autocast on CUDA, fp32 on CPU). Variants:

  bertlab           `training.loop.train` with `BucketBatchSampler` (batches of similar lengths, padded to
                    their longest) and `tasks.collate`; loss = cross-entropy of `Bert`'s classifier logits
  bertlab-shuffled  the same loop with its default seeded shuffle (no bucketing)
  hf                `Trainer` + `BertForSequenceClassification` (attn_implementation="sdpa") with the
                    default `DataCollatorWithPadding` and random batches
  hf-grouped        the same with `train_sampling_strategy="group_by_length"` (HF's own bucketing)

Each variant runs in a fresh process, so that its peak memory is its own: on GPU
`torch.cuda.max_memory_allocated` during training; on CPU the process's peak resident set
(`ru_maxrss`) and how far it rose above the resident set just before training. The clock runs from the
end of optimizer step `--warmup` to the end of step `--steps` (synchronised on GPU), so start-up and
warm-up are not counted; data loading and collation are. examples/s, tokens/s (non-padding tokens) and
positions/s (padded batch positions: the speed of model + loop whatever the batching) are over those
timed steps; "padding" is the share of padding among the positions of all the batches the
run made (a property of the batching: over a whole epoch of 8192 sentences at batch 32 it is 66 % for
random batches, 5.4 % for BucketBatchSampler and 5.5 % for HF's group_by_length).

    BERTLAB_DATA=../shared/data python bench/bench_finetune.py [--quick] [--device cpu|cuda] [--presets minilm base]
"""

from __future__ import annotations

import argparse
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
import torch.nn.functional as F
from torch import nn

# name -> (layers, hidden, heads, intermediate); the vocabulary is the offline default's.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),  # for smoke tests only
    "minilm": (6, 384, 12, 1536),  # the offline default's shape (all-MiniLM-L6-v2)
    "base": (12, 768, 12, 3072),  # BERT-base
}
VARIANTS = ("bertlab", "bertlab-shuffled", "hf", "hf-grouped")
LR = 2e-5
RESULT = "RESULT "  # prefix of the worker's JSON line


# -- data ----------------------------------------------------------------------------------------
def load_features(examples: int, max_length: int) -> tuple[list, Any]:
    """SST-2 train features (the first `examples`, 0 = all) and bertlab's tokenizer of the offline default."""
    from bertlab.loading import default_model_folder
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.tasks import featurize_classification, read_sst2

    tok = Tokenizer.from_folder(default_model_folder())
    data = read_sst2("train")
    if examples:
        data = data[:examples]
    return featurize_classification(data, tok, max_length=max_length), tok


class CountingCollate:
    """Wraps a collate and records (examples, real tokens, padded positions) of each batch it makes,
    read from the CPU tensors it returns (no device sync)."""

    def __init__(self, fn: Callable[[Sequence[Any]], Mapping[str, torch.Tensor]]) -> None:
        self.fn = fn
        self.batches: list[tuple[int, int, int]] = []

    def __call__(self, features: Sequence[Any]) -> Mapping[str, torch.Tensor]:
        batch = self.fn(features)
        ids, mask = batch["input_ids"], batch["attention_mask"]  # [batch, seq] each
        self.batches.append((int(ids.shape[0]), int(mask.sum()), int(ids.numel())))
        return batch

    def totals(self, first: int, last: int) -> tuple[int, int, int]:
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


class Clock:
    """Seconds between the end of step `start` and the end of step `stop` (synchronised on GPU)."""

    def __init__(self, device: torch.device, start: int, stop: int) -> None:
        self.device, self.start, self.stop = device, start, stop
        self.t0: float | None = None
        self.t1: float | None = None

    def step_done(self, step: int) -> None:
        if step in (self.start, self.stop):
            _sync(self.device)
            now = time.perf_counter()
            if step == self.start:
                self.t0 = now
            else:
                self.t1 = now

    @property
    def seconds(self) -> float:
        if self.t0 is None or self.t1 is None:
            raise RuntimeError("the run ended before the timed steps were done.")
        return self.t1 - self.t0


# -- the two trainers ----------------------------------------------------------------------------
def classification_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the classifier logits [batch, labels] against labels [batch]."""
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return F.cross_entropy(out.logits.float(), batch["labels"])


Prepared = tuple[Callable[[], None], CountingCollate]  # (start training, the counting collate it uses)


def prepare_bertlab(spec: dict, features: list, tok: Any, clock: Clock) -> Prepared:
    """Model, sampler and collate of a bertlab variant; training starts when the returned callable is called."""
    from bertlab.config import BertConfig
    from bertlab.model import Bert
    from bertlab.training.loop import TrainConfig, train
    from bertlab.training.tasks import SST2_LABELS, BucketBatchSampler, collate

    layers, hidden, heads, inter = PRESETS[spec["preset"]]
    torch.manual_seed(spec["seed"])
    model = Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=inter, pad_token_id=tok.pad_token_id,
                            task="sequence_classification", id2label=SST2_LABELS))
    counting = CountingCollate(functools.partial(collate, pad_token_id=tok.pad_token_id))
    sampler = None
    if spec["variant"] == "bertlab":
        sampler = BucketBatchSampler([len(f) for f in features], spec["batch"], seed=spec["seed"])
    cfg = TrainConfig(lr=LR, max_steps=spec["steps"], batch_size=spec["batch"], seed=spec["seed"],
                      device=spec["device"], precision="auto", log_every=spec["warmup"], max_grad_norm=1.0,
                      weight_decay=0.01)

    def on_event(event: Any) -> None:
        if event.kind == "step":
            clock.step_done(event.step)

    def go() -> None:
        train(model, classification_loss, features, cfg, collate=counting, batch_sampler=sampler,
              callbacks=[on_event]).raise_for_status()

    return go, counting


def prepare_hf(spec: dict, features: list, tok: Any, clock: Clock) -> Prepared:
    """Model, tokenizer, data and Trainer of an HF variant; training starts when the returned callable is called."""
    import transformers

    from bertlab.loading import default_model_folder

    layers, hidden, heads, inter = PRESETS[spec["preset"]]
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=inter, num_labels=2,
                                  pad_token_id=tok.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(spec["seed"])
    model = transformers.BertForSequenceClassification(cfg)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"HF built {model.config._attn_implementation!r} attention, not sdpa.")
    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(default_model_folder()))
    counting = CountingCollate(transformers.DataCollatorWithPadding(hf_tok))
    data = [{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids,
             "attention_mask": [1] * len(f.input_ids), "labels": f.label} for f in features]
    gpu = spec["device"] == "cuda"

    class Timer(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.step_done(state.global_step)

    out = tempfile.mkdtemp(prefix="bench_finetune_")  # HF wants one; nothing is saved (save_strategy="no")
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=spec["batch"], max_steps=spec["steps"], learning_rate=LR,
        weight_decay=0.01, warmup_steps=0, lr_scheduler_type="linear", max_grad_norm=1.0, seed=spec["seed"],
        bf16=gpu, use_cpu=not gpu, optim="adamw_torch_fused" if gpu else "adamw_torch",
        train_sampling_strategy="group_by_length" if spec["variant"] == "hf-grouped" else "random",
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=counting,
                                   callbacks=[Timer()])

    def go() -> None:
        try:
            trainer.train()
        finally:
            shutil.rmtree(out, ignore_errors=True)

    return go, counting


def worker(spec: dict) -> dict:
    """One variant in this process: train, then throughput and memory as a dict."""
    torch.set_num_threads(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    device = torch.device(spec["device"])
    features, tok = load_features(spec["examples"], spec["max_length"])
    if spec["variant"].startswith("hf"):
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    clock = Clock(device, spec["warmup"], spec["steps"])
    prepare = prepare_hf if spec["variant"].startswith("hf") else prepare_bertlab
    go, counting = prepare(spec, features, tok, clock)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # what is already there (HF moved its model) still counts
    rss_before = _rss_mb()
    go()
    examples, tokens, positions = counting.totals(spec["warmup"], spec["steps"])
    _, all_tokens, all_positions = counting.totals(0, len(counting.batches))
    sec = clock.seconds
    out = {
        "preset": spec["preset"], "variant": spec["variant"], "batch": spec["batch"],
        "timed_steps": spec["steps"] - spec["warmup"], "seconds": round(sec, 3),
        "examples_per_s": round(examples / sec, 1), "tokens_per_s": round(tokens / sec, 1),
        "positions_per_s": round(positions / sec, 1),
        "padding": round(1 - all_tokens / all_positions, 3), "mean_len": round(positions / examples, 1),
        "peak_mem_mb": None, "peak_rss_mb": round(_max_rss_mb()), "rss_increase_mb": None,
    }
    if device.type == "cuda":
        out["peak_mem_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    else:
        out["rss_increase_mb"] = round(_max_rss_mb() - rss_before)
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


HEADER = ("| preset | variant | batch | examples/s | speed-up vs HF | tokens/s | positions/s | padding "
          "| mean padded len | peak MiB | RSS rise MiB |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _dash(v: object) -> object:
    return "-" if v is None else v


def _fmt(r: dict) -> str:
    mem = r["peak_mem_mb"] if r["peak_mem_mb"] is not None else r["peak_rss_mb"]
    return (f"| {r['preset']} | {r['variant']} | {r['batch']} | {r['examples_per_s']} | "
            f"{_dash(r.get('speedup_vs_hf'))} | {r['tokens_per_s']:.0f} | {r['positions_per_s']:.0f} | "
            f"{100 * r['padding']:.1f} % | {r['mean_len']} | {mem} | {_dash(r['rss_increase_mb'])} |")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--presets", nargs="+", choices=tuple(PRESETS), default=["minilm", "base"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps in all (default 300 on cuda, 20 on cpu)")
    p.add_argument("--warmup", type=int, default=None, help="steps before the clock starts (default 30 / 3)")
    p.add_argument("--examples", type=int, default=0, help="use the first N SST-2 sentences (0 = all 60k)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="MiniLM shape, bertlab and hf only, few steps, 4096 sentences")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "finetune.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one variant (JSON spec)
    a = p.parse_args()
    gpu = a.device == "cuda"
    a.steps = a.steps or (300 if gpu else 20)
    a.warmup = a.warmup if a.warmup is not None else (30 if gpu else 3)
    if a.quick:
        a.presets, a.variants = [p for p in a.presets if p != "base"] or a.presets, ["bertlab", "hf"]
        a.steps, a.warmup, a.examples = min(a.steps, 10), min(a.warmup, 2), a.examples or 4096
    if not 1 <= a.warmup < a.steps:
        p.error(f"need 1 <= --warmup < --steps (got warmup {a.warmup}, steps {a.steps}).")
    return a


def main() -> None:
    a = _parse()
    if a.worker:
        print(RESULT + json.dumps(worker(json.loads(a.worker))), flush=True)
        return
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but CUDA is not available here; use --device cpu.")
    from bertlab.settings import DataNotFoundError, data_path

    try:
        data_path("sst2", "train.tsv")
    except DataNotFoundError as e:
        raise SystemExit(f"SST-2 is needed: {e}") from None
    print(HEADER)
    rows = []
    for preset in a.presets:
        hf_eps = None
        for variant in ["hf", *[v for v in a.variants if v != "hf"]] if "hf" in a.variants else a.variants:
            spec = {"preset": preset, "variant": variant, "batch": a.batch, "steps": a.steps, "warmup": a.warmup,
                    "examples": a.examples, "max_length": a.max_length, "threads": a.threads, "seed": a.seed,
                    "device": a.device}
            row = run_in_subprocess(spec)
            hf_eps = row["examples_per_s"] if variant == "hf" else hf_eps
            row["speedup_vs_hf"] = round(row["examples_per_s"] / hf_eps, 3) if hf_eps else None
            rows.append(row)
            print(_fmt(row), flush=True)
    meta = {"torch": torch.__version__, "transformers": importlib.metadata.version("transformers"), "device": a.device,
            "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
            "cpu": platform.processor() or platform.machine(), "threads": a.threads,
            "precision": "bf16 autocast" if a.device == "cuda" else "fp32", "steps": a.steps, "warmup": a.warmup,
            "examples": a.examples or "all", "max_length": a.max_length, "lr": LR, "task": "sst2"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
