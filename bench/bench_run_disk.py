"""What one finished one-minute fine-tune leaves on disk, by part: the aim is at most 150 MB a run.

The run: SST-2 in full from the offline default's encoder (default-encoder, MiniLM-L6), a seeded 2,000 of
the training sentences, fp32, once

- as the Fine-tuning tab runs it (`training.finetune.with_schedule`: a checkpoint once an epoch, and a
  `SnapshotKeeper` keeping the replay snapshots in the run's `replay/`), and
- through the command line (`bertlab finetune --task sst2 --max-train-examples 2000 --precision fp32`),
  in its own process.

Each run folder is measured by part: the final model (its weights file, and the config and tokenizer
files), `checkpoints/`, `replay/` and the rest (results.json); a file hard-linked twice counts once. Needs
BERTLAB_DATA. Writes bench/results/run_disk.json.

    python bench/bench_run_disk.py [--examples 2000] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AIM_MB = 150.0
OUT = Path(__file__).resolve().parent / "results" / "run_disk.json"
MB = 1e6


def parts(folder: Path) -> dict[str, float]:
    """MB on disk of each part of a run folder (a hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    sizes = {"weights": 0, "model files": 0, "checkpoints": 0, "replay": 0, "other": 0}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        st = path.stat()
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        top = path.relative_to(folder).parts[0]
        if top in ("checkpoints", "replay"):
            part = top
        elif path.parent == folder and path.suffix == ".safetensors":
            part = "weights"
        elif path.parent == folder and not path.name.endswith("results.json"):
            part = "model files"
        else:
            part = "other"
        sizes[part] += st.st_size
    out = {k: round(v / MB, 1) for k, v in sizes.items()}
    out["total"] = round(sum(sizes.values()) / MB, 1)
    return out


def tab_run(folder: Path, examples: int) -> dict:
    """The Fine-tuning tab's run: its schedule and its replay snapshots."""
    from bertlab.tasks import get_task
    from bertlab.tasks.splits import read_train_dev
    from bertlab.training.finetune import FinetuneConfig, finetune, with_schedule
    from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper

    cfg = FinetuneConfig(task="sst2", mode="full", model="default-encoder", max_train_examples=examples,
                         precision="fp32", out_dir=str(folder)).resolved()
    split = read_train_dev(get_task("sst2"))
    train, dev = split.train, split.dev
    cfg = with_schedule(cfg, len(train))
    t = time.perf_counter()
    result = finetune(cfg, callbacks=[SnapshotKeeper(folder / REPLAY_DIR)], train_examples=train,
                      eval_examples=dev)
    return {"status": result.status, "steps": result.train.step, "seconds": round(time.perf_counter() - t, 1)}


def cli_run(folder: Path, examples: int, threads: int) -> dict:
    """`bertlab finetune` in a process of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "bertlab.cli", "finetune", "--task", "sst2", "--max-train-examples",
           str(examples), "--precision", "fp32", "--out", str(folder), "--no-progress"]
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bertlab finetune failed:\n{done.stderr[-3000:]}")
    return {"command": "bertlab finetune --task sst2 --max-train-examples "
                       f"{examples} --precision fp32 --out RUN --no-progress",
            "seconds": round(time.perf_counter() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bertlab-disk-") as tmp:
        tab = Path(tmp) / "tab"
        rows["tab"] = {**tab_run(tab, args.examples), "MB": parts(tab)}
        cli = Path(tmp) / "cli"
        rows["cli"] = {**cli_run(cli, args.examples, args.threads), "MB": parts(cli)}
    result = {
        "what": f"SST-2 full fine-tune of default-encoder, {args.examples} sentences, fp32, one epoch",
        "aim_mb": AIM_MB,
        "runs": rows,
        "within_aim": all(r["MB"]["total"] <= AIM_MB for r in rows.values()),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "load": os.getloadavg()[0]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
