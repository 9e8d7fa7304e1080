"""Re-measure the fine-tuning table (docs/results.md) with today's defaults and code, then rewrite the table.

Each row is one `bertlab finetune` command (the task's defaults unless the row says otherwise), run in a
fresh process; its dev metric, wall time, device, torch threads and date go to
bench/results/finetune_table.json (rows merged by name: a row re-run replaces only itself), and the
`figures:finetune-table` block of docs/results.md is rewritten from that file by bench/render.py. Only rows
measured with the defaults of the current code are shown (`shown_rows`): a row whose settings no longer
match the code's defaults is left out of the table until it is run again.

    BERTLAB_DATA=../shared/data python bench/finetune_table.py                 # every row (hours on a CPU)
    python bench/finetune_table.py --only nli --only ner --threads 1 --cpus 1  # some rows, pinned to core 1
    python bench/finetune_table.py --list                                      # the rows and their commands
    python bench/finetune_table.py --sweep nli-lr1e-4 --task nli -- --lr 1e-4  # a tuning run: finetune_sweep.json

`make results` runs every row.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TABLE = RESULTS / "finetune_table.json"
SWEEP = RESULTS / "finetune_sweep.json"


@dataclass(frozen=True)
class Row:
    """One row of the fine-tuning table: a `bertlab finetune` command and what its data is."""

    name: str
    task: str
    data: str  # the training data in words
    args: tuple[str, ...] = ()  # options beyond --task/--out (none = the task's defaults)

    def command(self) -> list[str]:
        return ["bertlab", "finetune", "--task", self.task, *self.args]


ROWS: tuple[Row, ...] = (
    Row("sst2", "sst2", "all training rows, dev held out by whole sentences"),
    Row("sst2-4k", "sst2", "4,000 sentences", ("--max-train-examples", "4000")),
    Row("sst2-4k-adapter", "sst2", "4,000 sentences", ("--max-train-examples", "4000", "--mode", "adapter")),
    Row("sst2-4k-feature", "sst2", "4,000 sentences", ("--max-train-examples", "4000", "--mode", "feature")),
    Row("nli", "nli", "SICK TRAIN part, 4,439 pairs"),
    Row("nli-adapter", "nli", "SICK TRAIN part, 4,439 pairs", ("--mode", "adapter")),
    Row("nli-feature", "nli", "SICK TRAIN part, 4,439 pairs", ("--mode", "feature")),
    Row("ner", "ner", "all 14,041 sentences"),
    Row("qa", "qa", "25 articles, 5,418 questions"),
)


def rows_by_name() -> dict[str, Row]:
    return {r.name: r for r in ROWS}


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"rows": []}


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def merge_row(path: Path, row: dict[str, Any]) -> None:
    """Put `row` into the results file `path`, replacing the row of the same name."""
    data = _read(path)
    data["rows"] = [r for r in data.get("rows", []) if r.get("name") != row["name"]] + [row]
    _write(path, data)


def run(name: str, task: str, args: list[str], threads: int, cpus: str | None, data: str = "") -> dict[str, Any]:
    """Run `bertlab finetune --task task args` in a fresh process; the row for the results file."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    env.setdefault("BERTLAB_DATA", str((ROOT.parent / "shared" / "data").resolve()))
    with tempfile.TemporaryDirectory(prefix=f"bertlab-table-{name}-") as out:
        cmd = [sys.executable, "-m", "bertlab.cli", "finetune", "--task", task, "--out", out, "--no-progress", *args]
        if cpus:
            cmd = ["taskset", "-c", cpus, *cmd]
        t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # its log: our stderr
        wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"row {name} failed (exit {proc.returncode}): see its log above")
        summary = json.loads((Path(out) / "finetune_results.json").read_text(encoding="utf-8"))
    row = row_from_results(name, task, args, summary, wall, threads, cpus, data)
    # CPU seconds the run used (all its threads): on a shared machine, what it costs without the others
    row["cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)
    return row


def row_from_results(name: str, task: str, args: list[str], summary: dict[str, Any], wall: float | None,
                     threads: int, cpus: str | None, data: str = "") -> dict[str, Any]:
    """A results-file row from a run's finetune_results.json (`args`: its options beyond --task/--out)."""
    cfg = summary["config"]
    m = summary["metrics"]
    keep = ("accuracy", "f1", "exact_match", "precision", "recall", "per_type")
    return {
        "name": name, "task": task, "data": data or summary.get("data", ""),
        "command": shlex.join(["bertlab", "finetune", "--task", task, *args]),
        "mode": summary["mode"], "epochs": cfg.get("epochs"), "lr": cfg.get("lr"),
        "batch_size": cfg.get("batch_size"), "max_length": cfg.get("max_length"),
        "warmup_ratio": cfg.get("warmup_ratio"), "model": cfg.get("model"),
        "main_metric": summary["main_metric"], "score": summary["score"],
        "metrics": {k: m[k] for k in keep if k in m},
        "history": [{k: h.get(k) for k in ("epoch", summary["main_metric"])} for h in summary["history"]],
        "train_examples": summary["train_examples"], "eval_examples": summary["eval_examples"],
        "trainable_parameters": summary["trainable_parameters"],
        "train_s": summary["wall_time_s"], "wall_s": round(wall, 1) if wall is not None else None,
        "device": summary["device"], "precision": summary.get("precision", "fp32"), "threads": threads,
        "cpus": cpus or "any",
        "cores": os.cpu_count(), "cpu": platform.machine(), "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
    }


TASK_NAMES = {"sst2": "SST-2", "nli": "SICK (NLI)", "ner": "CoNLL-2003 (NER)", "qa": "SQuAD v1.1 (QA)"}


def dev_figure(r: dict[str, Any]) -> str:
    """The row's dev metric in words, and after each epoch when there were several."""
    m, hist = r["metrics"], r.get("history", [])
    scale = 1 if r["task"] == "qa" else 100
    if r["task"] == "qa":
        text = f"EM {m['exact_match']:.1f}, F1 {m['f1']:.1f}"
    else:
        text = f"{'entity F1' if r['task'] == 'ner' else 'accuracy'} {100 * m[r['main_metric']]:.1f}"
    if len(hist) > 1:
        text += "; by epoch " + " / ".join(f"{scale * h[r['main_metric']]:.1f}" for h in hist)
    return text


def shown_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of finetune_table.json measured with the defaults the code has today, in task order, each with
    its task named and its dev figure in words ("shown")."""
    sys.path.insert(0, str(ROOT))
    from bertlab.training.finetune_defaults import recipe

    def current(r: dict[str, Any]) -> bool:
        rec = recipe(r["task"], r["mode"])
        return ((r["model"], r["epochs"], r["lr"], r["batch_size"], r["max_length"], r.get("warmup_ratio"))
                == (rec.model, rec.epochs, rec.lr, rec.batch_size, rec.max_length, rec.warmup_ratio))

    order = list(TASK_NAMES)
    rows = sorted((r for r in data["rows"] if current(r)), key=lambda r: (order.index(r["task"]), r["name"]))
    return [{**r, "task": TASK_NAMES[r["task"]], "shown": dev_figure(r)} for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[r.name for r in ROWS], help="run this row (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the rows and their commands, run nothing")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS) per run")
    parser.add_argument("--cpus", default=None, help="pin the runs to these CPUs (taskset -c), e.g. 1")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite the docs' table")
    parser.add_argument("--sweep", default=None, help="a tuning run of this name into finetune_sweep.json "
                                                       "(with --task and finetune options after --)")
    parser.add_argument("--task", default=None, help="the task of a --sweep run")
    parser.add_argument("extra", nargs="*", help="finetune options of a --sweep run (after --)")
    args = parser.parse_args(argv)
    if args.list:
        for r in ROWS:
            print(f"{r.name:18s} {shlex.join(r.command())}")
        return 0
    if args.sweep:
        if not args.task:
            parser.error("--sweep needs --task")
        row = run(args.sweep, args.task, list(args.extra), args.threads, args.cpus)
        merge_row(SWEEP, row)
        print(json.dumps({k: row[k] for k in ("name", "score", "history", "train_s", "threads")}))
        return 0
    chosen = [rows_by_name()[n] for n in (args.only or [r.name for r in ROWS])]
    for r in chosen:
        print(f"== {r.name}: {shlex.join(r.command())}", flush=True)
        row = run(r.name, r.task, list(r.args), args.threads, args.cpus, r.data)
        merge_row(TABLE, row)
        print(json.dumps({k: row[k] for k in ("name", "score", "train_s", "threads")}), flush=True)
    if not args.no_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        import render

        render.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
