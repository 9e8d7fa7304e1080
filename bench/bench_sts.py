"""Text similarity two ways on SICK's held-out pairs (its TRIAL part, 495 pairs), scored by Pearson and
Spearman against people's relatedness (1-5):

- the cosine of the frozen encoder's mean-pooled sentence vectors (`bertlab.analysis.sentences`), no training;
- a cross-encoder fine-tuned with a regression head on SICK's TRAIN part (`bertlab finetune --task sts` with
  its defaults, `training.finetune_defaults.recipe("sts")`), the two sentences read together.

Both start from the same encoder (default: the offline default's MiniLM as its package ships it,
`default-encoder`); the cosine is also measured on the offline default itself (`default`: that MiniLM with
the layers bertlab re-trained for its masked-word heads, what the Embeddings tab shows first). Needs
BERTLAB_DATA. Writes bench/results/sts.json, which docs/results.md shows through `python bench/render.py`.

    python bench/bench_sts.py [--model default-encoder] [--threads 1] [--epochs N] [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "sts.json"
QUICK_TRAIN, QUICK_DEV = 400, 100


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default-encoder", help="the encoder both ways start from")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    p.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs (default: the task's)")
    p.add_argument("--precision", default="auto", help="the fine-tune's precision (auto, bf16, fp32)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_TRAIN} training pairs, 1 epoch, "
                                                        f"{QUICK_DEV} held-out pairs")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from bertlab.analysis.sentences import cosine_score
    from bertlab.loading import load
    from bertlab.tasks import get_task, read_train_dev, subset
    from bertlab.training.finetune import FinetuneConfig, finetune
    from bertlab.training.finetune_defaults import recipe

    task = get_task("sts")
    split = read_train_dev(task, seed=0)
    if args.quick:
        split.train, split.dev = subset(split.train, QUICK_TRAIN, 0, "train"), subset(split.dev, QUICK_DEV, 0, "dev")
        args.epochs = args.epochs or 1
    rows = []
    for source, name in ((args.model, args.model), (None, "default")):
        model, tok = load(source)
        t0 = time.perf_counter()
        cosine = cosine_score(model, tok, split.dev)
        rows.append({"way": "cosine of mean-pooled sentence vectors", "encoder": f"{name}, frozen",
                     "trained_on": "nothing", "pairs": cosine.pairs, "pearson": cosine.pearson,
                     "spearman": cosine.spearman, "mse": None, "seconds": round(time.perf_counter() - t0, 1),
                     "timed": "encoding the held-out pairs"})
        del model
    r = recipe("sts")
    cfg = FinetuneConfig(task="sts", model=args.model, epochs=args.epochs, precision=args.precision, seed=0)
    result = finetune(cfg, train_examples=split.train, eval_examples=split.dev)
    if result.status != "completed":
        print(f"the fine-tune {result.status}: {result.error}", file=sys.stderr)
        return 1
    by_epoch = [round(h["pearson"], 4) for h in result.history]
    c = cfg.resolved()
    rows += [
        {"way": "cross-encoder, regression head (`--task sts`)", "encoder": f"{args.model}, fine-tuned",
         "trained_on": f"SICK TRAIN part, {len(split.train):,} pairs, {c.epochs} epochs",
         "pairs": int(result.metrics["examples"]), "pearson": result.metrics["pearson"],
         "spearman": result.metrics["spearman"], "mse": result.metrics["mse"],
         "seconds": round(result.wall_time_s, 1), "timed": "fine-tuning and scoring", "pearson_by_epoch": by_epoch,
         "epochs": c.epochs, "lr": c.lr, "batch_size": c.batch_size, "precision": result.precision},
    ]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    meta = {"model": args.model, "held_out": split.note, "threads": args.threads, "cpu": cpu,
            "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_avg": [round(x, 1) for x in os.getloadavg()], "recipe_basis": r.basis,
            "quick": args.quick,
            "command": "python bench/bench_sts.py" + (" --quick" if args.quick else "")
                       + (f" --epochs {args.epochs}" if args.epochs and not args.quick else "")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        print(f"{row['way']}: Pearson {row['pearson']:.3f}, Spearman {row['spearman']:.3f} on {row['pairs']} pairs "
              f"({row['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
