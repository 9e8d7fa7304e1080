"""The compression lab on SST-2: int8, head pruning and a distilled student against the fp32 model they
came from, and bertlab's int8 against what a user would otherwise pick for CPU serving.

A 6-layer SST-2 teacher is fine-tuned first (the offline default's encoder, `--train-examples` seeded
sentences of SST-2's train file, one epoch; kept in `--workdir` for later runs with the same settings).
Every model is then scored on the same `--dev-examples` seeded sentences of SST-2's dev file, never
trained on (see /work/shared/data's README: that dev file is a held-out random piece of GLUE's train
set), and timed on the same encoded batches of dev sentences, batch 1 and batch 32 (median over
`--reps-b1` single sentences and `--reps` batches of 32 after a warm-up; the variants take turns batch by
batch, so background load hits them alike; the single sentences are timed `--rounds-b1` times, batch 1 giving
the median round, and each round's ratio to ONNX Runtime is kept to show the spread). Variants:

  fp32            the teacher (bertlab)
  int8            `bertlab.compress.quantize` (encoder Linears int8 per channel, embeddings stored int8)
  torch int8      plain torch: `torch.ao.quantization.quantize_dynamic` ({nn.Linear}, qint8) on the teacher
                  itself (bertlab's modules, torch's own int8 Linear)
  tab ort int8    what the Compression tab offers beside its int8 row: bertlab's int8 model exported to ONNX
                  (`bertlab.compress.onnx.export_int8`) and run by ONNX Runtime with `--threads` threads
  pruned 50 %     `bertlab.compress.prune` (Michel et al. head scores on 256 training sentences)
  student 3L      `bertlab.compress.distill`: 3 layers from the teacher's 0, 2, 4; T=2, alpha 0.5; the
                  teacher's training sentences, `--student-epochs` epochs
  hf fp32         transformers' BertForSequenceClassification on the teacher's saved folder (sdpa)
  hf int8         the same after `torch.ao.quantization.quantize_dynamic` ({nn.Linear}, qint8)
  ort fp32 / int8 the HF model exported to ONNX (opset 17), then `onnxruntime.quantization.quantize_dynamic`
                  (QInt8 weights, its defaults), run by an InferenceSession with `--threads` threads

Sizes are the weights as saved: bertlab's folders' model.safetensors, the HF int8 model's `torch.save`d
state dict, the .onnx files. torch runs with `--threads` threads (1 by default: the machine is shared).

    BERTLAB_DATA=../shared/data OMP_NUM_THREADS=1 python bench/bench_compress.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "compress.json"
AIMS = {"int8_speedup": 1.6, "int8_points_lost": 1.0, "int8_size_ratio": 0.4,
        "student_points_lost": 3.0, "student_speedup": 1.8,
        "int8_vs_ort_b1": 1.1}

log = logging.getLogger("bench_compress")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------------------------------------
# The teacher
# ---------------------------------------------------------------------------------------------
def teacher(args: argparse.Namespace):
    """The fine-tuned 6-layer SST-2 model (trained once per settings, then loaded from --workdir)."""
    import bertlab
    from bertlab.training.finetune import FinetuneConfig, finetune

    folder = Path(args.workdir) / f"teacher-{args.train_examples}-{args.epochs}-{args.max_length}"
    if (folder / "config.json").is_file():
        log.info("teacher: %s (trained before)", folder)
        return bertlab.load(str(folder)), folder
    cfg = FinetuneConfig(task="sst2", model="default-encoder", epochs=args.epochs, lr=5e-5, batch_size=32,
                         max_length=args.max_length, max_train_examples=args.train_examples,
                         max_eval_examples=args.dev_examples, eval_every=0, out_dir=str(folder), device="cpu")
    result = finetune(cfg)
    result.train.raise_for_status()
    log.info("teacher: dev accuracy %.4f after %d steps (%.0f s)", result.score, result.train.step, result.wall_time_s)
    return bertlab.load(str(folder)), folder


# ---------------------------------------------------------------------------------------------
# Timing and scoring, the same for every variant
# ---------------------------------------------------------------------------------------------
Run = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # a batch (input_ids, token_type_ids, attention_mask) -> logits


def bertlab_run(model) -> Run:
    return lambda b: model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).logits


def hf_run(model) -> Run:
    return lambda b: model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                           attention_mask=b["attention_mask"]).logits


def ort_run(session) -> Run:
    def run(b: dict[str, torch.Tensor]) -> torch.Tensor:
        feed = {k: b[k].numpy().astype(np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
        return torch.from_numpy(session.run(None, feed)[0])
    return run


@torch.inference_mode()
def time_in_turns(runs: dict[str, Run], batches: Sequence[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Median ms per batch of each run; batch by batch, the runs take turns (rotating order)."""
    names = list(runs)
    for name in names:  # warm-up
        runs[name](batches[0])
    times: dict[str, list[float]] = {n: [] for n in names}
    for r, batch in enumerate(batches[1:]):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            runs[name](batch)
            times[name].append((time.perf_counter() - t0) * 1000)
    return {n: statistics.median(t) for n, t in times.items()}


@torch.inference_mode()
def accuracy(run: Run, batches: Sequence[dict[str, torch.Tensor]]) -> float:
    right = total = 0
    for b in batches:
        right += int((run(b).argmax(-1) == b["labels"]).sum())
        total += len(b["labels"])
    return right / total


def encoded(batch) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids, "token_type_ids": batch.token_type_ids,
            "attention_mask": batch.attention_mask}


# ---------------------------------------------------------------------------------------------
# The peers
# ---------------------------------------------------------------------------------------------
def hf_models(folder: Path) -> tuple[Any, Any, int]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    fp32 = transformers.BertForSequenceClassification.from_pretrained(folder, attn_implementation="sdpa").eval()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = torch.ao.quantization.quantize_dynamic(fp32, {torch.nn.Linear}, dtype=torch.qint8)
    buffer = io.BytesIO()
    torch.save(int8.state_dict(), buffer)
    return fp32, int8, buffer.tell()


def torch_ao_int8(model) -> tuple[Any, int]:
    """Plain torch dynamic int8 of the bertlab model itself (its Linear layers, per-tensor qint8), and the size
    of its state dict as `torch.save` writes it."""
    import copy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)
    buffer = io.BytesIO()
    torch.save(int8.state_dict(), buffer)
    return int8, buffer.tell()


def ort_sessions(hf_fp32, workdir: Path, threads: int, example: dict[str, torch.Tensor]) -> tuple[Any, Any, int, int]:
    import warnings

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_path, int8_path = workdir / "model.onnx", workdir / "model-int8.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(hf_fp32, tuple(example[n] for n in names), str(fp32_path), input_names=names,
                          output_names=["logits"], dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
                          opset_version=17, dynamo=False)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's "consider pre-processing" note
    quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8)
    logging.getLogger().setLevel(logging.INFO)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    make = lambda p: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])  # noqa: E731
    return make(fp32_path), make(int8_path), fp32_path.stat().st_size, int8_path.stat().st_size


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-examples", type=int, default=4000)
    p.add_argument("--dev-examples", type=int, default=872, help="held-out SST-2 sentences scored (GLUE dev's size)")
    p.add_argument("--epochs", type=int, default=1, help="the teacher's fine-tuning epochs")
    p.add_argument("--student-epochs", type=int, default=2)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--reps", type=int, default=10, help="timed batches of 32")
    p.add_argument("--reps-b1", type=int, default=60, help="timed single sentences (cheap: a few ms each)")
    p.add_argument("--rounds-b1", type=int, default=5,
                   help="times the single sentences are timed (in turns each time): batch 1 reports the median "
                        "round and the spread of the rounds, which a busy machine widens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir", default=str(Path.home() / ".cache" / "bertlab" / "bench-compress"))
    p.add_argument("--quick", action="store_true", help="a smoke run: 400 training sentences, 200 dev, 3 reps")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.quick:
        args.train_examples, args.dev_examples, args.reps, args.reps_b1, args.rounds_b1 = 400, 200, 3, 6, 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    import bertlab.compress.lab as lab
    from bertlab.compress.distill import DistillConfig
    from bertlab.compress.measure import MB, disk_bytes, timing_batches
    from bertlab.tasks import collate

    t_start = time.perf_counter()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    (model, tok), teacher_folder = teacher(args)
    data = lab.TaskData.read("sst2", tok, model, max_train=args.train_examples, max_dev=args.dev_examples,
                             max_length=args.max_length)
    score_batches = [collate(data.eval_set.features[i:i + 64], pad_token_id=tok.pad_token_id)
                     for i in range(0, len(data.eval_set.features), 64)]
    reps = {1: args.reps_b1, 32: args.reps}
    sentences = data.sentences(max(32 * (args.reps + 1), args.reps_b1 + 1))
    timing = {b: [encoded(x) for x in timing_batches(tok, sentences, b, reps[b], args.max_length)]
              for b in (1, 32)}

    log.info("compressing: int8, pruned 50 %, 3-layer student")
    work = Path(args.workdir)
    int8 = lab.run_quantize(model, tok, data, work / "int8", reps=1, batch_sizes=(1,), onnx=False)
    pruned = lab.run_prune(model, tok, data, 0.5, work / "pruned", reps=1, batch_sizes=(1,))
    cfg = DistillConfig(task="sst2", layers=3, epochs=args.student_epochs, lr=1e-4, batch_size=32,
                        max_length=args.max_length, device="cpu", eval_every=0)
    student = lab.run_distill(model, tok, data, cfg, work / "student", reps=1, batch_sizes=(1,))
    torch_int8, torch_int8_bytes = torch_ao_int8(model)
    from bertlab.compress.onnx import OnnxRuntimeModel, export_int8

    tab_onnx = export_int8(int8.model, tok, work / "int8")
    tab_ort = OnnxRuntimeModel(tab_onnx.int8, int8.model, threads=args.threads)
    hf_fp32, hf_int8, hf_int8_bytes = hf_models(teacher_folder)
    ort_fp32, ort_int8, ort_fp32_bytes, ort_int8_bytes = ort_sessions(hf_fp32, work, args.threads, timing[1][0])

    runs: dict[str, tuple[Run, int, dict[str, Any]]] = {
        "fp32": (bertlab_run(model), disk_bytes(teacher_folder), {"lib": "bertlab", "layers": 6, "heads": 72}),
        "int8": (bertlab_run(int8.model), disk_bytes(work / "int8"), {"lib": "bertlab", "layers": 6, "heads": 72}),
        "torch int8": (bertlab_run(torch_int8), torch_int8_bytes,
                       {"lib": "bertlab + torch.ao", "layers": 6, "heads": 72}),
        "tab ort int8": (bertlab_run(tab_ort), tab_onnx.int8.stat().st_size,
                         {"lib": "bertlab → onnxruntime", "layers": 6, "heads": 72}),
        "pruned 50 %": (bertlab_run(pruned.model), disk_bytes(work / "pruned"),
                        {"lib": "bertlab", "layers": 6, "heads": pruned.variant.heads}),
        "student 3L": (bertlab_run(student.model), disk_bytes(work / "student"),
                       {"lib": "bertlab", "layers": 3, "heads": student.variant.heads}),
        "hf fp32": (hf_run(hf_fp32), disk_bytes(teacher_folder), {"lib": "transformers", "layers": 6, "heads": 72}),
        "hf int8": (hf_run(hf_int8), hf_int8_bytes, {"lib": "transformers + torch.ao", "layers": 6, "heads": 72}),
        "ort fp32": (ort_run(ort_fp32), ort_fp32_bytes, {"lib": "onnxruntime", "layers": 6, "heads": 72}),
        "ort int8": (ort_run(ort_int8), ort_int8_bytes, {"lib": "onnxruntime", "layers": 6, "heads": 72}),
    }
    log.info("scoring %d variants on %d held-out sentences", len(runs), len(data.dev))
    scores = {name: accuracy(run, score_batches) for name, (run, _, _) in runs.items()}
    log.info("timing at batch 1 (%d sentences) and 32 (%d batches), in turns", args.reps_b1, args.reps)
    plain = {n: r for n, (r, _, _) in runs.items()}
    rounds = [time_in_turns(plain, timing[1]) for _ in range(args.rounds_b1)]  # each: median ms per variant
    lat = {1: {n: statistics.median(r[n] for r in rounds) for n in runs}, 32: time_in_turns(plain, timing[32])}
    rows = [{"name": n, **info, "size_mb": round(size / MB, 2), "accuracy": round(scores[n], 4),
             "latency_ms_b1": round(lat[1][n], 2), "latency_ms_b32": round(lat[32][n], 1),
             "latency_ms_b1_rounds": [round(r[n], 2) for r in rounds]}
            for n, (_, size, info) in runs.items()]
    by = {r["name"]: r for r in rows}

    def speed(a: str, b: str, batch: int) -> float:  # how many times faster b is than a
        return round(by[a][f"latency_ms_b{batch}"] / by[b][f"latency_ms_b{batch}"], 2)

    def lost(a: str, b: str) -> float:
        return round((by[a]["accuracy"] - by[b]["accuracy"]) * 100, 2)

    ratios = {
        "int8": {"speedup_b1": speed("fp32", "int8", 1), "speedup_b32": speed("fp32", "int8", 32),
                 "points_lost": lost("fp32", "int8"),
                 "size_ratio": round(by["int8"]["size_mb"] / by["fp32"]["size_mb"], 3)},
        # bertlab's int8 time / the peer's int8 time: below 1 = bertlab faster
        # bertlab's int8 / plain torch dynamic int8 on the same modules: below 1 = bertlab's int8 faster
        "int8_vs_torch_int8": {"time_ratio_b1": speed("int8", "torch int8", 1),
                               "time_ratio_b1_rounds": [round(r["int8"] / r["torch int8"], 2) for r in rounds],
                               "time_ratio_b32": speed("int8", "torch int8", 32)},
        # the tab's two int8 rows: torch's time / ONNX Runtime's (the same int8 weights exported)
        "int8_vs_tab_ort": {"time_ratio_b1": speed("int8", "tab ort int8", 1),
                            "time_ratio_b32": speed("int8", "tab ort int8", 32),
                            "points_lost": lost("int8", "tab ort int8")},
        "int8_vs_hf_int8": {"time_ratio_b1": speed("int8", "hf int8", 1),
                            "time_ratio_b32": speed("int8", "hf int8", 32),
                            "size_ratio": round(by["int8"]["size_mb"] / by["hf int8"]["size_mb"], 3)},
        "int8_vs_ort_int8": {"time_ratio_b1": speed("int8", "ort int8", 1),
                             "time_ratio_b1_rounds": [round(r["int8"] / r["ort int8"], 2) for r in rounds],
                             "time_ratio_b32": speed("int8", "ort int8", 32),
                             "size_ratio": round(by["int8"]["size_mb"] / by["ort int8"]["size_mb"], 3)},
        "fp32_vs_hf_fp32": {"time_ratio_b1": speed("fp32", "hf fp32", 1),
                            "time_ratio_b32": speed("fp32", "hf fp32", 32)},
        "student": {"speedup_b1": speed("fp32", "student 3L", 1), "speedup_b32": speed("fp32", "student 3L", 32),
                    "points_lost": lost("fp32", "student 3L")},
        "pruned_50": {"speedup_b1": speed("fp32", "pruned 50 %", 1), "speedup_b32": speed("fp32", "pruned 50 %", 32),
                      "points_lost": lost("fp32", "pruned 50 %")},
    }
    r = ratios
    slowest = {k: min(r[k]["speedup_b1"], r[k]["speedup_b32"]) for k in ("int8", "student")}
    aims = {
        "int8 ≥ 1.6× faster at batch 1 and 32": slowest["int8"] >= AIMS["int8_speedup"],
        "int8 ≤ 1 point lost": r["int8"]["points_lost"] <= AIMS["int8_points_lost"],
        "int8 ≤ 0.4× the weights' size": r["int8"]["size_ratio"] <= AIMS["int8_size_ratio"],
        "student ≤ 3 points lost": r["student"]["points_lost"] <= AIMS["student_points_lost"],
        "student ≥ 1.8× faster": slowest["student"] >= AIMS["student_speedup"],
        "int8 ≤ 1.1× ONNX Runtime int8's time at batch 1":
            r["int8_vs_ort_int8"]["time_ratio_b1"] <= AIMS["int8_vs_ort_b1"],
    }
    result = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu(), "threads": args.threads,
            "load_average": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
            "transformers": _version("transformers"), "onnxruntime": _version("onnxruntime"),
            "train_examples": len(data.train), "dev_examples": len(data.dev), "max_length": args.max_length,
            "reps": args.reps, "reps_b1": args.reps_b1, "rounds_b1": args.rounds_b1,
            "teacher": f"the offline default's encoder fine-tuned on {len(data.train)} SST-2 "
                       f"sentences, {args.epochs} epoch(s), lr 5e-5, batch 32",
            "student": f"3 layers, T=2, alpha 0.5, {args.student_epochs} epochs, lr 1e-4",
            "held_out": data.note, "quick": args.quick, "wall_s": round(time.perf_counter() - t_start),
            "command": "BERTLAB_DATA=../shared/data OMP_NUM_THREADS=1 python bench/bench_compress.py"
                       + (" --quick" if args.quick else ""),
        },
        "rows": rows,
        "ratios": ratios,
        "curve": [{"heads_kept": p.heads_kept, "fraction": p.fraction, "accuracy": round(p.score, 4)}
                  for p in pruned.curve],
        "aims": aims,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ratios": ratios, "aims": aims}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
