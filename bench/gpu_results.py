"""Turns the files a GPU check brought back (bench/gpu_check.sh's $OUT) into bench/results/*_cuda.json, each
with the GPU's name, and puts the new heads file back together.

    python bench/gpu_results.py FILES_AT [--results bench/results] [--compare-heads]

Writes `gpu_check_cuda.json` (the device, each step's exit code and wall time, the CUDA tests' counts, the
SST-2 and QA fine-tunes' figures, the heads run's figures as measured there), `finetune_cuda.json` and
`pretrain_cuda.json` (the benchmarks' own files), and joins `heads.safetensors.part-*` into
`out/gpu-heads/default_heads.safetensors`. `--compare-heads` then scores that file and the shipped one on this
CPU (`evaluate_default_heads`, the same held-out text for both) into `default_heads_cuda.json`, with the
verdict: the new file replaces bertlab/assets/default_heads.safetensors only if it is better on every
held-out figure (copy it by hand, with its .json, then re-run bench/render.py). Then the GPU block of
docs/benchmarks.md is rewritten from the files (bench/render.py). A dry run (GPU_CHECK_DEVICE=cpu or
GPU_CHECK_TINY=1) is refused unless --dry-run, which writes `*_dryrun.json` and prints the block it makes.
`--note TEXT` stores what the reader must know of the code that ran (e.g. a default changed since) with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
HEADS_OUT = REPO / "out" / "gpu-heads" / "default_heads.safetensors"
HELD_OUT_FIGURES = (  # (figure, key): higher is better for each
    ("mlm_wiki_held_out", "top1"), ("mlm_wiki_held_out", "top5"), ("mlm_wikitext2_valid", "top1"),
    ("mlm_wikitext2_valid", "top5"), ("nsp_wiki_held_out", "accuracy"), ("nsp_wiki_held_out_sentences", "accuracy"),
)


def test_counts(junit: Path) -> dict[str, int] | None:
    """passed / failed / errors / skipped of pytest's JUnit XML, or None when there is none."""
    if not junit.is_file():
        return None
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "failed": n["failures"],
            "errors": n["errors"], "skipped": n["skipped"]}


def check_summary(summary: dict[str, Any]) -> None:
    for s in summary["steps"]:
        state = "skipped" if s.get("skipped") else ("timed out" if s.get("timed_out") else f"exit {s['rc']}")
        print(f"{s['step']:>9}: {state}, {s['wall_s']} s")


def fine_tune_figures(step: dict[str, Any]) -> dict[str, Any] | None:
    """The figures of a `bertlab finetune` step (its JSON line), with the step's wall time."""
    r = step.get("result")
    if not isinstance(r, dict):
        return None
    keep = ("task", "status", "error", "main_metric", "score", "metrics", "history", "steps", "wall_time_s",
            "device", "precision", "mode", "train_examples", "eval_examples", "data")
    return {**{k: r[k] for k in keep if k in r}, "step_wall_s": step["wall_s"], "command": step.get("command")}


def _figure(figures: dict[str, Any], name: str, key: str) -> float | None:
    v = figures.get(name)
    return v.get(key) if isinstance(v, dict) else None


def compare_heads(new: Path) -> dict[str, Any]:
    """Both heads files scored on this CPU on the same held-out text; `better` only if every figure is."""
    from bertlab.default_heads_file import heads_path
    from bertlab.loading import default_model_folder
    from bertlab.recipes.default_heads import evaluate_default_heads, start_model
    from bertlab.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(default_model_folder())
    scores = {}
    for name, path in (("shipped", heads_path()), ("gpu", new)):
        print(f"scoring the {name} heads ({path}) on this CPU ...", flush=True)
        scores[name] = evaluate_default_heads(start_model(path), tok)
    rows = {f"{a}.{b}": (_figure(scores["shipped"], a, b), _figure(scores["gpu"], a, b)) for a, b in HELD_OUT_FIGURES}
    rows = {k: v for k, v in rows.items() if None not in v}
    better = bool(rows) and all(new_v > old_v for old_v, new_v in rows.values())
    return {"shipped": scores["shipped"], "gpu": scores["gpu"], "held_out": rows, "better_on_every_figure": better}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", type=Path, help="the folder the GPU check's files came back to (files_at)")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--compare-heads", action="store_true", help="score the new heads and the shipped ones here")
    p.add_argument("--dry-run", action="store_true", help="accept a CPU or tiny dry run (writes *_dryrun.json)")
    p.add_argument("--note", default=None, help="what a reader must know of the code that ran, kept with the figures")
    a = p.parse_args()
    summary = json.loads((a.files / "summary.json").read_text())
    a.results.mkdir(parents=True, exist_ok=True)
    dry = summary["device"] != "cuda" or summary["tiny"]
    if dry and not a.dry_run:
        raise SystemExit(f"{a.files} holds a dry run (device {summary['device']}, tiny {summary['tiny']}): "
                         f"give --dry-run to write *_dryrun.json, or bring back a run on the GPU.")
    suffix = "dryrun" if dry else "cuda"
    check_summary(summary)
    gpu = summary["gpu"]
    steps = {s["step"]: s for s in summary["steps"]}
    out: dict[str, Any] = {
        "gpu": gpu, "device": summary["device"], "torch": summary["torch"], "cuda": summary["cuda"],
        "when": summary["when"], "tests": test_counts(a.files / "junit.xml"),
        "steps": [{k: v for k, v in s.items() if k != "result"} for s in summary["steps"]],
        "finetune_sst2": fine_tune_figures(steps["sst2"]) if "sst2" in steps else None,
        "finetune_qa": fine_tune_figures(steps["qa"]) if "qa" in steps else None,
        "note": a.note,
        "start_model": "the offline default (package embeddings in float16 + bertlab's re-trained layers): "
                       "see bench/gpu_bundle.py",
    }
    heads = a.files / "heads.json"
    out["heads_on_gpu"] = json.loads(heads.read_text()) if heads.is_file() else None
    for name in ("bench_finetune", "bench_pretrain"):
        src = a.files / f"{name}.json"
        if src.is_file():
            data = json.loads(src.read_text())
            data["meta"]["gpu"] = data["meta"].get("gpu") or gpu
            data["meta"]["note"] = a.note
            target = a.results / f"{name.removeprefix('bench_')}_{suffix}.json"
            target.write_text(json.dumps(data, indent=2) + "\n")
            print(f"written {target}")
    parts = sorted(a.files.glob("heads.safetensors.part-*"))
    if parts:
        target = HEADS_OUT if not dry else HEADS_OUT.with_name("default_heads_dryrun.safetensors")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"".join(p.read_bytes() for p in parts))
        out["heads_file"] = {"path": str(target.relative_to(REPO)), "bytes": target.stat().st_size, "parts": len(parts)}
        print(f"heads joined from {len(parts)} parts into {target}")
        if a.compare_heads:
            comparison = compare_heads(target)
            (a.results / f"default_heads_{suffix}.json").write_text(json.dumps(comparison, indent=2) + "\n")
            print(f"better on every held-out figure: {comparison['better_on_every_figure']}")
    target = a.results / f"gpu_check_{suffix}.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written {target}")
    sys.path.insert(0, str(REPO / "bench"))
    import render

    if dry:  # the block these files make, without touching the docs
        print(render.block("benchmarks.md", "gpu", a.results, suffix))
    elif a.results.resolve() == render.RESULTS.resolve():
        render.main([])


if __name__ == "__main__":
    main()
