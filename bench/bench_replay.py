"""Training replayed: what keeping snapshots costs, and how fast the Replay slider redraws.

Two runs through the shared training loop, each with a `SnapshotKeeper` (8 log-spaced snapshots, fp16,
weights only), as the training tabs keep them:

- pre-training the Pre-training tab's "tiny" BERT (2 layers, 128 wide, the offline default's vocabulary);
- fine-tuning the offline default (MiniLM-L6, 6 layers x 12 heads) on SST-2 in full, as the Fine-tuning
  tab does (needs BERTLAB_DATA; skipped without it). Its Mask and logit-lens views read each snapshot's
  encoder with the offline default's MLM head.

For each: the snapshots' size on disk, the time spent writing them against the run's time, the time to
read the probe with every snapshot (the Replay section's `add_run`), then the slider: every view, the step
slider swept back and forth across all snapshots `--sweeps` times, timing each redraw in the kernel
(`ReplaySection.draw`: building the figure and updating the widget; the browser's own drawing is not
included). The first sweep draws every frame for the first time ("first"), later ones find its figure
cached ("again"); the aim is checked on all moves together. Writes bench/results/replay.json.

    python bench/bench_replay.py [--quick] [--sweeps 4] [--steps 60] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

AIM_MS = 100.0  # p95 of a slider redraw
VIEWS = ("Mask", "Attention", "Embeddings", "Logit lens")
OUT = Path(__file__).resolve().parent / "results" / "replay.json"


class TimedKeeper:
    """A SnapshotKeeper whose calls are timed (writing snapshots is all it does)."""

    def __init__(self, folder: Path) -> None:
        from bertlab.training.snapshots import SnapshotKeeper

        self.keeper = SnapshotKeeper(folder)
        self.seconds = 0.0

    def __call__(self, event) -> None:
        t = time.perf_counter()
        self.keeper(event)
        self.seconds += time.perf_counter() - t


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _stats(ms: list[float]) -> dict[str, float]:
    return {"moves": len(ms), "p50_ms": round(statistics.median(ms), 2), "p95_ms": round(_percentile(ms, 0.95), 2),
            "max_ms": round(max(ms), 2)}


def sweep(section, sweeps: int) -> dict[str, dict]:
    """Move the step slider across every snapshot, back and forth, in each view; redraw times in ms: the
    first sweep ("first": every frame drawn for the first time) and the later ones ("again": cached)."""
    out = {}
    steps = section.result.steps
    for view in VIEWS:
        section.step.value = steps[0]  # (drawn in the view before: not counted)
        section.draw_ms.clear()
        if section.view.value == view:
            section.draw()
        section.view.value = view  # the first snapshot's first visit
        for step in steps[1:]:
            section.step.value = step
        first = list(section.draw_ms)
        section.draw_ms.clear()
        for i in range(1, sweeps):
            for step in (steps[::-1] if i % 2 else steps)[1:]:
                section.step.value = step
        again = list(section.draw_ms)
        out[view] = {"first": _stats(first), "again": _stats(again), "all": _stats(first + again)}
    return out


def measure(label: str, model, tok, run, base=None, probe: str = "", sweeps: int = 4) -> dict:
    """Train with a timed keeper (`run(callback)` -> the trained model), replay it, sweep the slider."""
    from bertlab.panels.replay import ReplaySection
    from bertlab.training.snapshots import list_snapshots, snapshot_bytes

    with tempfile.TemporaryDirectory() as tmp:
        keeper = TimedKeeper(Path(tmp) / "replay")
        t = time.perf_counter()
        trained = run(keeper)
        train_s = time.perf_counter() - t
        snaps = list_snapshots(keeper.keeper.folder)
        section = ReplaySection(tok, probe)
        t = time.perf_counter()
        section.add_run(label, trained, tok, keeper.keeper.folder, base=base)
        replay_s = time.perf_counter() - t
        assert section.result is not None, section.messages
        views = sweep(section, sweeps)
        every = [v["all"]["p95_ms"] for v in views.values()]
        return {
            "run": label, "steps": snaps[-1].step, "snapshots": [s.step for s in snaps],
            "snapshot_mb": round(snapshot_bytes(keeper.keeper.folder) / 2**20, 1),
            "first_snapshot_mb": round(snaps[0].path.stat().st_size / 2**20, 1),
            "write_s": round(keeper.seconds, 2), "write_ms_per_snapshot": round(1000 * keeper.seconds / len(snaps)),
            "train_s": round(train_s, 2),
            "write_share": round(keeper.seconds / train_s, 3), "replay_s": round(replay_s, 2),
            "probe": probe, "views": views, "p95_ms": max(every),
        }


def pretraining(steps: int, sweeps: int) -> dict:
    from bertlab.loading import default_model_folder
    from bertlab.panels.pretrain import DEFAULT_PROBE, FALLBACK_DOCUMENTS
    from bertlab.tokenizer import Tokenizer
    from bertlab.training.pretrain import PretrainConfig, new_model, pretrain

    tok = Tokenizer.from_folder(default_model_folder())
    model = new_model("tiny", tok)
    cfg = PretrainConfig(size="tiny", steps=steps, seq_len=64, batch_size=8, log_every=1, device="cpu")

    def run(keeper):
        return pretrain(cfg, model=model, tokenizer=tok, documents=FALLBACK_DOCUMENTS * 10, callbacks=[keeper])[0]

    return measure(f"pre-training tiny BERT, {steps} steps", model, tok, run, probe=DEFAULT_PROBE, sweeps=sweeps)


def finetuning(sweeps: int) -> dict | None:
    from bertlab.loading import load
    from bertlab.panels.finetune import REPLAY_PROBE
    from bertlab.settings import data_dir
    from bertlab.training.finetune import FinetuneConfig, finetune

    if not (data_dir() / "sst2").is_dir():
        print("no SST-2 under BERTLAB_DATA: the fine-tuning run is skipped")
        return None
    base, tok = load()
    cfg = FinetuneConfig(task="sst2", mode="full", model=base, epochs=1, batch_size=8, max_train_examples=64,
                         max_eval_examples=32, max_length=64, log_every=1, device="cpu", eval_every=0)

    def run(keeper):
        return finetune(cfg, callbacks=[keeper], tokenizer=tok).model

    return measure("fine-tuning the offline default (full, SST-2)", copy.deepcopy(base), tok, run, base=base,
                   probe=tok.spell(REPLAY_PROBE), sweeps=sweeps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=4, help="back-and-forth passes of the slider per view")
    parser.add_argument("--steps", type=int, default=60, help="pre-training steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="2 sweeps, 20 pre-training steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.sweeps, args.steps = 2, 20
    torch.set_num_threads(args.threads)
    load_before = round(os.getloadavg()[0], 1)
    rows = [pretraining(args.steps, args.sweeps)]
    ft = finetuning(args.sweeps)
    if ft is not None:
        rows.append(ft)
    for r in rows:
        views = ", ".join(f"{v} {d['first']['p95_ms']:.0f}/{d['again']['p95_ms']:.0f}" for v, d in r["views"].items())
        print(f"{r['run']}: {len(r['snapshots'])} snapshots, {r['snapshot_mb']} MB, writing {r['write_s']} s of "
              f"{r['train_s']} s; replay {r['replay_s']} s; redraw p95 ms, first visit/again: {views}")
    worst = max(r["p95_ms"] for r in rows)
    print(f"worst p95 {worst:.1f} ms (aim <= {AIM_MS:.0f} ms)")
    result = {
        "meta": {"threads": args.threads, "sweeps": args.sweeps, "load_before": load_before,
                 "python": platform.python_version(),
                 "torch": torch.__version__, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime())},
        "rows": rows,
        "summary": {"worst_p95_ms": worst, "aim_ms": AIM_MS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
